//go:build linux && (amd64 || arm64)

package cuda

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/ipc"
)

func exportableProp() *acl.PhysicalMemProp {
	p := prop()
	p.HandleType = acl.MemHandleTypePOSIX
	return p
}

// Export and import over the double: the binding asks cuMemCreate for a
// POSIX descriptor, exports it with cuMemExportToShareableHandle, and another
// driver (another instance of the double, as another process would have)
// imports a copy of the descriptor with cuMemImportFromShareableHandle and
// maps the same memory, whose size it learns from its first map.
func TestShareOverDouble(t *testing.T) {
	const g = 2 << 20
	a, fa := openFake(t, 0, Config{})
	b, fb := openFake(t, 0, Config{})
	h, err := a.MallocPhysical(g, exportableProp(), 0)
	require.NoError(t, err)
	s, err := a.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, acl.ExportDisablePIDValidation)
	require.NoError(t, err)
	assert.Equal(t, int64(1), fa.calls(t, "cuMemExportToShareableHandle"))
	fd, ok := s.FD()
	require.True(t, ok)

	// The descriptor as another process receives it: a new number.
	other, err := ipc.Dup(fd)
	require.NoError(t, err)
	imp, err := b.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(other)}, 0)
	require.NoError(t, err)
	require.NoError(t, ipc.Close(other), "CUDA does not take the descriptor")
	assert.Equal(t, int64(1), fb.calls(t, "cuMemImportFromShareableHandle"))
	l := b.Live()
	assert.Equal(t, 1, l.Imported)
	assert.Zero(t, l.ImportedBytes, "CUDA does not tell the importer the size")

	ba, err := a.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	bb, err := b.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, a.MapMem(ba, g, 0, h, 0))
	require.NoError(t, a.MemSetAccess(ba, g, acl.ReadWrite(0)))
	require.Error(t, b.MapMem(bb, 2*g, 0, imp, 0), "larger than the allocation: CUDA refuses")
	require.NoError(t, b.MapMem(bb, g, 0, imp, 0))
	assert.Equal(t, uintptr(g), b.Live().ImportedBytes, "learned from the map")
	ro := acl.ReadWrite(0)
	ro[0].Flags = acl.MemAccessRead
	require.NoError(t, b.MemSetAccess(bb, g, ro))

	require.NoError(t, a.MemcpyHtoD(ba, []byte("one memory")))
	got := make([]byte, 10)
	require.NoError(t, b.MemcpyDtoH(got, bb))
	assert.Equal(t, "one memory", string(got), "the importer reads what the exporter wrote")
	acltest.RequireCode(t, b.MemcpyHtoD(bb, []byte("x")), acl.ErrCodeRTParamInvalid, "read-only for the importer")
	acltest.RequireCode(t, b.Memset(bb, 0, 1), acl.ErrCodeRTParamInvalid)

	// The exporter frees first: the importer's mapping lives on.
	require.NoError(t, a.UnmapMem(ba))
	require.NoError(t, a.FreePhysical(h))
	require.NoError(t, a.ReleaseMemAddress(ba))
	require.NoError(t, b.MemcpyDtoH(got, bb))
	assert.Equal(t, "one memory", string(got))
	_, _, err = ipc.Stat(fd)
	assert.Error(t, err, "the exporter closed its descriptor with the allocation")

	require.NoError(t, b.UnmapMem(bb))
	require.NoError(t, b.FreePhysical(imp))
	require.NoError(t, b.ReleaseMemAddress(bb))
	assert.True(t, b.Live().Zero())
}

// The binding's refusals and CUDA's failures carry ACL codes.
func TestShareErrors(t *testing.T) {
	const g = 2 << 20
	d, f := openFake(t, 0, Config{})
	plain, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreePhysical(plain)) }()
	_, err = d.MemExportToShareableHandle(plain, acl.MemHandleTypePOSIX, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "not made exportable")
	assert.Zero(t, f.calls(t, "cuMemExportToShareableHandle"), "refused before CUDA")

	h, err := d.MallocPhysical(g, exportableProp(), 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreePhysical(h)) }()
	f.fail(t, "cuMemExportToShareableHandle", 1, ResultOutOfMemory)
	_, err = d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, 0)
	require.ErrorIs(t, err, acl.ErrOutOfMemory)
	assert.Equal(t, ResultOutOfMemory, resultOf(err))
	s, err := d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, 0)
	require.NoError(t, err, "a failed export can be made again")
	_, err = d.MemImportFromShareableHandle(s, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTDrvInternal, "the export itself, imported by its exporter")

	fd, _ := s.FD()
	other, err := ipc.Dup(fd)
	require.NoError(t, err)
	defer ipc.Close(other)
	f.fail(t, "cuMemImportFromShareableHandle", 1, ResultInvalidValue)
	_, err = d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(other)}, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid)
	assert.Zero(t, d.Live().Imported, "nothing imported")
	imp, err := d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(other)}, 0)
	require.NoError(t, err, "CUDA itself imports in the exporting process; only the export's own number is refused")
	_, err = d.MemExportToShareableHandle(imp, acl.MemHandleTypePOSIX, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTDrvInternal, "an import is not exported again")
	require.NoError(t, d.FreePhysical(imp))
	_, err = d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: 1 << 20}, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTInvalidHandle, "a descriptor that is not open")
	require.ErrorIs(t, d.MemSetPidToShareableHandle(s, []int32{1}), acl.ErrNotSupported)
	pid, err := d.DeviceGetBareTgid()
	require.NoError(t, err)
	assert.Positive(t, pid)
}

// A device that cannot export descriptors shares nothing.
func TestShareUnsupported(t *testing.T) {
	f := newFake(t)
	f.set(t, "posix_fd", 0)
	d, err := Open(Config{Library: f.path})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	assert.Equal(t, acl.SharingNone, d.Caps().Sharing)
	_, err = d.MallocPhysical(2<<20, exportableProp(), 0)
	require.ErrorIs(t, err, acl.ErrNotSupported)
	_, err = d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX}, 0)
	require.ErrorIs(t, err, acl.ErrNotSupported)
}

// An import is checked before it is mapped: memory that does not live on
// this driver's device is refused, and released, and a first map must be a
// multiple of the memory's own granularity. vmarena's read-only export flag
// never reaches CUDA.
func TestImportChecksTheMemory(t *testing.T) {
	const g = 2 << 20
	a, _ := openFake(t, 0, Config{})
	b, fb := openFake(t, 0, Config{})
	h, err := a.MallocPhysical(g, exportableProp(), 0)
	require.NoError(t, err)
	s, err := a.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, acl.ExportReadOnly)
	require.NoError(t, err, "ExportReadOnly is not passed to cuMemExportToShareableHandle, whose flags must be 0")
	fd, _ := s.FD()
	other, err := ipc.Dup(fd) // as another process receives it
	require.NoError(t, err)
	defer ipc.Close(other)
	s = acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(other)}

	fb.set(t, "import_device", 1+3) // the memory says it lives on device 3
	_, err = b.MemImportFromShareableHandle(s, 0)
	require.ErrorIs(t, err, acl.ErrInvalidHandle)
	assert.ErrorContains(t, err, "not pinned memory of device 0")
	assert.Equal(t, int64(1), fb.calls(t, "cuMemRelease"), "the import is released")
	assert.True(t, b.Live().Zero(), "%+v", b.Live())

	fb.set(t, "import_device", 0)
	imp, err := b.MemImportFromShareableHandle(s, 0)
	require.NoError(t, err)
	base, err := b.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	require.Error(t, b.MapMem(base, g+4096, 0, imp, 0), "not a multiple of the granularity")
	require.NoError(t, b.MapMem(base, g, 0, imp, 0))
	require.NoError(t, b.UnmapMem(base))
	require.NoError(t, b.FreePhysical(imp))
	require.NoError(t, b.ReleaseMemAddress(base))
	require.NoError(t, a.FreePhysical(h))
	assert.True(t, b.Live().Zero())
	assert.True(t, a.Live().Zero())
}
