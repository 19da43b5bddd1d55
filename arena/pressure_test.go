package arena_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
	"github.com/vmarena/vmarena/internal/skip"
)

// The pressure protocol's promises, tested by forcing interleavings: a test
// stops one growth at a chosen point of its path (each lock it takes, each
// step of the relief and of the wait), runs the others there, then lets it
// go, for every point in turn. See docs/design.md, "Pressure".

// newStream makes a stream on d, destroyed at the end of the test.
func newStream(t *testing.T, d interface {
	CreateStream() (acl.Stream, error)
	DestroyStream(acl.Stream) error
}) acl.Stream {
	t.Helper()
	s, err := d.CreateStream()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.DestroyStream(s)) })
	return s
}

// A gate stops the goroutine that reaches point at, for who, the nth time.
type gate struct {
	at   sched.Point
	who  any
	nth  int
	seen int
	hit  chan struct{} // closed when a goroutine stopped at the gate
	open chan struct{} // closed to let it go
}

func (g *gate) String() string { return fmt.Sprintf("%s#%d", g.at, g.nth) }

// gates is the hook the tests install: every armed gate stops the nth
// passage of its point.
type gates struct {
	mu   sync.Mutex
	list []*gate
}

func newGates(t *testing.T) *gates {
	gs := &gates{}
	t.Cleanup(sched.Set(gs.pass))
	t.Cleanup(gs.reset) // first: a failed test lets its stopped growths go
	return gs
}

func (gs *gates) arm(at sched.Point, who any, nth int) *gate {
	g := &gate{at: at, who: who, nth: nth, hit: make(chan struct{}), open: make(chan struct{})}
	gs.mu.Lock()
	gs.list = append(gs.list, g)
	gs.mu.Unlock()
	return g
}

func (gs *gates) reset() {
	gs.mu.Lock()
	for _, g := range gs.list {
		select {
		case <-g.open:
		default:
			close(g.open)
		}
	}
	gs.list = nil
	gs.mu.Unlock()
}

func (gs *gates) pass(p sched.Point, who any) {
	gs.mu.Lock()
	var stop *gate
	for _, g := range gs.list {
		if g.at == p && g.who == who && g.seen < g.nth {
			g.seen++
			if g.seen == g.nth {
				stop = g
			}
		}
	}
	gs.mu.Unlock()
	if stop != nil {
		close(stop.hit)
		<-stop.open
	}
}

// contest is a pool and arenas that have each grown and then dropped
// everything: every arena holds its chunks mapped and idle.
type contest struct {
	pool   *chunk.Pool
	arenas []*arena.Arena
}

func newContest(t *testing.T, budget, idle int, n int) *contest {
	t.Helper()
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: int64(budget * wg)})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	c := &contest{pool: pool}
	for range n {
		a := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
		require.NoError(t, a.Grow(idle*wg))
		require.NoError(t, a.Reset())
		c.arenas = append(c.arenas, a)
	}
	return c
}

// candidates are the points at which a test stops the growth of x, whose
// relief may take from y: x's own points, the pool's, and y's lock taken
// by x's relief.
func candidates(c *contest, x, y *arena.Arena) []*gate {
	var out []*gate
	for nth := 1; nth <= 2; nth++ {
		for _, p := range []sched.Point{sched.GrowLocked, sched.GrowTaken, sched.GrowUnlocked, sched.GrowRelocked, sched.GrowFailed} {
			out = append(out, &gate{at: p, who: x, nth: nth})
		}
		for _, p := range []sched.Point{sched.ReliefBegin, sched.ReliefSelect, sched.ReliefWaited, sched.ReliefDone, sched.ReleaseQueued} {
			out = append(out, &gate{at: p, who: c.pool, nth: nth})
		}
		out = append(out, &gate{at: sched.GiveLocked, who: y, nth: nth})
	}
	return out
}

type outcome struct {
	who int
	err error
}

// run starts grow(i) for each i in order, stopping each but the last at
// its gate (if it reaches it), runs the last to its end (or until it blocks
// for 200 ms behind a stopped one), then lets the stopped ones go, last
// stopped first. It returns every growth's error, and which gates were
// reached.
func run(t *testing.T, gs *gates, stops []*gate, grow func(i int) error) (errs []error, reached []bool) {
	t.Helper()
	n := len(stops) + 1
	done := make(chan outcome, n)
	errs, reached = make([]error, n), make([]bool, len(stops))
	finished := make([]bool, n)
	collect := func(r outcome) { errs[r.who], finished[r.who] = r.err, true }
	for i := range n {
		var g *gate
		if i < len(stops) {
			g = gs.arm(stops[i].at, stops[i].who, stops[i].nth)
		}
		go func() { done <- outcome{i, grow(i)} }()
		if g == nil {
			break
		}
		// The first growth runs alone, so it reaches its gate or ends; a
		// later one may block behind a stopped one instead, and then the
		// next starts anyway.
		patience := 10 * time.Second
		if i > 0 {
			patience = 200 * time.Millisecond
		}
		timeout := time.After(patience)
	wait:
		for {
			select {
			case <-g.hit:
				reached[i] = true
				break wait
			case r := <-done:
				collect(r)
				if r.who == i {
					break wait // ended before its gate
				}
			case <-timeout:
				if i == 0 {
					t.Fatalf("growth %d neither ended nor reached %v", i, g)
				}
				break wait
			}
		}
	}
	// Run the last growth to its end, unless it blocks behind a stopped one.
	last := time.After(200 * time.Millisecond)
	for !finished[n-1] {
		select {
		case r := <-done:
			collect(r)
			continue
		case <-last:
		}
		break
	}
	gs.reset() // lets every stopped growth go
	deadline := time.After(20 * time.Second)
	for slices.Contains(finished, false) {
		select {
		case r := <-done:
			collect(r)
		case <-deadline:
			t.Fatalf("growths stuck after their gates opened: finished %v", finished)
		}
	}
	return errs, reached
}

// checkPool asserts that the pool and the arenas agree, and that no growth
// is left protected or waiting: what the arenas do not use is reclaimable.
func checkPool(t *testing.T, c *contest) {
	t.Helper()
	s := c.pool.Stats()
	mapped := 0
	for _, a := range c.arenas {
		st := a.Stats()
		mapped += st.Mapped
		assert.Equal(t, st.Mapped-max(st.Used, 0), st.Reclaimable+promised(a), "arena protects nothing after its growths")
	}
	assert.Zero(t, c.pool.Lender().Waiters())
	assert.LessOrEqual(t, s.HeldBytes, s.Budget)
	assert.Equal(t, mapped/wg+s.Pending, s.InUse, "every chunk out of the pool is mapped in an arena or waits for the device")
}

// promised is the part of an arena's Cap above Len that a Grow promised.
func promised(a *arena.Arena) int {
	st := a.Stats()
	return st.Mapped - st.Used - st.Reclaimable
}

// Two growths that cannot both fit, each needing the other's idle memory:
// whatever the interleaving, exactly one succeeds; the other fails with
// ErrOutOfMemory and leaves nothing pinned, so that it succeeds once the
// winner drops its memory. Two that can both fit both succeed.
func TestPressureTwoGrowthsEverySchedule(t *testing.T) {
	gs := newGates(t)
	for _, tc := range []struct {
		name           string
		budget, arenas int
		served         int
	}{
		{"one fits", 4, 2, 1}, // each needs the other's idle chunks
		{"both fit", 6, 3, 2}, // a third arena's idle chunks serve both
	} {
		t.Run(tc.name, func(t *testing.T) {
			probe := newContest(t, tc.budget, 2, tc.arenas)
			stops := candidates(probe, probe.arenas[0], probe.arenas[1])
			reachedAny := 0
			for k := range stops {
				t.Run(stops[k].String(), func(t *testing.T) {
					c := newContest(t, tc.budget, 2, tc.arenas)
					g := *candidates(c, c.arenas[0], c.arenas[1])[k]
					errs, reached := run(t, gs, []*gate{&g}, func(i int) error { return c.arenas[i].Grow(3 * wg) })
					if reached[0] {
						reachedAny++
					}
					ok := 0
					for i, err := range errs {
						if err == nil {
							ok++
							assert.GreaterOrEqual(t, c.arenas[i].Cap(), 3*wg)
							continue
						}
						assert.ErrorIs(t, err, arena.ErrOutOfMemory)
					}
					assert.Equal(t, tc.served, ok, "served: %v", errs)
					checkPool(t, c)
					// Nothing stays pinned: once the winners give their
					// memory back, a loser is served.
					for i, err := range errs {
						if err == nil {
							require.NoError(t, c.arenas[i].Shrink())
						}
					}
					for i, err := range errs {
						if err != nil {
							require.NoError(t, c.arenas[i].Grow(3*wg), "loser %d after the winner shrank", i)
						}
					}
				})
			}
			t.Logf("%d of %d gates reached", reachedAny, len(stops))
			assert.GreaterOrEqual(t, reachedAny, 9, "the gates are on the path")
		})
	}
}

// The same contest with GrowContext: the loser waits instead of failing,
// and is served as soon as the winner drops its memory, whatever the
// interleaving.
func TestPressureTwoWaitersEverySchedule(t *testing.T) {
	gs := newGates(t)
	probe := newContest(t, 4, 2, 2)
	stops := candidates(probe, probe.arenas[0], probe.arenas[1])
	for _, p := range []sched.Point{sched.WaitEnqueued, sched.WaitWoken, sched.WaitServed} {
		stops = append(stops, &gate{at: p, who: probe.pool, nth: 1})
	}
	stops[len(stops)-1].who = probe.arenas[0] // WaitServed names the arena
	for k := range stops {
		t.Run(stops[k].String(), func(t *testing.T) {
			c := newContest(t, 4, 2, 2)
			all := candidates(c, c.arenas[0], c.arenas[1])
			for _, p := range []sched.Point{sched.WaitEnqueued, sched.WaitWoken, sched.WaitServed} {
				all = append(all, &gate{at: p, who: c.pool, nth: 1})
			}
			all[len(all)-1].who = c.arenas[0]
			g := *all[k]
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Each drops its memory as soon as it has it; the other, waiting,
			// must then be served before the deadline.
			errs, _ := run(t, gs, []*gate{&g}, func(i int) error {
				if err := c.arenas[i].GrowContext(ctx, 3*wg); err != nil {
					return err
				}
				return c.arenas[i].Shrink()
			})
			for i, err := range errs {
				assert.NoError(t, err, "growth %d", i)
			}
			checkPool(t, c)
		})
	}
}

// Three growths, each stopped in turn at every pair of points: of three
// that each need three of six chunks, two are served and the third fails;
// nothing is left pinned.
func TestPressureThreeGrowthsEverySchedule(t *testing.T) {
	skip.IfShort(t, "long: every pair of points")
	gs := newGates(t)
	probe := newContest(t, 6, 2, 3)
	first := candidates(probe, probe.arenas[0], probe.arenas[1])
	second := candidates(probe, probe.arenas[1], probe.arenas[2])
	schedules := 0
	for i := range first {
		if first[i].nth != 1 {
			continue
		}
		for j := range second {
			if second[j].nth != 1 {
				continue
			}
			c := newContest(t, 6, 2, 3)
			g1 := *candidates(c, c.arenas[0], c.arenas[1])[i]
			g2 := *candidates(c, c.arenas[1], c.arenas[2])[j]
			if g1.at == g2.at && g1.who == g2.who {
				continue // one gate stops one growth
			}
			errs, _ := run(t, gs, []*gate{&g1, &g2}, func(k int) error { return c.arenas[k].Grow(3 * wg) })
			ok := 0
			for _, err := range errs {
				if err == nil {
					ok++
				} else {
					assert.ErrorIs(t, err, arena.ErrOutOfMemory)
				}
			}
			assert.Equal(t, 2, ok, "stops %v, %v: %v", &g1, &g2, errs)
			checkPool(t, c)
			schedules++
		}
	}
	t.Logf("%d schedules", schedules)
}

// A relief waits for the device work on the streams of the chunks it takes,
// never for work on other streams: a kernel that runs on another arena's
// stream, over chunks that arena gave back, does not delay a growth that
// the idle memory of a quiet arena can serve.
func TestReliefWaitsOnlyForItsChunks(t *testing.T) {
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 4 * wg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	busy, quiet := newStream(t, d), newStream(t, d)
	b := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20, Streams: []acl.Stream{busy}})
	q := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20, Streams: []acl.Stream{quiet}})
	// b gives back two chunks while a kernel still reads them.
	buf, err := b.Alloc(2*wg, 1)
	require.NoError(t, err)
	kernel := make(chan struct{})
	finish := sync.OnceFunc(func() { close(kernel) })
	defer finish()
	require.NoError(t, d.Launch(busy, buf.Ptr(), 2*wg, kernel))
	require.NoError(t, b.Reset())
	require.NoError(t, b.Shrink()) // two chunks wait for the kernel
	// q holds two idle chunks, its stream quiet.
	require.NoError(t, q.Grow(2*wg))
	require.NoError(t, q.Reset())

	g := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	done := make(chan error, 1)
	go func() { done <- g.Grow(2 * wg) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the growth waited for a kernel on a stream that does not touch the chunks it took")
	}
	assert.Equal(t, 0, q.Cap(), "the quiet arena's idle chunks served it")
	assert.Equal(t, 2, pool.Stats().Pending, "the kernel's chunks still wait")
	assert.Zero(t, pool.Stats().DeviceSyncs)
	finish()
}

// A growth that fails wakes the first waiter: what it protected (the idle
// chunks of its arena) may serve the waiter now. Here nothing else happens
// that could wake it.
func TestFailedGrowthWakesTheWaiter(t *testing.T) {
	gs := newGates(t)
	c := newContest(t, 4, 2, 1)
	y := c.arenas[0] // two idle chunks
	z := isoArena(t, arena.Config{Pool: c.pool, Reserve: 16 << 20})
	_, err := z.Alloc(2*wg, 1) // two chunks in use
	require.NoError(t, err)
	x := isoArena(t, arena.Config{Pool: c.pool, Reserve: 16 << 20})

	// y tries to grow to the whole budget, and stops once its relief has
	// chosen for it: its idle chunks are protected.
	stop := gs.arm(sched.ReliefSelect, c.pool, 1)
	yerr := make(chan error, 1)
	go func() { yerr <- y.Grow(4 * wg) }()
	<-stop.hit
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	xerr := make(chan error, 1)
	go func() { xerr <- x.GrowContext(ctx, 2*wg) }() // finds y's chunks protected: waits
	require.Eventually(t, func() bool { return c.pool.Lender().Waiters() == 1 }, 5*time.Second, 100*time.Microsecond)
	gs.reset()
	assert.ErrorIs(t, <-yerr, arena.ErrOutOfMemory) // z's chunks are in use
	require.NoError(t, <-xerr, "y's failure made its idle chunks reclaimable, and woke x")
	assert.Equal(t, 2*wg, x.Cap())
	assert.Zero(t, y.Cap())
}

// Grow's lock-free path raises its promise before it looks again; when it
// then finds that a relief took the memory meanwhile, it undoes the promise,
// so nothing stays pinned by a growth that did not happen there.
func TestLockFreeGrowUndoesItsPromise(t *testing.T) {
	gs := newGates(t)
	c := newContest(t, 4, 3, 1) // x holds three idle chunks; one more is free
	x := c.arenas[0]
	y := isoArena(t, arena.Config{Pool: c.pool, Reserve: 16 << 20})
	stop := gs.arm(sched.GrowFastPath, x, 1)
	xerr := make(chan error, 1)
	go func() { xerr <- x.Grow(3 * wg) }() // mapped already: the lock-free path
	<-stop.hit
	require.NoError(t, y.Grow(2*wg)) // the free chunk, and one of x's
	require.Equal(t, 2*wg, x.Cap())
	gs.reset()
	assert.ErrorIs(t, <-xerr, arena.ErrOutOfMemory, "x's slow path finds no room")
	assert.Equal(t, 2*wg, x.Stats().Reclaimable, "x's two chunks are not pinned by the promise it undid")
}

// Copies that race Close either complete or fail with ErrClosed, never with
// a driver error about memory that Close unmapped under them.
func TestCopiesRaceClose(t *testing.T) {
	for round := range 20 {
		d := isoDriver(t, 64<<20)
		a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20})
		require.NoError(t, err)
		b, err := a.Alloc(4<<10, 64)
		require.NoError(t, err)
		var wgr sync.WaitGroup
		start := make(chan struct{})
		for i := range 8 {
			wgr.Add(1)
			go func() {
				defer wgr.Done()
				src := make([]byte, 4<<10)
				<-start
				for {
					var err error
					if i%2 == 0 {
						err = arena.CopyIn(b, src)
					} else {
						err = arena.CopyOut(src[:1024], b)
					}
					if errors.Is(err, arena.ErrClosed) {
						return
					}
					if !assert.NoError(t, err, "round %d", round) {
						return
					}
				}
			}()
		}
		close(start)
		time.Sleep(time.Duration(round%4) * 100 * time.Microsecond)
		require.NoError(t, a.Close())
		wgr.Wait()
	}
}

// Many tenants under one budget, growing (most of them waiting with
// GrowContext, some failing fast with Grow), using, dropping and shrinking,
// some with streams: nobody stalls. A watchdog fails the test when no
// growth has been served for stallAfter while a growth waits, although
// every waiting tenant holds nothing in use, so the memory it waits for
// sits idle (mapped and dropped, or in the cache). VMARENA_PRESSURE_ROUNDS
// sets the rounds, all tenants together (CI runs 100,000 under -race).
func TestPressureStress(t *testing.T) {
	rounds := envInt("VMARENA_PRESSURE_ROUNDS", 8000)
	t.Run("one size", func(t *testing.T) { pressureStress(t, chunk.Config{Budget: 16 * wg}, rounds) })
	// Chunks of two sizes: growths of 1-4 granules take large chunks for
	// whole blocks and tails for the rest, reliefs give both, takes convert
	// between them; every arena's layout stays canonical.
	t.Run("two sizes", func(t *testing.T) {
		pressureStress(t, chunk.Config{Size: 2 * wg, TailSize: wg, Budget: 16 * wg}, rounds/2)
	})
}

func pressureStress(t *testing.T, pc chunk.Config, rounds int) {
	const tenants, stallAfter = 16, 5 * time.Second
	d := isoDriver(t, 256<<20)
	pool, err := chunk.New(d, pc)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var served, failed, waiting atomic.Int64
	var lastServed atomic.Int64 // unix nanoseconds
	lastServed.Store(time.Now().UnixNano())
	stalled := watchdog(ctx, cancel, stallAfter, &lastServed, func(idle time.Duration) string {
		if waiting.Load() == 0 {
			return ""
		}
		return fmt.Sprintf("no growth served for %v while %d wait; pool %+v", idle.Round(time.Millisecond),
			waiting.Load(), pool.Stats())
	})

	var all sync.WaitGroup
	next := atomic.Int64{}
	for i := range tenants {
		cfg := arena.Config{Pool: pool, Reserve: 16 << 20}
		if i%4 == 3 {
			cfg.Streams = []acl.Stream{newStream(t, d)}
		}
		a := isoArena(t, cfg)
		all.Add(1)
		go func() {
			defer all.Done()
			for r := next.Add(1); r <= int64(rounds) && ctx.Err() == nil; r = next.Add(1) {
				n := (1 + int(r+int64(i))%4) * wg
				var err error
				if i%8 == 7 {
					err = a.Grow(n) // fails fast under pressure
				} else {
					waiting.Add(1)
					err = a.GrowContext(ctx, n)
					waiting.Add(-1)
				}
				switch {
				case err == nil:
					served.Add(1)
					lastServed.Store(time.Now().UnixNano())
				case errors.Is(err, arena.ErrOutOfMemory) && (i%8 == 7 || ctx.Err() != nil):
					failed.Add(1)
					continue
				default:
					t.Errorf("tenant %d, round %d: %v", i, r, err)
					cancel()
					return
				}
				if _, err := a.Alloc(n, 1); err != nil { // promised by the growth
					t.Errorf("tenant %d, round %d: alloc after grow: %v", i, r, err)
					cancel()
					return
				}
				if msg := canonical(a); msg != "" {
					t.Errorf("tenant %d, round %d: %s", i, r, msg)
					cancel()
					return
				}
				if r%5 == 0 {
					time.Sleep(20 * time.Microsecond)
				}
				drop := a.Reset
				if r%3 == 0 {
					drop = func() error { return errors.Join(a.Reset(), a.Shrink()) }
				}
				if err := drop(); err != nil {
					t.Errorf("tenant %d, round %d: %v", i, r, err)
					cancel()
					return
				}
			}
		}()
	}
	all.Wait()
	select {
	case msg := <-stalled:
		t.Fatal(msg)
	default:
	}
	assert.Zero(t, pool.Lender().Waiters())
	assert.Equal(t, int64(rounds), served.Load()+failed.Load())
	t.Logf("%d rounds: %d served, %d plain Grows refused; pool %+v", rounds, served.Load(), failed.Load(), pool.Stats())
}

// A Sleep that runs while a growth of the same arena has let go of its lock
// for a relief wins: the growth, back, finds the arena asleep, gives back what
// the relief found and fails with ErrAsleep, mapping nothing into it.
func TestSleepDuringRelief(t *testing.T) {
	gs := newGates(t)
	c := newContest(t, 4, 2, 2)
	x, y := c.arenas[0], c.arenas[1]
	stop := gs.arm(sched.GrowUnlocked, x, 1)
	xerr := make(chan error, 1)
	go func() { xerr <- x.Grow(3 * wg) }() // needs one of y's idle chunks
	<-stop.hit
	require.NoError(t, x.Sleep(context.Background(), arena.Discard))
	gs.reset()
	require.ErrorIs(t, <-xerr, arena.ErrAsleep)
	assert.True(t, x.Asleep())
	assert.Zero(t, x.Cap())
	checkPool(t, c)
	require.NoError(t, x.Wake(context.Background()))
	require.NoError(t, y.Grow(2*wg), "the memory the relief took went back")
}

// blockingCopies is a driver whose host-to-device copies wait at a barrier.
type blockingCopies struct {
	acl.Driver
	in, out chan struct{}
}

func (d blockingCopies) MemcpyHtoD(dst acl.DevicePtr, src []byte) error {
	d.in <- struct{}{}
	<-d.out
	return d.Driver.MemcpyHtoD(dst, src)
}

// A copy under way when Close comes completes first: Close waits for it (the
// copy is stopped inside the driver call), and the next copy fails with
// ErrClosed. The interleaving is forced at the driver call.
func TestCloseWaitsForCopyUnderWay(t *testing.T) {
	d := isoDriver(t, 64<<20)
	bd := blockingCopies{Driver: d, in: make(chan struct{}), out: make(chan struct{})}
	a, err := arena.New(arena.Config{Driver: bd, Reserve: 16 << 20})
	require.NoError(t, err)
	b, err := a.Alloc(4<<10, 64)
	require.NoError(t, err)
	copied := make(chan error, 1)
	go func() { copied <- arena.CopyIn(b, make([]byte, 4<<10)) }()
	<-bd.in // the copy is inside the driver
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a copy was inside the driver", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(bd.out)
	require.NoError(t, <-copied, "the copy under way completes")
	require.NoError(t, <-closed)
	assert.ErrorIs(t, arena.CopyIn(b, []byte{1}), arena.ErrClosed)
}

// A member gives chunks to a relief while it holds its lock, and a growth of
// that member into those addresses waits for the relief to unmap them, then
// maps chunks of its own: it never maps over a chunk still mapped there. The
// relief is stopped once it has claimed the member's chunks.
func TestGrowIntoChunksGivenToARelief(t *testing.T) {
	gs := newGates(t)
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 2 * wg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	v := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20, Streams: []acl.Stream{newStream(t, d)}})
	require.NoError(t, v.Grow(2*wg))
	require.NoError(t, v.Reset()) // two idle chunks, the whole budget
	x := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})

	stop := gs.arm(sched.ReliefSelect, pool, 1)
	xerr := make(chan error, 1)
	go func() { xerr <- x.Grow(2 * wg) }()
	<-stop.hit // x's relief holds v's two chunks, still mapped in v's range
	require.Zero(t, v.Cap())
	verr := make(chan error, 1)
	go func() { verr <- v.Grow(2 * wg) }()
	select {
	case err := <-verr:
		t.Fatalf("v grew into chunks a relief holds (%v)", err)
	case <-time.After(50 * time.Millisecond): // it waits for the relief's unmaps
	}
	gs.reset()
	require.NoError(t, <-xerr)
	assert.ErrorIs(t, <-verr, arena.ErrOutOfMemory, "the budget is x's now")
	assert.Equal(t, 2*wg, x.Cap())
	assert.Zero(t, d.Faults())
	assert.Equal(t, 2, d.Live().Mappings)
}

// A relief does not wait for an arena that is closing while its Close waits
// for the arena's streams: it skips it, and the growth fails (or waits, with
// GrowContext) instead of waiting for a kernel on a stream that is not its.
func TestReliefSkipsAClosingArena(t *testing.T) {
	gs := newGates(t)
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 2 * wg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	s := newStream(t, d)
	c, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20, Streams: []acl.Stream{s}})
	require.NoError(t, err)
	b, err := c.Alloc(2*wg, 1)
	require.NoError(t, err)
	kernel := make(chan struct{})
	finish := sync.OnceFunc(func() { close(kernel) })
	defer finish()
	require.NoError(t, d.Launch(s, b.Ptr(), 2*wg, kernel))
	require.NoError(t, c.Reset()) // two idle chunks, under the kernel
	stop := gs.arm(sched.CloseWaiting, c, 1)
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	<-stop.hit // the Close holds c's lock, about to wait for the kernel

	g := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	gerr := make(chan error, 1)
	go func() { gerr <- g.Grow(wg) }()
	select {
	case err := <-gerr:
		assert.ErrorIs(t, err, arena.ErrOutOfMemory, "the closing arena's chunks are not to be had yet")
	case <-time.After(5 * time.Second):
		t.Fatal("the growth waited for a kernel on the closing arena's stream")
	}
	gs.reset()
	finish()
	require.NoError(t, <-closed)
	require.NoError(t, g.Grow(wg), "the closed arena's memory came back")
}

// watchdog watches a stress test: when last (unix nanoseconds) is older
// than stallAfter and stall says why (a non-empty message), it sends the
// message and cancels the test's context.
func watchdog(ctx context.Context, cancel func(), stallAfter time.Duration, last *atomic.Int64,
	stall func(idle time.Duration) string) <-chan string {
	stalled := make(chan string, 1)
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if idle := time.Since(time.Unix(0, last.Load())); idle > stallAfter {
				if msg := stall(idle); msg != "" {
					stalled <- msg
					cancel()
					return
				}
			}
		}
	}()
	return stalled
}

// TestPressureKernelStress is TestPressureStress with kernels that run for
// a long time: a few arenas keep their memory under stand-in kernels on
// their own streams (idle, so that reliefs claim it and wait for the
// kernels' events, or released to wait for them), while others grow with
// deadlines of 50 to 100 ms, sleep and wake, and are made and closed with
// deadlines. Every call with a deadline must return within half a kernel's
// run of it: one that waited for a kernel on a stream that is not its own
// would be late by up to the whole run. A watchdog fails the test when no
// call completes for 5 s. VMARENA_KERNEL_MS sets the kernels' run (3,000 by
// default: 3 s kernels against deadlines of 50 to 100 ms), and the tenants
// go on for two runs.
func TestPressureKernelStress(t *testing.T) {
	const stallAfter = 5 * time.Second
	kernelFor := time.Duration(envInt("VMARENA_KERNEL_MS", 3000)) * time.Millisecond
	late := kernelFor / 2
	d := isoDriver(t, 256<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 16 * wg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var progress atomic.Int64 // unix nanoseconds of the last call that returned
	progress.Store(time.Now().UnixNano())
	var maxLate atomic.Int64
	var lateMu sync.Mutex
	latest := map[string]time.Duration{} // per call
	fail := func(format string, args ...any) {
		t.Errorf(format, args...)
		cancel()
	}
	// timed runs a call with a deadline of dl and checks that it returned
	// in time.
	timed := func(what string, dl time.Duration, call func(ctx context.Context) error) error {
		cctx, ccancel := context.WithTimeout(ctx, dl)
		defer ccancel()
		start := time.Now()
		err := call(cctx)
		over := time.Since(start) - dl
		progress.Store(time.Now().UnixNano())
		for m := maxLate.Load(); int64(over) > m && !maxLate.CompareAndSwap(m, int64(over)); m = maxLate.Load() {
		}
		lateMu.Lock()
		latest[what] = max(latest[what], over)
		lateMu.Unlock()
		if over > late {
			fail("%s returned %v after its deadline of %v (a kernel runs %v): %v", what, over.Round(time.Millisecond), dl, kernelFor, err)
		}
		return err
	}
	stalled := watchdog(ctx, cancel, stallAfter, &progress, func(idle time.Duration) string {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		return fmt.Sprintf("no call returned for %v; pool %+v\n%s", idle.Round(time.Millisecond), pool.Stats(), buf)
	})
	// oom is what a call with a deadline may fail with under pressure.
	oom := func(err error) bool {
		return errors.Is(err, arena.ErrOutOfMemory) || errors.Is(err, context.DeadlineExceeded)
	}

	var kernels, tenants sync.WaitGroup
	done := make(chan struct{})
	// The machine's own lateness, beside the calls': how late a 1 ms timer
	// (the kind a context's deadline is) fires on this loaded process. A
	// call late by no more than this waited for the CPU, not for a kernel.
	var timerLate atomic.Int64
	kernels.Add(1)
	go func() {
		defer kernels.Done()
		for {
			start := time.Now()
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			over := int64(time.Since(start) - time.Millisecond)
			for m := timerLate.Load(); over > m && !timerLate.CompareAndSwap(m, over); m = timerLate.Load() {
			}
		}
	}()
	var launched atomic.Int64
	for k := range 3 { // arenas that keep kernels running over their memory
		s := newStream(t, d)
		a := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20, Streams: []acl.Stream{s}})
		kernels.Add(1)
		go func() {
			defer kernels.Done()
			for r := 0; ; r++ {
				select {
				case <-done:
					return
				case <-ctx.Done():
					return
				default:
				}
				n := (1 + (k+r)%2) * wg
				b, err := a.Alloc(n, 1)
				if err != nil {
					if !errors.Is(err, arena.ErrOutOfMemory) {
						fail("kernel arena %d: %v", k, err)
						return
					}
					time.Sleep(time.Millisecond)
					continue
				}
				end := make(chan struct{})
				if err := d.Launch(s, b.Ptr(), uintptr(n), end); err != nil {
					fail("kernel arena %d: launch: %v", k, err)
					return
				}
				launched.Add(1)
				finish := sync.OnceFunc(func() { close(end) })
				timer := time.AfterFunc(kernelFor, finish)
				drop := a.Reset // idle under the kernel: a relief claims it and waits
				if r%2 == 1 {
					drop = func() error { return errors.Join(a.Reset(), a.Shrink()) } // waits in the pool
				}
				if err := drop(); err != nil {
					fail("kernel arena %d: %v", k, err)
					return
				}
				select {
				case <-end:
				case <-done:
				case <-ctx.Done():
				}
				timer.Stop()
				finish()
			}
		}()
	}

	var rounds, served, refused, slept, closed atomic.Int64
	end := time.Now().Add(2 * kernelFor)
	for i := range 8 {
		tenants.Add(1)
		go func() {
			defer tenants.Done()
			// Every tenant has a stream: one without waits for the whole
			// device, kernels included, as it must.
			cfg := arena.Config{Pool: pool, Reserve: 16 << 20, Streams: []acl.Stream{newStream(t, d)}}
			a, err := arena.New(cfg)
			if err != nil {
				fail("tenant %d: %v", i, err)
				return
			}
			defer func() {
				if err := a.Close(); err != nil {
					fail("tenant %d: close: %v", i, err)
				}
			}()
			for r := int64(i); time.Now().Before(end) && ctx.Err() == nil; r++ {
				rounds.Add(1)
				n := (1 + int(r)%3) * wg
				dl := time.Duration(50+r%51) * time.Millisecond
				switch {
				case i%4 == 2 && r%2 == 0: // made and closed again, with a deadline
					err := timed("CloseContext", dl, a.CloseContext)
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						fail("tenant %d, round %d: close: %v", i, r, err)
						return
					}
					if err != nil {
						if err := a.Close(); err != nil {
							fail("tenant %d, round %d: close again: %v", i, r, err)
							return
						}
					}
					closed.Add(1)
					if a, err = arena.New(cfg); err != nil {
						fail("tenant %d, round %d: %v", i, r, err)
						return
					}
					continue
				case i%4 == 3 && r%2 == 0: // asleep and awake again, with deadlines
					mode := arena.Discard
					if r%2 == 0 {
						mode = arena.Offload
					}
					err := timed("Sleep", dl, func(ctx context.Context) error { return a.Sleep(ctx, mode) })
					if err != nil && !oom(err) {
						fail("tenant %d, round %d: sleep: %v", i, r, err)
						return
					}
					for a.Asleep() && ctx.Err() == nil {
						err := timed("Wake", dl, a.Wake)
						if err != nil && !oom(err) {
							fail("tenant %d, round %d: wake: %v", i, r, err)
							return
						}
					}
					slept.Add(1)
					continue
				}
				err := timed("GrowContext", dl, func(ctx context.Context) error { return a.GrowContext(ctx, n) })
				switch {
				case err == nil:
					served.Add(1)
				case oom(err):
					refused.Add(1)
					continue
				default:
					fail("tenant %d, round %d: %v", i, r, err)
					return
				}
				if _, err := a.Alloc(n, 1); err != nil { // promised by the growth
					fail("tenant %d, round %d: alloc after grow: %v", i, r, err)
					return
				}
				drop := a.Reset
				if r%3 == 0 {
					drop = func() error { return errors.Join(a.Reset(), a.Shrink()) }
				}
				if err := drop(); err != nil {
					fail("tenant %d, round %d: %v", i, r, err)
					return
				}
			}
		}()
	}
	tenants.Wait()
	close(done)
	kernels.Wait()
	select {
	case msg := <-stalled:
		t.Fatal(msg)
	default:
	}
	assert.Zero(t, pool.Lender().Waiters())
	assert.Zero(t, d.Faults(), "no unmap under a kernel")
	assert.Positive(t, launched.Load())
	t.Logf("%d rounds, kernels of %v: %d served, %d refused, %d sleeps, %d closes, %d kernels; latest return %v past a deadline %v; a 1 ms timer fired up to %v late meanwhile",
		rounds.Load(), kernelFor, served.Load(), refused.Load(), slept.Load(), closed.Load(), launched.Load(),
		time.Duration(maxLate.Load()).Round(time.Millisecond), latest, time.Duration(timerLate.Load()).Round(time.Millisecond))
}
