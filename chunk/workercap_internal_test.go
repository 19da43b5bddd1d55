package chunk

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
)

// The bucket's arithmetic, on made-up instants.
func TestBucketArithmetic(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const ms = time.Millisecond

	b := newBucket(0.25, t0)
	assert.Equal(t, capBurst, b.credit, "a new bucket is full")
	assert.Zero(t, b.wait(t0))

	// From a full bucket (2 ms), a 4 ms round earns 1 ms back while it runs:
	// 2 + 1 − 4 = −1 ms, paid back in 4 ms at a quarter.
	b.spend(at(0), at(4*ms))
	assert.Equal(t, -1*ms, b.credit)
	assert.Equal(t, 4*ms, b.wait(at(4*ms)))
	assert.Equal(t, 2*ms, b.wait(at(6*ms)), "half of it paid back")
	assert.Zero(t, b.wait(at(8*ms)))

	// From an empty bucket a 4 ms round leaves −3 ms: 12 ms to wait, so the
	// worker is busy 4 ms in every 16, a quarter.
	b.spend(at(8*ms), at(12*ms))
	assert.Equal(t, -3*ms, b.credit)
	assert.Equal(t, 12*ms, b.wait(at(12*ms)))
	assert.Equal(t, 1*ms, b.wait(at(23*ms)))
	assert.Zero(t, b.wait(at(24*ms)))

	// Credit never exceeds the burst, however long the worker rests.
	assert.Zero(t, b.wait(at(time.Hour)))
	assert.Equal(t, capBurst, b.credit)
	// A short round from a full bucket ends full again: it earns back at
	// most up to the burst.
	b.spend(at(time.Hour), at(time.Hour+100*time.Microsecond))
	assert.Equal(t, capBurst-75*time.Microsecond, b.credit)
	assert.Zero(t, b.wait(at(time.Hour+100*time.Microsecond)))
	b.accrue(at(2 * time.Hour))
	assert.Equal(t, capBurst, b.credit)

	// Time that runs backwards (it does not on the monotonic clock, but a
	// round measured as negative) earns and costs nothing.
	b.spend(at(2*time.Hour), at(2*time.Hour-ms))
	assert.Equal(t, capBurst, b.credit)

	// A share of 1 never waits for rounds back to back: each earns what it
	// spends.
	one := newBucket(1, t0)
	for i := range 100 {
		one.spend(at(time.Duration(i)*10*ms), at(time.Duration(i+1)*10*ms))
		assert.Zero(t, one.wait(at(time.Duration(i+1)*10*ms)))
	}
	// No cap: nothing is ever owed.
	none := newBucket(0, t0)
	none.spend(t0, at(time.Hour))
	assert.Zero(t, none.wait(at(time.Hour)))
}

// Over a long run of rounds of every length, the busy share stays within the
// cap plus the burst, and the worker is never held back while in credit.
func TestBucketHoldsTheShare(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, share := range []float64{0.01, 0.1, 0.25, 0.5} {
		b := newBucket(share, t0)
		now, busy := t0, time.Duration(0)
		for i := range 1000 {
			now = now.Add(b.wait(now))
			d := time.Duration(1+i%7) * 300 * time.Microsecond
			b.spend(now, now.Add(d))
			now, busy = now.Add(d), busy+d
			elapsed := now.Sub(t0)
			limit := time.Duration(share*float64(elapsed)) + capBurst + d
			require.LessOrEqual(t, busy, limit, "share %v after %d rounds", share, i+1)
		}
		// And it reaches the share: the waits are no longer than needed.
		got := float64(busy) / float64(now.Sub(t0))
		assert.InDelta(t, share, got, share*0.02, "share %v", share)
	}
}

// fakeClock is a clock whose time moves only when the test says. Its timers
// fire when the time passes their deadline, and every reset is reported on
// armed, so that a test knows when the worker is waiting, and for when.
type fakeClock struct {
	mu    sync.Mutex
	t     time.Time
	tms   []*fakeTimer
	armed chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Unix(1000, 0), armed: make(chan time.Time, 1000)}
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) timer() timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	ft := &fakeTimer{c: c, ch: make(chan time.Time, 1)}
	c.tms = append(c.tms, ft)
	return ft
}

// advance moves the time forward by d and fires the timers due.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	for _, ft := range c.tms {
		if ft.on && !ft.at.After(c.t) {
			ft.on = false
			ft.ch <- c.t
		}
	}
}

// advanceTo moves the time to at, if it is later.
func (c *fakeClock) advanceTo(at time.Time) {
	c.advance(max(0, at.Sub(c.now())))
}

// nextArm waits (on the real clock, at most 5 s) for the worker to arm its
// timer, and returns the deadline.
func (c *fakeClock) nextArm(t *testing.T) time.Time {
	t.Helper()
	select {
	case at := <-c.armed:
		return at
	case <-time.After(5 * time.Second):
		t.Fatal("the worker never waited")
		return time.Time{}
	}
}

type fakeTimer struct {
	c  *fakeClock
	ch chan time.Time
	on bool
	at time.Time
}

func (ft *fakeTimer) reset(d time.Duration) {
	ft.c.mu.Lock()
	select {
	case <-ft.ch:
	default:
	}
	ft.on, ft.at = true, ft.c.t.Add(d)
	at := ft.at
	ft.c.mu.Unlock()
	ft.c.armed <- at
}

func (ft *fakeTimer) stop() {
	ft.c.mu.Lock()
	defer ft.c.mu.Unlock()
	ft.on = false
	select {
	case <-ft.ch:
	default:
	}
}

func (ft *fakeTimer) fired() <-chan time.Time { return ft.ch }

// slowRefiller is a member whose refills take a set time on the fake clock,
// and which records when each started and ended. Each refill waits, before
// it returns, for the test to let it go (waitRefill).
type slowRefiller struct {
	c    *fakeClock
	p    *Pool
	took time.Duration
	mu   sync.Mutex
	runs [][2]time.Time
	done chan struct{} // a receive per refill
	gone chan struct{} // lets a refill return
}

func (r *slowRefiller) Reclaimable(Ticket) (int, bool)                             { return 0, false }
func (r *slowRefiller) Held() int                                                  { return 0 }
func (r *slowRefiller) Give(int, Ticket, func([]Mapped, []acl.Stream)) (int, bool) { return 0, false }
func (r *slowRefiller) Refill() {
	start := r.c.now()
	r.c.advance(r.took)
	r.mu.Lock()
	r.runs = append(r.runs, [2]time.Time{start, r.c.now()})
	r.mu.Unlock()
	r.done <- struct{}{}
	<-r.gone
}

func (r *slowRefiller) run(i int) [2]time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[i]
}

// waitRefill waits (on the real clock, at most 5 s) for the next refill,
// and lets it return. Meanwhile it drops a kick left in the worker's channel:
// a poke that found the worker not yet parked leaves one there, which would
// wake the worker once more after its round, and the tests count its waits.
func (r *slowRefiller) waitRefill(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		t.Fatal("no refill came")
	}
	select {
	case <-r.p.w.kick:
	default:
	}
	r.gone <- struct{}{}
}

// noRefill fails the test if a refill has started.
func (r *slowRefiller) noRefill(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
		r.gone <- struct{}{}
		t.Error("a refill ran before the worker was back in credit")
	default:
	}
}

// cappedPool returns a pool whose worker runs on a fake clock, capped at
// share, and a member whose refills take took of fake time.
func cappedPool(t *testing.T, share float64, took time.Duration) (*Pool, *fakeClock, *slowRefiller, *Member) {
	t.Helper()
	d, err := host.New(host.Config{Capacity: 16 << 20})
	require.NoError(t, err)
	p, err := New(d, Config{WorkerCPU: share})
	require.NoError(t, err)
	c := newFakeClock()
	p.clk = c // before the worker starts (Join)
	r := &slowRefiller{c: c, p: p, took: took, done: make(chan struct{}, 100), gone: make(chan struct{})}
	m, err := p.lend().Join(r, true)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, p.Close())
		assert.True(t, d.Live().Zero(), "leaked: %+v", d.Live())
		assert.NoError(t, d.Close())
	})
	return p, c, r, m
}

// With WorkerCPU 0.25, after a round of 4 ms from an empty bucket the worker
// starts no round for 12 ms of the clock, though it is asked at once; its
// polls stretch to that moment, and the wait is counted.
func TestWorkerCapHoldsRoundsBack(t *testing.T) {
	const ms = time.Millisecond
	p, c, r, m := cappedPool(t, 0.25, 4*ms)

	// Round 1, from a full bucket (2 ms): 2 + 1 − 4 = −1 ms, 4 ms to wait.
	m.WantRefill()
	r.waitRefill(t)
	end1 := r.run(0)[1]
	at := c.nextArm(t)
	assert.Equal(t, end1.Add(4*ms), at, "the next poll waits for credit")
	m.WantRefill() // asked again while the worker is throttled (and polling: no kick)
	c.advance(4*ms - time.Nanosecond)
	c.advance(time.Nanosecond)

	// Round 2, from an empty bucket: −3 ms, 12 ms to wait.
	r.waitRefill(t)
	run2 := r.run(1)
	assert.Equal(t, at, run2[0], "served when credit returned, not before")
	m.WantRefill() // during the round: polling, so no kick either
	at = c.nextArm(t)
	assert.Equal(t, run2[1].Add(12*ms), at)
	c.advance(12*ms - time.Nanosecond)
	r.noRefill(t)
	c.advance(time.Nanosecond)
	r.waitRefill(t)
	assert.Equal(t, at, r.run(2)[0])
	c.nextArm(t) // the round is over and counted

	s := p.Stats()
	assert.Equal(t, int64(12*ms)+int64(4*ms)-int64(idlePollMin)*2, s.WorkerThrottledNS,
		"held back beyond each 250 µs poll: 3.75 ms, then 11.75 ms")
	assert.Equal(t, int64(12*ms), s.WorkerNS)
	assert.Equal(t, int64(3), s.WorkerSpins)
}

// A kick that wakes the worker while it is overspent is served when credit
// returns, not before; the worker does not lose it.
func TestWorkerCapKickServedAfter(t *testing.T) {
	const ms = time.Millisecond
	p, c, r, m := cappedPool(t, 0.25, 10*ms)
	m.WantRefill()
	r.waitRefill(t)
	end := r.run(0)[1]
	// 2 + 2.5 − 10 = −5.5 ms: 22 ms to wait.
	due := end.Add(22 * ms)
	require.Equal(t, due, c.nextArm(t))

	// The worker polls, so a poke only raises the flag; a kick (as one sent
	// just before the worker started polling) wakes it early.
	m.WantRefill()
	p.w.kick <- struct{}{}
	assert.Equal(t, due, c.nextArm(t), "woken by the kick, it waits for the same moment")
	c.advance(21 * ms)
	r.noRefill(t)
	c.advanceTo(due)
	r.waitRefill(t)
	assert.Equal(t, due, r.run(1)[0])
}

// Close returns while the worker waits for credit, and a Settle waiting for
// that round is answered.
func TestWorkerCapCloseWhileThrottled(t *testing.T) {
	p, c, r, m := cappedPool(t, 0.01, time.Second) // 1 s of work: 99 s to wait
	m.WantRefill()
	r.waitRefill(t)
	c.nextArm(t)
	settled := make(chan struct{})
	go func() { p.lend().Settle(); close(settled) }()
	c.nextArm(t) // the Settle woke it; it waits again
	assert.Equal(t, int64(1), p.Stats().WorkerSpins, "no round for the Settle while overspent")
	closed := make(chan error)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		assert.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return while the worker was throttled")
	}
	select {
	case <-settled:
	case <-time.After(5 * time.Second):
		t.Fatal("Settle was not answered when the pool closed")
	}
}

// A Settle that comes while the worker waits for credit is answered after
// the round that follows.
func TestWorkerCapSettleWaitsForCredit(t *testing.T) {
	const ms = time.Millisecond
	p, c, r, m := cappedPool(t, 0.25, 10*ms)
	m.WantRefill()
	r.waitRefill(t)
	due := r.run(0)[1].Add(22 * ms)
	require.Equal(t, due, c.nextArm(t))
	m.WantRefill()
	settled := make(chan struct{})
	go func() { p.lend().Settle(); close(settled) }()
	require.Equal(t, due, c.nextArm(t), "the Settle woke it; it waits for the same moment")
	assert.Equal(t, int64(1), p.Stats().WorkerSpins, "no round for the Settle while overspent")
	c.advanceTo(due)
	r.waitRefill(t)
	select {
	case <-settled:
	case <-time.After(5 * time.Second):
		t.Fatal("Settle was not answered after the round")
	}
}

// An uncapped worker polls after a round it was asked for while the asks
// come at most idlePollMax apart; once two asks came further apart it parks
// after each round (the next ask wakes it), and asks closer together bring
// the polls back.
func TestWorkerParksBetweenSparseAsks(t *testing.T) {
	const ms = time.Millisecond
	_, c, r, m := cappedPool(t, 0, 0) // no cap
	m.WantRefill()
	r.waitRefill(t)
	start := c.now()
	assert.Equal(t, start.Add(idlePollMin), c.nextArm(t), "asked once: it polls")
	c.advance(4 * ms) // the poll finds nothing asked, and polls again later
	assert.Equal(t, start.Add(4*ms+2*idlePollMin), c.nextArm(t))
	m.WantRefill() // polling: no kick
	c.advance(2 * idlePollMin)
	// At 4.5 ms, inside the round that finds the asks 4.5 ms apart and so
	// parks after it: an ask made now finds the worker still polling and
	// only raises the flag, which the worker looks at before it parks.
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		t.Fatal("no refill came")
	}
	m.WantRefill()
	select {
	case <-r.p.w.kick:
		t.Fatal("the ask inside the round kicked: the worker was not polling")
	default:
	}
	r.gone <- struct{}{}
	r.waitRefill(t) // served before parking, with no kick and no poll
	select {
	case at := <-c.armed:
		t.Fatalf("asks 4.5 ms apart: the worker polls again at %v instead of parking", at.Sub(start))
	case <-time.After(100 * ms):
	}
	c.advance(ms)
	m.WantRefill() // parked: a kick
	r.waitRefill(t)
	assert.Equal(t, c.now().Add(idlePollMin), c.nextArm(t), "asks 1 ms apart: it polls again")
}
