package arena_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// A failed Grow (or Alloc) on an arena that keeps headroom leaves Stats as it
// was: it mapped nothing on the caller's path, so it is no miss, and the
// learnt headroom does not double.
func TestFailedGrowCountsNoMiss(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{Budget: 8 * cg})
	a := e.arena(t, arena.Config{Headroom: cg, MaxHeadroom: 8 * cg})
	e.pool.Lender().Settle()
	require.Equal(t, cg, a.Cap())
	before := a.Stats()

	e.fd.FailNth(faultdriver.MapMem, 1, 0)
	require.Error(t, a.Grow(3*cg))
	e.fd.Clear()
	require.Equal(t, before, a.Stats(), "failed Grow (MapMem)")

	e.fd.FailNth(faultdriver.MapMem, 1, 0)
	_, err := a.Alloc(3*cg, 256)
	require.Error(t, err)
	e.fd.Clear()
	require.Equal(t, before, a.Stats(), "failed Alloc (MapMem)")

	// Over the budget: no driver call fails, and no miss either.
	require.ErrorIs(t, a.Grow(12*cg), arena.ErrOutOfMemory)
	require.Equal(t, before, a.Stats(), "failed Grow (past the budget)")
}

// Activity.OOMs counts every growth on a caller's path that failed for want
// of memory: a plain Grow or Alloc of an arena fails and counts while
// another goroutine's GrowContext of the same arena waits for memory.
func TestOOMCountedDuringAnotherWait(t *testing.T) {
	d := isoDriver(t, 64<<20)
	e := newTenants(t, nil, d, arena.Config{})
	w := isoArena(t, arena.Config{Pool: e.pool, Reserve: 16 << 20})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.GrowContext(ctx, 2*wg) }()
	e.waiting(t, 1)

	require.ErrorIs(t, w.Grow(wg), arena.ErrOutOfMemory)
	_, err := w.Alloc(wg, 1)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	cancel()
	require.ErrorIs(t, <-done, arena.ErrOutOfMemory)
	assert.Equal(t, int64(3), w.Activity().OOMs, "a plain Grow, a plain Alloc, and the wait that gave up")
}

// A Prefetch of an arena without Config.Headroom is served even when the
// worker's refill finds the arena's lock held (a growth under way): the
// worker comes back for it, as it does for an arena that keeps headroom.
func TestPrefetchNotLostWhileLocked(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{})
	a := e.arena(t, arena.Config{})
	_, err := a.Alloc(cg/2, 256)
	require.NoError(t, err)
	require.Equal(t, cg, a.Cap())

	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	defer sched.Set(func(p sched.Point, who any) {
		if p == sched.GrowLocked && who == a {
			once.Do(func() { close(held); <-release })
		}
	})()
	done := make(chan error, 1)
	go func() { done <- a.Grow(cg) }() // maps on the caller's path, holding mu
	<-held

	require.NoError(t, a.Prefetch(4*cg))
	e.pool.Lender().Settle() // the worker's round found mu held
	close(release)
	require.NoError(t, <-done)
	e.pool.Lender().Settle()
	e.pool.Lender().Settle()
	assert.GreaterOrEqual(t, a.Cap(), cg/2+4*cg, "the prefetch was served")

	// Nor does asking again help: the lost target still stands.
	require.NoError(t, a.Prefetch(4*cg))
	e.pool.Lender().Settle()
	e.pool.Lender().Settle()
	assert.GreaterOrEqual(t, a.Cap(), cg/2+4*cg, "the second prefetch was served")
}

// A GrowContext whose pool closes between its failed try and its joining
// the queue fails without waiting; its shortage is counted once, as a
// plain Grow's would be (the try was quiet, and no wait counted it).
func TestOOMCountedWhenThePoolClosesBeforeTheWait(t *testing.T) {
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 2 * wg})
	require.NoError(t, err)
	holder := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	_, err = holder.Alloc(2*wg, 1) // the whole budget, in use
	require.NoError(t, err)
	w, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	var once sync.Once
	defer sched.Set(func(p sched.Point, who any) {
		if p == sched.WaitJoining && who == w {
			once.Do(func() { _ = pool.Close() }) // reports the arenas still open
		}
	})()
	err = w.GrowContext(context.Background(), wg)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	assert.Equal(t, int64(1), w.Activity().OOMs)
	require.NoError(t, w.Close())
	require.NoError(t, holder.Close())
}
