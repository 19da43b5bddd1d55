package ascend

import (
	"os"

	"github.com/vmarena/vmarena/acl"
)

// MemExportToShareableHandle TODO.
func (d *Driver) MemExportToShareableHandle(h acl.PhysicalHandle, handleType acl.MemHandleType, flags uint64) (acl.ShareableHandle, error) {
	return acl.ShareableHandle{}, acl.NewError("aclrtMemExportToShareableHandle", acl.ErrCodeRTFeatureNotSupport, "not implemented yet in this binding")
}

// MemSetPidToShareableHandle TODO.
func (d *Driver) MemSetPidToShareableHandle(s acl.ShareableHandle, pids []int32) error {
	return acl.NewError("aclrtMemSetPidToShareableHandle", acl.ErrCodeRTFeatureNotSupport, "not implemented yet in this binding")
}

// MemImportFromShareableHandle TODO.
func (d *Driver) MemImportFromShareableHandle(s acl.ShareableHandle, device int32) (acl.PhysicalHandle, error) {
	return 0, acl.NewError("aclrtMemImportFromShareableHandle", acl.ErrCodeRTFeatureNotSupport, "not implemented yet in this binding")
}

// DeviceGetBareTgid TODO.
func (d *Driver) DeviceGetBareTgid() (int32, error) { return int32(os.Getpid()), nil }
