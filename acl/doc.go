// Package acl is the driver contract of vmarena, written in the terms of the
// Huawei Ascend ACL runtime's virtual-memory API.
//
// A [Driver] exposes, one method per ACL function, the calls an allocator
// needs to reserve device address space and back it with physical memory:
//
//	aclrtMemGetAllocationGranularity  Driver.MemGetAllocationGranularity
//	aclrtMallocPhysical               Driver.MallocPhysical
//	aclrtFreePhysical                 Driver.FreePhysical
//	aclrtReserveMemAddress            Driver.ReserveMemAddress
//	aclrtReleaseMemAddress            Driver.ReleaseMemAddress
//	aclrtMapMem                       Driver.MapMem
//	aclrtUnmapMem                     Driver.UnmapMem
//	aclrtMemSetAccess                 Driver.MemSetAccess
//	aclrtMemcpy (HOST_TO_DEVICE)      Driver.MemcpyHtoD
//	aclrtMemcpy (DEVICE_TO_HOST)      Driver.MemcpyDtoH
//	aclrtMemcpy (DEVICE_TO_DEVICE)    Driver.MemcpyDtoD
//	aclrtMemset                       Driver.Memset
//	aclrtGetMemInfo                   Driver.GetMemInfo
//	aclrtMemExportToShareableHandle   Driver.MemExportToShareableHandle
//	aclrtMemSetPidToShareableHandle   Driver.MemSetPidToShareableHandle
//	aclrtMemImportFromShareableHandle Driver.MemImportFromShareableHandle
//	aclrtDeviceGetBareTgid            Driver.DeviceGetBareTgid
//
// The types ([PhysicalMemProp], [MemLocation], [MemAccessDesc]) have the exact
// layout of their C structs and the enums carry ACL's values, so a binding can
// hand them to the runtime unchanged.
//
// # Memory states
//
// Device virtual address space and physical memory move through these states;
// every method is named after the transition it makes:
//
//	address range: none ──ReserveMemAddress──▶ reserved ──MapMem──▶ mapped
//	               none ◀──ReleaseMemAddress── reserved ◀──UnmapMem── mapped
//	physical:      none ──MallocPhysical──▶ owned ──MapMem──▶ mapped ──UnmapMem──▶ owned
//	               owned ──FreePhysical──▶ none
//
// The rules every driver enforces, because the strictest device (ACL) does:
//
//   - sizes and addresses are multiples of the granularity (2 MiB; 1 GiB for
//     the HUGE1G attributes);
//   - MapMem maps a whole physical allocation at offset 0: the size equals the
//     MallocPhysical size;
//   - UnmapMem takes the exact start of one mapping; there is no partial unmap;
//   - a range is never mapped twice;
//   - ReleaseMemAddress takes the exact base of a reservation with no mappings
//     left in it;
//   - FreePhysical drops the owner's reference; memory still mapped is freed
//     when its last mapping goes;
//   - on a real device, work that may read a range finishes before the range
//     is unmapped;
//   - an allocation is exported at most once, an imported one never, and a
//     process does not import what it exported (see [ShareableHandle]).
//
// # Errors
//
// Every failing call returns an [*Error] carrying the ACL function, the aclError
// code and the runtime's message. It matches the sentinel for its class with
// errors.Is: [ErrOutOfMemory] for 207001, [ErrInvalidParam], [ErrNotSupported]
// and so on.
//
// # Registration
//
// Memory that collective and transfer libraries (HCCL, NCCL, RDMA engines)
// use must be registered with them, and registered again whenever its
// backing changes. [Registrar] is the protocol an owner of reserved memory
// follows to keep a library's view true at every step; [Mapping] names what
// one registration covers. Drivers may offer [Binder] (run code with the
// device's context current, for such libraries) and [DMABufExporter]
// (export a mapped range as a dma-buf for an RDMA NIC). docs/distributed.md
// describes them.
//
// # Drivers
//
// The host driver (package acl/host) implements the contract on Linux virtual
// memory and is the default: arena.DefaultDriver uses it unless
// $VMARENA_DEVICE ([DeviceEnv]) names a device, which needs the selector of
// package acl/device ([RegisterSelector]). Bindings to real runtimes live in
// their own packages so that host-only programs do not link a dynamic loader.
// Package acl/acltest holds the conformance suite every driver passes.
package acl
