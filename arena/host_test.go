package arena_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// A pointer into a tail that Shrink unmapped faults on the host driver: it
// cannot read the bytes the chunk holds for its next owner.
func TestShrunkTailFaults(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer d.Close()
	a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20})
	require.NoError(t, err)
	defer a.Close()
	b, err := a.Alloc(6<<20, 1)
	require.NoError(t, err)
	tail, err := d.Bytes(b.Ptr().Add(5<<20), 4096)
	require.NoError(t, err)
	tail[0] = 1
	require.NoError(t, a.Truncate(1<<20))
	require.NoError(t, a.Shrink())
	require.Equal(t, 2<<20, a.Cap())
	require.True(t, acltest.ReadFaults(tail, 0), "a read of the shrunk tail did not fault")
	head, err := d.Bytes(a.Base(), 16)
	require.NoError(t, err, "the kept chunk is still mapped")
	require.False(t, acltest.ReadFaults(head, 0))
}

// On a device with 8 chunks, two arenas on one pool run it out of memory and
// the failing Grow changes nothing, in either arena or the driver.
func TestGrowOOMLeavesDriverUnchanged(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 8 * acl.HugePageSize})
	require.NoError(t, err)
	defer d.Close()
	pool, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	defer pool.Close()
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 64 << 20})
	require.NoError(t, err)
	defer a.Close()
	b, err := arena.New(arena.Config{Pool: pool, Reserve: 64 << 20})
	require.NoError(t, err)
	defer b.Close()
	require.NoError(t, a.Grow(5*acl.HugePageSize))
	live, sa, sb := d.Live(), a.Stats(), b.Stats()
	err = b.Grow(4 * acl.HugePageSize)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	now := d.Live()
	require.Equal(t, live.Mappings, now.Mappings, "no mapping left behind")
	require.Equal(t, live.Handles+3, now.Handles, "the three chunks it did get are cached, not lost")
	require.Equal(t, sa, a.Stats())
	got := b.Stats()
	sb.Maps, sb.Unmaps = got.Maps, got.Unmaps
	require.Equal(t, sb, got)
	require.Equal(t, 3, pool.Stats().Cached, "the three chunks it did get wait in the cache")
}

func TestBadArguments(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer d.Close()
	for _, cfg := range []arena.Config{
		{Driver: d, Reserve: -1},
		{Driver: d, Reserve: arena.MaxReserve + 1},
		{Driver: d, Reserve: 200 << 30}, // over ACL's 128 GiB per reservation
		{Driver: d, Chunk: chunk.Config{Size: 3 << 20}},
	} {
		_, err := arena.New(cfg)
		require.ErrorIs(t, err, arena.ErrInvalid, "%+v", cfg)
	}
	other, err := host.New(host.Config{Capacity: 8 << 20})
	require.NoError(t, err)
	defer other.Close()
	pool, err := chunk.New(other, chunk.Config{})
	require.NoError(t, err)
	defer pool.Close()
	_, err = arena.New(arena.Config{Driver: d, Pool: pool})
	require.ErrorIs(t, err, arena.ErrInvalid, "driver and pool disagree")

	a, err := arena.New(arena.Config{Driver: d, Reserve: 8 << 20})
	require.NoError(t, err)
	defer a.Close()
	for _, c := range []struct{ size, align int }{{-1, 1}, {1, 0}, {1, 3}, {1, -8}, {1, 1 << 40}} {
		_, err := a.Alloc(c.size, c.align)
		require.ErrorIs(t, err, arena.ErrInvalid, "%+v", c)
	}
	require.ErrorIs(t, a.Grow(-1), arena.ErrInvalid)
	require.Zero(t, a.Cap(), "bad arguments map nothing")
	b, err := a.Alloc(0, 1)
	require.NoError(t, err, "a zero-length buffer is fine")
	require.Zero(t, b.Len())
	var zero arena.Buffer
	require.ErrorIs(t, arena.CopyIn(zero, []byte{1}), arena.ErrInvalid)
	require.Zero(t, zero.Ptr())
}
