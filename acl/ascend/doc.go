// Package ascend is the acl.Driver of Huawei Ascend NPUs: it calls the CANN
// ACL runtime (libascendcl.so), which it loads at run time with purego. It
// needs no cgo and no CANN headers to build, so CGO_ENABLED=0 builds and
// cross-compiles work, and one binary runs everywhere: where no runtime or
// NPU is found, Open fails with an error wrapping acl.ErrNotSupported.
//
// # Loading
//
// Open looks for the runtime in this order and loads the first library that
// loads (later ones are not tried, so the environment a user set up wins):
//
//  1. Config.Library, else $VMARENA_ASCEND_LIBRARY: a file, or a directory
//     holding libascendcl.so. When given, it is the only candidate.
//  2. $ASCEND_HOME_PATH/lib64/libascendcl.so, then
//     $ASCEND_TOOLKIT_HOME/lib64/libascendcl.so (both set by CANN's
//     set_env.sh).
//  3. The default install, /usr/local/Ascend/ascend-toolkit/latest/lib64.
//  4. "libascendcl.so" through the dynamic loader (LD_LIBRARY_PATH,
//     ld.so.cache).
//
// Where a directory has libacl_rt.so but no libascendcl.so it loads that.
// Every symbol the library lacks is then looked up in libacl_rt.so beside it:
// the open-source 9.x runtime defines the aclrt* functions there. A library
// that lacks a required function is an error naming the function and the
// files searched; the search does not go on to the next candidate.
//
// Functions newer than the VMM core, or that a caller may do without, are
// resolved on first use, and a missing one is an error with code 207000,
// matching acl.ErrNotSupported, that names it; the rest of the driver works:
//
//   - aclrtMemSetAccess (CANN 8.5 on): callers (the arena, the conformance
//     suite) read 207000 as "mappings are accessible anyway";
//   - the event calls aclrtCreateEvent, aclrtRecordEvent,
//     aclrtQueryEventStatus, aclrtSynchronizeEvent and aclrtDestroyEvent,
//     resolved together: where any is missing every event method fails, and
//     callers order their unmaps with SynchronizeDevice instead;
//   - aclrtMemsetAsync;
//   - aclrtStreamQuery, which DestroyStream uses to refuse a busy stream
//     (without it, it records an event on the stream and queries that);
//   - aclFinalize and aclrtGetSocName;
//   - the sharing calls aclrtMemExportToShareableHandle,
//     aclrtMemSetPidToShareableHandle and aclrtMemImportFromShareableHandle,
//     resolved together (Caps().Sharing is SharingToken when they are there,
//     SharingNone otherwise), and aclrtDeviceGetBareTgid (os.Getpid()
//     without it). The runtime enforces ACL's sharing rules itself; the
//     books count imports, and learn an import's size from its first map.
//
// The stream calls (aclrtCreateStream, aclrtDestroyStream,
// aclrtSynchronizeStream, aclrtSynchronizeDevice) and aclrtMallocHost and
// aclrtFreeHost are resolved at load with the VMM core: every runtime has
// them. The library is never unloaded.
//
// # Runtime and device states
//
// The ACL runtime is process-wide, and so is this package's view of it:
//
//	runtime:  not initialised ──Open (aclInit)──▶ initialised ──Finalize (aclFinalize)──▶ not initialised
//	device:   not set ──first Open (aclrtSetDevice)──▶ set, refs=1 ──Open──▶ refs+1
//	          set ──Close──▶ refs-1 ──last Close (aclrtResetDevice)──▶ not set
//
// If aclInit returns ACL_ERROR_REPEAT_INITIALIZE (100002), someone else in the
// process initialised ACL: the driver uses the runtime and Finalize leaves it
// alone. Each device is set once however many Drivers use it: ACL counts
// set/reset calls, and the package keeps one reference of its own per device.
// Resetting the device frees its default context and streams; memory still
// allocated then is left to the runtime, so close arenas before their Driver.
//
// # Finalisation
//
// The package never calls aclFinalize by itself. [Finalize] does, once every
// Driver is closed, for a runtime this package initialised. Calling it is
// optional: process exit releases the device. Do not call it from a
// destructor; it may take up to 2 s to flush device logs unless
// ASCEND_LOG_DEVICE_FLUSH_TIMEOUT=0.
//
// # Threads
//
// ACL keeps the current context (and so the current device) per OS thread,
// and Go moves goroutines between threads. Every driver call therefore runs
// as: runtime.LockOSThread; aclrtSetCurrentContext(device's default context);
// the ACL call; aclGetRecentErrMsg on failure (messages are per thread too);
// runtime.UnlockOSThread. Whatever goroutine calls, on whatever thread, the
// call sees its device, and no call ever fails with 107002 (no context). The
// cost is one extra call per driver call, made with purego.SyscallN rather
// than RegisterFunc: about 0.1 µs, and 0.2–0.3 µs with the thread locking,
// next to the 0.4 µs of the bound call itself and the microseconds a VMM call
// takes in the driver. A dedicated worker thread per device would cost a
// thread hand-off per call instead, about 10 µs, and serialise copies
// (BenchmarkCall measures all of these).
//
// The driver leaves its context current on the threads it ran on. Code that
// calls ACL itself on a locked thread with a context of its own should set
// that context again after calling the driver.
//
// The calls that change the VMM state (MallocPhysical, FreePhysical,
// ReserveMemAddress, ReleaseMemAddress, MapMem, UnmapMem, MemSetAccess) are
// serialised per device, since no ACL document says they are thread-safe;
// copies and queries run in parallel.
//
// # Streams and events
//
// A Stream or Event of this driver is the runtime's own handle (the
// aclrtStream or aclrtEvent pointer). Stream 0 is the default stream of the
// device's context (NULL in ACL). So a caller can pass a stream it created
// here to the code that launches its kernels, and pass the driver the
// streams its own CANN code created (a framework's or kernel library's
// aclrtStream), as they are.
//
// The runtime does not validate these handles: it dereferences them, so a
// destroyed one is a use after free. The driver therefore keeps books of the
// streams and events it created. A stream in the books is counted (Live,
// acl.Counter), held by each call that passes it, destroyed by Close if the
// caller leaked it, and only it can be destroyed through the driver. A stream
// the driver did not create is foreign: RecordEvent, MemsetAsync and
// SynchronizeStream pass it to the runtime as it is (the caller owns it and
// vouches for it, as a C program calling ACL does), and DestroyStream refuses
// it with 107000 (ACL_ERROR_RT_PARAM_INVALID): its owner destroys it. Events
// are always the driver's own: an event it did not create, or destroyed, is
// refused with 107000.
//
// A stream the driver destroyed is remembered (the last 1024) and refused
// with 107000, unless the runtime hands the same pointer out again through
// CreateStream: then it is simply the new stream. The runtime may instead
// hand that pointer to the caller's own code; the driver cannot tell that
// stream from the destroyed one and refuses it while it remembers the
// pointer. About a foreign stream the driver checks nothing: not that it is
// live, nor that it belongs to this device and its default context (the one
// the driver makes current, which aclrtSetDevice creates and every thread
// that sets the device shares), nor that its owner keeps it alive while a
// call uses it. A stream of another context of the device (aclrtCreateContext)
// has not been tried on an NPU.
//
// A NULL event, and destroying stream 0, fail with 100000, as ACL's own NULL
// checks do. A call that passes a stream or event of the books holds it until
// it returns, and DestroyStream and DestroyEvent refuse (107000) a handle
// another call is using, so that nothing is destroyed under a
// SynchronizeEvent in progress. DestroyStream also refuses a stream with work
// pending, which ACL requires but does not check. The same books count the
// reservations, mappings and physical memory made through the driver: Live
// reports them exactly, and Close destroys the streams and events a caller
// leaked, after synchronising those streams, and reports them and any memory
// still held. Foreign streams are neither counted nor touched by Close.
//
// QueryEvent calls aclrtQueryEventStatus, whose aclrtEventRecordedStatus has
// NOT_READY = 0 and COMPLETE = 1. The deprecated aclrtQueryEvent reports an
// aclrtEventStatus with the opposite values; the driver never calls it. An
// event never recorded is not complete, and SynchronizeEvent on it returns at
// once.
//
// # Unmapping
//
// UnmapMem is the bare aclrtUnmapMem. Like the runtime, it does not wait for
// device work: unmapping memory that queued or running work still touches
// makes the NPU fault (an illegal address), and the stream reports it at its
// next synchronisation. The caller orders the unmap: vmarena's chunk pool
// records an event on the streams of the chunk's last owner and unmaps once
// the event is complete, or, where it has no stream to go by (or the runtime
// has no events), calls SynchronizeDevice first, which waits for all the
// process's work on the device.
//
// The synchronous calls (the copies and Memset) wait for no stream either,
// and never for the whole device: a device-to-device copy runs on a private
// stream of the driver and synchronises that stream alone.
//
// # Hardware semantics
//
// MemSetAccess grants access to one mapping per call, with the pointer and
// size of one MapMem: ACL documents nothing else, and whether a run of
// adjacent mappings is accepted is unknown until an NPU shows it, so Caps
// reports AccessSpan false.
//
// No ACL document promises what fresh physical memory holds. The driver
// source suggests it is cleared (docs/ascend.md gives the evidence), but
// until an NPU confirms it Caps reports acl.FreshUnknown, and vmarena clears
// fresh chunks before a new owner reads them.
//
// Device-to-device copies of reserved memory must use aclrtMemcpyAsync with
// 64-byte aligned addresses; MemcpyDtoD does so on a per-device stream and
// copies other ranges through host memory.
//
// # Errors
//
// A failed ACL call is an *acl.Error with the function, the aclError code and
// the text of aclGetRecentErrMsg, matching the acl sentinel for its code
// (207001 is acl.ErrOutOfMemory). Errors from Open and Close wrap those, or
// acl.ErrNotSupported when there is no usable runtime or NPU.
package ascend
