package chunk_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/chunk"
)

// An Acquire of more chunks than the whole budget holds fails at once, with
// no driver call; one that fits the budget still succeeds.
func TestAcquireOverBudgetFailsFast(t *testing.T) {
	fd := faultdriver.New(newDriver(t, 64<<20))
	p, err := chunk.New(fd, chunk.Config{Budget: 8 * g})
	require.NoError(t, err)
	defer func() { assert.NoError(t, p.Close()) }()
	assert.Equal(t, int64(8*g), p.Budget())
	before := fd.Calls(faultdriver.Any)
	_, err = p.Lender().Acquire(chunk.NewTenant(), 9)
	assert.ErrorIs(t, err, chunk.ErrBudget)
	assert.ErrorIs(t, err, acl.ErrOutOfMemory)
	assert.ErrorContains(t, err, "16777216 bytes (16 MiB)")
	assert.Equal(t, before, fd.Calls(faultdriver.Any), "no driver call")
	assert.Equal(t, int64(1), p.Stats().Failures)
	cs, err := p.Lender().Acquire(chunk.NewTenant(), 8)
	require.NoError(t, err)
	for _, c := range cs {
		require.NoError(t, p.Lender().Put(c))
	}
}

// A take the cache and the budget's room cannot make whole takes and
// allocates nothing, and Fits says so first. It used to allocate what the
// budget left, then put it back (freed, with a full cache), on every try of
// a growth waiting for memory.
func TestShortTakeAllocatesNothing(t *testing.T) {
	fd := faultdriver.New(newDriver(t, 64<<20))
	p, err := chunk.New(fd, chunk.Config{Budget: 8 * g})
	require.NoError(t, err)
	defer func() { assert.NoError(t, p.Close()) }()
	l, tn := p.Lender(), chunk.NewTenant()
	held, err := l.TakeFree(nil, tn, chunk.Ask{Units: 5, Large: 5})
	require.NoError(t, err)
	require.NoError(t, l.Put(held[4])) // 4 in use, 1 cached, room for 3 more in the budget
	assert.True(t, l.Fits(4))
	assert.False(t, l.Fits(5))
	before, st := fd.Calls(faultdriver.Any), p.Stats()
	for _, take := range []func([]chunk.Chunk, chunk.Tenant, chunk.Ask) ([]chunk.Chunk, error){l.TakeFree, l.TryAcquire} {
		got, err := take(nil, tn, chunk.Ask{Units: 5, Large: 5})
		require.ErrorIs(t, err, acl.ErrOutOfMemory)
		assert.Empty(t, got)
	}
	assert.Equal(t, before, fd.Calls(faultdriver.Any), "no driver call")
	after := p.Stats()
	assert.Equal(t, st.Cached, after.Cached)
	assert.Equal(t, st.HeldBytes, after.HeldBytes)
	assert.Equal(t, st.Hits, after.Hits, "the cached chunk was not taken and put back")

	got, err := l.TakeFree(nil, tn, chunk.Ask{Units: 4, Large: 4}) // fits: the cached one and three fresh
	require.NoError(t, err)
	assert.False(t, l.Fits(1))
	require.NoError(t, l.PutBack(got))
	for _, c := range held[:4] {
		require.NoError(t, l.Put(c))
	}
}
