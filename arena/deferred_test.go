package arena_test

import (
	"context"
	"errors"
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
	"github.com/vmarena/vmarena/internal/goid"
)

const cg = acl.HugePageSize

// deferredEnv is a host driver behind a counting fault driver, a budgeted
// pool on it, and two streams.
type deferredEnv struct {
	hd       *host.Driver
	fd       *faultdriver.Driver
	path     *pathMaps
	pool     *chunk.Pool
	s, other acl.Stream
}

// pathMaps counts the MapMem calls one goroutine makes, to tell a caller's
// maps from those of the pool's worker, which may run beside them (a refill
// the call itself asked for).
type pathMaps struct {
	acl.Driver
	g atomic.Int64 // the goroutine counted; 0: none
	n atomic.Int64
}

func (d *pathMaps) Unwrap() acl.Driver { return d.Driver }

func (d *pathMaps) MapMem(ptr acl.DevicePtr, size, offset uintptr, h acl.PhysicalHandle, flags uint64) error {
	if g := d.g.Load(); g != 0 && g == goid.ID() {
		d.n.Add(1)
	}
	return d.Driver.MapMem(ptr, size, offset, h, flags)
}

// mapsOnPath runs f and returns how many MapMem calls it made on this
// goroutine (the worker's, meanwhile, are not counted).
func (e *deferredEnv) mapsOnPath(f func()) int64 {
	e.path.n.Store(0)
	e.path.g.Store(goid.ID())
	defer e.path.g.Store(0)
	f()
	return e.path.n.Load()
}

func newDeferredEnv(t *testing.T, cfg chunk.Config) *deferredEnv {
	t.Helper()
	hd := isoDriver(t, 128<<20)
	e := &deferredEnv{hd: hd, fd: faultdriver.New(hd)}
	e.path = &pathMaps{Driver: e.fd}
	var err error
	e.pool, err = chunk.New(e.path, cfg)
	require.NoError(t, err)
	e.s, err = hd.CreateStream()
	require.NoError(t, err)
	e.other, err = hd.CreateStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, e.pool.Close())
		assert.NoError(t, hd.SynchronizeDevice())
		assert.NoError(t, hd.DestroyStream(e.s))
		assert.NoError(t, hd.DestroyStream(e.other))
		assert.Zero(t, hd.Faults(), "the device saw memory unmapped under its work, or a copy racing it")
	})
	return e
}

func (e *deferredEnv) arena(t *testing.T, cfg arena.Config) *arena.Arena {
	t.Helper()
	cfg.Pool = e.pool
	if cfg.Reserve == 0 {
		cfg.Reserve = 32 << 20
	}
	a, err := arena.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, a.Close()) })
	return a
}

// Memory a tenant drops stays mapped: taking it again costs no driver call.
func TestDroppedMemoryReusedWithoutDriverCalls(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{})
	a := e.arena(t, arena.Config{})
	require.NoError(t, a.Grow(8*cg))
	for i := range 8 {
		_, err := a.Alloc(cg, 256)
		require.NoError(t, err, "alloc %d", i)
	}
	calls := e.fd.Calls(faultdriver.Any)
	for range 10 {
		require.NoError(t, a.Reset())
		require.NoError(t, a.Grow(8*cg))
		for range 8 {
			_, err := a.Alloc(cg, 256)
			require.NoError(t, err)
		}
	}
	assert.Equal(t, calls, e.fd.Calls(faultdriver.Any), "ten sequences on the same memory, no driver call")
}

// Under a budget, a growth reclaims what idle arenas dropped, least
// recently used first, before it fails; memory in use, and what Grow
// promised, is never taken.
func TestReclaimUnderPressure(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{Budget: 8 * cg})
	old := e.arena(t, arena.Config{})
	recent := e.arena(t, arena.Config{})
	busy := e.arena(t, arena.Config{})
	grower := e.arena(t, arena.Config{})

	fill := func(a *arena.Arena, n int) {
		for range n {
			b, err := a.Alloc(cg, 256)
			require.NoError(t, err)
			require.NoError(t, arena.Fill(b, 0x5A))
		}
	}
	fill(old, 2)
	fill(recent, 2)
	fill(busy, 2)
	require.NoError(t, old.Reset()) // dropped first: least recently used
	require.NoError(t, recent.Reset())
	require.NoError(t, busy.Grow(2*cg)) // promised: not reclaimable

	require.NoError(t, grower.Grow(2*cg), "two chunks reclaimed")
	assert.Zero(t, old.Cap(), "the least recently used idle arena gave first")
	assert.Equal(t, 2*cg, recent.Cap())
	require.NoError(t, grower.Grow(4*cg), "two more, from the next idle arena")
	assert.Zero(t, recent.Cap())
	assert.Equal(t, 4*cg, busy.Cap(), "in use and promised: untouched")
	err := grower.Grow(6 * cg)
	require.ErrorIs(t, err, arena.ErrOutOfMemory, "nothing else to take")
	require.ErrorIs(t, err, chunk.ErrBudget)
	got := make([]byte, 2*cg)
	b, err := busy.Slice(0, 2*cg)
	require.NoError(t, err)
	require.NoError(t, arena.CopyOut(got, b))
	for _, v := range got {
		require.Equal(t, byte(0x5A), v, "bytes below Len never change")
	}
	assert.Equal(t, int64(4), e.pool.Stats().Reclaimed)
	assert.Equal(t, int64(2), old.Stats().Reclaimed)
}

// Two arenas that reclaim from each other while both grow never deadlock,
// and never take the pool past its budget.
func TestReclaimFromEachOtherNoDeadlock(t *testing.T) {
	for _, streams := range []bool{false, true} {
		t.Run(map[bool]string{false: "device-sync", true: "streams"}[streams], func(t *testing.T) {
			e := newDeferredEnv(t, chunk.Config{Budget: 6 * cg, MaxCached: 1})
			var as [2]*arena.Arena
			for i := range as {
				cfg := arena.Config{}
				if streams {
					cfg.Streams = []acl.Stream{[]acl.Stream{e.s, e.other}[i]}
				}
				as[i] = e.arena(t, cfg)
			}
			rounds := 400
			if testing.Short() || raceEnabled {
				rounds = 100
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			var grew, refused int
			done := make(chan struct{})
			for i, a := range as {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for r := range rounds {
						n := 1 + (i+r)%5
						err := a.Grow(n * cg)
						mu.Lock()
						if err == nil {
							grew++
						} else {
							refused++
						}
						mu.Unlock()
						if err != nil && !errors.Is(err, arena.ErrOutOfMemory) {
							t.Error(err)
							return
						}
						if err == nil {
							if _, err := a.Alloc(n*cg, 256); err != nil {
								t.Error(err)
								return
							}
						}
						if err := a.Reset(); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				t.Fatal("deadlock: the growers never finished")
			}
			assert.NotZero(t, grew)
			t.Logf("%d growths, %d refused, %d chunks reclaimed", grew, refused, e.pool.Stats().Reclaimed)
			s := e.pool.Stats()
			assert.LessOrEqual(t, s.HeldBytes, s.Budget)

			// How often they took from each other above depends on the
			// scheduler (one goroutine may run all its rounds while the
			// other sits between its Grow and its Reset, holding its
			// chunks). That they can is checked here, in turn: each takes
			// the whole budget, which needs every chunk the other holds.
			for i, a := range as {
				other := as[1-i]
				held, before := other.Cap(), e.pool.Stats().Reclaimed
				require.NoError(t, a.Grow(6*cg), "the whole budget, reclaiming the other's %d idle bytes", held)
				assert.Zero(t, other.Cap())
				assert.Equal(t, before+int64(held/cg), e.pool.Stats().Reclaimed)
				require.NoError(t, a.Reset())
			}
		})
	}
}

// With a stream, Shrink returns at once: the chunks wait, still mapped,
// until the work queued on the arena's stream has run, and are then
// unmapped by the pool's worker. Work on an unrelated stream is never
// waited for, and the device is never synchronised.
func TestShrinkOrderedByStream(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{})
	a := e.arena(t, arena.Config{Streams: []acl.Stream{e.s}})
	u := e.arena(t, arena.Config{})
	ub, err := u.Alloc(cg, 256)
	require.NoError(t, err)
	unrelated := make(chan struct{})
	require.NoError(t, e.hd.Launch(e.other, ub.Ptr(), cg, unrelated)) // a long kernel elsewhere
	defer close(unrelated)

	b, err := a.Alloc(4*cg, 256)
	require.NoError(t, err)
	kernel := make(chan struct{})
	require.NoError(t, e.hd.Launch(e.s, b.Ptr(), uintptr(b.Len()), kernel)) // reads the arena's memory
	require.NoError(t, a.Reset())

	start := time.Now()
	require.NoError(t, a.Shrink())
	assert.Less(t, time.Since(start), time.Second, "Shrink did not wait for the kernels")
	assert.Zero(t, a.Cap())
	assert.Equal(t, 4, e.pool.Stats().Pending, "the chunks wait for the kernel")
	assert.Equal(t, 5, e.hd.Live().Mappings, "and are still mapped")
	// The worker asks twice whether the kernel is done, and hears no: it
	// has decided once, and unmapped nothing.
	q := e.fd.Calls(faultdriver.QueryEvent)
	for deadline := time.Now().Add(5 * time.Second); e.fd.Calls(faultdriver.QueryEvent) < q+2; time.Sleep(100 * time.Microsecond) {
		require.True(t, time.Now().Before(deadline), "the worker does not look at the kernel's event")
	}
	assert.Equal(t, 4, e.pool.Stats().Pending, "the kernel still reads them")

	close(kernel)
	deadline := time.Now().Add(5 * time.Second)
	for e.pool.Stats().Pending > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Microsecond)
	}
	s := e.pool.Stats()
	assert.Zero(t, s.Pending, "unmapped once the kernel finished, while the unrelated one still runs")
	assert.Equal(t, int64(4), s.Ordered)
	assert.Zero(t, s.DeviceSyncs)
	assert.Zero(t, e.fd.Calls(faultdriver.SynchronizeDevice), "no device-wide wait")
	assert.Equal(t, 1, e.hd.Live().Mappings)
}

// A growth into chunks that still wait for the device takes them back
// where they lie: no driver call at all.
func TestGrowTakesBackWaitingChunks(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{})
	a := e.arena(t, arena.Config{Streams: []acl.Stream{e.s}})
	b, err := a.Alloc(3*cg, 256)
	require.NoError(t, err)
	kernel := make(chan struct{})
	require.NoError(t, e.hd.Launch(e.s, b.Ptr(), uintptr(b.Len()), kernel))
	require.NoError(t, a.Truncate(0))
	require.NoError(t, a.Shrink())
	require.Equal(t, 3, e.pool.Stats().Pending)
	// (The worker polls the events meanwhile: count the calls that map.)
	maps, mallocs, access := e.fd.Calls(faultdriver.MapMem), e.fd.Calls(faultdriver.MallocPhysical), e.fd.Calls(faultdriver.MemSetAccess)
	before := a.Stats()
	require.NoError(t, a.Grow(3*cg))
	assert.Equal(t, before.Maps+3, a.Stats().Maps, "Stats.Maps counts chunks taken back in place")
	assert.Equal(t, maps, e.fd.Calls(faultdriver.MapMem), "taken back in place: no map")
	assert.Equal(t, mallocs, e.fd.Calls(faultdriver.MallocPhysical))
	assert.Equal(t, access, e.fd.Calls(faultdriver.MemSetAccess))
	assert.Equal(t, 3*cg, a.Cap())
	assert.Zero(t, e.pool.Stats().Pending)
	close(kernel)
}

// CloseContext gives up at its deadline while the arena's stream is busy,
// changing nothing; once the work is done, Close succeeds.
func TestCloseContextDeadline(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{})
	a, err := arena.New(arena.Config{Pool: e.pool, Reserve: 16 << 20, Streams: []acl.Stream{e.s}})
	require.NoError(t, err)
	b, err := a.Alloc(cg, 256)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(b, []byte("kept")))
	kernel := make(chan struct{})
	require.NoError(t, e.hd.Launch(e.s, b.Ptr(), cg, kernel))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	err = a.CloseContext(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.False(t, a.Stats().Closed, "still open")
	close(kernel)
	require.NoError(t, e.hd.SynchronizeStream(e.s)) // the kernel is done with b
	got := make([]byte, 4)
	require.NoError(t, arena.CopyOut(got, b))
	assert.Equal(t, "kept", string(got), "and as it was")
	require.NoError(t, a.Close())
}

// Arenas of one tenant pass chunks to each other uncleared; another tenant
// gets them cleared.
func TestSharedTenant(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{Budget: 2 * cg})
	model := chunk.NewTenant()
	a := e.arena(t, arena.Config{Tenant: model})
	b := e.arena(t, arena.Config{Tenant: model})
	c := e.arena(t, arena.Config{})
	x, err := a.Alloc(2*cg, 256)
	require.NoError(t, err)
	require.NoError(t, arena.Fill(x, 0x77))
	require.NoError(t, a.Reset())
	require.NoError(t, b.Grow(2*cg), "reclaimed from a, same tenant")
	assert.Zero(t, e.pool.Stats().Scrubs, "no clear between arenas of one tenant")
	require.NoError(t, b.Reset())
	require.NoError(t, c.Grow(cg), "reclaimed from b, another tenant")
	assert.Equal(t, int64(1), e.pool.Stats().Scrubs, "cleared for another tenant")
	y, err := c.Alloc(cg, 256)
	require.NoError(t, err)
	got := make([]byte, cg)
	require.NoError(t, arena.CopyOut(got, y))
	assert.Equal(t, make([]byte, cg), got)
}

// A clear queued on the tenant's stream runs before the tenant's work there,
// and the arena's own host copies wait for it: a copy racing the queued
// clear would be a fault on the host driver, and the data would be lost.
func TestAsyncScrubOrderedBeforeCopies(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{Budget: 2 * cg})
	// a says which stream reads its memory: reclaiming from it waits for
	// that stream only (without it, the device-wide wait would wait for the
	// kernel that holds e.s below, and this test would hang).
	a := e.arena(t, arena.Config{Streams: []acl.Stream{e.other}})
	x, err := a.Alloc(cg, 256)
	require.NoError(t, err)
	require.NoError(t, arena.Fill(x, 0xEE))
	require.NoError(t, a.Reset())
	// Hold the stream with a kernel on other memory, so that the clear the
	// next arena needs is still queued when it copies in.
	held := e.arena(t, arena.Config{})
	h, err := held.Alloc(cg, 256)
	require.NoError(t, err)
	blocker := make(chan struct{})
	require.NoError(t, e.hd.Launch(e.s, h.Ptr(), cg, blocker))
	b := e.arena(t, arena.Config{Streams: []acl.Stream{e.s}})
	y, err := b.Alloc(cg, 256) // reclaims a's chunk: another tenant, so a clear is queued on e.s
	require.NoError(t, err)
	assert.Equal(t, int64(1), e.pool.Stats().ScrubsAsync)
	const hold = 20 * time.Millisecond
	time.AfterFunc(hold, func() { close(blocker) })
	start := time.Now()
	require.NoError(t, arena.CopyIn(y, []byte("after the clear")))
	assert.GreaterOrEqual(t, time.Since(start), hold/2, "the copy waited for the queued clear")
	got := make([]byte, cg)
	require.NoError(t, arena.CopyOut(got, y))
	assert.Equal(t, "after the clear", string(got[:15]))
	assert.Equal(t, make([]byte, cg-15), got[15:], "cleared, then written: in that order")
}

// Headroom: the pool's worker keeps memory mapped above Len, so that Alloc
// finds it mapped; Alloc asks for refills without allocating.
func TestHeadroom(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{})
	a := e.arena(t, arena.Config{Headroom: 4 * cg})
	e.pool.Lender().Settle()
	assert.Equal(t, 4*cg, a.Cap(), "mapped ahead by the worker")
	for range 3 {
		_, err := a.Alloc(cg, 256)
		require.NoError(t, err)
	}
	e.pool.Lender().Settle()
	assert.Equal(t, 7*cg, a.Cap(), "refilled to Len + headroom after crossing the low-water mark")
	st := a.Stats()
	assert.GreaterOrEqual(t, st.Refills, int64(2))
	assert.Equal(t, 4*cg, st.Headroom)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := a.Alloc(64, 64); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs, "Alloc allocates nothing, refill requests included")
}

// The worker never maps headroom past the budget, and never takes memory
// from another arena for it.
func TestHeadroomWithinBudget(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{Budget: 4 * cg})
	other := e.arena(t, arena.Config{})
	x, err := other.Alloc(3*cg, 256)
	require.NoError(t, err)
	require.NoError(t, other.Reset()) // dropped: reclaimable, but not by a refill
	_ = x
	a := e.arena(t, arena.Config{Headroom: 4 * cg})
	e.pool.Lender().Settle()
	assert.Equal(t, 3*cg, other.Cap(), "a refill takes nothing from anyone")
	assert.LessOrEqual(t, a.Cap(), cg, "only what was free")
	s := e.pool.Stats()
	assert.LessOrEqual(t, s.HeldBytes, s.Budget)
}

func TestBadHeadroom(t *testing.T) {
	_, err := arena.New(arena.Config{Headroom: -1})
	require.ErrorIs(t, err, arena.ErrInvalid)
	_, err = arena.New(arena.Config{Headroom: cg, LowWater: 2 * cg})
	require.ErrorIs(t, err, arena.ErrInvalid)
}
