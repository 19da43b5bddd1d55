package chunk_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
)

// A release after the work of two streams: a clear queued on the first is
// not ordered after the second's work, which may write the chunk after it
// ran. The chunk must not be cached as cleared (it was, and the next tenant
// read the first's bytes): it is cleared when the other tenant maps it.
func TestScrubOnReleaseAfterTwoStreams(t *testing.T) {
	d, p, base := scrubPool(t, chunk.Config{Scrub: chunk.ScrubOnRelease, FreshZeroed: true})
	s1, err := d.CreateStream()
	require.NoError(t, err)
	s2, err := d.CreateStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, d.SynchronizeDevice())
		assert.NoError(t, d.DestroyStream(s1))
		assert.NoError(t, d.DestroyStream(s2))
	})
	a, b := chunk.NewTenant(), chunk.NewTenant()
	c, _ := mapped(t, d, p, a, base)

	// Tenant a's work on s2: a kernel still running, then a write of a's
	// bytes behind it, both queued before the release.
	kernel := make(chan struct{})
	require.NoError(t, d.Launch(s2, base, chunkG, kernel))
	require.NoError(t, d.MemsetAsync(base, 0xA5, chunkG, s2))
	require.NoError(t, p.Lender().ReleaseAfter([]chunk.Mapped{{At: base, C: c}}, []acl.Stream{s1, s2}))
	require.NoError(t, d.SynchronizeStream(s1)) // the clear has run
	close(kernel)                               // a's write on s2 runs after it
	waitFor(t, func() bool { return !p.Lender().Pending(base) }, "the worker to unmap the chunk")
	require.Equal(t, 1, p.Stats().Cached)

	c2, mem := mapped(t, d, p, b, base)
	assert.Equal(t, c, c2, "b got a's chunk from the cache")
	assert.Zero(t, bytes.Count(mem, []byte{0xA5}), "b must see none of a's bytes")
	require.NoError(t, p.Lender().Unmap(base))
	require.NoError(t, p.Lender().Put(c2))
}

// A Warm whose MallocPhysical is in flight when Close runs put its chunk in
// the closed pool's cache after Close had freed the cache: Close returned
// nil with the pool still holding a chunk (HeldBytes, the driver's handle)
// that nothing freed. Close waits for the allocation, then frees it.
func TestWarmRacingClose(t *testing.T) {
	d := scrubDriver(t, 64<<20)
	gd := &gatedMalloc{freshDriver: &freshDriver{Driver: d, name: fmt.Sprintf("fresh-test-%d", freshDevices.Add(1))},
		in: make(chan struct{}), out: make(chan struct{})}
	p, err := chunk.New(gd, chunk.Config{})
	require.NoError(t, err)
	gd.mu.Lock()
	gd.armed = true
	gd.mu.Unlock()
	warmed := make(chan error, 1)
	go func() {
		_, err := p.Warm(1)
		warmed <- err
	}()
	<-gd.in // Warm is inside MallocPhysical
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while an allocation ahead was under way", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(gd.out)
	require.NoError(t, <-closed)
	require.NoError(t, <-warmed)
	assert.Zero(t, p.Stats().HeldBytes, "a closed pool holds nothing")
	assert.Zero(t, d.Live().Handles, "no physical handle left after Close")
}
