package acl

// Driver is the ACL virtual-memory API of one device. Each method is the ACL
// function named in its comment, with the same arguments in the same order,
// the output parameter turned into a result and the aclError into an error
// (an [*Error]).
//
// A Driver is safe for concurrent use: implementations bind the device's
// context on whatever OS thread runs the call. A Driver is bound to one device
// for its whole life, so calls take no device argument beyond what ACL itself
// asks for (the location in a PhysicalMemProp).
type Driver interface {
	// Name describes the driver and its device, e.g. "host" or "ascend:0".
	Name() string
	// Device is the id of the device the driver is bound to.
	Device() int32

	// MemGetAllocationGranularity is aclrtMemGetAllocationGranularity: the
	// multiple that sizes and addresses for memory with prop must be.
	MemGetAllocationGranularity(prop *PhysicalMemProp, option MemGranularityOptions) (uintptr, error)
	// MallocPhysical is aclrtMallocPhysical: allocate size bytes of physical
	// memory. The memory is not guaranteed to be zeroed.
	MallocPhysical(size uintptr, prop *PhysicalMemProp, flags uint64) (PhysicalHandle, error)
	// FreePhysical is aclrtFreePhysical: drop the owner's reference to h. The
	// memory returns to the device when no mapping of it remains.
	FreePhysical(h PhysicalHandle) error
	// ReserveMemAddress is aclrtReserveMemAddress: reserve size bytes of
	// device virtual address space, backed by nothing. alignment must be 0 and
	// expect must be 0 (the driver chooses the address).
	ReserveMemAddress(size, alignment uintptr, expect DevicePtr, flags uint64) (DevicePtr, error)
	// ReleaseMemAddress is aclrtReleaseMemAddress: give back a reservation,
	// given its exact base. No mapping may remain in it.
	ReleaseMemAddress(base DevicePtr) error
	// MapMem is aclrtMapMem: back [ptr, ptr+size) with the whole physical
	// allocation h. size equals h's size, offset and flags are 0.
	MapMem(ptr DevicePtr, size, offset uintptr, h PhysicalHandle, flags uint64) error
	// UnmapMem is aclrtUnmapMem: remove the mapping that starts exactly at
	// ptr. On a device, work that may still read the range is waited for first.
	UnmapMem(ptr DevicePtr) error
	// MemSetAccess is aclrtMemSetAccess: grant access to the mapping at
	// [ptr, ptr+size), which must match one MapMem call. An error matching
	// ErrNotSupported means the runtime lacks the call and mappings are
	// accessible to their device without it.
	MemSetAccess(ptr DevicePtr, size uintptr, desc []MemAccessDesc) error

	// The copies and Memset are synchronous: they return when the bytes are
	// in place. Every byte of a device range must be mapped with access.
	//
	// MemcpyHtoD is aclrtMemcpy(dst, len(src), src, len(src), ACL_MEMCPY_HOST_TO_DEVICE).
	MemcpyHtoD(dst DevicePtr, src []byte) error
	// MemcpyDtoH is aclrtMemcpy(dst, len(dst), src, len(dst), ACL_MEMCPY_DEVICE_TO_HOST).
	MemcpyDtoH(dst []byte, src DevicePtr) error
	// MemcpyDtoD copies n bytes from src to dst on the device
	// (ACL_MEMCPY_DEVICE_TO_DEVICE). ACL copies within reserved memory only
	// with aclrtMemcpyAsync and 64-byte-aligned ends, so the Ascend binding
	// does that plus a stream sync, and bounces other copies through the host.
	// The ranges must not overlap (the devices leave that undefined).
	MemcpyDtoD(dst, src DevicePtr, n uintptr) error
	// Memset is aclrtMemset(ptr, n, value, n).
	Memset(ptr DevicePtr, value byte, n uintptr) error
	// GetMemInfo is aclrtGetMemInfo: free and total bytes of attr memory on
	// the device.
	GetMemInfo(attr MemAttr) (free, total uintptr, err error)

	// Close gives the device back (aclrtResetDevice). Calls after Close fail.
	// Close is safe to call more than once.
	Close() error
}

// LiveCounts counts what a driver holds on behalf of its callers. Tests use it
// to prove nothing leaked: every field is zero once everything is released.
type LiveCounts struct {
	Reservations  int     // reserved address ranges
	ReservedBytes uintptr // bytes in those ranges
	Mappings      int     // mapped ranges
	MappedBytes   uintptr // bytes in those mappings
	Handles       int     // physical allocations not yet freed
	PhysicalBytes uintptr // bytes of physical memory held
}

// Zero reports whether nothing is held.
func (c LiveCounts) Zero() bool { return c == LiveCounts{} }

// Counter is implemented by drivers that count their live objects (the host
// driver and the test doubles).
type Counter interface {
	Live() LiveCounts
}

// ReadWrite returns the access descriptor that grants the device read and
// write access to its own memory.
func ReadWrite(device int32) []MemAccessDesc {
	return []MemAccessDesc{{Flags: MemAccessReadWrite, Location: MemLocation{ID: uint32(device), Type: MemLocationTypeDevice}}}
}

// Zeroing is implemented by drivers whose MallocPhysical always returns
// zeroed memory, like the host driver (fallocate zeroes the pages it
// commits). ACL and CUDA promise no such thing.
type Zeroing interface {
	PhysicalZeroed() bool
}

// PhysicalZeroed reports whether d, or the driver it wraps (through an
// Unwrap() Driver method, as wrappers for tests provide), promises zeroed
// physical memory.
func PhysicalZeroed(d Driver) bool {
	for d != nil {
		if z, ok := d.(Zeroing); ok {
			return z.PhysicalZeroed()
		}
		u, ok := d.(interface{ Unwrap() Driver })
		if !ok {
			return false
		}
		d = u.Unwrap()
	}
	return false
}
