package chunk_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// An exported chunk is exported once, and freed, never cached, when it comes
// back; the budget counts it until then.
func TestExportedChunkIsFreed(t *testing.T) {
	d := newDriver(t, 64<<20)
	fd := faultdriver.New(d)
	p, err := chunk.New(fd, chunk.Config{Shareable: true, Budget: 4 * g, Scrub: chunk.ScrubOnRelease})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	cs, err := p.Lender().Acquire(0, 2)
	require.NoError(t, err)
	for i, c := range cs {
		require.NoError(t, p.Lender().Map(base.Add(uintptr(i)*g), c))
	}
	s, err := p.Lender().Export(cs[0], 1234)
	require.NoError(t, err)
	again, err := p.Lender().Export(cs[0], 1234)
	require.NoError(t, err)
	assert.Equal(t, s, again, "exported once")
	assert.Equal(t, int64(1), fd.Calls(faultdriver.MemExportToShareableHandle))
	assert.Zero(t, fd.Calls(faultdriver.MemSetPidToShareableHandle), "a descriptor has no allow-list to set")
	assert.Equal(t, int64(1), p.Stats().Exported)

	scrubs := fd.Calls(faultdriver.Memset)
	for i, c := range cs {
		require.NoError(t, p.Lender().Release(base.Add(uintptr(i)*g), c))
		require.NoError(t, p.Lender().Put(c))
	}
	assert.Equal(t, scrubs+1, fd.Calls(faultdriver.Memset), "the shared chunk is not scrubbed on release: the other process may read it")
	st := p.Stats()
	assert.Equal(t, 1, st.Cached, "only the chunk that was not shared is cached")
	assert.Equal(t, int64(1), st.Frees)
	assert.Equal(t, int64(g), st.HeldBytes)
	_, err = p.Lender().Export(cs[0], 1)
	require.ErrorIs(t, err, acl.ErrInvalidParam, "a chunk that is not out")
}

// Pools that cannot share say so.
func TestShareableNeedsSharing(t *testing.T) {
	d := newDriver(t, 64<<20)
	_, err := chunk.New(&noShare{d}, chunk.Config{Shareable: true})
	require.ErrorIs(t, err, acl.ErrNotSupported)
	p, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	c, err := p.Lender().Get()
	require.NoError(t, err)
	_, err = p.Lender().Export(c, 1)
	require.ErrorIs(t, err, acl.ErrInvalidParam, "the host driver exports only chunks made exportable")
	require.NoError(t, p.Lender().Put(c))
}

type noShare struct{ acl.Driver }

func (noShare) Caps() acl.Caps { return acl.Caps{} }

// tokenDriver stands in for another process's exports, ACL-style: a token
// names memory it allocates on first import, and importing it again returns
// the same handle with one more reference.
type tokenDriver struct {
	acl.Driver
	mu    sync.Mutex
	h     map[uint64]acl.PhysicalHandle
	refs  map[acl.PhysicalHandle]int
	sizes map[uint64]uintptr // the bytes a token names, g when it is not here
}

func (d *tokenDriver) Caps() acl.Caps { c := d.Driver.Caps(); c.Sharing = acl.SharingToken; return c }

func (d *tokenDriver) MemImportFromShareableHandle(s acl.ShareableHandle, dev int32) (acl.PhysicalHandle, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s.Value == 0 {
		return 0, acl.NewError("aclrtMemImportFromShareableHandle", acl.ErrCodeRTInvalidHandle, "unknown token")
	}
	if h, ok := d.h[s.Value]; ok {
		d.refs[h]++
		return h, nil
	}
	size := uintptr(g)
	if z, ok := d.sizes[s.Value]; ok {
		size = z
	}
	p := acl.DeviceProp(0, 0)
	h, err := d.Driver.MallocPhysical(size, &p, 0)
	if err != nil {
		return 0, err
	}
	d.h[s.Value], d.refs[h] = h, 1
	return h, nil
}

func (d *tokenDriver) FreePhysical(h acl.PhysicalHandle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n, ok := d.refs[h]; ok && n > 1 {
		d.refs[h]--
		return nil
	}
	delete(d.refs, h)
	for k, v := range d.h {
		if v == h {
			delete(d.h, k)
		}
	}
	return d.Driver.FreePhysical(h)
}

// Imports count against the budget (refused before any driver call), are
// never cached or scrubbed, and two imports of the same memory hold it once.
func TestImport(t *testing.T) {
	d := newDriver(t, 64<<20)
	td := &tokenDriver{Driver: d, h: map[uint64]acl.PhysicalHandle{}, refs: map[acl.PhysicalHandle]int{}}
	fd := faultdriver.New(td)
	p, err := chunk.New(fd, chunk.Config{Budget: 2 * g})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	tok := func(v uint64) acl.ShareableHandle { return acl.ShareableHandle{Value: v} }

	_, err = p.Lender().Import(0, tok(0), g)
	require.ErrorIs(t, err, acl.ErrInvalidHandle)
	assert.Zero(t, p.Stats().HeldBytes, "a failed import holds nothing")

	tn := chunk.NewTenant()
	c1, err := p.Lender().Import(tn, tok(1), g)
	require.NoError(t, err)
	c1b, err := p.Lender().Import(tn, tok(1), g)
	require.NoError(t, err)
	assert.Equal(t, c1, c1b, "the same memory")
	c2, err := p.Lender().Import(tn, tok(2), g)
	require.NoError(t, err)
	assert.Equal(t, uintptr(g), c1.Size, "an import books the size it was given")
	st := p.Stats()
	assert.Equal(t, int64(2*g), st.HeldBytes, "counted once")
	assert.Equal(t, 2, st.InUse)
	assert.Equal(t, int64(2*g), st.InUseBytes)
	assert.Equal(t, int64(3), st.Imported)
	calls := fd.Calls(faultdriver.MemImportFromShareableHandle)
	_, err = p.Lender().Import(tn, tok(3), g)
	require.ErrorIs(t, err, chunk.ErrBudget)
	assert.Equal(t, calls, fd.Calls(faultdriver.MemImportFromShareableHandle), "refused before the driver")

	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	require.NoError(t, p.Lender().MapImported(base, []chunk.Chunk{c1, c2}, false))
	assert.Zero(t, fd.Calls(faultdriver.Memset)+fd.Calls(faultdriver.MemsetAsync), "imported memory is never scrubbed")
	_, err = p.Lender().Export(c1, 1)
	require.ErrorIs(t, err, acl.ErrInvalidParam, "an import cannot be exported again")
	for i, c := range []chunk.Chunk{c1, c2} {
		require.NoError(t, p.Lender().Release(base.Add(uintptr(i)*g), c))
	}
	require.ErrorIs(t, p.Lender().Put(chunk.Chunk{Handle: c1.Handle, Size: 2 * g}), acl.ErrInvalidParam, "not the size it was imported as")
	require.NoError(t, p.Lender().Put(c1))
	assert.Equal(t, 2, p.Stats().InUse, "the second import of c1 still holds it")
	require.NoError(t, p.Lender().Put(c1b))
	require.NoError(t, p.Lender().Put(c2))
	st = p.Stats()
	assert.Zero(t, st.InUse)
	assert.Zero(t, st.Cached, "imports are freed, not cached")
	assert.Zero(t, st.HeldBytes)
	assert.Empty(t, td.refs, "every reference freed")
}

// An import books the size it is given, one of the pool's sizes or not:
// a size that is not a positive multiple of the tail size, or passes the
// largest reservation, is refused before the driver; the same memory
// imported again as another size is refused; MapImported lays chunks of
// several sizes side by side.
func TestImportSizes(t *testing.T) {
	d := newDriver(t, 64<<20)
	td := &tokenDriver{Driver: d, h: map[uint64]acl.PhysicalHandle{}, refs: map[acl.PhysicalHandle]int{},
		sizes: map[uint64]uintptr{2: big, 3: 3 * g}}
	fd := faultdriver.New(td)
	p, err := chunk.New(fd, chunk.Config{Size: big, TailSize: g, Budget: 16 * g})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	tok := func(v uint64) acl.ShareableHandle { return acl.ShareableHandle{Value: v} }
	tn := chunk.NewTenant()

	for _, size := range []uintptr{0, g / 2, g + 4096, d.Caps().ReserveLimit() + g} {
		_, err := p.Lender().Import(tn, tok(1), size)
		require.ErrorIs(t, err, acl.ErrInvalidParam, "%d bytes", size)
	}
	assert.Zero(t, fd.Calls(faultdriver.MemImportFromShareableHandle), "refused before the driver")
	_, err = new(chunk.Pool).Lender().Import(tn, tok(1), g)
	require.ErrorIs(t, err, acl.ErrInvalidParam, "a Pool not made by New")

	tail, err := p.Lender().Import(tn, tok(1), g)
	require.NoError(t, err)
	large, err := p.Lender().Import(tn, tok(2), big)
	require.NoError(t, err)
	odd, err := p.Lender().Import(tn, tok(3), 3*g)
	require.NoError(t, err, "a size the pool does not lend: imports are never cached")
	assert.Equal(t, []uintptr{g, big, 3 * g}, sizes([]chunk.Chunk{tail, large, odd}))
	st := p.Stats()
	assert.Equal(t, int64(8*g), st.HeldBytes)
	assert.Equal(t, int64(8*g), st.InUseBytes)

	_, err = p.Lender().Import(tn, tok(2), g)
	require.ErrorIs(t, err, acl.ErrInvalidHandle, "the same memory as another size")
	assert.Equal(t, st.HeldBytes, p.Stats().HeldBytes, "nothing more booked")
	assert.Equal(t, 1, td.refs[large.Handle], "the second reference dropped")
	again, err := p.Lender().Import(tn, tok(2), big)
	require.NoError(t, err, "the same memory as the same size, within the budget once")
	require.NoError(t, p.Lender().Put(again))

	cs := []chunk.Chunk{tail, large, odd}
	base, err := d.ReserveMemAddress(8*g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	require.NoError(t, p.Lender().MapImported(base, cs, false))
	at := base
	for _, c := range cs {
		require.NoError(t, p.Lender().Release(at, c), "mapped at %v", at)
		require.NoError(t, p.Lender().Put(c))
		at = at.Add(c.Size)
	}
	st = p.Stats()
	assert.Zero(t, st.InUse)
	assert.Zero(t, st.Cached, "imports are freed, not cached")
	assert.Zero(t, st.HeldBytes)
	assert.Empty(t, td.refs, "every reference freed")
}

// A shared chunk whose free fails is kept aside, never cached, and freed by
// Trim.
func TestSharedFreeFails(t *testing.T) {
	d := newDriver(t, 64<<20)
	fd := faultdriver.New(d)
	p, err := chunk.New(fd, chunk.Config{Shareable: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	c, err := p.Lender().Get()
	require.NoError(t, err)
	_, err = p.Lender().Export(c, 0)
	require.NoError(t, err)
	fd.FailNth(faultdriver.FreePhysical, 1, 0)
	require.NoError(t, p.Lender().Put(c))
	st := p.Stats()
	assert.Zero(t, st.Cached, "not cached")
	assert.Equal(t, int64(g), st.HeldBytes, "still held")
	c2, err := p.Lender().Get()
	require.NoError(t, err)
	assert.NotEqual(t, c, c2, "the shared chunk is handed to nobody")
	require.NoError(t, p.Lender().Put(c2))
	require.NoError(t, p.Trim())
	assert.Zero(t, p.Stats().HeldBytes)
}

// A chunk is exported read-only or read-write, once: asking the other way
// later is refused. The exporter's own mapping stays writable.
func TestExportReadOnly(t *testing.T) {
	const g = acl.HugePageSize
	d := newDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{Shareable: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	cs, err := p.Lender().Acquire(0, 2)
	require.NoError(t, err)
	for i, c := range cs {
		require.NoError(t, p.Lender().Map(base.Add(uintptr(i)*g), c))
	}
	_, err = p.Lender().Export(cs[0], 1)
	require.NoError(t, err)
	_, err = p.Lender().ExportReadOnly(cs[0], 1)
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	assert.ErrorContains(t, err, "exported read-write")
	ro, err := p.Lender().ExportReadOnly(cs[1], 1)
	require.NoError(t, err)
	_, err = p.Lender().Export(cs[1], 1)
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	assert.ErrorContains(t, err, "exported read-only")
	again, err := p.Lender().ExportReadOnly(cs[1], 1)
	require.NoError(t, err)
	assert.Equal(t, ro, again, "exported once")
	require.NoError(t, d.MemcpyHtoD(base.Add(g), []byte("still written")), "the exporter's mapping stays writable")
	for i, c := range cs {
		require.NoError(t, p.Lender().Release(base.Add(uintptr(i)*g), c))
		require.NoError(t, p.Lender().Put(c))
	}
	assert.Zero(t, p.Stats().HeldBytes, "shared chunks are freed")
}

// Regression: a shared chunk put back is freed, never cached, after the
// pool's lock is let go; a growth short of device memory meanwhile found the
// chunk neither in the books nor counted as freeing, and failed beside the
// memory its free was about to give back. Now it is counted as freeing, so
// the growth's relief waits for that free and counts it. The Put is held
// between the books and the free until the relief waits for frees under way
// (or, were it unaware, until the Acquire has failed).
func TestRegressionReliefWaitsForASharedFree(t *testing.T) {
	d := newDriver(t, g) // room for one chunk
	p, err := chunk.New(d, chunk.Config{Shareable: true, MaxCached: -1})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	l := p.Lender()
	c, err := l.Get()
	require.NoError(t, err)
	_, err = l.Export(c, 1234)
	require.NoError(t, err)
	freeing, awaits, acquired := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var held, awaited sync.Once
	defer sched.Set(func(at sched.Point, who any) {
		if who != p {
			return
		}
		switch at {
		case sched.SharedFree:
			held.Do(func() {
				close(freeing)
				select {
				case <-awaits:
				case <-acquired: // the relief did not wait: the Acquire is over
				}
			})
		case sched.FreesAwaited:
			awaited.Do(func() { close(awaits) })
		}
	})()
	put := make(chan error, 1)
	go func() { put <- l.Put(c) }()
	<-freeing
	cs, err := l.Acquire(chunk.NewTenant(), 1)
	close(acquired)
	require.NoError(t, err, "the shared chunk's free makes room for the Acquire")
	require.NoError(t, <-put)
	require.NoError(t, l.Put(cs[0]))
}
