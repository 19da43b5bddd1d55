package chunk_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/chunk"
)

// Allocs - Frees is what the driver holds: a FreePhysical the driver refused
// freed nothing, on every path alike (a Put past the cache, a Trim, a Free).
func TestFreesCountOnlyFrees(t *testing.T) {
	d := scrubDriver(t, 64<<20)
	fd := faultdriver.New(d)
	p, err := chunk.New(fd, chunk.Config{MaxCached: 1, Budget: 4 * chunkG})
	require.NoError(t, err)
	check := func(what string) {
		t.Helper()
		s := p.Stats()
		assert.Equal(t, int64(d.Live().Handles), s.Allocs-s.Frees, "%s: Allocs-Frees against the driver's live handles", what)
	}
	var cs []chunk.Chunk
	for range 4 {
		c, err := p.Lender().Get()
		require.NoError(t, err)
		cs = append(cs, c)
	}
	check("after the Gets")
	require.NoError(t, p.Lender().Put(cs[0])) // cached
	fd.FailNth(faultdriver.FreePhysical, 1, 0)
	require.NoError(t, p.Lender().Put(cs[1])) // cache full: free refused, kept cached
	check("after a refused eviction")
	fd.FailNth(faultdriver.FreePhysical, 1, 0)
	require.Error(t, p.Trim())
	check("after a refused Trim")
	fd.FailNth(faultdriver.FreePhysical, 1, 0)
	require.Error(t, p.Lender().Free(cs[2]))
	check("after a refused Free")
	require.NoError(t, p.Lender().Put(cs[2]))
	require.NoError(t, p.Lender().Put(cs[3]))
	require.NoError(t, p.Close())
	check("after Close")
}

// Stats.Failures is exported as vmarena_pool_ooms_total, "Acquires that
// failed for want of memory": an import the driver refuses for a bad handle
// is no shortage, as an Acquire whose MallocPhysical fails for another
// reason than memory is none.
func TestImportBadHandleIsNoOOM(t *testing.T) {
	d := newDriver(t, 64<<20)
	td := &tokenDriver{Driver: d, h: map[uint64]acl.PhysicalHandle{}, refs: map[acl.PhysicalHandle]int{}}
	p, err := chunk.New(td, chunk.Config{Budget: 2 * g})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	_, err = p.Lender().Import(0, acl.ShareableHandle{Value: 0}, g)
	require.ErrorIs(t, err, acl.ErrInvalidHandle)
	require.NotErrorIs(t, err, acl.ErrOutOfMemory)
	assert.Zero(t, p.Stats().Failures, "a bad handle counted as an out-of-memory failure")
}
