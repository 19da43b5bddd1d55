package acl

import "fmt"

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
	// ptr. Like ACL and CUDA, it does not wait for device work: the caller
	// makes sure nothing queued still reads or writes the range, by waiting
	// for an event recorded after that work (SynchronizeEvent) or, as a last
	// resort, for the whole device (SynchronizeDevice). Work that touches a
	// range after its unmap faults on a device; the host driver and the
	// model record it as a fault of the stream.
	UnmapMem(ptr DevicePtr) error
	// MemSetAccess is aclrtMemSetAccess: grant access to the mapping at
	// [ptr, ptr+size), which must match one MapMem call, or, where
	// Caps().AccessSpan says so, a run of adjacent mappings of one
	// reservation. An error matching ErrNotSupported means the runtime lacks
	// the call and mappings are accessible to their device without it.
	MemSetAccess(ptr DevicePtr, size uintptr, desc []MemAccessDesc) error

	// The copies and Memset are synchronous: they return when the bytes are
	// in place. Every byte of a device range must be mapped with access. They
	// are not ordered after work queued on streams: a range that queued work
	// may still write must be waited for first (the host driver records a
	// synchronous access to such a range as a fault).
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

	// Streams and events order work on the device without waiting for all
	// of it. A stream is a queue of device work that runs in order; the
	// caller that creates one owns it, and Stream 0 is the device's default
	// stream. An event marks a point in a stream's queue: it completes when
	// the work queued before it has run. Vmarena itself creates no streams
	// and queues nothing on its callers' streams but events and the memsets
	// that clear memory for a new owner.
	//
	// CreateStream is aclrtCreateStream: a new stream, owned by the caller.
	CreateStream() (Stream, error)
	// DestroyStream is aclrtDestroyStream. The stream must have no work
	// pending (synchronise it first).
	DestroyStream(s Stream) error
	// SynchronizeStream is aclrtSynchronizeStream: wait until the work queued
	// on s has run. It returns the error of work that failed on s.
	SynchronizeStream(s Stream) error
	// SynchronizeDevice is aclrtSynchronizeDevice: wait until every stream of
	// the device has drained. It stalls all work in flight, so vmarena uses it
	// only as the fallback where no stream or event orders an unmap.
	SynchronizeDevice() error
	// CreateEvent is aclrtCreateEvent: a new event, never recorded.
	CreateEvent() (Event, error)
	// RecordEvent is aclrtRecordEvent: mark the present end of s's queue. The
	// event completes when the work queued on s before it has run. Recording
	// again moves the mark.
	RecordEvent(ev Event, s Stream) error
	// QueryEvent is aclrtQueryEventStatus: whether the work before ev's last
	// record has run (ACL_EVENT_RECORDED_STATUS_COMPLETE). It never waits. An
	// event never recorded reports false on ACL and true on CUDA: callers do
	// not ask.
	QueryEvent(ev Event) (complete bool, err error)
	// SynchronizeEvent is aclrtSynchronizeEvent: wait until ev completes.
	SynchronizeEvent(ev Event) error
	// DestroyEvent is aclrtDestroyEvent.
	DestroyEvent(ev Event) error
	// MemsetAsync is aclrtMemsetAsync(ptr, n, value, n, s): queue a memset
	// of n bytes on s and return. The range must be mapped with access and
	// stay mapped until the memset has run.
	MemsetAsync(ptr DevicePtr, value byte, n uintptr, s Stream) error

	// Pinned host memory: page-locked, so that copies between it and the
	// device run at the link's full speed, with no staging through a
	// bounce buffer (an arena's offload to host goes through it).
	//
	// MallocHost is aclrtMallocHost (cuMemHostAlloc with flags 0 on CUDA):
	// size bytes of page-locked host memory, not initialised. Size 0 fails
	// with ErrInvalidParam (100000). The host driver and the device model
	// return ordinary, unpinned memory, and count it.
	MallocHost(size uintptr) ([]byte, error)
	// FreeHost is aclrtFreeHost (cuMemFreeHost): free memory MallocHost
	// returned, given the slice it returned (its first byte names it). It
	// does not wait for device work that may still copy to or from it.
	FreeHost(b []byte) error

	// Sharing memory with other processes (see ShareableHandle and
	// Caps().Sharing). A driver that cannot share fails these calls with
	// ErrNotSupported (207000), and DeviceGetBareTgid still answers.
	//
	// MemExportToShareableHandle is aclrtMemExportToShareableHandle: the
	// shareable form of h, of handleType Caps().Sharing.HandleType(), with
	// flags ExportDefault or ExportDisablePIDValidation. An allocation is
	// exported once; the result is valid until h is freed.
	MemExportToShareableHandle(h PhysicalHandle, handleType MemHandleType, flags uint64) (ShareableHandle, error)
	// MemSetPidToShareableHandle is aclrtMemSetPidToShareableHandle: the
	// processes (as DeviceGetBareTgid names them) that may import the token
	// s. Only the exporter may call it.
	MemSetPidToShareableHandle(s ShareableHandle, pids []int32) error
	// MemImportFromShareableHandle is aclrtMemImportFromShareableHandle:
	// a handle of this process for the memory another process exported, on
	// device (the driver's own). The handle is mapped and freed like one
	// MallocPhysical made; its memory stays alive while any process holds it.
	MemImportFromShareableHandle(s ShareableHandle, device int32) (PhysicalHandle, error)
	// DeviceGetBareTgid is aclrtDeviceGetBareTgid: this process's id as the
	// device knows it, for another process's MemSetPidToShareableHandle
	// (inside a container it differs from os.Getpid). Drivers without such a
	// call return os.Getpid().
	DeviceGetBareTgid() (int32, error)

	// Caps says what the device allows beyond the rules every driver
	// enforces. It makes no driver call.
	Caps() Caps

	// Close gives the device back (aclrtResetDevice). Calls after Close fail.
	// Close is safe to call more than once.
	Close() error
}

// Caps describes what a driver's device allows, or promises, beyond the rules
// every driver enforces. The zero value is the strictest device.
type Caps struct {
	// AccessSpan: one MemSetAccess may grant access to several adjacent
	// mappings of one reservation, as cuMemSetAccess does. ACL documents one
	// mapping per call; until an NPU shows otherwise the Ascend binding, and
	// the host driver that imitates it, say false.
	AccessSpan bool
	// Fresh says what a fresh physical allocation (MallocPhysical) may hold.
	Fresh Freshness
	// Sharing says in which form physical memory crosses processes, if at
	// all (SharingNone).
	Sharing Sharing
	// ReadOnly: MemSetAccess also grants MemAccessRead, so that a mapping
	// can be made read-only for the device. ACL documents READWRITE only.
	ReadOnly bool
	// MaxReserve is the largest ReserveMemAddress one call grants, in
	// bytes. 0 means MaxReserve (128 GiB), the Ascend driver's limit, which
	// every driver of this module accepts; see ReserveLimit.
	MaxReserve uintptr
}

// ReserveLimit returns the largest ReserveMemAddress one call grants:
// c.MaxReserve, or MaxReserve (128 GiB) when the driver leaves it 0.
func (c Caps) ReserveLimit() uintptr {
	if c.MaxReserve == 0 {
		return MaxReserve
	}
	return c.MaxReserve
}

// Freshness says what bytes a fresh physical allocation may hold, and so
// whether it must be cleared before a tenant may read it.
type Freshness int

const (
	// FreshUnknown: the memory may hold bytes any process freed. Clear it.
	FreshUnknown Freshness = iota
	// FreshProcess: the device clears memory between processes, so the
	// memory may hold only bytes this process freed. It needs clearing only
	// once the process has had more than one tenant on the device.
	FreshProcess
	// FreshZeroed: the memory is always zero.
	FreshZeroed
)

// String returns "unknown", "process" or "zeroed".
func (f Freshness) String() string {
	switch f {
	case FreshUnknown:
		return "unknown"
	case FreshProcess:
		return "process"
	case FreshZeroed:
		return "zeroed"
	}
	return fmt.Sprintf("acl.Freshness(%d)", int(f))
}

// LiveCounts counts what a driver holds on behalf of its callers. Tests use it
// to prove nothing leaked: every field is zero once everything is released.
type LiveCounts struct {
	Reservations  int     // reserved address ranges
	ReservedBytes uintptr // bytes in those ranges
	Mappings      int     // mapped ranges
	MappedBytes   uintptr // bytes in those mappings
	Handles       int     // physical allocations not yet freed, imported ones included
	PhysicalBytes uintptr // bytes of physical memory held, imported ones included
	Imported      int     // of Handles, those imported from another process
	ImportedBytes uintptr // of PhysicalBytes, those of imported handles
	Streams       int     // streams created and not destroyed
	Events        int     // events created and not destroyed
	HostBuffers   int     // host buffers MallocHost returned and FreeHost has not freed
	HostBytes     uintptr // bytes in those buffers
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

// Launcher is implemented by drivers that simulate a device (the host driver
// and the device model): they can queue stand-in device work, the way a
// kernel would be, so that tests can prove what vmarena waits for and what it
// does not.
type Launcher interface {
	// Launch queues work on s that reads and writes [ptr, ptr+n) and stays in
	// flight until done is closed (or, for a nil done, runs at once when its
	// turn comes). The range must be mapped with access when it is queued.
	Launch(s Stream, ptr DevicePtr, n uintptr, done <-chan struct{}) error
	// Faults returns how many times device work touched a range after it was
	// unmapped, or a synchronous copy touched a range that queued work was
	// still writing: what a real device would report as an illegal address
	// or a data race.
	Faults() int
}

// GrantAccess grants desc to n adjacent mappings of size bytes each, the
// first at ptr, the way d's device allows: one MemSetAccess over the whole
// run where d.Caps().AccessSpan says so, else one call per mapping (ACL's
// rule). It stops at the first error and returns it as the driver gave it;
// one matching ErrNotSupported means the runtime lacks the call and the
// mappings are accessible without it.
func GrantAccess(d Driver, ptr DevicePtr, size uintptr, n int, desc []MemAccessDesc) error {
	if n <= 0 {
		return nil
	}
	if d.Caps().AccessSpan {
		return d.MemSetAccess(ptr, uintptr(n)*size, desc)
	}
	for i := range n {
		if err := d.MemSetAccess(ptr.Add(uintptr(i)*size), size, desc); err != nil {
			return err
		}
	}
	return nil
}
