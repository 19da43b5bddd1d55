package chunk_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/chunk"
)

const g = acl.HugePageSize

func newDriver(t *testing.T, capacity uintptr) *host.Driver {
	d, err := host.New(host.Config{Capacity: capacity})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.True(t, d.Live().Zero(), "leaked: %+v", d.Live())
		assert.NoError(t, d.Close())
	})
	return d
}

func TestConfig(t *testing.T) {
	d := newDriver(t, 64<<20)
	_, err := chunk.New(nil, chunk.Config{})
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	_, err = chunk.New(d, chunk.Config{Size: g + 4096})
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	_, err = chunk.New(d, chunk.Config{Size: -1})
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	_, err = chunk.New(d, chunk.Config{Budget: -1})
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	_, err = chunk.New(d, chunk.Config{MemAttr: acl.HBMMem})
	require.ErrorIs(t, err, acl.ErrInvalidParam, "ACL_HBM_MEM is not a physical attribute")
	p, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	require.Equal(t, g, p.ChunkSize())
	require.Same(t, d, p.Driver().(*host.Driver))
	require.NoError(t, p.Close())
}

func TestCacheReuse(t *testing.T) {
	d := newDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{Size: 2 * g, MaxCached: 2})
	require.NoError(t, err)
	var cs []chunk.Chunk
	for range 4 {
		c, err := p.Lender().Get()
		require.NoError(t, err)
		cs = append(cs, c)
	}
	for _, c := range cs {
		require.NoError(t, p.Lender().Put(c))
	}
	s := p.Stats()
	assert.Equal(t, chunk.Stats{ChunkSize: 2 * g, TailSize: 2 * g, Cached: 2, HeldBytes: 4 * g, CachedBytes: 4 * g, Misses: 4, Allocs: 4, Frees: 2, Evictions: 2}, s)
	assert.Equal(t, 2, d.Live().Handles, "the cache bound freed the rest")
	// LIFO: the chunk put back last comes out first.
	c, err := p.Lender().Get()
	require.NoError(t, err)
	assert.Equal(t, cs[1], c)
	assert.Equal(t, int64(1), p.Stats().Hits)
	require.NoError(t, p.Lender().Put(c))
	require.NoError(t, p.Trim())
	assert.Zero(t, d.Live().Handles)
	assert.Zero(t, p.Stats().HeldBytes)
	require.NoError(t, p.Close())
}

func TestNoCache(t *testing.T) {
	d := newDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{MaxCached: -1})
	require.NoError(t, err)
	c, err := p.Lender().Get()
	require.NoError(t, err)
	require.NoError(t, p.Lender().Put(c))
	assert.Zero(t, d.Live().Handles)
	require.NoError(t, p.Close())
}

func TestBudget(t *testing.T) {
	d := newDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{Budget: 3 * g})
	require.NoError(t, err)
	var cs []chunk.Chunk
	for range 3 {
		c, err := p.Lender().Get()
		require.NoError(t, err)
		cs = append(cs, c)
	}
	_, err = p.Lender().Get()
	require.ErrorIs(t, err, chunk.ErrBudget)
	require.ErrorIs(t, err, acl.ErrOutOfMemory)
	assert.Equal(t, int64(1), p.Stats().Failures)
	// A cached chunk counts against the budget but serves the next Get.
	require.NoError(t, p.Lender().Put(cs[0]))
	c, err := p.Lender().Get()
	require.NoError(t, err)
	cs[0] = c
	for _, c := range cs {
		require.NoError(t, p.Lender().Put(c))
	}
	require.NoError(t, p.Close())
}

func TestDeviceOOM(t *testing.T) {
	d := newDriver(t, 2*g)
	p, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	a, err := p.Lender().Get()
	require.NoError(t, err)
	b, err := p.Lender().Get()
	require.NoError(t, err)
	_, err = p.Lender().Get()
	require.ErrorIs(t, err, acl.ErrOutOfMemory)
	code, ok := acl.CodeOf(err)
	require.True(t, ok)
	require.Equal(t, acl.ErrCodeRTMemoryAllocation, code)
	assert.Equal(t, int64(2*g), p.Stats().HeldBytes, "a failed allocation holds nothing")
	require.NoError(t, p.Lender().Put(a))
	require.NoError(t, p.Lender().Put(b))
	require.NoError(t, p.Close())
}

func TestCloseReportsChunksInUse(t *testing.T) {
	d := newDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	c, err := p.Lender().Get()
	require.NoError(t, err)
	require.ErrorContains(t, p.Close(), "1 chunks still in use")
	require.NoError(t, p.Close(), "second Close")
	_, err = p.Lender().Get()
	require.ErrorIs(t, err, chunk.ErrClosed)
	require.NoError(t, p.Lender().Put(c), "a chunk put back after Close is freed")
	assert.Zero(t, d.Live().Handles)
}

func TestMapUnmap(t *testing.T) {
	d := newDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	c, err := p.Lender().Get()
	require.NoError(t, err)
	require.NoError(t, p.Lender().Map(base, c))
	b, err := d.Bytes(base, g)
	require.NoError(t, err, "Map granted access")
	b[0] = 1
	require.Error(t, p.Lender().Map(base, c), "double map")
	require.NoError(t, p.Lender().Unmap(base))
	require.Error(t, p.Lender().Unmap(base))
	require.NoError(t, p.Lender().Put(c))
	require.NoError(t, d.ReleaseMemAddress(base))
	require.NoError(t, p.Close())
}

func TestConcurrentGetPut(t *testing.T) {
	d := newDriver(t, 256<<20)
	p, err := chunk.New(d, chunk.Config{MaxCached: 8, Budget: 32 * g})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				c, err := p.Lender().Get()
				if err != nil {
					assert.ErrorIs(t, err, chunk.ErrBudget)
					continue
				}
				assert.NoError(t, p.Lender().Put(c))
			}
		}()
	}
	wg.Wait()
	s := p.Stats()
	assert.Zero(t, s.InUse)
	assert.LessOrEqual(t, s.HeldBytes, int64(32*g))
	assert.Equal(t, s.Allocs-s.Frees, int64(s.Cached), "every chunk held is in the cache")
	assert.Equal(t, int64(s.Cached), int64(d.Live().Handles))
	require.NoError(t, p.Close())
}
