package chunk_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/chunk"
)

// Free gives a chunk straight back to the driver: not to the cache, out of
// the budget; a chunk that is not out is refused, and one the driver will
// not free stays with the caller.
func TestFree(t *testing.T) {
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer hd.Close()
	fd := faultdriver.New(hd)
	p, err := chunk.New(fd, chunk.Config{Budget: 4 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()

	cs, err := p.Lender().Acquire(0, 2)
	require.NoError(t, err)
	require.Equal(t, 2, hd.Live().Handles)
	require.NoError(t, p.Lender().Free(cs[0]))
	require.Equal(t, 1, hd.Live().Handles, "freed to the driver")
	s := p.Stats()
	require.Zero(t, s.Cached, "not cached")
	require.Equal(t, 1, s.InUse)
	require.Equal(t, int64(2<<20), s.HeldBytes)
	require.ErrorIs(t, p.Lender().Free(cs[0]), acl.ErrInvalidParam, "freed twice")

	fd.FailNth(faultdriver.FreePhysical, 1, 0)
	require.Error(t, p.Lender().Free(cs[1]))
	require.Equal(t, 1, p.Stats().InUse, "the driver kept it: still out, with the caller")
	require.Equal(t, 1, hd.Live().Handles)
	require.NoError(t, p.Lender().Free(cs[1]), "and the caller can try again")
	require.Zero(t, p.Stats().HeldBytes)
	require.True(t, hd.Live().Zero(), "%+v", hd.Live())

	// The budget it made room in is usable at once.
	cs, err = p.Lender().Acquire(0, 2)
	require.NoError(t, err)
	require.NoError(t, p.Lender().Free(cs[0]))
	require.NoError(t, p.Lender().Free(cs[1]))
}

// afterFree runs a hook right after the driver's FreePhysical returns, before
// the caller hears of it: the window in which a runtime may hand the freed
// handle's value to another allocation.
type afterFree struct {
	acl.Driver
	hook func(acl.PhysicalHandle)
}

func (d *afterFree) FreePhysical(h acl.PhysicalHandle) error {
	err := d.Driver.FreePhysical(h)
	if err == nil && d.hook != nil {
		hook := d.hook
		d.hook = nil
		hook(h)
	}
	return err
}

// Free takes a chunk off the pool's books before the driver call that makes
// its handle reusable: a growth of another arena that gets the freed value
// back from MallocPhysical in that window keeps its chunk (the driver hands
// freed values out again, as a device runtime does).
func TestFreeBooksBeforeTheDriverCall(t *testing.T) {
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer hd.Close()
	d := &afterFree{Driver: hd}
	p, err := chunk.New(d, chunk.Config{MaxCached: -1})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()

	cs, err := p.Lender().Acquire(0, 1)
	require.NoError(t, err)
	var again []chunk.Chunk
	d.hook = func(freed acl.PhysicalHandle) {
		again, err = p.Lender().Acquire(0, 1)
		require.NoError(t, err)
		require.Equal(t, freed, again[0].Handle, "the driver handed the freed value out again")
	}
	require.NoError(t, p.Lender().Free(cs[0]))
	require.Len(t, again, 1)
	require.Equal(t, 1, p.Stats().InUse, "the new chunk is still out")
	require.NoError(t, p.Lender().Put(again[0]), "the new chunk is still the pool's")
	require.Zero(t, p.Stats().InUse)
}
