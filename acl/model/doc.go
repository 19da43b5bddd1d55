// Package model is a calibrated model of a device: the acl.Driver contract
// with the books and rules of a real driver, the device's bytes on host
// memory, and every call charged the time the modelled device's driver takes
// for it. It lets the trade-offs of device memory management (driver calls
// per chunk, scrubs, synchronisation, background work) be measured without
// the device, and at the sizes real servers use: a 141 GiB device costs the
// model its books and the bytes written, or, with Config.NoData, its books
// only.
//
// Times from the model are modelled, not measured: every program output that
// used it should say so ([Driver.Modelled] gives the line, naming the
// profile).
//
// # What it models
//
// The books and rules are the host driver's (acl/host), from the same
// shared code, with the same ACL codes: reservations, whole-allocation
// mappings, access grants (read-only ones too), reference-counted physical
// allocations, capacity (207001 past it), HUGE1G pages, the 128 GiB
// reservation limit, live counts, and streams, events and faults. On Linux
// it shares memory with models in other processes as the host driver does,
// as memory files passed by descriptor (acl.SharingFD). The conformance suite (acl/acltest) passes
// on it with exact codes.
//
// Each call spends its cost on the calling goroutine, by spinning on the
// monotonic clock (accurate to about 0.1 µs at the median; waits over 2 ms
// sleep all but the last millisecond), starting from the moment the call
// begins, so the model's own bookkeeping (about 0.1–0.3 µs a call) is
// absorbed into the charge. The cost comes from a [Profile]:
//
//	sized calls (malloc, free, reserve, release, map, unmap, access):
//	    base + per_mib × (size − granularity) / MiB
//	    (+ per_mapping × (k − 1) for a MemSetAccess over k adjacent mappings)
//	other calls:                      base
//	MemcpyHtoD, MemcpyDtoH:           base + n ÷ link bandwidth (the pinned one
//	                                  for a MallocHost buffer, else the pageable one)
//	MemcpyDtoD, Memset (synchronous): base + latency + bytes moved ÷ local bandwidth
//	                                  (a copy moves 2n bytes, a memset n)
//	MemsetAsync, Launch, LaunchFor:   base for the caller; the work then
//	                                  occupies its stream (below)
//	SynchronizeStream/Event/Device:   base, after the later of the call and
//	                                  the completion of the work waited for
//
// A failed call costs its base. Calls the profile marks serial (those a real
// driver serialises, such as the VMM calls that enter the kernel driver)
// hold a device-wide lock while they spend their host-side time, so work
// moved to a background goroutine contends with the caller as on the device;
// device time and transfers are spent outside the lock.
//
// Streams have modelled time. Work queued with MemsetAsync (latency +
// n ÷ local bandwidth), [Driver.LaunchFor] (a fixed duration) or
// [Driver.Launch] (until its done channel is closed) starts when its launch
// call returns and the work before it on its stream has finished; an event
// completes when the work queued before its record has; QueryEvent never
// waits. Faults are recorded as the host driver records them: an unmap under
// work that has not finished and touches the range (the stream reports an
// illegal address at its next synchronisation), and a synchronous copy or
// memset of a range that unfinished work will write ([Driver.Faults]).
//
// # What it does not model
//
//   - The speed of the bytes. The model keeps every byte written (on host
//     memory, in 64 KiB pages made on first write, per physical allocation),
//     so a read returns what was written, but it moves them at the host's
//     speed: a large device-side copy or memset can run longer than its
//     charge. With Config.NoData (the selector's model:NAME,nodata) it keeps
//     none, its memory is proportional to its books, and MemcpyDtoH fails
//     with acl.ErrNotSupported instead of returning bytes nobody wrote.
//   - Contention for the device's resources: concurrent copies do not share
//     the link, concurrent kernels do not share the device, and no other
//     process uses it.
//   - The spread of call times: every call costs its profile's figure, which
//     for the shipped profiles is a mean.
//   - Anything the profile estimates rather than measures. Each coefficient
//     says which it is, and why.
//   - The model's own work can exceed a very small charge (a microsecond or
//     less); a call then takes that long. Under the race detector this is
//     much more.
//
// # Profiles
//
// Profiles are JSON files whose every coefficient carries its value, its
// source and whether it is an estimate. The package ships "h200" (from the
// per-call costs measured on an NVIDIA H200, with estimates for the rest)
// and "a100" (from kvcached's published VMM benchmark on an A100):
// [Profiles], [LoadProfile]; [LoadProfileFile] and [Resolve] read a profile
// from a file, such as one [Calibrate] wrote. docs/model.md has every
// coefficient of both, with its provenance.
//
// # Calibration
//
// [Calibrate] measures every call of the contract on a real driver at
// several sizes, fits the costs and writes a profile; what it cannot measure
// (the stand-in kernel launch, which calls are serialised) it carries over
// from a base profile as estimates. Calibrating the model itself recovers
// the model's coefficients to the three figures a profile keeps (the test
// runs the model on a virtual clock, so load cannot disturb it), which
// checks both halves. From the command line:
//
//	go run ./bench -calibrate -device cuda -profile-out h200-mine.json
//
// and the device selector opens a model by name or file:
// VMARENA_DEVICE=model:h200, or model:/path/to/profile.json.
package model
