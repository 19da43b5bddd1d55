package chunk_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/chunk"
)

const chunkG = acl.HugePageSize

func scrubDriver(t testing.TB, capacity uintptr) *host.Driver {
	t.Helper()
	d, err := host.New(host.Config{Capacity: capacity})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.True(t, d.Live().Zero(), "leaked: %+v", d.Live())
		assert.NoError(t, d.Close())
	})
	return d
}

// scrubPool returns a pool on a fresh host driver and a reservation of 4
// chunks to map into, both given back at the end of the test.
func scrubPool(t *testing.T, cfg chunk.Config) (*host.Driver, *chunk.Pool, acl.DevicePtr) {
	t.Helper()
	d := scrubDriver(t, 64<<20)
	p, err := chunk.New(d, cfg)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(4*chunkG, 0, 0, 0)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, p.Close())
		assert.NoError(t, d.ReleaseMemAddress(base))
	})
	return d, p, base
}

// mapped gets a chunk for owner, maps it at at and returns its bytes.
func mapped(t *testing.T, d *host.Driver, p *chunk.Pool, o chunk.Tenant, at acl.DevicePtr) (chunk.Chunk, []byte) {
	t.Helper()
	c, err := p.Lender().GetFor(o)
	require.NoError(t, err)
	require.NoError(t, p.Lender().Map(at, c))
	b, err := d.Bytes(at, chunkG)
	require.NoError(t, err)
	return c, b
}

// The pool scrubs a chunk when it changes owner, not when its owner takes it
// back; an anonymous Get always counts as a new owner.
func TestScrubOnReuse(t *testing.T) {
	d, p, base := scrubPool(t, chunk.Config{FreshZeroed: true})
	a, b := chunk.NewTenant(), chunk.NewTenant()

	c, mem := mapped(t, d, p, a, base)
	assert.Zero(t, p.Stats().Scrubs, "fresh memory the driver zeroed needs no scrub")
	copy(mem, "a's secret")
	require.NoError(t, p.Lender().Release(base, c))
	require.NoError(t, p.Lender().Put(c))

	c, mem = mapped(t, d, p, a, base)
	assert.Equal(t, "a's secret", string(mem[:10]), "a took its own chunk back, unscrubbed")
	assert.Zero(t, p.Stats().Scrubs)
	require.NoError(t, p.Lender().Release(base, c))
	require.NoError(t, p.Lender().Put(c))

	c, mem = mapped(t, d, p, b, base)
	assert.Equal(t, make([]byte, chunkG), mem, "b sees none of a's bytes")
	assert.Equal(t, int64(1), p.Stats().Scrubs)
	require.NoError(t, p.Lender().Unmap(base))
	require.NoError(t, p.Lender().Put(c))

	c, mem = mapped(t, d, p, 0, base)
	assert.Equal(t, int64(2), p.Stats().Scrubs, "an anonymous owner is a new owner every time")
	copy(mem, "anon")
	require.NoError(t, p.Lender().Unmap(base))
	require.NoError(t, p.Lender().Put(c))
	c, _ = mapped(t, d, p, 0, base)
	assert.Equal(t, int64(3), p.Stats().Scrubs)
	require.NoError(t, p.Lender().Unmap(base))
	require.NoError(t, p.Lender().Put(c))
}

// In ScrubOnRelease mode the chunk is cleared when it is given back, so
// nobody clears it again when it is taken.
func TestScrubOnRelease(t *testing.T) {
	d, p, base := scrubPool(t, chunk.Config{Scrub: chunk.ScrubOnRelease, FreshZeroed: true})
	a, b := chunk.NewTenant(), chunk.NewTenant()
	c, mem := mapped(t, d, p, a, base)
	copy(mem, "a's secret")
	require.NoError(t, p.Lender().Release(base, c))
	assert.Equal(t, int64(1), p.Stats().Scrubs)
	require.NoError(t, p.Lender().Put(c))
	c, mem = mapped(t, d, p, b, base)
	assert.Equal(t, make([]byte, chunkG), mem)
	assert.Equal(t, int64(1), p.Stats().Scrubs, "no second scrub on reuse")
	// A chunk that comes back without Release is scrubbed on reuse instead.
	copy(mem, "b's secret")
	require.NoError(t, p.Lender().Unmap(base))
	require.NoError(t, p.Lender().Put(c))
	c, mem = mapped(t, d, p, a, base)
	assert.Equal(t, make([]byte, chunkG), mem)
	assert.Equal(t, int64(2), p.Stats().Scrubs)
	require.NoError(t, p.Lender().Release(base, c))
	require.NoError(t, p.Lender().Put(c))
}

// GetFor prefers a cached chunk that needs no scrub.
func TestGetForPrefersOwnChunk(t *testing.T) {
	d, p, base := scrubPool(t, chunk.Config{FreshZeroed: true})
	a, b := chunk.NewTenant(), chunk.NewTenant()
	ca, _ := mapped(t, d, p, a, base)
	cb, _ := mapped(t, d, p, b, base+chunkG)
	require.NoError(t, p.Lender().Unmap(base))
	require.NoError(t, p.Lender().Put(ca))
	require.NoError(t, p.Lender().Unmap(base+chunkG))
	require.NoError(t, p.Lender().Put(cb)) // on top of the cache
	c, err := p.Lender().GetFor(a)
	require.NoError(t, err)
	assert.Equal(t, ca, c, "a gets its own chunk, not the one on top")
	require.NoError(t, p.Lender().Put(c))
}

// Bug: a chunk put back twice sat in the cache twice, so two owners could
// map the same physical memory. Now the second Put is refused.
func TestRegressionDoublePutRefused(t *testing.T) {
	d := scrubDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	c, err := p.Lender().Get()
	require.NoError(t, err)
	require.NoError(t, p.Lender().Put(c))
	require.ErrorIs(t, p.Lender().Put(c), acl.ErrInvalidParam)
	require.Equal(t, 1, p.Stats().Cached)
	x, err := p.Lender().Get()
	require.NoError(t, err)
	y, err := p.Lender().Get()
	require.NoError(t, err)
	require.NotEqual(t, x, y, "two Gets never share a chunk")
	require.NoError(t, p.Lender().Put(x))
	require.NoError(t, p.Lender().Put(y))
}

// Bug: a chunk the driver failed to free was dropped from the cache, though
// the driver still held it and the budget still counted it: leaked for good.
// Now it stays cached, and the next Trim or Close frees it.
func TestRegressionFreeFailureKeepsChunk(t *testing.T) {
	d := scrubDriver(t, 64<<20)
	fd := faultdriver.New(d)
	p, err := chunk.New(fd, chunk.Config{MaxCached: 1, Budget: 3 * chunkG})
	require.NoError(t, err)
	var cs []chunk.Chunk
	for range 3 {
		c, err := p.Lender().Get()
		require.NoError(t, err)
		cs = append(cs, c)
	}
	require.NoError(t, p.Lender().Put(cs[0])) // cached
	fd.FailNth(faultdriver.FreePhysical, 1, 0)
	require.NoError(t, p.Lender().Put(cs[1]), "the cache is full: the free fails, the pool keeps the chunk")
	s := p.Stats()
	assert.Equal(t, 2, s.Cached)
	assert.Equal(t, int64(3*chunkG), s.HeldBytes)
	assert.Equal(t, 3, d.Live().Handles)
	c, err := p.Lender().Get()
	require.NoError(t, err, "a kept chunk serves a Get")
	require.NoError(t, p.Lender().Put(c))

	fd.FailNth(faultdriver.FreePhysical, 1, 0)
	err = p.Trim()
	require.Error(t, err)
	assert.Equal(t, 1, p.Stats().Cached, "the chunk Trim could not free stays cached")
	assert.Equal(t, 2, d.Live().Handles)
	require.NoError(t, p.Trim())
	assert.Equal(t, 1, d.Live().Handles)

	fd.FailNth(faultdriver.FreePhysical, 1, 0)
	require.NoError(t, p.Lender().Put(cs[2]))
	require.Error(t, p.Close(), "Close reports what it could not free")
	assert.Equal(t, 1, d.Live().Handles)
	require.NoError(t, p.Close(), "and a second Close frees it")
	assert.True(t, d.Live().Zero())
}

// A Map whose access grant fails and whose undo fails too says so with
// ErrMapped: the chunk is still mapped.
func TestMapErrMapped(t *testing.T) {
	d := scrubDriver(t, 64<<20)
	fd := faultdriver.New(d)
	p, err := chunk.New(fd, chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	base, err := d.ReserveMemAddress(2*chunkG, 0, 0, 0)
	require.NoError(t, err)
	defer d.ReleaseMemAddress(base)
	c, err := p.Lender().Get()
	require.NoError(t, err)
	defer p.Lender().Put(c)

	fd.FailNth(faultdriver.MemSetAccess, 1, 0)
	err = p.Lender().Map(base, c)
	require.Error(t, err)
	require.NotErrorIs(t, err, chunk.ErrMapped, "undone: not mapped")
	require.Zero(t, d.Live().Mappings)

	fd.FailNth(faultdriver.MemSetAccess, 1, 0)
	fd.FailNth(faultdriver.UnmapMem, 1, 0)
	err = p.Lender().Map(base, c)
	require.ErrorIs(t, err, chunk.ErrMapped)
	require.Equal(t, 1, d.Live().Mappings)
	require.NoError(t, p.Lender().Unmap(base))
}

// BenchmarkScrub measures what scrubbing costs in each mode, per chunk
// mapped and unmapped, for the ways arenas use a shared pool:
//
//	self       one owner shrinks and regrows (an arena's own cycle)
//	alternate  two owners take turns with the same chunks (tenants sharing)
//	unused     chunks are released and then freed unused (Shrink, then Trim)
//
// Chunks are 2 MiB on the host driver; fresh memory is known zero.
func BenchmarkScrub(b *testing.B) {
	const n = 8 // chunks per cycle
	for _, mode := range []chunk.Scrub{chunk.ScrubNever, chunk.ScrubOnReuse, chunk.ScrubOnRelease} {
		for _, pattern := range []string{"self", "alternate", "unused"} {
			b.Run(mode.String()+"/"+pattern, func(b *testing.B) {
				d := scrubDriver(b, 256<<20)
				p, err := chunk.New(d, chunk.Config{Scrub: mode, FreshZeroed: true})
				if err != nil {
					b.Fatal(err)
				}
				defer p.Close()
				base, err := d.ReserveMemAddress(n*chunkG, 0, 0, 0)
				if err != nil {
					b.Fatal(err)
				}
				defer d.ReleaseMemAddress(base)
				owners := []chunk.Tenant{chunk.NewTenant(), chunk.NewTenant()}
				cs := make([]chunk.Chunk, n)
				cycle := func(o chunk.Tenant) {
					for i := range cs {
						c, err := p.Lender().GetFor(o)
						if err != nil {
							b.Fatal(err)
						}
						at := base.Add(uintptr(i) * chunkG)
						if err := p.Lender().Map(at, c); err != nil {
							b.Fatal(err)
						}
						cs[i] = c
					}
					for i := n - 1; i >= 0; i-- {
						if err := p.Lender().Release(base.Add(uintptr(i)*chunkG), cs[i]); err != nil {
							b.Fatal(err)
						}
						if err := p.Lender().Put(cs[i]); err != nil {
							b.Fatal(err)
						}
					}
				}
				cycle(owners[0]) // warm the cache
				start := p.Stats().Scrubs
				k := 0
				for b.Loop() {
					k++
					switch pattern {
					case "self":
						cycle(owners[0])
					case "alternate":
						cycle(owners[k%2])
					case "unused":
						cycle(owners[0])
						if err := p.Trim(); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(p.Stats().Scrubs-start)/float64(k*n), "scrubs/chunk")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(k*n), "ns/chunk")
			})
		}
	}
}

// A MapRange whose scrubs were queued on the tenant's stream, and whose wait
// for them failed after another scrub failed, unmaps nothing: the queued
// clears may still run (here they wait behind a kernel), and unmapping under
// them would make the device fault. Every chunk is left mapped, in state
// LeftQueued, for the caller to unmap once the stream is waited for.
func TestMapRangeKeepsChunksUnderQueuedClears(t *testing.T) {
	d := scrubDriver(t, 64<<20)
	fd := faultdriver.New(d)
	p, err := chunk.New(fd, chunk.Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	lend := p.Lender()
	base, err := d.ReserveMemAddress(4*chunkG, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	s, err := d.CreateStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyStream(s)) }()

	// Three chunks that hold tenant x's bytes, in the cache.
	x, v := chunk.NewTenant(), chunk.NewTenant()
	xs, err := lend.Acquire(x, 3)
	require.NoError(t, err)
	_, err = lend.MapRange(base, xs, nil)
	require.NoError(t, err)
	for i, c := range xs {
		require.NoError(t, lend.Unmap(base.Add(uintptr(i)*chunkG)))
		require.NoError(t, lend.Put(c))
	}
	// A kernel in flight on the stream, on one of them.
	k, err := lend.GetFor(x)
	require.NoError(t, err)
	kat := base.Add(3 * chunkG)
	require.NoError(t, lend.Map(kat, k))
	done := make(chan struct{})
	require.NoError(t, d.Launch(s, kat, chunkG, done))

	vs, err := lend.Acquire(v, 2)
	require.NoError(t, err)
	fd.FailNth(faultdriver.MemsetAsync, 2, 0)       // the second chunk's scrub
	fd.FailNth(faultdriver.SynchronizeStream, 1, 0) // and the wait for the first's
	_, err = lend.MapRange(base, vs, []acl.Stream{s})
	var left *chunk.LeftMappedError
	require.ErrorAs(t, err, &left)
	require.Len(t, left.Left, 2, "nothing unmapped under the queued clear")
	for _, l := range left.Left {
		require.Equal(t, chunk.LeftQueued, l.State, "%v", l.At)
	}
	require.Zero(t, d.Faults(), "no unmap under queued work")

	close(done)
	require.NoError(t, d.SynchronizeStream(s))
	for _, l := range left.Left {
		require.NoError(t, lend.Unmap(l.At))
		require.NoError(t, lend.Put(l.C))
	}
	require.NoError(t, lend.Unmap(kat))
	require.NoError(t, lend.Put(k))
	require.Zero(t, d.Faults())
}
