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
// Functions newer than the VMM core are resolved on first use and are
// optional: without aclrtMemSetAccess (before CANN 8.5) MemSetAccess fails
// with code 207000, which matches acl.ErrNotSupported and which callers (the
// arena, the conformance suite) treat as "mappings are accessible anyway".
// The library is never unloaded.
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
// # Hardware semantics
//
// Unmapping memory that queued device work still reads makes the NPU fault
// (an illegal-address error). UnmapMem therefore first calls
// aclrtSynchronizeDevice: it blocks until the device finishes all work this
// process queued on it, on every stream. Callers that synchronise their own
// streams before unmapping set Config.SkipUnmapSync to skip the wait.
// Physical memory from MallocPhysical is not zeroed.
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
