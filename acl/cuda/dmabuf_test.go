//go:build linux && (amd64 || arm64)

package cuda

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
)

// openFDs counts the process's open descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// mapChunks reserves n granules and maps each with a fresh allocation of prop
// and access; the test's cleanup unmaps, frees and releases them.
func mapChunks(t *testing.T, d *Driver, n int, p *acl.PhysicalMemProp) (acl.DevicePtr, []acl.PhysicalHandle) {
	t.Helper()
	base, err := d.ReserveMemAddress(uintptr(n)*g, 0, 0, 0)
	require.NoError(t, err)
	hs := make([]acl.PhysicalHandle, n)
	for i := range hs {
		hs[i], err = d.MallocPhysical(g, p, 0)
		require.NoError(t, err)
		ptr := base.Add(uintptr(i) * g)
		require.NoError(t, d.MapMem(ptr, g, 0, hs[i], 0))
		require.NoError(t, d.MemSetAccess(ptr, g, acl.ReadWrite(0)))
	}
	t.Cleanup(func() {
		for i, h := range hs {
			if h == 0 {
				continue
			}
			require.NoError(t, d.UnmapMem(base.Add(uintptr(i)*g)))
			require.NoError(t, d.FreePhysical(h))
		}
		require.NoError(t, d.ReleaseMemAddress(base))
	})
	return base, hs
}

// cuHandle returns the CUDA allocation behind h.
func cuHandle(d *Driver, h acl.PhysicalHandle) uint64 {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.handles[h].cu
}

// A run of chunks exports as one dma-buf, a real descriptor of the run's
// size, and every chunk was made GPUDirect RDMA capable.
func TestExportDMABuf(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	rdma, dmaBuf := d.RDMACapable()
	require.True(t, rdma)
	require.True(t, dmaBuf)
	base, hs := mapChunks(t, d, 4, prop())
	for _, h := range hs {
		require.Equal(t, int32(1), f.rdma(cuHandle(d, h)), "chunks are created RDMA capable")
	}
	fds := openFDs(t)
	fd, err := d.ExportDMABuf(base, 4*g)
	require.NoError(t, err)
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(fd, &st))
	require.Equal(t, int64(4*g), st.Size)
	require.Equal(t, int64(1), f.dmabufs())
	require.Equal(t, fds+1, openFDs(t), "the caller owns one new descriptor")
	require.NoError(t, syscall.Close(fd))

	// A part of the run, page-aligned, exports too.
	fd, err = d.ExportDMABuf(base.Add(g+4096), g)
	require.NoError(t, err)
	require.NoError(t, syscall.Close(fd))
	require.Equal(t, fds, openFDs(t))
}

// What CUDA refuses is refused in the books, before CUDA is called, with the
// descriptor count unchanged.
func TestExportDMABufRefusals(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	base, hs := mapChunks(t, d, 4, prop())
	calls := f.calls(t, "cuMemGetHandleForAddressRange")
	refuse := func(ptr acl.DevicePtr, size uintptr, code int32, what string) {
		t.Helper()
		fds := openFDs(t)
		fd, err := d.ExportDMABuf(ptr, size)
		acltest.RequireCode(t, err, code, what)
		require.Equal(t, -1, fd, what)
		require.Equal(t, fds, openFDs(t), what)
	}
	refuse(base, 0, acl.ErrCodeInvalidParam, "0 bytes")
	refuse(0, g, acl.ErrCodeInvalidParam, "NULL")
	refuse(base.Add(512), g, acl.ErrCodeRTParamInvalid, "an address not aligned to the page size")
	refuse(base, g+512, acl.ErrCodeRTParamInvalid, "a size not aligned to the page size")
	refuse(base, 5*g, acl.ErrCodeRTParamInvalid, "past the reservation")

	// A gap: the third chunk unmapped.
	require.NoError(t, d.UnmapMem(base.Add(2*g)))
	refuse(base, 4*g, acl.ErrCodeRTParamInvalid, "a range with a gap")
	// Mapped again without access yet.
	require.NoError(t, d.MapMem(base.Add(2*g), g, 0, hs[2], 0))
	refuse(base, 4*g, acl.ErrCodeRTParamInvalid, "a chunk without access")
	require.NoError(t, d.MemSetAccess(base.Add(2*g), g, acl.ReadWrite(0)))

	// Chunks of different properties: an exportable one among plain ones.
	require.NoError(t, d.UnmapMem(base.Add(3*g)))
	require.NoError(t, d.FreePhysical(hs[3]))
	px := *prop()
	px.HandleType = acl.MemHandleTypePOSIX
	var err error
	hs[3], err = d.MallocPhysical(g, &px, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base.Add(3*g), g, 0, hs[3], 0))
	require.NoError(t, d.MemSetAccess(base.Add(3*g), g, acl.ReadWrite(0)))
	refuse(base, 4*g, acl.ErrCodeRTParamInvalid, "chunks that differ in properties")
	require.Equal(t, calls, f.calls(t, "cuMemGetHandleForAddressRange"), "refused before CUDA was called")

	// The first three, alike, still export.
	fd, err := d.ExportDMABuf(base, 3*g)
	require.NoError(t, err)
	require.NoError(t, syscall.Close(fd))
}

// The double itself is as strict as CUDA documents: called directly, it
// refuses a range that is not fully mapped or whose chunks differ, and
// without the device's support.
func TestDoubleDMABufRules(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	base, hs := mapChunks(t, d, 3, prop())
	raw := func(ptr acl.DevicePtr, size uintptr) Result {
		var fd int32 = -1
		var r Result
		require.NoError(t, d.Bind(func() error {
			r = d.lib.cuMemGetHandleForAddressRange(&fd, uint64(ptr), size, cuMemRangeHandleDMABufFD, 0)
			return nil
		}))
		if r == ResultSuccess {
			require.NoError(t, syscall.Close(int(fd)))
		}
		return r
	}
	require.Equal(t, ResultSuccess, raw(base, 3*g))
	require.Equal(t, ResultInvalidValue, raw(base.Add(100), g), "unaligned")
	require.NoError(t, d.UnmapMem(base.Add(g)))
	require.Equal(t, ResultInvalidValue, raw(base, 3*g), "not fully mapped")
	require.NoError(t, d.FreePhysical(hs[1]))
	px := *prop()
	px.HandleType = acl.MemHandleTypePOSIX
	var err error
	hs[1], err = d.MallocPhysical(g, &px, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base.Add(g), g, 0, hs[1], 0))
	require.NoError(t, d.MemSetAccess(base.Add(g), g, acl.ReadWrite(0)))
	require.Equal(t, ResultInvalidValue, raw(base, 3*g), "different properties")
	f.set(t, "dma_buf", 0)
	require.Equal(t, ResultNotSupported, raw(base, g), "no dma-buf support")
}

// After the backing of a range changes, its old descriptor no longer
// describes it; the range exports again once fully mapped.
func TestExportDMABufAfterRemap(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	base, hs := mapChunks(t, d, 2, prop())
	fd1, err := d.ExportDMABuf(base, 2*g)
	require.NoError(t, err)
	defer syscall.Close(fd1)
	require.NoError(t, d.UnmapMem(base.Add(g)))
	_, err = d.ExportDMABuf(base, 2*g)
	require.ErrorIs(t, err, acl.ErrInvalidParam, "half unmapped")
	require.NoError(t, d.MapMem(base.Add(g), g, 0, hs[1], 0))
	require.NoError(t, d.MemSetAccess(base.Add(g), g, acl.ReadWrite(0)))
	fd2, err := d.ExportDMABuf(base, 2*g)
	require.NoError(t, err)
	require.NotEqual(t, fd1, fd2, "a new descriptor per export")
	require.NoError(t, syscall.Close(fd2))
	require.Equal(t, int64(2), f.dmabufs())
}

// A device without GPUDirect RDMA on VMM memory gets plain chunks, which
// still export alike; one without dma-buf support refuses the export.
func TestExportDMABufWithoutSupport(t *testing.T) {
	f := newFake(t)
	f.set(t, "rdma_vmm", 0)
	d, err := Open(Config{Library: f.path})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	rdma, dmaBuf := d.RDMACapable()
	require.False(t, rdma)
	require.True(t, dmaBuf)
	base, hs := mapChunks(t, d, 2, prop())
	require.Equal(t, int32(0), f.rdma(cuHandle(d, hs[0])))
	fd, err := d.ExportDMABuf(base, 2*g)
	require.NoError(t, err)
	require.NoError(t, syscall.Close(fd))

	f2 := newFake(t)
	f2.set(t, "dma_buf", 0)
	d2, err := Open(Config{Library: f2.path})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d2.Close()) })
	_, dmaBuf = d2.RDMACapable()
	require.False(t, dmaBuf)
	base2, _ := mapChunks(t, d2, 1, prop())
	_, err = d2.ExportDMABuf(base2, g)
	require.ErrorIs(t, err, acl.ErrNotSupported)
	require.Zero(t, f2.calls(t, "cuMemGetHandleForAddressRange"))
}

// A driver older than CUDA 11.7 lacks the call: Open still works, and only
// the export fails, naming what is missing.
func TestExportDMABufOldDriver(t *testing.T) {
	f := newOldFake(t)
	d, err := Open(Config{Library: f.path})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	_, dmaBuf := d.RDMACapable()
	require.False(t, dmaBuf)
	base, _ := mapChunks(t, d, 1, prop())
	_, err = d.ExportDMABuf(base, g)
	require.ErrorIs(t, err, acl.ErrNotSupported)
	require.ErrorContains(t, err, "cuMemGetHandleForAddressRange")
}

// A failing CUDA call returns its typed error, leaks no descriptor, and the
// export succeeds when tried again.
func TestExportDMABufFailure(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	base, _ := mapChunks(t, d, 2, prop())
	fds := openFDs(t)
	f.fail(t, "cuMemGetHandleForAddressRange", 1, ResultUnknown)
	_, err := d.ExportDMABuf(base, 2*g)
	var ce *Error
	require.True(t, errors.As(err, &ce), "%v", err)
	require.Equal(t, ResultUnknown, ce.Result)
	require.Equal(t, fds, openFDs(t))
	fd, err := d.ExportDMABuf(base, 2*g)
	require.NoError(t, err)
	require.NoError(t, syscall.Close(fd))
}

// Bind runs its function with the device's primary context current on a
// locked thread, and refuses once the driver is closed.
func TestBind(t *testing.T) {
	f := newFake(t)
	d, err := Open(Config{Library: f.path})
	require.NoError(t, err)
	var cur, primary uintptr
	require.NoError(t, d.Bind(func() error {
		cur, primary = f.current(), f.primary(0)
		return nil
	}))
	require.NotZero(t, primary)
	require.Equal(t, primary, cur)
	want := errors.New("from fn")
	require.Equal(t, want, d.Bind(func() error { return want }))
	require.NoError(t, d.Close())
	acltest.RequireCode(t, d.Bind(func() error { return nil }), acl.ErrCodeRTContextNull)
	f.requireClean(t)
}
