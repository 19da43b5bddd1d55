package acl

import "fmt"

// DevicePtr is a device virtual address. It is an integer, not a Go pointer:
// the host can dereference it only where the driver says so (the host driver).
type DevicePtr uintptr

// String formats p in hexadecimal.
func (p DevicePtr) String() string { return fmt.Sprintf("%#x", uintptr(p)) }

// Add returns p advanced by n bytes.
func (p DevicePtr) Add(n uintptr) DevicePtr { return p + DevicePtr(n) }

// Stream is an aclrtStream (a CUstream on CUDA): a queue of device work that
// runs in order. 0 is the device's default stream.
type Stream uintptr

// Event is an aclrtEvent (a CUevent on CUDA): a mark in a stream's queue that
// completes when the work queued before it has run. The zero Event is never
// valid.
type Event uintptr

// PhysicalHandle is an aclrtDrvMemHandle: an opaque handle to a physical
// allocation made by MallocPhysical. The zero handle is never valid.
type PhysicalHandle uintptr

// MemHandleType is aclrtMemHandleType.
type MemHandleType int32

// Handle types. MallocPhysical accepts MemHandleTypeNone, and
// MemHandleTypePOSIX (an allocation that can be exported as a file
// descriptor) where Caps().Sharing is SharingFD; ACL accepts NONE only, and
// exports any allocation as a token.
const (
	MemHandleTypeNone  MemHandleType = 0 // ACL_MEM_HANDLE_TYPE_NONE
	MemHandleTypePOSIX MemHandleType = 2 // ACL_MEM_HANDLE_TYPE_POSIX
)

// MemAllocationType is aclrtMemAllocationType.
type MemAllocationType int32

// MemAllocationTypePinned is ACL_MEM_ALLOCATION_TYPE_PINNED, the only value.
const MemAllocationTypePinned MemAllocationType = 0

// MemLocationType is aclrtMemLocationType.
type MemLocationType int32

// Memory locations.
const (
	MemLocationTypeHost         MemLocationType = 0 // ACL_MEM_LOCATION_TYPE_HOST
	MemLocationTypeDevice       MemLocationType = 1 // ACL_MEM_LOCATION_TYPE_DEVICE
	MemLocationTypeUnregistered MemLocationType = 2 // ACL_MEM_LOCATION_TYPE_UNREGISTERED
	MemLocationTypeManaged      MemLocationType = 3 // ACL_MEM_LOCATION_TYPE_MANAGED
	MemLocationTypeHostNUMA     MemLocationType = 4 // ACL_MEM_LOCATION_TYPE_HOST_NUMA
)

// MemAttr is aclrtMemAttr: the kind of physical memory, and the attr argument
// of aclrtGetMemInfo.
type MemAttr int32

// Memory attributes, with ACL's values.
const (
	DDRMem          MemAttr = 0  // ACL_DDR_MEM
	HBMMem          MemAttr = 1  // ACL_HBM_MEM
	DDRMemHuge      MemAttr = 2  // ACL_DDR_MEM_HUGE
	DDRMemNormal    MemAttr = 3  // ACL_DDR_MEM_NORMAL
	HBMMemHuge      MemAttr = 4  // ACL_HBM_MEM_HUGE
	HBMMemNormal    MemAttr = 5  // ACL_HBM_MEM_NORMAL
	DDRMemP2PHuge   MemAttr = 6  // ACL_DDR_MEM_P2P_HUGE
	DDRMemP2PNormal MemAttr = 7  // ACL_DDR_MEM_P2P_NORMAL
	HBMMemP2PHuge   MemAttr = 8  // ACL_HBM_MEM_P2P_HUGE
	HBMMemP2PNormal MemAttr = 9  // ACL_HBM_MEM_P2P_NORMAL
	HBMMemHuge1G    MemAttr = 10 // ACL_HBM_MEM_HUGE1G
	HBMMemP2PHuge1G MemAttr = 11 // ACL_HBM_MEM_P2P_HUGE1G
	MemNormal       MemAttr = 12 // ACL_MEM_NORMAL
	MemHuge         MemAttr = 13 // ACL_MEM_HUGE
	MemHuge1G       MemAttr = 14 // ACL_MEM_HUGE1G
	MemP2PNormal    MemAttr = 15 // ACL_MEM_P2P_NORMAL
	MemP2PHuge      MemAttr = 16 // ACL_MEM_P2P_HUGE
	MemP2PHuge1G    MemAttr = 17 // ACL_MEM_P2P_HUGE1G
)

// Huge1G reports whether a allocates in 1 GiB pages.
func (a MemAttr) Huge1G() bool {
	return a == HBMMemHuge1G || a == HBMMemP2PHuge1G || a == MemHuge1G || a == MemP2PHuge1G
}

// PhysicalSupported reports whether MallocPhysical accepts a, per the ACL
// layer's memAttr table (docs/acl.md, "Enum values"). ACL_DDR_MEM, ACL_HBM_MEM and the
// HBM P2P attributes are rejected with ACL_ERROR_INVALID_PARAM.
func (a MemAttr) PhysicalSupported() bool {
	switch a {
	case HBMMemHuge, HBMMemNormal, HBMMemHuge1G, DDRMemHuge, DDRMemNormal, DDRMemP2PHuge, DDRMemP2PNormal,
		MemNormal, MemHuge, MemHuge1G, MemP2PNormal, MemP2PHuge, MemP2PHuge1G:
		return true
	}
	return false
}

// DDR reports whether a is one of the ACL_DDR_MEM* attributes.
func (a MemAttr) DDR() bool {
	return a == DDRMem || (a >= DDRMemHuge && a <= DDRMemNormal) || a == DDRMemP2PHuge || a == DDRMemP2PNormal
}

// MemGranularityOptions is aclrtMemGranularityOptions.
type MemGranularityOptions int32

// Granularity options.
const (
	GranularityMinimum     MemGranularityOptions = 0      // ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM
	GranularityRecommended MemGranularityOptions = 1      // ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED
	GranularityUndef       MemGranularityOptions = 0xFFFF // ACL_RT_MEM_ALLOC_GRANULARITY_UNDEF
)

// MemAccessFlags is aclrtMemAccessFlags.
type MemAccessFlags int32

// Access flags. ACL supports only MemAccessReadWrite today.
const (
	MemAccessNone      MemAccessFlags = 0x0 // ACL_RT_MEM_ACCESS_FLAGS_NONE
	MemAccessRead      MemAccessFlags = 0x1 // ACL_RT_MEM_ACCESS_FLAGS_READ
	MemAccessReadWrite MemAccessFlags = 0x3 // ACL_RT_MEM_ACCESS_FLAGS_READWRITE
)

// MemcpyKind is aclrtMemcpyKind.
type MemcpyKind int32

// Copy directions.
const (
	MemcpyHostToHost          MemcpyKind = 0 // ACL_MEMCPY_HOST_TO_HOST
	MemcpyHostToDevice        MemcpyKind = 1 // ACL_MEMCPY_HOST_TO_DEVICE
	MemcpyDeviceToHost        MemcpyKind = 2 // ACL_MEMCPY_DEVICE_TO_HOST
	MemcpyDeviceToDevice      MemcpyKind = 3 // ACL_MEMCPY_DEVICE_TO_DEVICE
	MemcpyDefault             MemcpyKind = 4 // ACL_MEMCPY_DEFAULT
	MemcpyHostToBufToDevice   MemcpyKind = 5 // ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE
	MemcpyInnerDeviceToDevice MemcpyKind = 6 // ACL_MEMCPY_INNER_DEVICE_TO_DEVICE
	MemcpyInterDeviceToDevice MemcpyKind = 7 // ACL_MEMCPY_INTER_DEVICE_TO_DEVICE
)

// Page types for the flags argument of ReserveMemAddress (CANN 7.0–8.x; 9.x
// ignores it and recommends 0).
const (
	ReserveNormalPage uint64 = 0 // NORMAL_PAGE_TYPE
	ReserveHugePage   uint64 = 1 // HUGE_PAGE_TYPE
)

// MemLocation is aclrtMemLocation (8 bytes).
type MemLocation struct {
	ID   uint32          // device id; NUMA id for HostNUMA; 0 for Host
	Type MemLocationType // where the memory lives
}

// PhysicalMemProp is aclrtPhysicalMemProp (32 bytes, the C layout).
type PhysicalMemProp struct {
	HandleType     MemHandleType     // MemHandleTypeNone, or MemHandleTypePOSIX for an exportable allocation (SharingFD)
	AllocationType MemAllocationType // must be MemAllocationTypePinned
	MemAttr        MemAttr           // kind of memory, e.g. HBMMemHuge
	Location       MemLocation       // device the memory lives on
	_              [4]byte           // C padding
	Reserve        uint64            // must be 0
}

// DeviceProp returns the properties vmarena allocates with: pinned HBM in
// 2 MiB pages (or attr, when it is not zero) on the given device.
func DeviceProp(device int32, attr MemAttr) PhysicalMemProp {
	if attr == 0 {
		attr = HBMMemHuge
	}
	return PhysicalMemProp{
		HandleType:     MemHandleTypeNone,
		AllocationType: MemAllocationTypePinned,
		MemAttr:        attr,
		Location:       MemLocation{ID: uint32(device), Type: MemLocationTypeDevice},
	}
}

// MemAccessDesc is aclrtMemAccessDesc (24 bytes).
type MemAccessDesc struct {
	Flags    MemAccessFlags // MemAccessReadWrite
	Location MemLocation    // who gets the access
	Rsv      [12]byte       // reserved, zero
}

// Page sizes of ACL physical memory.
const (
	HugePageSize   = 2 << 20 // granularity of every attribute but HUGE1G
	Huge1GPageSize = 1 << 30 // granularity of the HUGE1G attributes
	// MaxReserve is the largest ReserveMemAddress the Ascend driver grants in
	// one call, and the default limit of every driver here (Caps.MaxReserve
	// reports a driver's own).
	MaxReserve = 128 << 30
)
