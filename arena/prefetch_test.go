package arena_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
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

	maps := e.fd.Calls(faultdriver.MapMem)
	require.NoError(t, a.Grow(9*cg))
	assert.Equal(t, maps, e.fd.Calls(faultdriver.MapMem), "the Grow found it mapped")
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
	eager := e.arena(t, arena.Config{})
	require.NoError(t, eager.Prefetch(cg), "no worker: nothing to do")
	e.pool.Lender().Settle()
	assert.Zero(t, eager.Cap())
	b, err := arena.New(arena.Config{Pool: e.pool, Reserve: 4 * cg})
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.ErrorIs(t, b.Prefetch(cg), arena.ErrClosed)
	var zero arena.Arena
	require.ErrorIs(t, zero.Prefetch(cg), arena.ErrInvalid)
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
