package acltest

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

// testHostMemory checks MallocHost and FreeHost: the buffer has the size
// asked, copies to and from it round-trip through device memory, the
// driver counts it until it is freed, and bad arguments are refused without
// freeing anything.
func testHostMemory(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	base := reserve(t, d, 2*g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h := mapChunk(t, d, base, g)
	defer unmapFree(t, d, base, h)

	_, err := d.MallocHost(0)
	RequireCode(t, err, acl.ErrCodeInvalidParam, "MallocHost(0)")

	a, err := d.MallocHost(g)
	require.NoError(t, err)
	require.Len(t, a, int(g))
	b, err := d.MallocHost(g + 4096) // any size, not only granules
	require.NoError(t, err)
	require.Len(t, b, int(g)+4096)
	if c, ok := d.(acl.Counter); ok {
		l := c.Live()
		require.Equal(t, 2, l.HostBuffers, "%+v", l)
		require.Equal(t, 2*g+4096, l.HostBytes, "%+v", l)
	}

	for i := range a {
		a[i] = byte(i*13 + i>>11)
	}
	require.NoError(t, d.MemcpyHtoD(base, a))
	require.NoError(t, d.MemcpyDtoH(b[4096:], base))
	require.True(t, bytes.Equal(a, b[4096:]), "a round trip through pinned buffers differs")

	requireFail(t, f, d.FreeHost(b[4096:]), acl.ErrCodeRTParamInvalid, "FreeHost of a slice not at a buffer's start")
	requireFail(t, f, d.FreeHost(make([]byte, 16)), acl.ErrCodeRTParamInvalid, "FreeHost of Go memory")
	require.NoError(t, d.FreeHost(a))
	requireFail(t, f, d.FreeHost(a), acl.ErrCodeRTParamInvalid, "FreeHost twice")
	require.NoError(t, d.FreeHost(b))
	if c, ok := d.(acl.Counter); ok {
		l := c.Live()
		require.Zero(t, l.HostBuffers, "%+v", l)
		require.Zero(t, l.HostBytes, "%+v", l)
	}
}

// testHostMemoryConcurrent has two goroutines allocate and free pinned
// buffers of their own at once. A buffer one frees may come back at the
// same address to the other (64 MiB is above glibc's mmap threshold: each
// allocation maps, each free unmaps), so a driver that takes a buffer off
// its books only after the free can lose the other's entry: that one's
// FreeHost then fails, and the counts go wrong (the CUDA and Ascend
// bindings did, until they took it off first).
func testHostMemoryConcurrent(t *testing.T, d acl.Driver, f Factory) {
	const size = 64 << 20
	deadline := time.Now().Add(300 * time.Millisecond)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				b, err := d.MallocHost(size)
				if err == nil {
					err = d.FreeHost(b)
				}
				if err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err, "a goroutine's own buffer")
	}
	if c, ok := d.(acl.Counter); ok {
		l := c.Live()
		require.Zero(t, l.HostBuffers, "%+v", l)
		require.Zero(t, l.HostBytes, "%+v", l)
	}
}
