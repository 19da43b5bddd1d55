package arena_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// The waits of the growth protocol, forced: nothing is held while anything
// waits for the device or for memory, every such wait ends with the
// caller's context, and the worker never waits (docs/design.md,
// "Pressure").
//
// The kernels here are the host driver's stand-ins (acl.Launcher) and run
// until the test ends them, long after the deadlines (100 or 300 ms) of the
// calls under test: where a call returns only once the kernel has ended, the
// test fails at its own timeout instead, whatever the machine's speed.

// scene is a pool on the host driver, and an arena v with a stream whose
// idle chunks (mapped, dropped) lie under a kernel queued on that stream.
type scene struct {
	d      *host.Driver
	pool   *chunk.Pool
	s      acl.Stream
	v      *arena.Arena
	finish func() // ends the kernel
}

func newScene(t *testing.T, budget, idle int, vcfg arena.Config) *scene {
	t.Helper()
	d := isoDriver(t, 64<<20)
	return newSceneOn(t, d, d, budget, idle, vcfg)
}

// newSceneOn is newScene with the pool on drv, which wraps d.
func newSceneOn(t *testing.T, d *host.Driver, drv acl.Driver, budget, idle int, vcfg arena.Config) *scene {
	t.Helper()
	pool, err := chunk.New(drv, chunk.Config{Budget: int64(budget * wg)})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	sc := &scene{d: d, pool: pool, s: newStream(t, d)}
	vcfg.Pool, vcfg.Reserve, vcfg.Streams = pool, 16<<20, []acl.Stream{sc.s}
	sc.v = isoArena(t, vcfg)
	if idle > 0 {
		require.NoError(t, sc.v.Grow(idle*wg))
		sc.finish = sc.launch(t, sc.v.Base(), idle*wg)
		require.NoError(t, sc.v.Reset())
	}
	return sc
}

// launch queues on the scene's stream a kernel over [ptr, ptr+n) that runs
// until the returned function (also called at the end of the test) ends it.
func (sc *scene) launch(t *testing.T, ptr acl.DevicePtr, n int) func() {
	t.Helper()
	return launchOn(t, sc.d, sc.s, ptr, n)
}

// launchOn queues on s a kernel over [ptr, ptr+n) that runs until the
// returned function (also called at the end of the test) ends it.
func launchOn(t *testing.T, d *host.Driver, s acl.Stream, ptr acl.DevicePtr, n int) func() {
	t.Helper()
	kernel := make(chan struct{})
	require.NoError(t, d.Launch(s, ptr, uintptr(n), kernel))
	finish := sync.OnceFunc(func() { close(kernel) })
	t.Cleanup(finish)
	return finish
}

// launchElsewhere is launchOn over a chunk of an arena of its own on d
// (with a private pool): a kernel on another arena's memory.
func launchElsewhere(t *testing.T, d *host.Driver, s acl.Stream) func() {
	t.Helper()
	o := isoArena(t, arena.Config{Driver: d, Reserve: 4 << 20})
	require.NoError(t, o.Grow(wg))
	return launchOn(t, d, s, o.Base(), wg)
}

// claim starts a Grow of x by n bytes whose relief claims the idle chunks
// of the scene's arena, and returns once the relief has chosen them: it then
// waits for the kernel on their stream. The Grow's error comes on the
// channel.
func (sc *scene) claim(t *testing.T, gs *gates, x *arena.Arena, n int) <-chan error {
	t.Helper()
	stop := gs.arm(sched.ReliefSelect, sc.pool, 1)
	xerr := make(chan error, 1)
	go func() { xerr <- x.Grow(n) }()
	select {
	case <-stop.hit:
	case err := <-xerr:
		t.Fatalf("the growth ended before its relief chose (%v)", err)
	}
	gs.reset() // on to wait for the kernel
	return xerr
}

// returns waits for a call that should return while the kernel still
// runs, and fails the test if it has not 5 s after its deadline: then it
// ends the kernel (unblock) and waits for the call before failing, so that
// the test's cleanups do not wait behind it.
func returns(t *testing.T, what string, res <-chan error, start time.Time, deadline time.Duration, unblock func()) error {
	t.Helper()
	select {
	case err := <-res:
		t.Logf("%s returned %v after its deadline of %v", what, (time.Since(start) - deadline).Round(time.Millisecond), deadline)
		return err
	case <-time.After(deadline + 5*time.Second):
	}
	unblock()
	select {
	case err := <-res:
		t.Fatalf("%s returned (%v) only once the kernel on another arena's stream ended, %v after its deadline of %v",
			what, err, (time.Since(start) - deadline).Round(time.Millisecond), deadline)
	case <-time.After(20 * time.Second):
		t.Fatalf("%s had not returned 20 s after the kernel ended", what)
	}
	return nil
}

// CloseContext and Sleep honour their deadline while a relief holds the
// arena's idle chunks and waits for a kernel on the arena's stream: they
// do not wait for that relief holding the arena's lock, and change nothing.
func TestCloseAndSleepDoNotWaitForARelief(t *testing.T) {
	for _, op := range []struct {
		name string
		do   func(ctx context.Context, a *arena.Arena) error
	}{
		{"CloseContext", func(ctx context.Context, a *arena.Arena) error { return a.CloseContext(ctx) }},
		{"Sleep", func(ctx context.Context, a *arena.Arena) error { return a.Sleep(ctx, arena.Discard) }},
	} {
		t.Run(op.name, func(t *testing.T) {
			gs := newGates(t)
			sc := newScene(t, 2, 2, arena.Config{})
			x := isoArena(t, arena.Config{Pool: sc.pool, Reserve: 16 << 20})
			xerr := sc.claim(t, gs, x, 2*wg)
			require.Zero(t, sc.v.Cap(), "the relief holds v's chunks")

			const deadline = 100 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			res := make(chan error, 1)
			start := time.Now()
			go func() { res <- op.do(ctx, sc.v) }()
			err := returns(t, op.name, res, start, deadline, sc.finish)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			st := sc.v.Stats()
			assert.False(t, st.Closed)
			assert.False(t, sc.v.Asleep())
			assert.Zero(t, st.Mapped)
			require.NoError(t, sc.v.Grow(0), "the arena is open and usable")

			sc.finish()
			require.NoError(t, <-xerr, "the relief's growth is served once the kernel ends")
			assert.Equal(t, 2*wg, x.Cap())
		})
	}
}

// A growth into addresses whose chunks a relief claimed waits for that
// relief's unmaps holding nothing: another growth's relief, which may take
// the arena's other idle chunks, is not held up behind the arena's lock, and
// a GrowContext or AllocContext with a deadline returns by it.
func TestGrowthIntoClaimedChunksHoldsNothing(t *testing.T) {
	for _, op := range []struct {
		name string
		do   func(ctx context.Context, a *arena.Arena) error
	}{
		{"GrowContext", func(ctx context.Context, a *arena.Arena) error { return a.GrowContext(ctx, wg) }},
		{"AllocContext", func(ctx context.Context, a *arena.Arena) error {
			_, err := a.AllocContext(ctx, wg, 1)
			return err
		}},
	} {
		t.Run(op.name, func(t *testing.T) {
			gs := newGates(t)
			sc := newScene(t, 4, 4, arena.Config{})
			x := isoArena(t, arena.Config{Pool: sc.pool, Reserve: 16 << 20})
			xerr := sc.claim(t, gs, x, 2*wg) // v's top two chunks
			require.Equal(t, 2*wg, sc.v.Cap())

			// v grows into the addresses the relief holds.
			locked := gs.arm(sched.GrowLocked, sc.v, 1)
			verr := make(chan error, 1)
			go func() { verr <- sc.v.Grow(3 * wg) }()
			<-locked.hit
			gs.reset()

			w := isoArena(t, arena.Config{Pool: sc.pool, Reserve: 16 << 20})
			const deadline = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			res := make(chan error, 1)
			start := time.Now()
			go func() { res <- op.do(ctx, w) }()
			err := returns(t, op.name, res, start, deadline, sc.finish)
			require.ErrorIs(t, err, arena.ErrOutOfMemory)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Zero(t, w.Cap(), "a failed growth leaves the arena as it was")

			sc.finish()
			require.NoError(t, <-xerr)
			if err := <-verr; err != nil {
				assert.ErrorIs(t, err, arena.ErrOutOfMemory)
			}
		})
	}
}

// blockingFreeHost is a driver whose FreeHost, once armed, stops inside the
// driver until the test lets it go.
type blockingFreeHost struct {
	acl.Driver
	armed   atomic.Bool
	in, out chan struct{}
}

func (d *blockingFreeHost) FreeHost(b []byte) error {
	if d.armed.CompareAndSwap(true, false) {
		d.in <- struct{}{}
		<-d.out
	}
	return d.Driver.FreeHost(b)
}

func (d *blockingFreeHost) Unwrap() acl.Driver { return d.Driver }

// A relief never waits for a member's lock: here a Close holds it, before it
// has marked the arena closing (stopped there, or inside a driver call
// freeing its host copy), and the arena's idle chunks lie under a kernel. A
// growth with a deadline returns by it.
func TestReliefNeverWaitsForAMembersLock(t *testing.T) {
	const deadline = 100 * time.Millisecond
	grow := func(t *testing.T, sc *scene, unblock func()) {
		t.Helper()
		g := isoArena(t, arena.Config{Pool: sc.pool, Reserve: 16 << 20})
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		res := make(chan error, 1)
		start := time.Now()
		go func() { res <- g.GrowContext(ctx, wg) }()
		err := returns(t, "GrowContext", res, start, deadline, unblock)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Zero(t, g.Cap())
	}
	t.Run("stopped holding it", func(t *testing.T) {
		gs := newGates(t)
		sc := newScene(t, 2, 2, arena.Config{})
		stop := gs.arm(sched.CloseLocked, sc.v, 1)
		closed := make(chan error, 1)
		go func() { closed <- sc.v.Close() }()
		<-stop.hit
		grow(t, sc, func() { gs.reset(); sc.finish() })
		gs.reset()
		sc.finish()
		require.NoError(t, <-closed)
	})
	t.Run("in the driver", func(t *testing.T) {
		d := isoDriver(t, 64<<20)
		bd := &blockingFreeHost{Driver: d, in: make(chan struct{}), out: make(chan struct{})}
		sc := newSceneOn(t, d, bd, 2, 0, arena.Config{})
		c := sc.v
		// An Offload sleep leaves c a host buffer, which its Close frees first.
		_, err := c.Alloc(2*wg, 1)
		require.NoError(t, err)
		require.NoError(t, c.Sleep(context.Background(), arena.Offload))
		require.NoError(t, c.Wake(context.Background()))
		require.NotZero(t, c.HostCopy())
		sc.finish = sc.launch(t, c.Base(), 2*wg)
		require.NoError(t, c.Reset()) // two idle chunks under the kernel

		bd.armed.Store(true)
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		<-bd.in // Close holds c's lock, in the driver
		release := sync.OnceFunc(func() { close(bd.out) })
		grow(t, sc, func() { release(); sc.finish() })
		release()
		sc.finish()
		require.NoError(t, <-closed)
	})
}

// The pool's worker never waits: a refill into addresses whose chunks a
// relief claimed (and waits for a kernel over) is skipped and asked again,
// so the worker's other work, and Settle, go on.
func TestWorkerNeverWaits(t *testing.T) {
	gs := newGates(t)
	sc := newScene(t, 4, 0, arena.Config{Headroom: 2 * wg, MaxHeadroom: 2 * wg})
	v := sc.v
	sc.pool.Lender().Settle()
	_, err := v.Alloc(2*wg, 1) // below the low-water mark: a refill to 4 chunks
	require.NoError(t, err)
	sc.pool.Lender().Settle()
	require.Equal(t, 4*wg, v.Cap())
	sc.finish = sc.launch(t, v.Base(), 4*wg)
	require.NoError(t, v.Reset())
	x := isoArena(t, arena.Config{Pool: sc.pool, Reserve: 16 << 20})
	xerr := sc.claim(t, gs, x, 2*wg) // v's top two chunks
	require.Equal(t, 2*wg, v.Cap())

	_, err = v.Alloc(2*wg, 1) // asks for a refill into the claimed addresses
	require.NoError(t, err)
	settled := make(chan error, 1)
	start := time.Now()
	go func() {
		sc.pool.Lender().Settle()
		settled <- nil
	}()
	returns(t, "Settle", settled, start, 0, sc.finish)
	sc.finish()
	require.NoError(t, <-xerr)
}

// A growth waiting because the device is full is woken when a pool on the
// same device caches chunks it could take: its retry has the other pool
// free its cache, and is served.
func TestWaiterWokenByAnotherPoolsCache(t *testing.T) {
	d := isoDriver(t, 4*wg) // the device holds four chunks
	p1, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p1.Close()) })
	p2, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p2.Close()) })
	b := isoArena(t, arena.Config{Pool: p2, Reserve: 16 << 20})
	_, err = b.Alloc(4*wg, 1)
	require.NoError(t, err)
	a := isoArena(t, arena.Config{Pool: p1, Reserve: 16 << 20})

	const deadline = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	aerr := make(chan error, 1)
	go func() { aerr <- a.GrowContext(ctx, wg) }()
	require.Eventually(t, func() bool { return p1.Lender().Waiters() == 1 }, 5*time.Second, 100*time.Microsecond)
	require.NoError(t, b.Reset())
	require.NoError(t, b.Shrink()) // four chunks in p2's cache
	require.NoError(t, <-aerr, "woken by the other pool's cache, and served")
	assert.Equal(t, wg, a.Cap())
}

// Close ends the waits on the arena it closes: a GrowContext waiting for
// memory returns ErrClosed at once, whatever its deadline.
func TestCloseEndsTheArenasWaits(t *testing.T) {
	e := newTenants(t, nil, isoDriver(t, 64<<20), arena.Config{})
	a, err := arena.New(arena.Config{Pool: e.pool, Reserve: 16 << 20})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	aerr := make(chan error, 1)
	go func() { aerr <- a.GrowContext(ctx, wg) }()
	e.waiting(t, 1)
	require.NoError(t, a.Close())
	err = <-aerr
	require.ErrorIs(t, err, arena.ErrClosed)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	assert.Zero(t, e.pool.Lender().Waiters())
}

// blockingFree is a driver whose FreePhysical, once armed, stops inside the
// driver until the test lets it go.
type blockingFree struct {
	acl.Driver
	armed   atomic.Bool
	in, out chan struct{}
}

func (d *blockingFree) FreePhysical(h acl.PhysicalHandle) error {
	if d.armed.CompareAndSwap(true, false) {
		d.in <- struct{}{}
		<-d.out
	}
	return d.Driver.FreePhysical(h)
}

func (d *blockingFree) Unwrap() acl.Driver { return d.Driver }

// Sleep's frees are memory on its way back, as the pool's own are: a plain
// Grow that needs it waits for a free under way instead of failing.
func TestSleepFreesAreInFlight(t *testing.T) {
	d := isoDriver(t, 64<<20)
	bd := &blockingFree{Driver: d, in: make(chan struct{}), out: make(chan struct{})}
	pool, err := chunk.New(bd, chunk.Config{Budget: 2 * wg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	s := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	_, err = s.Alloc(2*wg, 1) // the whole budget, in use
	require.NoError(t, err)
	g := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})

	bd.armed.Store(true)
	slept := make(chan error, 1)
	go func() { slept <- s.Sleep(context.Background(), arena.Discard) }()
	<-bd.in // Sleep's first free is in the driver
	gerr := make(chan error, 1)
	go func() { gerr <- g.Grow(wg) }()
	select {
	case err := <-gerr:
		close(bd.out)
		t.Fatalf("a Grow racing a free under way returned %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(bd.out)
	require.NoError(t, <-gerr, "served by the memory the free gave back")
	require.NoError(t, <-slept)
	assert.Equal(t, wg, g.Cap())
}

// When every member holding the memory waits for memory too, nothing can
// come back: the youngest waiter fails at once with ErrDeadlock (which
// matches ErrOutOfMemory), and what its caller then frees serves the other.
func TestAllHoldersWaiting(t *testing.T) {
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 4 * wg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	a := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	b := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	_, err = a.Alloc(2*wg, 1)
	require.NoError(t, err)
	_, err = b.Alloc(2*wg, 1)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	aerr := make(chan error, 1)
	go func() { aerr <- a.GrowContext(ctx, 2*wg) }()
	require.Eventually(t, func() bool { return pool.Lender().Waiters() == 1 }, 5*time.Second, 100*time.Microsecond)
	start := time.Now()
	err = b.GrowContext(ctx, 2*wg)
	t.Logf("the youngest waiter failed after %v: %v", time.Since(start).Round(time.Microsecond), err)
	require.ErrorIs(t, err, arena.ErrDeadlock)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, 2*wg, b.Cap(), "the failed growth changed nothing")

	require.NoError(t, b.Reset()) // the server preempts the youngest
	require.NoError(t, b.Shrink())
	require.NoError(t, <-aerr, "what it freed serves the other")
	assert.Equal(t, 4*wg, a.Cap())
}

// Wake with a deadline honours it while the memory it would relieve lies
// under a kernel on another arena's stream, and leaves the arena asleep.
func TestWakeHonoursItsDeadline(t *testing.T) {
	sc := newScene(t, 2, 0, arena.Config{})
	k := isoArena(t, arena.Config{Pool: sc.pool, Reserve: 16 << 20})
	_, err := k.Alloc(2*wg, 1)
	require.NoError(t, err)
	require.NoError(t, k.Sleep(context.Background(), arena.Discard))
	require.NoError(t, sc.v.Grow(2*wg)) // v holds the budget, idle, under a kernel
	sc.finish = sc.launch(t, sc.v.Base(), 2*wg)
	require.NoError(t, sc.v.Reset())

	const deadline = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	res := make(chan error, 1)
	start := time.Now()
	go func() { res <- k.Wake(ctx) }()
	err = returns(t, "Wake", res, start, deadline, sc.finish)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, k.Asleep(), "a failed Wake leaves the arena asleep")
	sc.finish()
	require.NoError(t, k.Wake(context.Background()))
	assert.Equal(t, 2*wg, k.Len())
}

// shrinkScene is an arena without streams on a pool of its own, and a
// stream of the same device on which the test queues kernels.
func shrinkScene(t *testing.T) (*host.Driver, *chunk.Pool, acl.Stream, *arena.Arena) {
	t.Helper()
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	a := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	return d, pool, newStream(t, d), a
}

// A Shrink without streams waits for the whole device before it unmaps,
// and makes that wait holding nothing: while a kernel on another stream
// keeps the device busy, the arena's growth and its snapshot go on, and the
// Shrink returns once the kernel ends.
func TestShrinkWithoutStreamsWaitsHoldingNothing(t *testing.T) {
	d, pool, s, a := shrinkScene(t)
	finish := launchElsewhere(t, d, s)

	require.NoError(t, a.Grow(4*wg))
	_, err := a.Alloc(wg, 1)
	require.NoError(t, err)
	shrunk := make(chan error, 1)
	go func() { shrunk <- a.Shrink() }()
	// SyncDevice counts its wait before it makes it.
	for pool.Stats().DeviceSyncs == 0 {
		select {
		case err := <-shrunk:
			t.Fatalf("Shrink returned (%v) with the kernel still running", err)
		case <-time.After(time.Millisecond):
		}
	}

	grown := make(chan error, 1)
	start := time.Now()
	go func() {
		err := a.Grow(5 * wg) // past Cap: maps, under the arena's lock
		_ = a.Stats()
		grown <- err
	}()
	require.NoError(t, returns(t, "Grow beside a Shrink waiting for the device", grown, start, 0, finish))
	select {
	case err := <-shrunk:
		t.Fatalf("Shrink returned (%v) with the kernel still running", err)
	default:
	}
	finish()
	require.NoError(t, <-shrunk)
	assert.Equal(t, wg, a.Cap(), "everything above Len given back, the chunk the Grow mapped meanwhile too")
	assert.Zero(t, d.Faults())
}

// A Shrink without streams that has waited for the device, holding
// nothing, waits again when a Truncate ran meanwhile: memory that Truncate
// dropped may be under work queued after the first wait, and unmapping it
// then would fault the device.
func TestShrinkWaitsAgainAfterATruncate(t *testing.T) {
	gs := newGates(t)
	d, pool, s, a := shrinkScene(t)
	require.NoError(t, a.Grow(4*wg))
	_, err := a.Alloc(3*wg, 1)
	require.NoError(t, err)

	waited := gs.arm(sched.ShrinkWaited, a, 1)
	shrunk := make(chan error, 1)
	go func() { shrunk <- a.Shrink() }()
	select {
	case <-waited.hit:
	case err := <-shrunk:
		t.Fatalf("Shrink returned (%v) without a wait for the device before its lock", err)
	}
	// Between its wait and its lock: a kernel on the memory in use, then a
	// Truncate that drops it.
	finish := launchOn(t, d, s, a.Base().Add(2*wg), wg)
	require.NoError(t, a.Truncate(wg))
	gs.reset()

	for pool.Stats().DeviceSyncs < 2 {
		select {
		case err := <-shrunk:
			finish()
			t.Fatalf("Shrink returned (%v) without waiting again for the device: faults %d", err, d.Faults())
		case <-time.After(time.Millisecond):
		}
	}
	finish()
	require.NoError(t, <-shrunk)
	assert.Equal(t, wg, a.Cap())
	assert.Zero(t, d.Faults())
}

// A growth of an arena without streams that took back in place chunks
// waiting for the device (a relief had claimed them, and given up) and then
// fails gives them back to wait again, without waiting for the device
// holding the arena's lock: with a kernel running on another stream, the
// failed Grow returns at once, the arena as it was, and the chunks are
// unmapped once the kernel has ended.
func TestUndoWithoutStreamsHoldsNothing(t *testing.T) {
	d := isoDriver(t, 64<<20)
	fd := faultdriver.New(d)
	pool, err := chunk.New(fd, chunk.Config{Budget: 3 * wg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	finish := launchElsewhere(t, d, newStream(t, d))

	v := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20}) // no streams
	require.NoError(t, v.Grow(2*wg))
	require.NoError(t, v.Reset()) // idle: a relief may take its chunks
	// x's relief claims v's two chunks, waits for the whole device (v has
	// no streams), gives up at its deadline, and leaves them waiting.
	x := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, x.GrowContext(ctx, 3*wg), context.DeadlineExceeded)
	require.Zero(t, v.Cap(), "the relief took v's chunks")
	require.Equal(t, 2, pool.Stats().Pending, "they wait for the device")

	// v grows into them (taken back where they lie) and past them: the map
	// of the fresh chunk fails, and the growth is undone.
	fd.FailNth(faultdriver.MapMem, 1, 0)
	grown := make(chan error, 1)
	start := time.Now()
	go func() { grown <- v.Grow(3 * wg) }()
	err = returns(t, "a failed Grow giving back chunks that wait for the device", grown, start, 0, finish)
	require.ErrorContains(t, err, faultdriver.InjectedMsg)
	assert.Zero(t, v.Cap(), "the arena as it was")
	assert.Equal(t, 2, pool.Stats().Pending, "waiting again")
	finish()
	require.NoError(t, v.Grow(2*wg), "taken back where they lie")
	assert.Zero(t, d.Faults())
}

// Memory given back while a growth waits for it goes to that growth, not to
// the worker's refills: a refill of another arena's headroom (or a
// Prefetch) stands aside while any growth on the device waits for memory,
// as it does while one relieves pressure. Forced: the waiter is held after
// its wake-up, before its retry, while the worker runs a round with a
// Prefetch asked for.
func TestRefillStandsAsideForAWaiter(t *testing.T) {
	gs := newGates(t)
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 3 * wg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	h := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	_, err = h.Alloc(3*wg, 1) // the whole budget, in use
	require.NoError(t, err)
	a := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20, Headroom: wg})
	w := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})

	enqueued := gs.arm(sched.WaitEnqueued, pool, 1)
	woken := gs.arm(sched.WaitWoken, pool, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	grown := make(chan error, 1)
	go func() { grown <- w.GrowContext(ctx, wg) }()
	<-enqueued.hit
	close(enqueued.open)

	require.NoError(t, h.Truncate(2*wg))
	require.NoError(t, h.Shrink()) // one chunk back: the waiter's
	<-woken.hit
	require.NoError(t, a.Prefetch(wg))
	pool.Lender().Settle() // a worker round, with the waiter between its wake-up and its retry
	assert.Zero(t, a.Cap(), "the refill stood aside")
	close(woken.open)
	require.NoError(t, <-grown, "the waiter got the chunk given back")
	assert.Equal(t, wg, w.Cap())
}
