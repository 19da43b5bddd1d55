package arena_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// Prefetch: the worker maps what was asked for in the background, and the
// Grow that follows finds it mapped and calls no driver; until then it is
// headroom a pool under pressure may take back, not a promise.
func TestPrefetch(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{})
	a := e.arena(t, arena.Config{Headroom: 2 * cg})
	e.pool.Lender().Settle()
	require.Equal(t, 2*cg, a.Cap())
	_, err := a.Alloc(cg/2, 256)
	require.NoError(t, err)

	require.NoError(t, a.Prefetch(9*cg))
	e.pool.Lender().Settle()
	assert.GreaterOrEqual(t, a.Cap(), a.Len()+9*cg, "mapped by the worker")
	st := a.Stats()
	assert.Equal(t, a.Cap()-cg, st.Reclaimable, "all of it above the chunk Len is in reclaimable: headroom, not a promise")

	assert.Zero(t, e.mapsOnPath(func() { require.NoError(t, a.Grow(9*cg)) }), "the Grow found it mapped")
	assert.Less(t, a.Stats().Reclaimable, st.Reclaimable, "the Grow claimed it")

	// Served once: once Len is back at 0, the worker keeps only the headroom
	// it would anyway (it maps nothing more for the old prefetch).
	require.NoError(t, a.Shrink())
	e.pool.Lender().Settle()
	assert.LessOrEqual(t, a.Cap(), a.Len()+3*cg)
}

// A prefetch larger than the memory free now is not served (a refill takes
// nothing from anyone); the headroom still is.
func TestPrefetchWithinBudget(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{Budget: 6 * cg})
	other := e.arena(t, arena.Config{})
	_, err := other.Alloc(3*cg, 256)
	require.NoError(t, err)
	require.NoError(t, other.Reset()) // reclaimable, but not by a refill or a prefetch
	a := e.arena(t, arena.Config{Headroom: cg})
	e.pool.Lender().Settle()
	require.NoError(t, a.Prefetch(5*cg))
	e.pool.Lender().Settle()
	assert.Equal(t, 3*cg, other.Cap(), "a prefetch takes nothing from anyone")
	assert.Equal(t, cg, a.Cap(), "only the headroom")
	require.NoError(t, a.Prefetch(2*cg))
	e.pool.Lender().Settle()
	assert.Equal(t, 2*cg, a.Cap(), "a prefetch that fits is served")
	s := e.pool.Stats()
	assert.LessOrEqual(t, s.HeldBytes, s.Budget)
}

func TestPrefetchBadInput(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{})
	a := e.arena(t, arena.Config{Reserve: 4 * cg, Headroom: cg})
	require.ErrorIs(t, a.Prefetch(-1), arena.ErrInvalid)
	require.ErrorIs(t, a.Prefetch(5*cg), arena.ErrExhausted)
	require.NoError(t, a.Prefetch(0))
	b, err := arena.New(arena.Config{Pool: e.pool, Reserve: 4 * cg})
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.ErrorIs(t, b.Prefetch(cg), arena.ErrClosed)
	var zero arena.Arena
	require.ErrorIs(t, zero.Prefetch(cg), arena.ErrInvalid)
}

// An arena without Config.Headroom is served too: its first Prefetch starts
// the pool's worker, which maps what was asked for, once, and keeps no
// headroom after it.
func TestPrefetchWithoutHeadroom(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{})
	a := e.arena(t, arena.Config{})
	_, err := a.Alloc(cg/2, 256)
	require.NoError(t, err)
	require.Equal(t, cg, a.Cap())
	require.NoError(t, a.Prefetch(3*cg))
	e.pool.Lender().Settle()
	require.GreaterOrEqual(t, a.Cap(), a.Len()+3*cg, "mapped by the worker")
	assert.Equal(t, int64(1), a.Stats().Refills)

	assert.Zero(t, e.mapsOnPath(func() { require.NoError(t, a.Grow(3*cg)) }), "the Grow found it mapped")
	_, err = a.Alloc(3*cg, 256)
	require.NoError(t, err)
	e.pool.Lender().Settle()
	assert.Equal(t, (a.Len()+cg-1)/cg*cg, a.Cap(), "no headroom is kept: the prefetch was served once")
	assert.Equal(t, int64(1), a.Stats().Refills)
}

// What a prefetch mapped is headroom, not a promise: another arena's growth
// under pressure takes it back.
func TestPrefetchReclaimable(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{Budget: 8 * cg})
	a := e.arena(t, arena.Config{Headroom: cg})
	e.pool.Lender().Settle()
	require.NoError(t, a.Prefetch(6*cg))
	e.pool.Lender().Settle()
	require.Equal(t, 6*cg, a.Cap(), "served")
	b := e.arena(t, arena.Config{})
	require.NoError(t, b.Grow(6*cg), "takes what the prefetch mapped")
	assert.LessOrEqual(t, a.Cap(), 2*cg)
	assert.Positive(t, a.Stats().Reclaimed)
	s := e.pool.Stats()
	assert.LessOrEqual(t, s.HeldBytes, s.Budget)
}

// The headroom is learnt: each growth on the caller's path doubles it, up to
// MaxHeadroom, and refills without one shrink it again, down to Headroom.
func TestHeadroomLearns(t *testing.T) {
	defer arena.SetDecayAfter(3)()
	e := newDeferredEnv(t, chunk.Config{})
	a := e.arena(t, arena.Config{Headroom: cg, MaxHeadroom: 4 * cg, Reserve: 128 << 20})
	settle := func() { e.pool.Lender().Settle() }
	alloc := func(n int) {
		t.Helper()
		_, err := a.Alloc(n, 256)
		require.NoError(t, err)
	}
	settle()
	require.Equal(t, cg, a.Cap())
	require.Equal(t, cg, a.Stats().Headroom)

	// Misses: each Alloc past Cap maps on the caller's path and doubles it.
	for i, want := range []int{2, 4, 4} {
		assert.Positive(t, e.mapsOnPath(func() { alloc(a.Cap() - a.Len() + cg) }), "mapped on the caller's path")
		st := a.Stats()
		assert.Equal(t, int64(i+1), st.Misses)
		assert.Equal(t, want*cg, st.Headroom, "miss %d: doubled, up to MaxHeadroom", i+1)
		settle()
		assert.Equal(t, a.Len()+want*cg, a.Cap(), "the worker keeps the learnt headroom")
	}

	// An Alloc within the headroom that crosses the low-water mark (half of
	// it, at least a chunk) is no miss. The refill after the last miss was
	// the first to complete without one; the refill that follows every
	// third shrinks the headroom by a quarter (in whole chunks), down to
	// Headroom and never below.
	for i, want := range []int{4, 4, 3, 3, 3, 2, 2, 2, 1, 1} {
		// (The refill it asks for may map beside it: count this goroutine's maps.)
		assert.Zero(t, e.mapsOnPath(func() { alloc(a.Cap() - a.Len() - cg/2) }), "refill %d: found mapped", i+1)
		settle()
		assert.Equal(t, want*cg, a.Stats().Headroom, "after refill %d", i+1)
		assert.Equal(t, (a.Len()+want*cg+cg-1)/cg*cg, a.Cap(), "Len + headroom, in whole chunks")
	}
	assert.Equal(t, int64(3), a.Stats().Misses, "no miss since")
}

// A headroom smaller than a chunk is kept in bytes, not rounded up to a
// chunk: the next chunk is mapped once less than the headroom is left above
// the last allocation, and no more, so that an arena grown a little at a
// time holds at most a chunk and the headroom above Len. Misses double it in
// bytes, and refills shrink it again in bytes while it is under a chunk.
func TestHeadroomUnderAChunk(t *testing.T) {
	const h, tok = cg / 8, cg / 32 // a headroom of four "tokens"
	t.Run("fixed", func(t *testing.T) {
		e := newDeferredEnv(t, chunk.Config{})
		a := e.arena(t, arena.Config{Headroom: h, MaxHeadroom: h, Reserve: 64 << 20})
		e.pool.Lender().Settle()
		require.Equal(t, cg, a.Cap(), "the chunk that covers the headroom, not more")
		assert.Equal(t, h, a.Stats().Headroom)
		onPath := int64(0)
		for range 4 * cg / tok {
			onPath += e.mapsOnPath(func() {
				_, err := a.Alloc(tok, 256)
				require.NoError(t, err)
			})
			e.pool.Lender().Settle()
			assert.Equal(t, (a.Len()+h+cg-1)/cg*cg, a.Cap(), "Len %d: the chunks that cover Len + the headroom", a.Len())
		}
		assert.Zero(t, onPath, "each chunk was mapped before an Alloc reached it")
		assert.Zero(t, a.Stats().Misses)
		assert.Equal(t, int64(5), a.Stats().Refills, "one refill at New, then one a chunk")
	})
	t.Run("learnt", func(t *testing.T) {
		defer arena.SetDecayAfter(2)()
		e := newDeferredEnv(t, chunk.Config{})
		a := e.arena(t, arena.Config{Headroom: h, MaxHeadroom: 4 * h, Reserve: 64 << 20})
		e.pool.Lender().Settle()
		// A miss: an Alloc past Cap doubles the headroom, in bytes.
		assert.Positive(t, e.mapsOnPath(func() {
			_, err := a.Alloc(a.Cap()-a.Len()+tok, 256)
			require.NoError(t, err)
		}))
		assert.Equal(t, 2*h, a.Stats().Headroom)
		e.pool.Lender().Settle()
		assert.Equal(t, (a.Len()+2*h+cg-1)/cg*cg, a.Cap())
		// Refills without a miss shrink it by a quarter, in bytes, to Headroom.
		for a.Stats().Headroom > h {
			before := a.Stats().Headroom
			for i := 0; a.Stats().Headroom == before && i < 64; i++ {
				_, err := a.Alloc(a.Cap()-a.Len()-before/2, 256)
				require.NoError(t, err)
				e.pool.Lender().Settle()
			}
			got := a.Stats().Headroom
			require.Less(t, got, before, "the headroom shrinks")
			assert.Equal(t, max(h, before*3/4), got, "by a quarter, not to a whole chunk")
		}
		assert.Equal(t, int64(1), a.Stats().Misses)
	})
}

// MaxHeadroom equal to Headroom keeps the headroom fixed; a miss while the
// pool had no room for the last refill teaches nothing.
func TestHeadroomFixedAndShort(t *testing.T) {
	t.Run("fixed", func(t *testing.T) {
		e := newDeferredEnv(t, chunk.Config{})
		a := e.arena(t, arena.Config{Headroom: 2 * cg, MaxHeadroom: 2 * cg})
		e.pool.Lender().Settle()
		_, err := a.Alloc(5*cg, 256)
		require.NoError(t, err)
		st := a.Stats()
		assert.Equal(t, int64(1), st.Misses)
		assert.Equal(t, 2*cg, st.Headroom)
	})
	t.Run("short", func(t *testing.T) {
		e := newDeferredEnv(t, chunk.Config{Budget: 4 * cg})
		a := e.arena(t, arena.Config{Headroom: 2 * cg})
		e.pool.Lender().Settle()
		hog := e.arena(t, arena.Config{})
		require.NoError(t, hog.Grow(2*cg)) // the rest of the budget, promised
		_, err := a.Alloc(2*cg, 256)       // all the headroom: the refill finds no room
		require.NoError(t, err)
		e.pool.Lender().Settle()
		require.Equal(t, 2*cg, a.Cap())
		_, err = a.Alloc(cg, 256)
		require.ErrorIs(t, err, arena.ErrOutOfMemory)
		st := a.Stats()
		assert.Zero(t, st.Misses, "a growth that failed mapped nothing on the caller's path")
		assert.Equal(t, 2*cg, st.Headroom, "the budget was short, not the headroom")
		require.NoError(t, hog.Reset())
		_, err = a.Alloc(cg, 256) // reclaims from hog
		require.NoError(t, err)
		assert.Equal(t, int64(1), a.Stats().Misses)
		assert.Equal(t, 2*cg, a.Stats().Headroom, "still short of room for the last refill")
	})
}

// A refill maps in steps and yields the arena's lock to a growth on the
// caller's path between them: the caller waits for one step of the worker's
// driver calls, not for the whole refill. The worker is stopped inside its
// first step, a Grow that needs more than that step maps starts waiting for
// the lock, and when the worker goes on it finishes the step and lets go.
func TestRefillYieldsToCaller(t *testing.T) {
	var (
		first            sync.Once
		stopped, release = make(chan struct{}), make(chan struct{})
		waiting          = make(chan struct{})
		released, noted  atomic.Bool
		capAtLock        atomic.Int64
	)
	// The test's one arena: the worker's first step stops at GrowTaken.
	t.Cleanup(sched.Set(func(p sched.Point, who any) {
		ar, ok := who.(*arena.Arena)
		if !ok {
			return
		}
		switch p {
		case sched.GrowTaken:
			first.Do(func() { close(stopped); <-release })
		case sched.GrowWaiting:
			close(waiting)
		case sched.GrowLocked:
			if released.Load() && noted.CompareAndSwap(false, true) {
				capAtLock.Store(int64(ar.Cap()))
			}
		}
	}))
	e := newDeferredEnv(t, chunk.Config{})
	const h = 8 * cg
	a, err := arena.New(arena.Config{Pool: e.pool, Reserve: 64 << 20, Headroom: h, MaxHeadroom: h})
	require.NoError(t, err)
	<-stopped // New asked the worker for the first refill
	grown := make(chan error, 1)
	go func() { grown <- a.Grow(3 * cg) }()
	<-waiting
	released.Store(true)
	close(release)
	require.NoError(t, <-grown)
	assert.Equal(t, int64(2*cg), capAtLock.Load(), "the caller had the lock after one step of the refill")
	assert.Equal(t, int64(1), a.Stats().Misses, "and mapped the third chunk itself")
	e.pool.Lender().Settle()
	assert.Equal(t, h, a.Cap(), "the worker came back for the rest") // Len is 0; the promise lies within
	require.NoError(t, a.Close())
}
