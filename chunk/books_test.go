package chunk_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
)

// holdFree is a driver whose next FreePhysical, once hold is called, closes
// entered and waits for release: a free under way, seen from outside.
type holdFree struct {
	acl.Driver
	mu               sync.Mutex
	entered, release chan struct{}
}

// hold makes the next FreePhysical wait; it returns the channel that call
// closes when it starts and the one that lets it go on.
func (d *holdFree) hold() (entered, release chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.entered, d.release = make(chan struct{}), make(chan struct{})
	return d.entered, d.release
}

func (d *holdFree) FreePhysical(h acl.PhysicalHandle) error {
	d.mu.Lock()
	entered, release := d.entered, d.release
	d.entered, d.release = nil, nil
	d.mu.Unlock()
	if entered != nil {
		close(entered)
		<-release
	}
	return d.Driver.FreePhysical(h)
}

// whileFreeing runs f on a goroutine with its first FreePhysical held,
// calls seen while the free is under way, then lets it finish and returns
// f's error.
func whileFreeing(d *holdFree, f func() error, seen func()) error {
	entered, release := d.hold()
	done := make(chan error, 1)
	go func() { done <- f() }()
	<-entered
	seen()
	close(release)
	return <-done
}

// On a pool of one size, every byte field of Stats is its count times the
// chunk size, whatever brought the chunks where they are, and HeldBytes is
// the sum of the byte fields (no allocation under way).
func TestStatsBytesAgree(t *testing.T) {
	d := newDriver(t, 64<<20)
	hd := &holdFree{Driver: d}
	const size = 2 * g // not the granularity, so that counting by it shows
	p, err := chunk.New(hd, chunk.Config{Size: size, MaxCached: 2})
	require.NoError(t, err)
	l := p.Lender()
	base, err := d.ReserveMemAddress(3*size, 0, 0, 0)
	require.NoError(t, err)
	s, err := d.CreateStream()
	require.NoError(t, err)
	defer func() {
		assert.NoError(t, d.ReleaseMemAddress(base))
		assert.NoError(t, d.DestroyStream(s))
	}()
	check := func(what string, inUse, cached, pending, freeing int) {
		t.Helper()
		st := p.Stats()
		require.Equal(t, size, st.ChunkSize)
		assert.Equal(t, []int{inUse, cached, pending, freeing}, []int{st.InUse, st.Cached, st.Pending, st.Freeing},
			"%s: InUse, Cached, Pending, Freeing", what)
		bytes := func(n int) int64 { return int64(n) * int64(st.ChunkSize) }
		assert.Equal(t, bytes(st.InUse), st.InUseBytes, "%s: InUseBytes", what)
		assert.Equal(t, bytes(st.Cached), st.CachedBytes, "%s: CachedBytes", what)
		assert.Equal(t, bytes(st.Pending), st.PendingBytes, "%s: PendingBytes", what)
		assert.Equal(t, bytes(st.Freeing), st.FreeingBytes, "%s: FreeingBytes", what)
		assert.Equal(t, st.InUseBytes+st.CachedBytes+st.FreeingBytes, st.HeldBytes, "%s: HeldBytes", what)
	}
	at := func(i int) acl.DevicePtr { return base.Add(uintptr(i) * size) }

	check("new", 0, 0, 0, 0)
	cs, err := l.Acquire(0, 3)
	require.NoError(t, err)
	for _, c := range cs {
		assert.Equal(t, uintptr(size), c.Size, "the pool sets the size")
	}
	check("acquire", 3, 0, 0, 0)
	_, err = l.MapRange(base, cs, nil)
	require.NoError(t, err)
	assert.Equal(t, 3, d.Live().Mappings)
	check("map", 3, 0, 0, 0)
	require.NoError(t, l.SyncDevice())
	require.NoError(t, l.Release(at(2), cs[2]))
	check("release", 3, 0, 0, 0)
	require.NoError(t, l.Put(cs[2]))
	check("put", 2, 1, 0, 0)

	kernel := make(chan struct{})
	require.NoError(t, d.Launch(s, at(1), size, kernel))
	require.NoError(t, l.ReleaseAfter([]chunk.Mapped{{At: at(1), C: cs[1]}}, []acl.Stream{s}))
	check("release after", 2, 1, 1, 0)
	close(kernel)
	waitFor(t, func() bool { return !l.Pending(at(1)) }, "the worker to unmap the chunk")
	check("settled", 1, 2, 0, 0)

	require.NoError(t, whileFreeing(hd, p.Trim, func() { check("trimming", 1, 0, 0, 2) }))
	check("trim", 1, 0, 0, 0)
	n, err := p.Warm(2)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	check("warm", 1, 2, 0, 0)

	require.NoError(t, l.Release(at(0), cs[0]))
	require.NoError(t, whileFreeing(hd, func() error { return l.Put(cs[0]) }, func() { check("evicting", 0, 2, 0, 1) }))
	check("evict", 0, 2, 0, 0)
	assert.Equal(t, int64(1), p.Stats().Evictions)

	c, err := l.Get()
	require.NoError(t, err)
	check("get", 1, 1, 0, 0)
	require.NoError(t, whileFreeing(hd, func() error { return l.Free(c) }, func() { check("freeing", 0, 1, 0, 1) }))
	check("free", 0, 1, 0, 0)
	require.NoError(t, p.Close())
	check("closed", 0, 0, 0, 0)
}

// A chunk whose Size is not the one the pool lent it out with is refused
// by every entry point that takes a chunk back, with acl.ErrInvalidParam and
// a message naming both sizes, before any driver call: nothing changes. The
// chunk with its true size still works afterwards.
func TestChunkSizeMustMatchLease(t *testing.T) {
	d := newDriver(t, 64<<20)
	const size = 2 * g
	p, err := chunk.New(d, chunk.Config{Size: size})
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close()) }()
	l := p.Lender()
	m, err := l.Join(&refiller{}, false)
	require.NoError(t, err)
	defer m.Leave()
	base, err := d.ReserveMemAddress(3*size, 0, 0, 0)
	require.NoError(t, err)
	s, err := d.CreateStream()
	require.NoError(t, err)
	defer func() {
		assert.NoError(t, d.ReleaseMemAddress(base))
		assert.NoError(t, d.DestroyStream(s))
	}()
	at := func(i int) acl.DevicePtr { return base.Add(uintptr(i) * size) }
	cs, err := l.Acquire(0, 2)
	require.NoError(t, err)
	other, c := cs[0], cs[1]
	require.NoError(t, l.Map(at(2), c)) // mapped, so that a Release or a release after has something to act on

	for _, wrong := range []uintptr{0, g, 2 * size} {
		bad := chunk.Chunk{Handle: c.Handle, Size: wrong}
		for _, op := range []struct {
			name string
			f    func() error
		}{
			{"Put", func() error { return l.Put(bad) }},
			{"PutBack", func() error { return l.PutBack([]chunk.Chunk{bad}) }},
			{"Free", func() error { return l.Free(bad) }},
			{"Map", func() error { return l.Map(at(0), bad) }},
			{"MapRange", func() error { _, err := l.MapRange(at(0), []chunk.Chunk{other, bad}, nil); return err }},
			{"MapImported", func() error { return l.MapImported(at(0), []chunk.Chunk{other, bad}, false) }},
			{"Release", func() error { return l.Release(at(2), bad) }},
			{"ReleaseAfter", func() error { return l.ReleaseAfter([]chunk.Mapped{{At: at(2), C: bad}}, []acl.Stream{s}) }},
			{"Member.ReleaseAfter", func() error { return m.ReleaseAfter([]chunk.Mapped{{At: at(2), C: bad}}, []acl.Stream{s}) }},
			{"Member.ReleaseAfterDevice", func() error { return m.ReleaseAfterDevice([]chunk.Mapped{{At: at(2), C: bad}}) }},
			{"Export", func() error { _, err := l.Export(bad, 0); return err }},
		} {
			t.Run(fmt.Sprintf("%s/size=%d", op.name, wrong), func(t *testing.T) {
				before, live := p.Stats(), d.Live()
				err := op.f()
				require.ErrorIs(t, err, acl.ErrInvalidParam)
				assert.ErrorContains(t, err, "lent it out as")
				assert.ErrorContains(t, err, fmt.Sprintf("%d bytes", wrong), "the chunk's size")
				assert.ErrorContains(t, err, fmt.Sprintf("%d bytes", size), "the lease's size")
				assert.Equal(t, before, p.Stats(), "nothing changed in the books")
				assert.Equal(t, live, d.Live(), "nothing changed in the driver")
				assert.False(t, l.Pending(at(2)), "nothing waits for the device")
				assert.False(t, l.Shared(c), "nothing exported")
			})
		}
	}

	// The chunk as the pool lent it out still works.
	require.NoError(t, l.SyncDevice())
	require.NoError(t, l.Release(at(2), c))
	_, err = l.MapRange(base, []chunk.Chunk{other, c}, nil)
	require.NoError(t, err)
	require.NoError(t, d.MemcpyHtoD(at(2)-8, []byte("two size")))
	require.NoError(t, l.ReleaseAfter([]chunk.Mapped{{At: at(0), C: other}, {At: at(1), C: c}}, []acl.Stream{s}))
	waitFor(t, func() bool { return !l.Pending(at(0)) && !l.Pending(at(1)) }, "the worker to unmap the chunks")
	st := p.Stats()
	assert.Equal(t, 2, st.Cached)
	assert.Equal(t, int64(2*size), st.CachedBytes)
	assert.Zero(t, d.Live().Mappings)
}
