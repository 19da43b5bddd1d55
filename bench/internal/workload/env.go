// Package workload holds the memory patterns of inference that the suite
// replays on every strategy: KV-cache decode under continuous batching,
// per-step activation scratch with spikes, and tenants churning under one
// budget. A workload is a deterministic function of its configuration (and
// seed): every strategy sees exactly the same calls.
package workload

import (
	"bytes"
	"fmt"
	"time"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/bench/internal/counting"
	"github.com/vmarena/vmarena/bench/internal/strategy"
	"github.com/vmarena/vmarena/chunk"
)

// Workload is one memory pattern.
type Workload interface {
	// Name is a short identifier: "kv", "scratch", "churn".
	Name() string
	// Describe says in one line what the configuration does.
	Describe() string
	// Budget is the physical memory budget the workload runs under, 0 for
	// none; gran is the driver's granularity.
	Budget(gran int64) int64
	// Run replays the workload on env's strategy.
	Run(env *Env) error
}

// GrowEvent is one Grow that called the driver.
type GrowEvent struct {
	NS        int64 // wall time of the Grow
	DriverNS  int64 // time inside driver calls during it
	WrapperNS int64 // the counting wrapper's own bookkeeping during it (neither the strategy's nor the driver's)
	Calls     int64 // driver calls it made
}

// Sample is the memory at the end of one step.
type Sample struct {
	Step     int
	Live     int64 // bytes of live tensors (the workload's own count)
	Physical int64 // physical bytes held
	Mapped   int64 // bytes mapped
	// Held but free to take, within Physical: the arena pool's cache, and
	// what arenas keep mapped above what they use and promised (a pool under
	// pressure reclaims it). Physical − Cached − Reclaimable is what the
	// strategy cannot give up: its committed memory.
	Cached, Reclaimable int64
}

// Committed is the physical memory the strategy cannot give up on demand.
func (s Sample) Committed() int64 { return s.Physical - s.Cached - s.Reclaimable }

// CommittedMapped is the mapped memory the strategy cannot give up.
func (s Sample) CommittedMapped() int64 { return s.Mapped - s.Reclaimable }

// Result is what one run of a workload on a strategy measured.
type Result struct {
	Workload    string
	Strategy    string
	Rep         int
	WallNS      int64 // the whole run: opening, steps, closing
	MemNS       int64 // inside the strategy's calls during the steps: the caller's critical path
	SetupNS     int64 // opening and closing the regions (once per server, not per request)
	Steps       int
	GrowCalls   int64       // calls of Grow
	Grows       []GrowEvent // the Grows that called the driver
	Denied      int64       // Grows refused for lack of memory (budgeted workloads)
	FailedTrims int64       // Trims refused for lack of memory (budgeted workloads)
	Demand      int64       // bytes × steps asked for (budgeted workloads)
	Served      int64       // bytes × steps held (budgeted workloads)
	Regions     int
	Calls       counting.Calls
	Mem         counting.Memory // peaks over the run; the rest at the end
	Final       Sample          // before the regions closed
	PeakLive    int64
	Samples     []Sample
	Pool        *chunk.Stats // the arena's pool, before it closed
	// Registered and Deregistered count the modelled library's calls
	// (strategy.Config.Register): registrations (ncclCommRegister,
	// HcclCommActivateCommMemory) and their undoing, over the whole run.
	Registered, Deregistered int64
	Err                      string

	// The caller's critical path, step by step (KV decode): the time the
	// step's decode work (one token per sequence, and the block grows) spent
	// inside the strategy's calls, the driver calls made in the step's
	// strategy calls, prefills included (those the caller made, with
	// PathExact; otherwise an upper bound: a background call that overlaps
	// counts too), and the tokens generated. Steps before SteadyFrom are
	// warm-up.
	StepNS, StepCalls, StepTokens []int64
	SteadyFrom                    int
	// StepAllNS is each step's whole time inside the strategy's calls:
	// prefills, decode, releases and prefetches (KV).
	StepAllNS []int64
	// The step compute's kernel launches (KV on a driver that launches):
	// their number, their total time, and the part of it they waited for
	// the strategy's driver calls on other threads (counted by the device
	// model under its pessimistic reading; 0 otherwise).
	Launches, LaunchNS, LaunchWaitNS int64
	// The path time by kind of call: Grow, Truncate and Idle (a sequence's
	// release), Trim, and Prefetch; Alloc is the rest of MemNS.
	GrowNS, ReleaseNS, TrimNS, PrefetchNS int64
	Tokens                                int64          // tokens generated (KV)
	Preempted                             int64          // sequences preempted for want of memory and served again (KV)
	WindowCalls                           counting.Calls // driver calls inside the workload's strategy calls: the caller's (PathExact), or every thread's
	BesideCalls                           counting.Calls // driver calls other threads made meanwhile (PathExact)
	PathExact                             bool           // the caller's calls were told apart by thread (counting.Driver.ByThread)
	CPUNS                                 int64          // process CPU time (user + system) during the run: every goroutine's

	// What a user of the server feels (KV): the first token, from
	// Env.Start (the process's start, in a fresh run: setup included), to
	// the end of the first step, whose prefills sample the first tokens;
	// the serving time, from the first step's start to the last's end;
	// the setup before serving (Prepare and the opening of the regions);
	// the device compute the steps waited for; and the time between a
	// sequence's tokens (a preempted sequence's gap included): how many,
	// p50, p99 and the most.
	FirstTokenNS, ServeNS, OpenNS, ComputeNS int64
	// Loaded says the model's weights were loaded before serving (KV.Load),
	// in LoadNS (part of the setup).
	Loaded bool
	LoadNS int64
	// SkewNS is what the device waits took beyond their modelled length
	// (the host descheduled mid-wait): the serving times leave it out, and
	// WallNS − SkewNS is the run with every wait as long as modelled.
	SkewNS                       int64
	TBTs                         int
	TBTP50NS, TBTP99NS, TBTMaxNS int64
	// Several models (Models): the time from a request's arrival to its
	// first token (how many, p50, p99), the requests finished, the models'
	// sleeps and wakes and the path time they took (a wake's copy of the
	// weights included).
	TTFTs                   int
	TTFTP50NS, TTFTP99NS    int64
	Finished, Sleeps, Wakes int64
	SleepNS                 int64
}

// SteadyTokens returns the tokens generated from SteadyFrom on.
func (r *Result) SteadyTokens() int64 {
	var n int64
	if r.SteadyFrom < 0 {
		return 0
	}
	for i := r.SteadyFrom; i < len(r.StepTokens); i++ {
		n += r.StepTokens[i]
	}
	return n
}

// Env is what a workload runs against, and where it records.
type Env struct {
	// Start is when the program started (the suite sets it in a fresh
	// process; NewEnv sets the moment it is called): the first token is
	// timed from it.
	Start    time.Time
	Drv      *counting.Driver
	S        strategy.Strategy
	Touch    bool            // write every tensor's bytes, as kernels would
	Verify   bool            // read some back after growth, and compare
	Progress func(f float64) // called now and then with the fraction done
	Res      *Result

	src     []byte
	checked int
	skew    time.Duration // the device waits' time beyond their modelled length (stepCompute.wait)
	live    int64         // bytes of live tensors now
	regions map[strategy.Region]bool
	parts   map[strategy.Strategy]bool // the strategies regions were opened in besides S (strategy.Split's parts)
}

const touchChunk = 4 << 20

// NewEnv returns an environment recording into a fresh Result.
func NewEnv(drv *counting.Driver, s strategy.Strategy, workload string) *Env {
	return &Env{Start: time.Now(), Drv: drv, S: s, Res: &Result{Workload: workload, Strategy: s.Name()}}
}

// start and stop bracket a strategy call: the caller's critical path.
func (e *Env) start() time.Time {
	e.Drv.Window(true)
	return time.Now()
}

func (e *Env) stop(t time.Time) {
	e.Res.MemNS += int64(time.Since(t))
	e.Drv.Window(false)
}

// setup times a region's opening or closing, kept apart from the steps:
// its driver calls are not on the caller's path (no Window).
func (e *Env) setup(t time.Time) {
	e.Res.SetupNS += int64(time.Since(t))
}

// Prepare runs the strategy's start-up work (Strategy.Prepare), timed as
// setup. The suite calls it before the workload runs.
func (e *Env) Prepare() error {
	defer e.setup(time.Now())
	return e.S.Prepare()
}

func (e *Env) open(max int64) (strategy.Region, error) { return e.openIn(e.S, max) }

// openIn opens a region of strategy s (one model's, where the workload
// splits the device's strategy), timed as setup.
func (e *Env) openIn(s strategy.Strategy, max int64) (strategy.Region, error) {
	defer e.setup(time.Now())
	r, err := s.Open(max)
	if err == nil {
		e.Res.Regions++
		if e.regions == nil {
			e.regions = make(map[strategy.Region]bool)
		}
		e.regions[r] = true
		if s != e.S {
			if e.parts == nil {
				e.parts = make(map[strategy.Strategy]bool)
			}
			e.parts[s] = true
		}
	}
	return r, err
}

func (e *Env) close(r strategy.Region) error {
	defer e.setup(time.Now())
	delete(e.regions, r)
	return r.Close()
}

// grow calls r.Grow(n) and records it when it reached the driver.
func (e *Env) grow(r strategy.Region, n int64) error {
	c0, d0, s0 := e.Drv.CallCount(), e.Drv.DriverNS(), e.Drv.SelfNS()
	t := e.start()
	err := r.Grow(n)
	ns := int64(time.Since(t))
	e.Drv.Window(false)
	e.Res.MemNS += ns
	e.Res.GrowNS += ns
	e.Res.GrowCalls++
	if c := e.Drv.CallCount() - c0; c > 0 && err == nil {
		e.Res.Grows = append(e.Res.Grows, GrowEvent{NS: ns, DriverNS: e.Drv.DriverNS() - d0,
			WrapperNS: e.Drv.SelfNS() - s0, Calls: c})
	}
	return err
}

func (e *Env) truncate(r strategy.Region, n int64) error {
	defer e.stopAs(&e.Res.ReleaseNS, e.start())
	return r.Truncate(n)
}

func (e *Env) trim(r strategy.Region) error {
	defer e.stopAs(&e.Res.TrimNS, e.start())
	return r.Trim()
}

func (e *Env) idle(r strategy.Region) error {
	defer e.stopAs(&e.Res.ReleaseNS, e.start())
	return r.Idle()
}

// prefetch calls p.Prefetch(n) on the caller's path.
func (e *Env) prefetch(p strategy.Prefetcher, n int64) error {
	defer e.stopAs(&e.Res.PrefetchNS, e.start())
	return p.Prefetch(n)
}

// keep calls k.Keep(n) on the caller's path, timed as a release.
func (e *Env) keep(k strategy.Keeper, n int64) error {
	defer e.stopAs(&e.Res.ReleaseNS, e.start())
	return k.Keep(n)
}

// stopAs is stop, also adding the call's time to *kind.
func (e *Env) stopAs(kind *int64, t time.Time) {
	ns := int64(time.Since(t))
	e.Res.MemNS += ns
	*kind += ns
	e.Drv.Window(false)
}

// touch writes the logical range [off, off+n) of r, as a kernel producing
// the tensor would, when Env.Touch is set.
func (e *Env) touch(r strategy.Region, off, n int64) error {
	if !e.Touch {
		return nil
	}
	if e.src == nil {
		e.src = make([]byte, touchChunk)
		for i := range e.src {
			e.src[i] = byte(i*7 + 3)
		}
	}
	for n > 0 {
		k := min(n, touchChunk)
		if err := e.write(r, off, e.src[:k]); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// write copies src to the logical offset off of r, as the workload's kernel
// would: into an arena through arena.CopyIn, which first waits for clears
// the arena queued on its stream (a kernel on that stream would run after
// them), elsewhere with the driver's copy.
func (e *Env) write(r strategy.Region, off int64, src []byte) error {
	if a := strategy.Arena(r); a != nil {
		b, err := a.Slice(int(off), int(off)+len(src))
		if err != nil {
			return err
		}
		return arena.CopyIn(b, src)
	}
	p, err := r.Ptr(off, int64(len(src)))
	if err != nil {
		return err
	}
	return e.Drv.MemcpyHtoD(p, src)
}

// verify reads back [off, off+n) of r (at most one touch chunk), written by
// touch, and compares.
func (e *Env) verify(r strategy.Region, off, n int64) error {
	if !e.Verify || !e.Touch {
		return nil
	}
	n = min(n, touchChunk)
	p, err := r.Ptr(off, n)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	got := make([]byte, n)
	if err := e.Drv.MemcpyDtoH(got, p); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if !bytes.Equal(got, e.src[:n]) {
		return fmt.Errorf("verify: %s lost the data of [%d, +%d)", e.S.Name(), off, n)
	}
	e.checked++
	return nil
}

// skewBy adds d (when positive) to the time the device waits took beyond
// their modelled length.
func (e *Env) skewBy(d time.Duration) {
	if d > 0 {
		e.skew += d
		e.Res.SkewNS += int64(d)
	}
}

// Checked returns how many ranges verify compared.
func (e *Env) Checked() int { return e.checked }

// addLive counts d more bytes of live tensors (fewer when negative).
func (e *Env) addLive(d int64) {
	e.live += d
	e.Res.PeakLive = max(e.Res.PeakLive, e.live)
}

// sample records the memory at the end of a step.
func (e *Env) sample(step int) {
	m := e.Drv.Memory()
	cached, reclaimable := e.idleMemory()
	e.Res.Samples = append(e.Res.Samples, Sample{Step: step, Live: e.live, Physical: m.Physical, Mapped: m.Mapped,
		Cached: cached, Reclaimable: reclaimable})
	e.Res.Steps = step + 1
}

// idleMemory returns the memory held but free to take: the arena pool's
// cache, and what the arenas keep mapped above what they use and promised.
func (e *Env) idleMemory() (cached, reclaimable int64) {
	p := strategy.Pool(e.S)
	if p == nil {
		cached = strategy.Cached(e.S)
		for s := range e.parts {
			cached += strategy.Cached(s)
		}
		return cached, 0
	}
	cached = p.Stats().CachedBytes
	for r := range e.regions {
		if a := strategy.Arena(r); a != nil {
			reclaimable += int64(a.Stats().Reclaimable)
		}
	}
	return cached, reclaimable
}

// final records the memory at the end of the run, before the regions close.
func (e *Env) final() {
	m := e.Drv.Memory()
	cached, reclaimable := e.idleMemory()
	e.Res.Final = Sample{Step: e.Res.Steps, Live: e.live, Physical: m.Physical, Mapped: m.Mapped,
		Cached: cached, Reclaimable: reclaimable}
}

func (e *Env) progress(f float64) {
	if e.Progress != nil {
		e.Progress(f)
	}
}

func alignUp(n, a int64) int64 { return (n + a - 1) &^ (a - 1) }

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
