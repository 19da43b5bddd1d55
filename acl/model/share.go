package model

import (
	"os"

	"github.com/vmarena/vmarena/acl"
)

// The model does not share memory between processes (Caps().Sharing is
// acl.SharingNone): the profiles measure no export or import, and the
// model's memory is books in one process. The calls fail with 207000.

const noSharing = "the device model does not share memory between processes"

// MemExportToShareableHandle fails with 207000.
func (d *Driver) MemExportToShareableHandle(h acl.PhysicalHandle, handleType acl.MemHandleType, flags uint64) (acl.ShareableHandle, error) {
	return acl.ShareableHandle{}, acl.NewError("aclrtMemExportToShareableHandle", acl.ErrCodeRTFeatureNotSupport, noSharing)
}

// MemSetPidToShareableHandle fails with 207000.
func (d *Driver) MemSetPidToShareableHandle(s acl.ShareableHandle, pids []int32) error {
	return acl.NewError("aclrtMemSetPidToShareableHandle", acl.ErrCodeRTFeatureNotSupport, noSharing)
}

// MemImportFromShareableHandle fails with 207000.
func (d *Driver) MemImportFromShareableHandle(s acl.ShareableHandle, device int32) (acl.PhysicalHandle, error) {
	return 0, acl.NewError("aclrtMemImportFromShareableHandle", acl.ErrCodeRTFeatureNotSupport, noSharing)
}

// DeviceGetBareTgid returns os.Getpid(), or 107002 once the driver is closed.
func (d *Driver) DeviceGetBareTgid() (int32, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return 0, acl.NewError("aclrtDeviceGetBareTgid", acl.ErrCodeRTContextNull, "driver closed")
	}
	return int32(os.Getpid()), nil
}
