//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/ascend"
)

// Sharing over the double, which keeps the runtime's books of tokens, allow
// lists and references, with fakeacl_set_pid standing for the process that
// calls: process A exports, B (on the list) imports and maps the same memory,
// C (not on it) is refused; the memory outlives A's handle.
func TestShareTokens(t *testing.T) {
	const g = acl.HugePageSize
	const A, B, C = 1001, 1002, 1003
	path := freshCopy(t, "full", "", "libascendcl.so")
	a, dbl := openDouble(t, path, 0, ascend.Config{})
	b, _ := openDouble(t, path, 0, ascend.Config{})
	require.Equal(t, acl.SharingToken, a.Caps().Sharing)
	defer dbl.setPid(int32(os.Getpid()))

	dbl.setPid(A)
	p := acl.DeviceProp(0, 0)
	h, err := a.MallocPhysical(g, &p, 0)
	require.NoError(t, err)
	ba, err := a.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, a.MapMem(ba, g, 0, h, 0))
	require.NoError(t, a.MemcpyHtoD(ba, []byte("one memory")))
	s, err := a.MemExportToShareableHandle(h, acl.MemHandleTypeNone, acl.ExportDefault)
	require.NoError(t, err)
	assert.Equal(t, acl.MemHandleTypeNone, s.Type)
	_, err = a.MemExportToShareableHandle(h, acl.MemHandleTypeNone, acl.ExportDefault)
	requireACLError(t, err, "aclrtMemExportToShareableHandle", acl.ErrCodeRTDrvInternal)
	require.NoError(t, a.MemSetPidToShareableHandle(s, []int32{B}))
	_, err = a.MemImportFromShareableHandle(s, 0)
	requireACLError(t, err, "aclrtMemImportFromShareableHandle", acl.ErrCodeRTDrvInternal)

	dbl.setPid(C)
	_, err = b.MemImportFromShareableHandle(s, 0)
	requireACLError(t, err, "aclrtMemImportFromShareableHandle", acl.ErrCodeRTDrvInternal)

	dbl.setPid(B)
	pid, err := b.DeviceGetBareTgid()
	require.NoError(t, err)
	assert.Equal(t, int32(B), pid)
	requireACLError(t, b.MemSetPidToShareableHandle(s, []int32{C}), "aclrtMemSetPidToShareableHandle", acl.ErrCodeRTDrvInternal)
	hb, err := b.MemImportFromShareableHandle(s, 0)
	require.NoError(t, err)
	again, err := b.MemImportFromShareableHandle(s, 0)
	require.NoError(t, err)
	assert.Equal(t, hb, again, "a second import is the same handle")
	l := b.Live()
	assert.Equal(t, 1, l.Handles)
	assert.Equal(t, 1, l.Imported)
	assert.Zero(t, l.ImportedBytes, "ACL does not tell the importer the size")
	_, err = b.MemExportToShareableHandle(hb, acl.MemHandleTypeNone, 0)
	requireACLError(t, err, "aclrtMemExportToShareableHandle", acl.ErrCodeRTDrvInternal)
	bb, err := b.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, b.MapMem(bb, g, 0, hb, 0))
	assert.Equal(t, uintptr(g), b.Live().ImportedBytes, "learned from the map")
	got := make([]byte, 10)
	require.NoError(t, b.MemcpyDtoH(got, bb))
	assert.Equal(t, "one memory", string(got))
	require.NoError(t, b.MemcpyHtoD(bb, []byte("B was here")))

	// A sees B's write, then lets go; B's mapping lives on.
	dbl.setPid(A)
	require.NoError(t, a.MemcpyDtoH(got, ba))
	assert.Equal(t, "B was here", string(got))
	require.NoError(t, a.UnmapMem(ba))
	require.NoError(t, a.FreePhysical(h))
	require.NoError(t, a.ReleaseMemAddress(ba))
	assert.True(t, a.Live().Zero())

	dbl.setPid(B)
	require.NoError(t, b.MemcpyDtoH(got, bb))
	assert.Equal(t, "B was here", string(got))
	_, err = b.MemImportFromShareableHandle(s, 0)
	requireACLError(t, err, "aclrtMemImportFromShareableHandle", acl.ErrCodeRTInvalidHandle)
	require.NoError(t, b.UnmapMem(bb))
	require.NoError(t, b.FreePhysical(hb))
	assert.Equal(t, 1, b.Live().Handles, "one import reference left")
	require.NoError(t, b.FreePhysical(hb))
	require.NoError(t, b.ReleaseMemAddress(bb))
	assert.True(t, b.Live().Zero(), "%+v", b.Live())
	assert.True(t, dbl.Live().Zero(), "the runtime holds nothing: %+v", dbl.Live())
}

// An export without validation has no allow-list: any other process imports
// it, and setting one is refused.
func TestShareWithoutValidation(t *testing.T) {
	const g = acl.HugePageSize
	path := freshCopy(t, "full", "", "libascendcl.so")
	a, dbl := openDouble(t, path, 0, ascend.Config{})
	defer dbl.setPid(int32(os.Getpid()))
	dbl.setPid(2001)
	p := acl.DeviceProp(0, 0)
	h, err := a.MallocPhysical(g, &p, 0)
	require.NoError(t, err)
	s, err := a.MemExportToShareableHandle(h, acl.MemHandleTypeNone, acl.ExportDisablePIDValidation)
	require.NoError(t, err)
	requireACLError(t, a.MemSetPidToShareableHandle(s, []int32{2002}), "aclrtMemSetPidToShareableHandle", acl.ErrCodeRTNoPermission)
	dbl.setPid(2003)
	hb, err := a.MemImportFromShareableHandle(s, 0)
	require.NoError(t, err)
	require.NoError(t, a.FreePhysical(hb))
	dbl.setPid(2001)
	require.NoError(t, a.FreePhysical(h))
	assert.True(t, a.Live().Zero())
}

// A runtime without the sharing calls shares nothing, and says so.
func TestShareNotInRuntime(t *testing.T) {
	d, _ := openDouble(t, freshCopy(t, "noshare", "", "libascendcl.so"), 0, ascend.Config{})
	assert.Equal(t, acl.SharingNone, d.Caps().Sharing)
	p := acl.DeviceProp(0, 0)
	h, err := d.MallocPhysical(acl.HugePageSize, &p, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreePhysical(h)) }()
	_, err = d.MemExportToShareableHandle(h, acl.MemHandleTypeNone, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTFeatureNotSupport)
	_, err = d.MemImportFromShareableHandle(acl.ShareableHandle{Value: 1}, 0)
	require.ErrorIs(t, err, acl.ErrNotSupported)
	pid, err := d.DeviceGetBareTgid()
	require.NoError(t, err)
	assert.Equal(t, int32(os.Getpid()), pid, "os.Getpid() where the runtime cannot say")
}

// An import is checked before anything maps it, where the runtime says what
// it is (aclrtMemGetAllocationPropertiesFromHandle): memory of another
// device is refused and its reference dropped, and a map must be a multiple
// of its page size. vmarena's read-only flag never reaches the runtime,
// which refuses export flags above 1.
func TestImportChecksTheMemory(t *testing.T) {
	const g = acl.HugePageSize
	path := freshCopy(t, "full", "", "libascendcl.so")
	dbl := control(t, path)
	dbl.setDeviceCount(2)
	a, _ := openDouble(t, path, 0, ascend.Config{Device: 1})
	b, _ := openDouble(t, path, 0, ascend.Config{})
	defer dbl.setPid(int32(os.Getpid()))
	dbl.setPid(3001)
	p := acl.DeviceProp(1, 0)
	h, err := a.MallocPhysical(g, &p, 0)
	require.NoError(t, err)
	s, err := a.MemExportToShareableHandle(h, acl.MemHandleTypeNone, acl.ExportDisablePIDValidation|acl.ExportReadOnly)
	require.NoError(t, err)

	dbl.setPid(3002)
	_, err = b.MemImportFromShareableHandle(s, 0)
	require.ErrorIs(t, err, acl.ErrInvalidHandle)
	assert.ErrorContains(t, err, "not pinned memory of device 0")
	assert.True(t, b.Live().Zero(), "%+v", b.Live())

	dbl.setPid(3001)
	p0 := acl.DeviceProp(0, 0)
	h0, err := b.MallocPhysical(g, &p0, 0)
	require.NoError(t, err)
	s0, err := b.MemExportToShareableHandle(h0, acl.MemHandleTypeNone, acl.ExportDisablePIDValidation)
	require.NoError(t, err)
	dbl.setPid(3002)
	imp, err := b.MemImportFromShareableHandle(s0, 0)
	require.NoError(t, err)
	base, err := b.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	err = b.MapMem(base, 2*g-4096, 0, imp, 0)
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	assert.ErrorContains(t, err, "page size")
	require.NoError(t, b.MapMem(base, g, 0, imp, 0))
	require.NoError(t, b.UnmapMem(base))
	require.NoError(t, b.FreePhysical(imp))
	require.NoError(t, b.ReleaseMemAddress(base))
	dbl.setPid(3001)
	require.NoError(t, b.FreePhysical(h0))
	require.NoError(t, a.FreePhysical(h))
	assert.True(t, a.Live().Zero())
	assert.True(t, b.Live().Zero())
	assert.True(t, dbl.Live().Zero(), "%+v", dbl.Live())
}
