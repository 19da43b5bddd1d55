package acltest

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ipc"
)

// The rules of sharing that one process can test: exports, their once-only
// rule, the refusal of an import by the exporting process and of shareable
// handles that are no such thing, and the argument checks. Imports that
// succeed need a second process; the drivers' own tests and the arena's
// cross the process boundary.

// exportable returns a property for an allocation that can be exported.
func exportable(d acl.Driver) *acl.PhysicalMemProp {
	p := prop(d)
	p.HandleType = d.Caps().Sharing.HandleType()
	return p
}

func testShareArgs(t *testing.T, d acl.Driver, f Factory) {
	pid, err := d.DeviceGetBareTgid()
	require.NoError(t, err)
	assert.Positive(t, pid, "DeviceGetBareTgid")

	g := granule(t, d)
	sh := d.Caps().Sharing
	h, err := d.MallocPhysical(g, exportable(d), 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreePhysical(h)) }()

	posix := prop(d)
	posix.HandleType = acl.MemHandleTypePOSIX
	if sh != acl.SharingFD {
		_, err := d.MallocPhysical(g, posix, 0)
		requireFail(t, f, err, acl.ErrCodeInvalidParam, "an exportable (POSIX) allocation where descriptors are not shared")
	}
	if sh == acl.SharingNone {
		_, err := d.MemExportToShareableHandle(h, acl.MemHandleTypeNone, 0)
		require.ErrorIs(t, err, acl.ErrNotSupported, "export")
		_, err = d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, 0)
		require.ErrorIs(t, err, acl.ErrNotSupported, "export")
		_, err = d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: 0}, d.Device())
		require.ErrorIs(t, err, acl.ErrNotSupported, "import")
		require.ErrorIs(t, d.MemSetPidToShareableHandle(acl.ShareableHandle{}, []int32{pid}), acl.ErrNotSupported, "set pid")
		return
	}
	ht := sh.HandleType()
	_, err = d.MemExportToShareableHandle(0, ht, 0)
	RequireCode(t, err, acl.ErrCodeInvalidParam, "export of NULL")
	_, err = d.MemExportToShareableHandle(h, ht, 2)
	requireFail(t, f, err, acl.ErrCodeRTParamInvalid, "export flags 2")
	other := acl.MemHandleTypeNone
	if ht == acl.MemHandleTypeNone {
		other = acl.MemHandleTypePOSIX
	}
	_, err = d.MemExportToShareableHandle(h, other, 0)
	require.Error(t, err, "export as handle type %d", other)
	_, err = d.MemImportFromShareableHandle(acl.ShareableHandle{Type: other, Value: 3}, d.Device())
	require.Error(t, err, "import of handle type %d", other)
	_, err = d.MemImportFromShareableHandle(acl.ShareableHandle{Type: ht, Value: 1 << 40}, d.Device())
	requireFail(t, f, err, acl.ErrCodeRTInvalidHandle, "import of a shareable handle nobody exported")
	if sh == acl.SharingFD {
		// A descriptor of something that is not device memory.
		r, w, err := os.Pipe()
		require.NoError(t, err)
		defer r.Close()
		defer w.Close()
		_, err = d.MemImportFromShareableHandle(acl.ShareableHandle{Type: ht, Value: uint64(r.Fd())}, d.Device())
		require.Error(t, err, "import of a pipe")
		require.ErrorIs(t, d.MemSetPidToShareableHandle(acl.ShareableHandle{Type: ht, Value: uint64(r.Fd())}, []int32{pid}),
			acl.ErrNotSupported, "a descriptor has no allow-list")
	}
}

// testShareExport runs where the driver shares memory (Run lists it only
// there); testShareArgs checks that a driver that does not refuses.
func testShareExport(t *testing.T, d acl.Driver, f Factory) {
	sh := d.Caps().Sharing
	require.NotEqual(t, acl.SharingNone, sh)
	g := granule(t, d)
	ht := sh.HandleType()
	before, counted := live(d)
	if sh == acl.SharingFD {
		// Only allocations made exportable can be exported.
		h, err := d.MallocPhysical(g, prop(d), 0)
		require.NoError(t, err)
		_, err = d.MemExportToShareableHandle(h, ht, acl.ExportDefault)
		requireFail(t, f, err, acl.ErrCodeRTParamInvalid, "export of an allocation made without HandleType POSIX")
		require.NoError(t, d.FreePhysical(h))
	}
	base := reserve(t, d, g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h, err := d.MallocPhysical(g, exportable(d), 0)
	require.NoError(t, err)
	s, err := d.MemExportToShareableHandle(h, ht, acl.ExportDefault)
	require.NoError(t, err)
	assert.Equal(t, ht, s.Type)
	var file ipc.FileID
	if fd, ok := s.FD(); ok {
		file, _, err = ipc.Stat(fd)
		require.NoError(t, err, "the exported descriptor is open")
	}
	_, err = d.MemExportToShareableHandle(h, ht, acl.ExportDefault)
	requireFail(t, f, err, acl.ErrCodeRTDrvInternal, "a second export")
	if sh == acl.SharingToken {
		pid, err := d.DeviceGetBareTgid()
		require.NoError(t, err)
		require.NoError(t, d.MemSetPidToShareableHandle(s, []int32{pid + 1}))
	}
	// The exporting process cannot import its own export.
	_, err = d.MemImportFromShareableHandle(s, d.Device())
	requireFail(t, f, err, acl.ErrCodeRTDrvInternal, "an import by the exporter")
	_, err = d.MemImportFromShareableHandle(s, d.Device()+1)
	require.Error(t, err, "an import on another device")

	// The exported allocation is memory like any other.
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	setAccess(t, d, base, g)
	require.NoError(t, d.MemcpyHtoD(base, []byte("shared")))
	got := make([]byte, 6)
	require.NoError(t, d.MemcpyDtoH(got, base))
	assert.Equal(t, "shared", string(got))
	unmapFree(t, d, base, h)
	_, err = d.MemExportToShareableHandle(h, ht, acl.ExportDefault)
	requireFail(t, f, err, acl.ErrCodeRTInvalidHandle, "export of a freed allocation")
	if counted {
		after, _ := live(d)
		after.Reservations, after.ReservedBytes = before.Reservations, before.ReservedBytes
		assert.Equal(t, before, after, "nothing held after the exported allocation is freed")
	}
	if fd, ok := s.FD(); ok {
		// Once freed, the driver has closed its descriptor: the number is
		// closed, or names another file.
		now, _, err := ipc.Stat(fd)
		assert.True(t, err != nil || now != file, "the exported descriptor is closed with the allocation")
	}
}
