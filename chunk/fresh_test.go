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

// Where the device clears memory between processes, fresh memory holds only
// bytes this process freed: until a pool of the process frees any of the
// device's memory, fresh chunks need no clear, however many tenants the
// device has had; after the first free, they are cleared for every tenant
// but the device's only one.
func TestFreshMemoryBeforeAnyFree(t *testing.T) {
	d := scrubDriver(t, 64<<20)
	fd := &freshDriver{Driver: d, name: fmt.Sprintf("fresh-test-%d", freshDevices.Add(1))}
	p, err := chunk.New(fd, chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	defer d.ReleaseMemAddress(base)
	l := p.Lender()
	a, b := chunk.NewTenant(), chunk.NewTenant()
	ca, err := l.GetFor(a)
	require.NoError(t, err)
	require.NoError(t, l.Map(base, ca))
	cb, err := l.GetFor(b)
	require.NoError(t, err)
	require.NoError(t, l.Map(base+acl.DevicePtr(g), cb))
	assert.Zero(t, p.Stats().Scrubs, "two tenants, but nothing freed yet: fresh memory holds nobody's bytes")

	require.NoError(t, l.Release(base, ca))
	require.NoError(t, l.Put(ca))
	require.NoError(t, p.Trim()) // a's bytes go back to the driver
	c, err := l.GetFor(b)
	require.NoError(t, err)
	require.NoError(t, l.Map(base, c))
	s := p.Stats()
	assert.Equal(t, int64(1), s.ScrubsFresh, "after a free, fresh memory may hold a's bytes")
	require.NoError(t, l.Release(base, c))
	require.NoError(t, l.Put(c))
	require.NoError(t, l.Release(base+acl.DevicePtr(g), cb))
	require.NoError(t, l.Put(cb))
}

// gatedMalloc stops a MallocPhysical, when armed, until the test lets it go.
type gatedMalloc struct {
	*freshDriver
	mu      sync.Mutex
	armed   bool
	in, out chan struct{}
}

func (d *gatedMalloc) MallocPhysical(size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	d.mu.Lock()
	armed := d.armed
	d.armed = false
	d.mu.Unlock()
	if armed {
		d.in <- struct{}{}
		<-d.out
	}
	return d.freshDriver.MallocPhysical(size, prop, flags)
}

// A free that runs while a growth is inside MallocPhysical may give that
// growth the memory it frees: the chunk must then count as holding the freed
// bytes. The test stops a Get inside its MallocPhysical, has another pool on
// the device free a chunk another tenant wrote meanwhile, and checks that
// the Get's chunk is cleared for its tenant.
func TestFreshMemoryFreedDuringAMalloc(t *testing.T) {
	d := scrubDriver(t, 64<<20)
	gd := &gatedMalloc{freshDriver: &freshDriver{Driver: d, name: fmt.Sprintf("fresh-test-%d", freshDevices.Add(1))},
		in: make(chan struct{}), out: make(chan struct{})}
	p, err := chunk.New(gd, chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	q, err := chunk.New(gd, chunk.Config{})
	require.NoError(t, err)
	defer q.Close()
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	defer d.ReleaseMemAddress(base)
	a, b := chunk.NewTenant(), chunk.NewTenant()
	ca, err := q.Lender().GetFor(a)
	require.NoError(t, err)
	require.NoError(t, q.Lender().Map(base, ca)) // a writes its bytes
	require.NoError(t, q.Lender().Release(base, ca))
	require.NoError(t, q.Lender().Put(ca)) // and q keeps the chunk cached

	gd.mu.Lock()
	gd.armed = true
	gd.mu.Unlock()
	got := make(chan chunk.Chunk, 1)
	go func() {
		c, err := p.Lender().GetFor(b)
		assert.NoError(t, err)
		got <- c
	}()
	<-gd.in                      // b's Get is inside MallocPhysical
	require.NoError(t, q.Trim()) // q frees a's chunk meanwhile
	close(gd.out)
	c := <-got
	require.NoError(t, p.Lender().Map(base, c))
	s := p.Stats()
	assert.Equal(t, int64(1), s.ScrubsFresh, "the fresh chunk may hold the bytes a freed during its allocation")
	require.NoError(t, p.Lender().Release(base, c))
	require.NoError(t, p.Lender().Put(c))
}
