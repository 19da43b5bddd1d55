package chunk

import (
	"fmt"
	"math"
	"time"

	"github.com/vmarena/vmarena/acl"
)

// The worker's CPU cap (Config.WorkerCPU).
//
// The worker measures each round of work by the wall clock, from the moment
// it starts the round to the moment it finishes: its own CPU time plus the
// driver calls it made, which on the host driver are system calls and on a
// device are the library's time (some of it waiting for the device, not
// burning a CPU). This package makes no system call of its own, so it cannot
// read a per-thread CPU clock; the wall time is an upper bound of the CPU the
// round used, except for what a round leaves to the kernel: the cost of waking
// the worker from a timer or a kick is not seen.
//
// A token bucket turns the measurements into waits. It earns WorkerCPU
// seconds of credit per second of wall time, up to capBurst, and each round
// spends its wall time (earning WorkerCPU of it back while it runs). When the
// credit is negative the worker waits until it is back to zero before its
// next round: its polls stretch to that moment, and a poke, a kick or a Settle
// that comes meanwhile is served then. Over any stretch of time T the worker is
// therefore busy at most WorkerCPU×T plus capBurst plus one round (a round is
// never cut short: it holds the driver's state half-changed).
//
// capBurst is 2 ms: as long as the longest idle poll interval, and room for a
// few rounds of map calls after a quiet spell (one 2 MiB map and its access
// grant take tens of microseconds on the devices measured), so that a burst of
// asks after a pause is answered at once; it is small enough that the
// average holds over windows of capBurst/WorkerCPU (8 ms at a quarter of a
// core), shorter than a decode step.
const capBurst = 2 * time.Millisecond

// minWorkerCPU is the smallest share Config.WorkerCPU accepts. Below it, a
// round of a few milliseconds (a refill that maps a large block) would keep
// the worker away for more than a second, during which every growth maps on
// its caller's path and released chunks stay mapped: no worker at all
// (Config.Ahead 0 and no headroom) serves such a program better.
const minWorkerCPU = 0.01

// checkWorkerCPU checks Config.WorkerCPU.
func checkWorkerCPU(share float64) error {
	if share == 0 {
		return nil
	}
	if math.IsNaN(share) || share < minWorkerCPU || share > 1 {
		return fmt.Errorf("chunk: %w: Config.WorkerCPU %v: want 0 (no cap) or a share of one CPU from %v to 1 (the worker is one goroutine)",
			acl.ErrInvalidParam, share, minWorkerCPU)
	}
	return nil
}

// bucket is the worker's token bucket. It is the worker goroutine's own:
// nothing else touches it.
type bucket struct {
	rate   float64       // Config.WorkerCPU; 0: no cap
	burst  time.Duration // the most credit it holds
	credit time.Duration // negative: overspent
	at     time.Time     // the moment credit was brought up to date
}

// newBucket returns a full bucket for a share of rate, at now.
func newBucket(rate float64, now time.Time) bucket {
	return bucket{rate: rate, burst: capBurst, credit: capBurst, at: now}
}

// accrue brings the credit up to date at now.
func (b *bucket) accrue(now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.credit = min(b.burst, b.credit+time.Duration(b.rate*float64(d)))
		b.at = now
	}
}

// spend charges a round of work that ran from start to end.
func (b *bucket) spend(start, end time.Time) {
	if b.rate == 0 {
		return
	}
	b.accrue(start)
	if d := end.Sub(start); d > 0 {
		// Earned back while it ran, at the rate, and spent in full.
		b.credit = min(b.burst, b.credit+time.Duration(b.rate*float64(d))-d)
		b.at = end
	}
}

// wait returns how long from now the worker must wait before its next round:
// 0 when it is in credit.
func (b *bucket) wait(now time.Time) time.Duration {
	if b.rate == 0 {
		return 0
	}
	b.accrue(now)
	if b.credit >= 0 {
		return 0
	}
	return time.Duration(math.Ceil(float64(-b.credit) / b.rate))
}

// clock is the worker's source of time: the real one, or a test's.
type clock interface {
	now() time.Time
	// timer returns a stopped timer.
	timer() timer
}

// timer is a reusable one-shot timer, as time.Timer.
type timer interface {
	// reset arms the timer to fire d from now, dropping a firing not yet
	// received.
	reset(d time.Duration)
	// stop disarms it, dropping a firing not yet received.
	stop()
	// fired receives when it fires.
	fired() <-chan time.Time
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) now() time.Time { return time.Now() }

func (realClock) timer() timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return realTimer{t}
}

type realTimer struct{ t *time.Timer }

// Since Go 1.23 Reset and Stop leave no stale firing in the channel.
func (t realTimer) reset(d time.Duration)   { t.t.Reset(d) }
func (t realTimer) stop()                   { t.t.Stop() }
func (t realTimer) fired() <-chan time.Time { return t.t.C }
