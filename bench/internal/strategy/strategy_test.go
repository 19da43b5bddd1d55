package strategy

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/model"
	"github.com/vmarena/vmarena/bench/internal/counting"
	"github.com/vmarena/vmarena/internal/skip"
)

const mib = 1 << 20

// newDriver returns an untimed device model under a counting wrapper with
// budget, and checks at the end that nothing was left behind.
func newDriver(t *testing.T, budget int64) *counting.Driver {
	t.Helper()
	m, err := model.New(model.Config{Untimed: true, NoData: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.True(t, m.Live().Zero(), "left behind: %+v", m.Live())
		require.NoError(t, m.Close())
	})
	return counting.New(m, budget)
}

func TestPaged(t *testing.T) {
	cd := newDriver(t, 9*mib)
	st, err := New("paged", Config{Driver: cd, Budget: 9 * mib, Block: 2 * mib})
	require.NoError(t, err)
	require.NoError(t, st.Prepare())
	assert.Equal(t, int64(8*mib), cd.Memory().Physical, "the budget in whole blocks and granules, allocated once")
	calls := cd.CallCount()

	a, err := st.Open(8 * mib)
	require.NoError(t, err)
	b, err := st.Open(8 * mib)
	require.NoError(t, err)
	require.NoError(t, a.Grow(3*mib)) // two blocks
	require.NoError(t, b.Grow(2*mib)) // one
	require.NoError(t, b.Grow(2*mib)) // Len is 0: still one
	err = b.Grow(6 * mib)             // two more: only one free
	require.ErrorIs(t, err, acl.ErrOutOfMemory, "out of blocks: preempt")
	assert.Equal(t, 1, st.(*pagedStrategy).FreeBlocks(), "a failed Grow takes nothing")

	// Tensors never straddle blocks; Ptr follows the block table.
	off, err := a.Alloc(mib+mib/2, 256)
	require.NoError(t, err)
	assert.Zero(t, off)
	off, err = a.Alloc(mib, 256)
	require.NoError(t, err)
	assert.Equal(t, int64(2*mib), off, "moved to the next block")
	p0, err := a.Ptr(0, 16)
	require.NoError(t, err)
	p1, err := a.Ptr(2*mib, 16)
	require.NoError(t, err)
	assert.Equal(t, p0.Add(2*mib), p1, "blocks 0 and 1 of the pool, in the table's order")
	_, err = a.Ptr(mib, 2*mib)
	require.Error(t, err, "a range across blocks")
	_, err = a.Alloc(2*mib, 256)
	require.ErrorIs(t, err, ErrFull)

	require.NoError(t, a.Truncate(mib))
	assert.Equal(t, 2, st.(*pagedStrategy).FreeBlocks(), "the block wholly above Len went back")
	require.NoError(t, b.Grow(6*mib), "now it fits")
	assert.Equal(t, calls, cd.CallCount(), "no driver call after Prepare")
	require.Error(t, st.Close(), "blocks still in use")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	require.NoError(t, st.Close())
	assert.Zero(t, cd.Memory().Physical)
}

func TestCaching(t *testing.T) {
	cd := newDriver(t, 64*mib)
	st, err := New("caching", Config{Driver: cd})
	require.NoError(t, err)
	c := st.(*cachingStrategy)
	r, err := st.Open(0)
	require.NoError(t, err)

	// Two small tensors share one 2 MiB segment; a large one gets 20 MiB.
	require.NoError(t, r.Grow(100))
	require.NoError(t, r.Grow(300<<10))
	require.NoError(t, r.Grow(3*mib))
	assert.Equal(t, int64(22*mib), cd.Memory().Physical)
	n := cd.CallCount()

	// Freed blocks merge: the segment is whole again, and taken again
	// without a driver call.
	require.NoError(t, r.Truncate(0))
	assert.Equal(t, int64(22*mib), c.cached(), "all cached, none given back")
	assert.Len(t, c.pools[0].free, 1, "the small segment is one free block again")
	assert.Len(t, c.pools[1].free, 1)
	require.NoError(t, r.Grow(mib))
	require.NoError(t, r.Grow(19*mib))
	assert.Equal(t, n, cd.CallCount(), "served from the cache")
	off, err := r.Alloc(19*mib, 256)
	require.NoError(t, err)
	p, err := r.Ptr(off, 19*mib)
	require.NoError(t, err)
	assert.NotZero(t, p)

	// Out of memory: the cache is released and the allocation tried again.
	require.NoError(t, r.Truncate(0))
	require.NoError(t, r.Grow(60*mib))
	assert.Equal(t, int64(60*mib), cd.Memory().Physical, "the cached segments were freed for it")
	require.ErrorIs(t, r.Grow(8*mib), acl.ErrOutOfMemory)
	require.NoError(t, r.Close())
	require.NoError(t, st.Close())
	assert.Zero(t, cd.Memory().Physical)
}

func TestCachingExpandable(t *testing.T) {
	cd := newDriver(t, 0)
	st, err := New("caching-expandable", Config{Driver: cd})
	require.NoError(t, err)
	c := st.(*cachingStrategy)
	r, err := st.Open(0)
	require.NoError(t, err)
	require.NoError(t, r.Grow(3*mib)) // one 20 MiB page
	off, err := r.Alloc(3*mib, 256)
	require.NoError(t, err)
	p0, err := r.Ptr(off, 16)
	require.NoError(t, err)
	require.NoError(t, r.Grow(30*mib)) // the free end grows by one page (17 MiB free + 20)
	assert.Equal(t, int64(40*mib), cd.Memory().Physical)
	assert.Equal(t, int64(1), cd.Calls().N[counting.Reserve], "one reservation for the pool")
	assert.Equal(t, int64(2), cd.Calls().N[counting.SetAccess], "one access call per growth")
	_, err = r.Alloc(30*mib, 256)
	require.NoError(t, err)
	_, err = r.Alloc(256, 256)
	require.ErrorIs(t, err, ErrFull, "each Grow is its own tensor")
	require.NoError(t, r.Truncate(0))
	require.Len(t, c.pools[1].free, 1, "merged into one free block")
	require.NoError(t, c.releaseAll())
	assert.Zero(t, cd.Memory().Physical, "the free end's pages unmapped")
	require.NoError(t, r.Grow(mib+1))
	off, err = r.Alloc(mib, 256)
	require.NoError(t, err)
	p1, err := r.Ptr(off, 16)
	require.NoError(t, err)
	assert.Equal(t, p0, p1, "the same segment grows again from its base")
	require.NoError(t, r.Close())
	require.NoError(t, st.Close())
	assert.Zero(t, cd.Memory().Physical)
}

// TestCachingExpandableFollowsTheDriver grows the expandable segment by
// three pages at once on the host driver, which keeps ACL's rule (one
// MemSetAccess per mapping) unless told to allow spans as CUDA does: the
// access calls follow acl.Caps.AccessSpan, and the memory is usable.
func TestCachingExpandableFollowsTheDriver(t *testing.T) {
	for _, span := range []bool{false, true} {
		h, err := host.New(host.Config{Capacity: 256 * mib, AccessSpan: span})
		if errors.Is(err, acl.ErrNotSupported) {
			skip.Unsupported(t, "the host driver: %v", err)
		}
		require.NoError(t, err)
		cd := counting.New(h, 0)
		st, err := New("caching-expandable", Config{Driver: cd})
		require.NoError(t, err)
		r, err := st.Open(0)
		require.NoError(t, err)
		require.NoError(t, r.Grow(50*mib), "AccessSpan %v: three 20 MiB pages in one growth", span)
		calls := cd.Calls()
		require.Equal(t, int64(3), calls.N[counting.Map])
		want := int64(3)
		if span {
			want = 1
		}
		assert.Equal(t, want, calls.N[counting.SetAccess], "AccessSpan %v: access calls", span)
		assert.Equal(t, int64(3), cd.Memory().MaxMapBatch)
		off, err := r.Alloc(50*mib, 256)
		require.NoError(t, err)
		p, err := r.Ptr(off, 50*mib)
		require.NoError(t, err)
		require.NoError(t, h.Memset(p, 0xA5, 50*mib), "the whole run is accessible")
		require.NoError(t, r.Close())
		require.NoError(t, st.Close())
		assert.True(t, h.Live().Zero(), "%+v", h.Live())
		require.NoError(t, h.Close())
	}
}

// A model's Wake on the serving loop must not wait for memory only that
// loop can free: with another model holding the whole budget, the sleeping
// model's Wake fails (out of memory, still asleep) instead of waiting
// forever, and succeeds once the memory is back.
func TestArenaWakeWithoutMemoryFails(t *testing.T) {
	cd := newDriver(t, 0)
	st, err := New("arena", Config{Driver: cd, Budget: 8 * mib})
	require.NoError(t, err)
	require.NoError(t, st.Prepare())
	parts, err := Split(st, []int64{4 * mib, 4 * mib})
	require.NoError(t, err)

	a, err := parts[0].Open(8 * mib)
	require.NoError(t, err)
	require.NoError(t, a.Grow(4*mib))
	require.NoError(t, a.(Sleeper).Sleep())
	b, err := parts[1].Open(8 * mib)
	require.NoError(t, err)
	require.NoError(t, b.Grow(8*mib), "the sleeping model's memory went back: the whole budget")

	done := make(chan error, 1)
	go func() { done <- a.(Sleeper).Wake() }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Wake waited for memory that only its caller could free")
	}
	require.ErrorIs(t, err, acl.ErrOutOfMemory)

	require.NoError(t, b.Truncate(0))
	require.NoError(t, b.Trim())
	require.NoError(t, a.(Sleeper).Wake(), "the memory is back")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	for _, p := range parts {
		require.NoError(t, p.Close())
	}
	require.NoError(t, st.Close())
}
