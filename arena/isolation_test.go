package arena_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

func isoDriver(t *testing.T, capacity uintptr) *host.Driver {
	t.Helper()
	d, err := host.New(host.Config{Capacity: capacity})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.True(t, d.Live().Zero(), "leaked: %+v", d.Live())
		assert.NoError(t, d.Close())
	})
	return d
}

func isoArena(t *testing.T, cfg arena.Config) *arena.Arena {
	t.Helper()
	a, err := arena.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, a.Close()) })
	return a
}

// In TrapStale mode a stale pointer into memory that Truncate or Reset
// dropped faults (whole chunks) or reads poison (the chunk kept in part);
// without it, the same pointer still reads the old bytes.
func TestTrapStale(t *testing.T) {
	const g = acl.HugePageSize
	for _, trap := range []bool{false, true} {
		t.Run(map[bool]string{false: "off", true: "on"}[trap], func(t *testing.T) {
			d := isoDriver(t, 64<<20)
			a := isoArena(t, arena.Config{Driver: d, Reserve: 16 << 20, TrapStale: trap})
			b, err := a.Alloc(3*g, 1) // chunks 0, 1 and 2
			require.NoError(t, err)
			require.NoError(t, arena.Fill(b, 7))
			// Raw views of the buffer, as a kernel would hold its pointer.
			tail, err := d.Bytes(b.Ptr().Add(2*g+100), 16)
			require.NoError(t, err)
			dropped, err := d.Bytes(b.Ptr().Add(g/2), 16) // in chunk 0, above the new Len
			require.NoError(t, err)
			kept, err := d.Bytes(b.Ptr(), 16)
			require.NoError(t, err)

			require.NoError(t, a.Truncate(g/4))
			assert.Equal(t, byte(7), kept[0], "bytes below Len are kept")
			if !trap {
				assert.Equal(t, 3*g, a.Cap(), "Truncate keeps the chunks mapped")
				assert.False(t, acltest.ReadFaults(tail, 0))
				assert.Equal(t, byte(7), tail[0], "the stale pointer reads the old bytes")
				assert.Equal(t, byte(7), dropped[0])
				return
			}
			assert.Equal(t, g, a.Cap(), "Truncate unmapped the chunks above Len")
			assert.True(t, acltest.ReadFaults(tail, 0), "a read through a stale pointer did not fault")
			assert.True(t, acltest.WriteFaults(tail, 0), "a write through a stale pointer did not fault")
			assert.Equal(t, bytes.Repeat([]byte{arena.PoisonByte}, 16), dropped, "dropped bytes of the kept chunk are poison")
			dropEnd, err := d.Bytes(a.Base().Add(g-16), 16)
			require.NoError(t, err)
			assert.Equal(t, bytes.Repeat([]byte{arena.PoisonByte}, 16), dropEnd, "up to the end of the kept chunk")

			require.NoError(t, a.Reset())
			assert.Zero(t, a.Cap())
			assert.True(t, acltest.ReadFaults(kept, 0), "after Reset every chunk is gone")
			// The arena works as before.
			b, err = a.Alloc(100, 1)
			require.NoError(t, err)
			require.NoError(t, arena.CopyIn(b, []byte("again")))
		})
	}
}

// secret fills every byte an arena maps with a pattern and returns it.
func secret(t *testing.T, a *arena.Arena, n int) []byte {
	t.Helper()
	b, err := a.Alloc(n, 1)
	require.NoError(t, err)
	data := bytes.Repeat([]byte("tenant A's key! "), n/16)
	require.NoError(t, arena.CopyIn(b, data))
	return data
}

// readAll returns the bytes an arena has mapped, through the host driver.
func readAll(t *testing.T, d *host.Driver, a *arena.Arena) []byte {
	t.Helper()
	mem, err := d.Bytes(a.Base(), uintptr(a.Cap()))
	require.NoError(t, err)
	return bytes.Clone(mem)
}

// A chunk one tenant gives back and another takes from the cache never shows
// the first tenant's bytes, in either scrub mode; with ScrubNever it does (the
// documented opt-out). A tenant taking back its own chunk pays no scrub.
func TestTenantIsolation(t *testing.T) {
	const g = acl.HugePageSize
	for _, mode := range []chunk.Scrub{chunk.ScrubOnReuse, chunk.ScrubOnRelease, chunk.ScrubNever} {
		t.Run(mode.String(), func(t *testing.T) {
			d := isoDriver(t, 64<<20)
			pool, err := chunk.New(d, chunk.Config{Scrub: mode, FreshZeroed: true})
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, pool.Close()) })
			a := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
			b := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
			data := secret(t, a, 4*g)

			// A takes its own chunks back: no scrub on reuse, and its bytes
			// are still there.
			require.NoError(t, a.Truncate(0))
			require.NoError(t, a.Shrink())
			s0 := pool.Stats()
			require.NoError(t, a.Grow(4*g))
			s1 := pool.Stats()
			assert.Equal(t, s0.Hits+4, s1.Hits)
			switch mode {
			case chunk.ScrubOnReuse:
				assert.Equal(t, s0.Scrubs, s1.Scrubs, "an arena's own chunks need no scrub")
				assert.Equal(t, data, readAll(t, d, a), "and keep its bytes")
			case chunk.ScrubOnRelease:
				assert.Equal(t, int64(4), s0.Scrubs, "every released chunk was scrubbed")
			}

			// B takes A's chunks.
			require.NoError(t, a.Shrink())
			require.NoError(t, b.Grow(4*g))
			s2 := pool.Stats()
			assert.Equal(t, s1.Hits+4, s2.Hits, "B reused A's chunks")
			assert.Equal(t, s2.Allocs, s0.Allocs, "no fresh memory")
			mem := readAll(t, d, b)
			if mode == chunk.ScrubNever {
				assert.Contains(t, string(mem), "tenant A's key!", "ScrubNever leaves the bytes")
				return
			}
			assert.Equal(t, make([]byte, 4*g), mem, "B sees none of A's bytes")
			if mode == chunk.ScrubOnReuse {
				assert.Equal(t, s1.Scrubs+4, s2.Scrubs)
			}
		})
	}
}

// dirtyDriver stands for a device whose fresh physical memory holds what an
// earlier user left there: MallocPhysical hands out memory full of it.
type dirtyDriver struct {
	acl.Driver
	h       *host.Driver
	scratch acl.DevicePtr
}

// Caps says fresh memory may hold anything, as on a device that does not
// clear it.
func (d *dirtyDriver) Caps() acl.Caps { return acl.Caps{Fresh: acl.FreshUnknown} }

func (d *dirtyDriver) MallocPhysical(size uintptr, p *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	h, err := d.Driver.MallocPhysical(size, p, flags)
	if err != nil {
		return 0, err
	}
	// Write garbage through a scratch mapping, as a previous process would.
	if err := d.h.MapMem(d.scratch, size, 0, h, 0); err != nil {
		return 0, err
	}
	if err := d.h.MemSetAccess(d.scratch, size, acl.ReadWrite(0)); err != nil {
		return 0, err
	}
	if err := d.h.Memset(d.scratch, 0xEE, size); err != nil {
		return 0, err
	}
	return h, d.h.UnmapMem(d.scratch)
}

// Fresh physical memory is scrubbed too, unless the driver promises zeroes
// (Config.FreshZeroed).
func TestFreshChunksScrubbed(t *testing.T) {
	const g = acl.HugePageSize
	for _, zeroed := range []bool{false, true} {
		d := isoDriver(t, 64<<20)
		scratch, err := d.ReserveMemAddress(g, 0, 0, 0)
		require.NoError(t, err)
		dd := &dirtyDriver{Driver: d, h: d, scratch: scratch}
		pool, err := chunk.New(dd, chunk.Config{FreshZeroed: zeroed})
		require.NoError(t, err)
		a, err := arena.New(arena.Config{Pool: pool, Reserve: 8 << 20})
		require.NoError(t, err)
		require.NoError(t, a.Grow(2*g))
		mem := readAll(t, d, a)
		if zeroed {
			assert.Equal(t, bytes.Repeat([]byte{0xEE}, 2*g), mem, "a driver that breaks its promise is trusted")
			assert.Zero(t, pool.Stats().Scrubs)
		} else {
			assert.Equal(t, make([]byte, 2*g), mem, "fresh chunks were scrubbed")
			assert.Equal(t, int64(2), pool.Stats().Scrubs)
		}
		require.NoError(t, a.Close())
		require.NoError(t, pool.Close())
		require.NoError(t, d.ReleaseMemAddress(scratch))
	}
	// The host driver says its fresh memory is zero (acl.Caps.Fresh); the pool believes it.
	d := isoDriver(t, 64<<20)
	a := isoArena(t, arena.Config{Driver: d, Reserve: 8 << 20})
	require.NoError(t, a.Grow(2*g))
	assert.Zero(t, a.Pool().Stats().Scrubs)
}

// A scrub that fails leaves the chunk marked as holding its old owner's
// bytes: the Grow fails and changes nothing, and the next owner to map it
// scrubs it.
func TestScrubFailureKeepsChunkDirty(t *testing.T) {
	const g = acl.HugePageSize
	d := isoDriver(t, 64<<20)
	fd := faultdriver.New(d)
	pool, err := chunk.New(fd, chunk.Config{FreshZeroed: true})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	a := isoArena(t, arena.Config{Pool: pool, Reserve: 8 << 20})
	b := isoArena(t, arena.Config{Pool: pool, Reserve: 8 << 20})
	secret(t, a, g)
	require.NoError(t, a.Reset())
	require.NoError(t, a.Shrink())
	before := b.Stats()
	fd.FailNth(faultdriver.Memset, 1, 0)
	require.Error(t, b.Grow(g), "the scrub fails, so does the Grow")
	require.Equal(t, before, b.Stats(), "and changes nothing")
	require.NoError(t, b.Grow(g))
	assert.Equal(t, make([]byte, g), readAll(t, d, b), "the retry scrubbed the chunk")
}

// A tenant that hits its pool's budget gets the out-of-memory error; the
// other tenants, on the same pool or on their own pools of the same device,
// keep their memory and their data, and go on allocating.
func TestBudgetIsolation(t *testing.T) {
	const g = acl.HugePageSize
	d := isoDriver(t, 64<<20)
	shared, err := chunk.New(d, chunk.Config{Budget: 6 * g, FreshZeroed: true})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, shared.Close()) })
	own, err := chunk.New(d, chunk.Config{Budget: 4 * g, FreshZeroed: true})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, own.Close()) })

	greedy := isoArena(t, arena.Config{Pool: shared, Reserve: 32 << 20})
	polite := isoArena(t, arena.Config{Pool: shared, Reserve: 32 << 20})
	other := isoArena(t, arena.Config{Pool: own, Reserve: 32 << 20})
	pb, err := polite.Alloc(g+g/2, 1)
	require.NoError(t, err)
	pdata := bytes.Repeat([]byte{0x5A}, pb.Len())
	require.NoError(t, arena.CopyIn(pb, pdata))
	ob, err := other.Alloc(g, 1)
	require.NoError(t, err)
	require.NoError(t, arena.Fill(ob, 0x3C))
	ps, os := polite.Stats(), other.Stats()

	err = greedy.Grow(16 * g)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	require.ErrorIs(t, err, chunk.ErrBudget)
	require.Zero(t, greedy.Cap(), "the failed Grow kept nothing")
	require.NoError(t, greedy.Grow(4*g), "what fits the budget still works")
	_, err = greedy.Alloc(4*g+1, 1)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)

	require.Equal(t, ps, polite.Stats(), "the other tenant of the pool is undisturbed")
	require.Equal(t, os, other.Stats(), "so is the tenant of the other pool")
	got := make([]byte, pb.Len())
	require.NoError(t, arena.CopyOut(got, pb))
	require.Equal(t, pdata, got)
	_, err = polite.Alloc(g/4, 1)
	require.NoError(t, err, "and allocates within its mapped memory")
	_, err = other.Alloc(3*g, 1)
	require.NoError(t, err, "the other pool's budget is its own")
}
