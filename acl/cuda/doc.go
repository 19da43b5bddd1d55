// Package cuda implements the acl.Driver contract on an NVIDIA GPU, through
// the CUDA driver API's virtual-memory management (VMM) calls, so that the
// arena runs unchanged on CUDA.
//
// # Loading
//
// The CUDA driver library is loaded at run time with purego: no cgo and no
// CUDA headers at build time, and a machine without CUDA builds and runs
// everything else. [Open] loads, in this order of precedence, Config.Library,
// else $VMARENA_CUDA_LIB ([EnvLibrary]), else "libcuda.so.1" through the
// dynamic loader's search path; only the first that is set is tried. Every
// symbol is resolved by its exact exported name, the _v2 one where cuda.h
// renames the API (cuMemGetInfo_v2, cuMemcpyHtoD_v2, cuMemcpyDtoH_v2,
// cuMemcpyDtoD_v2, cuMemsetD8_v2, cuDevicePrimaryCtxRelease_v2), with Dlsym
// and RegisterFunc. A missing library or symbol, the toolkit's stub library
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
// extra cuCtxGetCurrent per call: about 0.4 µs over the test double
// (BenchmarkCallOverhead), within noise of the driver's own microseconds on
// an H200 (docs/cuda.md); a thread on
// which the caller had made a context of its own current gets it back. Calls
// run on the caller's goroutine, in parallel with each other: there is no
// worker thread to queue behind.
//
// # The ACL contract on CUDA
//
//	ACL (acl.Driver)                   CUDA driver API
//	MemGetAllocationGranularity        cuMemGetAllocationGranularity (queried per device at Open)
//	MallocPhysical                     cuMemCreate (PINNED, location DEVICE, id = the ordinal)
//	FreePhysical                       cuMemRelease
//	ReserveMemAddress                  cuMemAddressReserve (size remembered)
//	ReleaseMemAddress(base)            cuMemAddressFree(base, remembered size)
//	MapMem                             cuMemMap (offset 0)
//	UnmapMem(ptr)                      cuCtxSynchronize, then cuMemUnmap(ptr, remembered size)
//	MemSetAccess                       cuMemSetAccess (DEVICE, PROT_READWRITE)
//	MemcpyHtoD, MemcpyDtoH             cuMemcpyHtoD_v2, cuMemcpyDtoH_v2 (synchronous)
//	MemcpyDtoD                         cuMemcpyDtoD_v2, then cuCtxSynchronize (CUDA runs it asynchronously)
//	Memset                             cuMemsetD8_v2, then cuCtxSynchronize (likewise)
//	GetMemInfo                         cuMemGetInfo_v2
//	Close                              (release what is left), cuDevicePrimaryCtxRelease_v2
//
// The contract is the strictest of ACL and CUDA. Where CUDA is laxer, the
// driver enforces ACL's rules itself, from its own record of reservations,
// mappings and handles, and refuses a violation with the code the host
// driver gives it, before CUDA is called:
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
//     devices without the call relax); MemSetAccess must name exactly one
//     mapping, and granting it again is a no-op;
//   - copies and memsets must lie in mapped ranges with access, checked in
//     Go so that a bad one never reaches the GPU, where it would fault and
//     poison the context.
//
// ACL handles are the driver's own numbers, not CUDA's: CUDA may hand out a
// released handle's value again while the old allocation is still mapped.
//
// The state of a range and of an allocation, and the call that moves it:
//
//	address range: none ──cuMemAddressReserve──▶ reserved ──cuMemMap──▶ mapped, no access ──cuMemSetAccess──▶ mapped
//	               none ◀──cuMemAddressFree───── reserved ◀─────────cuCtxSynchronize + cuMemUnmap────────── mapped
//	allocation:    none ──cuMemCreate──▶ owned ──cuMemMap──▶ owned+mapped ──cuMemRelease──▶ mapped only ──last cuMemUnmap──▶ none
//	               owned ──cuMemRelease──▶ none
//
// Unmapping synchronises the primary context first, so that a kernel or copy
// still in flight cannot fault on the range. Callers that order their own
// streams before every unmap can skip it with Config.SkipUnmapSync.
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
