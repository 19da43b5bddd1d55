// Package cuda implements the acl.Driver contract on an NVIDIA GPU, through
// the CUDA driver API's virtual-memory management (VMM) calls, streams and
// events, so that the arena runs unchanged on CUDA.
//
// # Loading
//
// The CUDA driver library is loaded at run time with purego: no cgo and no
// CUDA headers at build time, and a machine without CUDA builds and runs
// everything else. [Open] loads, in this order of precedence, Config.Library,
// else $VMARENA_CUDA_LIBRARY ([LibraryEnv]), else "libcuda.so.1" through the
// dynamic loader's search path; only the first that is set is tried. Every
// symbol is resolved by its exact exported name with Dlsym and RegisterFunc:
// the _v2 name where cuda.h renames a function with a macro
// (cuMemGetInfo_v2, cuMemcpyHtoD_v2, cuMemcpyDtoH_v2, cuMemcpyDtoDAsync_v2,
// cuStreamDestroy_v2, cuEventDestroy_v2, cuDevicePrimaryCtxRelease_v2), the
// plain name where it does not (cuMemsetD8Async, cuStreamCreate,
// cuEventRecord, …), and never the _ptds/_ptsz variants cuda.h selects for
// per-thread default streams, so that a NULL stream is the legacy default
// stream. A missing library or symbol, the toolkit's stub library
// (CUDA_ERROR_STUB_LIBRARY), a driver older than CUDA 10.2 or a device
// without CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is an error
// wrapping acl.ErrNotSupported that says what and where; nothing panics. A
// loaded library stays loaded for the life of the process (the CUDA driver
// runs threads of its own and does not survive being unloaded); each Driver
// retains its device's primary context and releases it in Close.
//
// The binding is built on Linux amd64 and arm64, where purego is tier 1; on
// other platforms Open fails with acl.ErrNotSupported.
//
// # Threads
//
// CUDA binds the current context to the calling OS thread, and Go moves
// goroutines between threads. Every call into CUDA therefore runs with the
// goroutine locked to its thread (runtime.LockOSThread) and the device's
// primary context current there: the binding asks cuCtxGetCurrent and calls
// cuCtxSetCurrent only when another context is current. A thread with no
// context keeps the primary context afterwards, so the usual cost is one
// extra cuCtxGetCurrent per call (about 0.4 µs over the test double, within
// noise of the driver's own microseconds on an H200; docs/cuda.md has the
// figures); a thread on which the caller had made a context of its own
// current gets it back. Calls run on the caller's goroutine, in parallel with
// each other: there is no worker thread to queue behind.
//
// # The ACL contract on CUDA
//
//	ACL (acl.Driver)                   CUDA driver API
//	MemGetAllocationGranularity        cuMemGetAllocationGranularity (queried per device at Open)
//	MallocPhysical                     cuMemCreate (PINNED, location DEVICE, id = the ordinal; POSIX descriptor when asked)
//	FreePhysical                       cuMemRelease
//	ReserveMemAddress                  cuMemAddressReserve (size remembered)
//	ReleaseMemAddress(base)            cuMemAddressFree(base, remembered size)
//	MapMem                             cuMemMap (offset 0)
//	UnmapMem(ptr)                      cuMemUnmap(ptr, remembered size): no wait
//	MemSetAccess                       cuMemSetAccess (DEVICE, PROT_READWRITE or PROT_READ), one call per run of mappings
//	MemExportToShareableHandle         cuMemExportToShareableHandle (POSIX descriptor, kept by the driver)
//	MemImportFromShareableHandle       cuMemImportFromShareableHandle ((void*)fd); device and granularity checked (cuMemGetAllocationPropertiesFromHandle); size learned at the first MapMem
//	MemSetPidToShareableHandle         207000: a descriptor has no allow-list
//	DeviceGetBareTgid                  getpid()
//	MemcpyHtoD, MemcpyDtoH             cuMemcpyHtoD_v2, cuMemcpyDtoH_v2 (synchronous, legacy default stream)
//	MemcpyDtoD                         cuMemcpyDtoDAsync_v2 on the driver's own stream + cuStreamSynchronize of it
//	Memset                             cuMemsetD8Async on the driver's own stream + cuStreamSynchronize of it
//	GetMemInfo                         cuMemGetInfo_v2
//	CreateStream, DestroyStream        cuStreamCreate(CU_STREAM_NON_BLOCKING): the Stream is the CUstream; cuStreamQuery, cuStreamDestroy_v2
//	SynchronizeStream                  cuStreamSynchronize (Stream 0: the legacy default stream, CUstream NULL)
//	SynchronizeDevice                  cuCtxSynchronize
//	CreateEvent, DestroyEvent          cuEventCreate(CU_EVENT_DISABLE_TIMING), cuEventDestroy_v2
//	RecordEvent                        cuEventRecord
//	QueryEvent                         cuEventQuery: CUDA_SUCCESS complete, CUDA_ERROR_NOT_READY not yet
//	SynchronizeEvent                   cuEventSynchronize
//	MemsetAsync                        cuMemsetD8Async on the caller's stream (its own, or the driver's)
//	MallocHost, FreeHost               cuMemHostAlloc (flags 0), cuMemFreeHost (a slice MallocHost did not return: 107000, no call)
//	Caps                               {AccessSpan: true, Fresh: FreshProcess, Sharing: SharingFD, ReadOnly: true} (no call)
//	Close                              (release what is left), cuStreamDestroy_v2, cuDevicePrimaryCtxRelease_v2
//
// The contract is the strictest of ACL and CUDA. Where CUDA is laxer, the
// driver enforces ACL's rules itself, from its own record of reservations,
// mappings, handles, streams and events, and refuses a violation with the
// code the host driver gives it, before CUDA is called:
//
//   - sizes and addresses are multiples of the device's granularity;
//   - MapMem maps a whole allocation (size equal to its size) at offset 0,
//     inside one reservation, over no other mapping;
//   - UnmapMem takes the exact start of one mapping (CUDA accepts a run of
//     whole mappings);
//   - ReleaseMemAddress takes the exact base of a reservation with no
//     mappings left (CUDA needs the size, which the driver remembers);
//   - FreePhysical drops the owner's reference; memory still mapped is freed
//     at its last unmap (CUDA's cuMemRelease semantics exactly); a second
//     FreePhysical is an error;
//   - a mapping has no access until MemSetAccess (CUDA's rule, which ACL
//     devices without the call relax); MemSetAccess covers exactly one
//     mapping or a run of adjacent mappings of one reservation, a gap or an
//     end inside a mapping is refused, and granting again is a no-op;
//   - copies, memsets and queued memsets must lie in mapped ranges with
//     access, checked in Go so that a bad one never reaches the GPU, where it
//     would fault and poison the context;
//   - events are the driver's own ids, and a stream it destroyed is
//     remembered: a destroyed or unknown event, or a destroyed stream, is
//     refused (107000; 100000 for a NULL event) instead of reaching CUDA as
//     a dangling handle; a stream with work pending (cuStreamQuery says
//     CUDA_ERROR_NOT_READY), or a stream or event another call is waiting
//     on, cannot be destroyed (107000), where CUDA would destroy it later;
//     nor can a stream the driver did not create (107000).
//
// ACL handles are the driver's own numbers, not CUDA's: CUDA may hand out a
// released handle's value again while the old allocation is still mapped.
//
// # Streams
//
// An acl.Stream of this driver is the CUstream itself, and acl.Stream(0) the
// legacy default stream (a NULL CUstream). A caller may hand a stream it
// created through the driver to its own kernel launches, and pass the driver
// the streams its own CUDA code created (a framework's or kernel library's
// CUstream or cudaStream_t, which are the same pointer), as they are.
//
// The driver keeps books of the streams it created: they are counted (Live),
// destroyed by Close if leaked, held by each call that passes them, and only
// they can be destroyed through the driver. A stream it did not create is
// foreign: RecordEvent, MemsetAsync and SynchronizeStream pass it to CUDA as
// it is (the caller owns it and vouches for it, as a C program calling CUDA
// does), and DestroyStream refuses it with 107000: its owner destroys it.
// CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are foreign handles like any
// other.
//
// A stream the driver destroyed is remembered (the last 1024) and refused
// with 107000, unless CUDA hands the same pointer out again through
// CreateStream: then it is simply the new stream. CUDA may instead hand that
// pointer to the caller's own code; the driver cannot tell that stream from
// the destroyed one and refuses it while it remembers the pointer. About a
// foreign stream the driver checks nothing: not that it is live, nor that it
// belongs to the device's primary context (the CUDA runtime's streams do; for
// a stream of another context cuEventRecord fails with
// CUDA_ERROR_INVALID_HANDLE, reported as 107017), nor that its owner keeps it
// alive while a call uses it. A blocking foreign stream (flags 0, what
// cudaStreamCreate makes) is ordered with the legacy default stream, so the
// synchronous host copies wait for its work.
//
// The state of a range and of an allocation, and the call that moves it:
//
//	address range: none ──cuMemAddressReserve──▶ reserved ──cuMemMap──▶ mapped, no access ──cuMemSetAccess──▶ mapped
//	               none ◀──cuMemAddressFree───── reserved ◀──────────────cuMemUnmap──────────────────────── mapped
//	allocation:    none ──cuMemCreate──▶ owned ──cuMemMap──▶ owned+mapped ──cuMemRelease──▶ mapped only ──last cuMemUnmap──▶ none
//	               owned ──cuMemRelease──▶ none
//
// # Ordering
//
// UnmapMem does not wait for device work, and neither does CUDA: work still
// queued on the range faults (CUDA_ERROR_ILLEGAL_ADDRESS, which poisons the
// context) or, if the range is mapped again first, writes into the new
// owner's memory. The caller orders each unmap: it records an event on the
// streams that used the range and waits for it, or calls SynchronizeDevice as
// the fallback. In vmarena the chunk pool does that, in one place. No call of
// the driver waits for the whole device except SynchronizeDevice, and Close
// when it tears down leaked mappings or streams (that wait covers foreign
// streams too).
//
// The synchronous MemcpyDtoD and Memset are asynchronous in CUDA. The driver
// queues them on a non-blocking stream of its own, created at Open, and waits
// for that stream alone, so they do not wait for (or hold back) the callers'
// work. They are not ordered after work queued on other streams either: a
// range that queued work may still write must be waited for first. The host
// copies are CUDA's synchronous cuMemcpyHtoD_v2 and cuMemcpyDtoH_v2 on the
// legacy default stream, so they also wait for work queued there (and on
// blocking streams other code may create; the driver's are non-blocking).
//
// # Fresh memory
//
// Caps().Fresh is acl.FreshProcess: the NVIDIA kernel driver clears device
// memory a process frees before another can allocate it ("scrub on free"),
// but nothing promises that this process's own freed bytes are cleared.
// Config.NoScrubOnFree makes it acl.FreshUnknown for machines where the
// scrubber is off. docs/cuda.md gives the evidence and its limits.
//
// # Errors
//
// A failed CUDA call returns an [*Error] carrying the CUDA function, the raw
// CUresult and the driver's name and description of it (cuGetErrorName,
// cuGetErrorString). It unwraps to an *acl.Error whose Op is the CUDA
// function and whose Code is [ACLCode] of the result, so the acl sentinels
// work: CUDA_ERROR_OUT_OF_MEMORY matches acl.ErrOutOfMemory,
// CUDA_ERROR_INVALID_CONTEXT acl.ErrNoContext and so on. A violation of an
// ACL rule found before CUDA is called is a plain *acl.Error whose Op is the
// ACL function.
package cuda
