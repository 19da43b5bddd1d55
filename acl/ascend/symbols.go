package ascend

import "github.com/vmarena/vmarena/acl"

// symbols are the ACL functions the driver calls, with Go signatures that
// match acl_rt.h on LP64 Linux: aclError and every enum are int32 (C enums
// are 4 bytes); size_t is uintptr; device addresses, physical handles,
// contexts, streams and events (all void* in C) are integers; host memory and
// out-parameters are Go pointers, which the runtime uses only during the call.
// Structs go by pointer, in the exact C layouts of the acl types (checked in
// layout.go).
type symbols struct {
	aclInit         func(configPath *byte) int32
	getRecentErrMsg func() string // NULL reads as ""

	getDeviceCount    func(count *uint32) int32
	setDevice         func(id int32) int32
	resetDevice       func(id int32) int32
	getCurrentContext func(ctx *uintptr) int32
	setCurrentContext uintptr // the address: called with purego.SyscallN (library.setContext)
	synchronizeDevice func() int32
	createStream      func(stream *acl.Stream) int32
	destroyStream     func(stream acl.Stream) int32
	synchronizeStream func(stream acl.Stream) int32

	memGetAllocationGranularity func(prop *acl.PhysicalMemProp, option acl.MemGranularityOptions, granularity *uintptr) int32
	mallocPhysical              func(handle *acl.PhysicalHandle, size uintptr, prop *acl.PhysicalMemProp, flags uint64) int32
	freePhysical                func(handle acl.PhysicalHandle) int32
	reserveMemAddress           func(virPtr *acl.DevicePtr, size, alignment uintptr, expectPtr acl.DevicePtr, flags uint64) int32
	releaseMemAddress           func(virPtr acl.DevicePtr) int32
	mapMem                      func(virPtr acl.DevicePtr, size, offset uintptr, handle acl.PhysicalHandle, flags uint64) int32
	unmapMem                    func(virPtr acl.DevicePtr) int32

	// aclrtMemcpy, typed once per direction so that host memory is a Go
	// pointer and device memory an integer.
	memcpyHtoD  func(dst acl.DevicePtr, destMax uintptr, src *byte, count uintptr, kind acl.MemcpyKind) int32
	memcpyDtoH  func(dst *byte, destMax uintptr, src acl.DevicePtr, count uintptr, kind acl.MemcpyKind) int32
	memcpyAsync func(dst acl.DevicePtr, destMax uintptr, src acl.DevicePtr, count uintptr, kind acl.MemcpyKind, stream acl.Stream) int32
	memset      func(devPtr acl.DevicePtr, maxCount uintptr, value int32, count uintptr) int32
	getMemInfo  func(attr acl.MemAttr, free, total *uintptr) int32

	// aclrtMallocHost writes a void* to page-locked host memory, which
	// the runtime owns until aclrtFreeHost.
	mallocHost func(hostPtr **byte, size uintptr) int32
	freeHost   func(hostPtr *byte) int32
}

// symbol is one entry of the table resolved when a library loads.
type symbol struct {
	name     string
	fn       any  // pointer to the func field to fill, or to a uintptr for the bare address
	required bool // Open fails without it
}

// table lists the symbols resolved at load: the runtime is unusable without
// any of them, and every release with the VMM calls (CANN 7.0 on) has them.
// Newer or optional calls are not here: they are resolved on first use
// (library.setAccess, library.events and friends).
func (s *symbols) table() []symbol {
	return []symbol{
		{"aclInit", &s.aclInit, true},
		{"aclGetRecentErrMsg", &s.getRecentErrMsg, false}, // without it errors carry no message
		{"aclrtGetDeviceCount", &s.getDeviceCount, true},
		{"aclrtSetDevice", &s.setDevice, true},
		{"aclrtResetDevice", &s.resetDevice, true},
		{"aclrtGetCurrentContext", &s.getCurrentContext, true},
		{"aclrtSetCurrentContext", &s.setCurrentContext, true},
		{"aclrtSynchronizeDevice", &s.synchronizeDevice, true},
		{"aclrtCreateStream", &s.createStream, true},
		{"aclrtDestroyStream", &s.destroyStream, true},
		{"aclrtSynchronizeStream", &s.synchronizeStream, true},
		{"aclrtMemGetAllocationGranularity", &s.memGetAllocationGranularity, true},
		{"aclrtMallocPhysical", &s.mallocPhysical, true},
		{"aclrtFreePhysical", &s.freePhysical, true},
		{"aclrtReserveMemAddress", &s.reserveMemAddress, true},
		{"aclrtReleaseMemAddress", &s.releaseMemAddress, true},
		{"aclrtMapMem", &s.mapMem, true},
		{"aclrtUnmapMem", &s.unmapMem, true},
		{"aclrtMemcpy", &s.memcpyHtoD, true},
		{"aclrtMemcpy", &s.memcpyDtoH, true},
		{"aclrtMemcpyAsync", &s.memcpyAsync, true},
		{"aclrtMemset", &s.memset, true},
		{"aclrtGetMemInfo", &s.getMemInfo, true},
		{"aclrtMallocHost", &s.mallocHost, true},
		{"aclrtFreeHost", &s.freeHost, true},
	}
}

// Functions resolved on first use, with their Go signatures.
type (
	memSetAccessFunc = func(virPtr acl.DevicePtr, size uintptr, desc *acl.MemAccessDesc, count uintptr) int32
	finalizeFunc     = func() int32
	socNameFunc      = func() string
	memsetAsyncFunc  = func(devPtr acl.DevicePtr, maxCount uintptr, value int32, count uintptr, stream acl.Stream) int32
	// propsFromHandleFunc is aclrtMemGetAllocationPropertiesFromHandle.
	propsFromHandleFunc = func(handle acl.PhysicalHandle, prop *acl.PhysicalMemProp) int32
	// streamQueryFunc is aclrtStreamQuery; status is an aclrtStreamStatus.
	streamQueryFunc = func(stream acl.Stream, status *int32) int32
)

// aclrtStreamStatus, the status aclrtStreamQuery reports.
const (
	streamStatusComplete int32 = 0 // ACL_STREAM_STATUS_COMPLETE: every task on the stream has run
	streamStatusNotReady int32 = 1 // ACL_STREAM_STATUS_NOT_READY: at least one has not
)

// aclrtEventRecordedStatus, the status aclrtQueryEventStatus reports. The
// deprecated aclrtQueryEvent reports an aclrtEventStatus, whose values are
// the other way round (COMPLETE = 0); the driver never calls it.
const (
	eventRecordedNotReady int32 = 0 // ACL_EVENT_RECORDED_STATUS_NOT_READY: not recorded, or the work before it has not run
	eventRecordedComplete int32 = 1 // ACL_EVENT_RECORDED_STATUS_COMPLETE
)

// eventFuncs are the event calls. They are resolved together on first use,
// all or none, so that a runtime lacking one of them refuses events from
// CreateEvent on, rather than after an event exists.
type eventFuncs struct {
	create  func(event *acl.Event) int32
	record  func(event acl.Event, stream acl.Stream) int32
	query   func(event acl.Event, status *int32) int32 // aclrtQueryEventStatus
	sync    func(event acl.Event) int32
	destroy func(event acl.Event) int32
}

func (e *eventFuncs) table() []symbol {
	return []symbol{
		{"aclrtCreateEvent", &e.create, true},
		{"aclrtRecordEvent", &e.record, true},
		{"aclrtQueryEventStatus", &e.query, true},
		{"aclrtSynchronizeEvent", &e.sync, true},
		{"aclrtDestroyEvent", &e.destroy, true},
	}
}

// cString returns s as a NUL-terminated C string, or nil for "".
func cString(s string) *byte {
	if s == "" {
		return nil
	}
	b := make([]byte, len(s)+1)
	copy(b, s)
	return &b[0]
}

// shareFuncs are the calls that share physical memory between processes,
// resolved together on first use, all or none.
type shareFuncs struct {
	export func(handle acl.PhysicalHandle, handleType acl.MemHandleType, flags uint64, shareable *uint64) int32
	setPid func(shareable uint64, pid *int32, pidNum uintptr) int32
	imp    func(shareable uint64, deviceID int32, handle *acl.PhysicalHandle) int32
}

func (f *shareFuncs) table() []symbol {
	return []symbol{
		{"aclrtMemExportToShareableHandle", &f.export, true},
		{"aclrtMemSetPidToShareableHandle", &f.setPid, true},
		{"aclrtMemImportFromShareableHandle", &f.imp, true},
	}
}

// bareTgidFunc is aclrtDeviceGetBareTgid.
type bareTgidFunc = func(pid *int32) int32
