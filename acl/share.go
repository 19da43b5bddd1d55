package acl

import "fmt"

// Sharing physical memory between processes.
//
// A physical allocation made in one process can be mapped by another, with no
// copy: its owner exports it (MemExportToShareableHandle), the shareable form
// travels to the other process, which imports it (MemImportFromShareableHandle)
// and maps the handle it gets like one of its own. The memory lives until
// every process that holds it has unmapped and freed it, as a device counts
// references. Devices share in one of two forms, which Caps().Sharing names:
//
//   - SharingToken (ACL): aclrtMemExportToShareableHandle with
//     ACL_MEM_HANDLE_TYPE_NONE writes a uint64 token. A token is a number,
//     not a capability: with ExportDefault only the processes whose PIDs
//     were set with MemSetPidToShareableHandle may import it (the PID is what
//     DeviceGetBareTgid returns in the importer). Any allocation can be
//     exported.
//   - SharingFD (CUDA, and the host driver): the shareable form is a POSIX
//     file descriptor (ACL_MEM_HANDLE_TYPE_POSIX, CUDA's
//     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR). The descriptor is the
//     capability: whoever holds it may import, so it is passed over a Unix
//     domain socket (SCM_RIGHTS) to a process the sender has identified. Only
//     allocations made with PhysicalMemProp.HandleType = MemHandleTypePOSIX
//     can be exported. There is no allow-list; MemSetPidToShareableHandle
//     fails with ErrNotSupported.
//
// The rules every driver enforces, because the strictest device (ACL) does:
// an allocation is exported at most once (a second export fails with
// 507899); an imported allocation cannot be exported again (507899); a
// process cannot import what it exported itself (507899); an unknown or
// stale shareable handle is refused with 107017; importing the same memory
// twice in one process returns the same PhysicalHandle with one more
// reference, and each import is freed with its own FreePhysical.

// ShareableHandle is the shareable form of a physical allocation: what
// aclrtMemExportToShareableHandle writes into its uint64, or what
// cuMemExportToShareableHandle writes for a POSIX file descriptor.
//
// An exported descriptor belongs to the driver that exported it: it stays
// open until the allocation is freed (FreePhysical), and the caller must not
// close it. A descriptor passed to MemImportFromShareableHandle stays the
// caller's: the driver keeps what it needs, and the caller may close it as
// soon as the import returns.
type ShareableHandle struct {
	// Type is the form: MemHandleTypeNone for an ACL token,
	// MemHandleTypePOSIX for a file descriptor.
	Type MemHandleType
	// Value is the token, or the file descriptor.
	Value uint64
}

// FD returns the file descriptor s carries, and whether it carries one.
func (s ShareableHandle) FD() (int, bool) {
	if s.Type != MemHandleTypePOSIX {
		return -1, false
	}
	return int(s.Value), true
}

// String formats s as "token:0x…" or "fd:N".
func (s ShareableHandle) String() string {
	switch s.Type {
	case MemHandleTypeNone:
		return fmt.Sprintf("token:%#x", s.Value)
	case MemHandleTypePOSIX:
		return fmt.Sprintf("fd:%d", s.Value)
	}
	return fmt.Sprintf("acl.ShareableHandle{%d, %#x}", s.Type, s.Value)
}

// Flags of MemExportToShareableHandle.
const (
	// ExportDefault is ACL_RT_VMM_EXPORT_FLAG_DEFAULT: only the PIDs set
	// with MemSetPidToShareableHandle may import a token.
	ExportDefault uint64 = 0x0
	// ExportDisablePIDValidation is
	// ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION: any process may import
	// the token. Drivers that share descriptors accept it and ignore it.
	ExportDisablePIDValidation uint64 = 0x1
	// ExportReadOnly is vmarena's own flag, not ACL's: the shareable form
	// lets the importer read the memory and not write it, where the driver
	// can enforce that against the importer. The host driver seals the
	// memory file against writes through any new mapping or descriptor (its
	// own mapping, made before, stays writable); ACL and CUDA cannot refuse
	// an importer write access, and ignore it (the bindings never pass it
	// to the runtime).
	ExportReadOnly uint64 = 0x100
)

// Sharing says how a driver's physical memory crosses processes.
type Sharing int

const (
	// SharingNone: the driver cannot share memory between processes; the
	// export and import calls fail with ErrNotSupported.
	SharingNone Sharing = iota
	// SharingToken: ACL's uint64 tokens, with an allow-list of PIDs.
	SharingToken
	// SharingFD: POSIX file descriptors, for allocations made with
	// PhysicalMemProp.HandleType = MemHandleTypePOSIX.
	SharingFD
)

// HandleType returns the MemHandleType of the shareable form: the handleType
// argument of MemExportToShareableHandle, and for SharingFD the HandleType
// an exportable allocation is made with.
func (s Sharing) HandleType() MemHandleType {
	if s == SharingFD {
		return MemHandleTypePOSIX
	}
	return MemHandleTypeNone
}

// String returns "none", "token" or "fd".
func (s Sharing) String() string {
	switch s {
	case SharingNone:
		return "none"
	case SharingToken:
		return "token"
	case SharingFD:
		return "fd"
	}
	return fmt.Sprintf("acl.Sharing(%d)", int(s))
}
