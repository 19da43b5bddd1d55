// Package host is the host driver: the acl.Driver contract implemented on
// Linux virtual memory, so that everything built on vmarena runs, and is
// tested, on any Linux machine with no accelerator. It is the default driver
// (arena.DefaultDriver, when $VMARENA_DEVICE names no device). It needs
// Linux: elsewhere the package builds, and New and Default fail.
//
// # How device memory is simulated
//
//	ACL call                  host driver
//	ReserveMemAddress         mmap PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE (2 MiB/1 GiB aligned)
//	MallocPhysical            fallocate a range of one sparse memfd (committed now; 207001 past Capacity)
//	MapMem                    mmap the range MAP_SHARED|MAP_FIXED into the reservation, PROT_NONE
//	MemSetAccess              mprotect PROT_READ|PROT_WRITE
//	UnmapMem                  mmap PROT_NONE anonymous MAP_FIXED over it: still reserved, inaccessible
//	FreePhysical              drop the owner's reference; punch the hole when no mapping is left
//	ReleaseMemAddress         munmap the whole reservation
//	MallocPhysical (POSIX)    its own memory file (memfd + fallocate, size sealed), so that it can be exported
//	MemExportTo…Handle        that file's descriptor, its seals sealed (and writes, with ExportReadOnly)
//	MemImportFrom…Handle      a duplicate of another process's descriptor, once its seals are checked
//
// A device pointer is a host address, so [Driver.Bytes] exposes mapped device
// memory to Go code, and touching a range after UnmapMem faults.
//
// # Sharing between processes
//
// Exportable allocations (PhysicalMemProp.HandleType = MemHandleTypePOSIX)
// each get a memory file of their own, whose descriptor is the shareable
// handle; it travels over a Unix socket and another process's driver maps
// the same memory. The kernel's reference counting keeps the memory while
// any process holds a descriptor or a mapping of it, as a device does. ACL's
// rules hold: one export per allocation, no export of an import, no import
// by the exporting process (507899), and a second import of the same memory
// is the same handle with one more reference. Imported memory counts against
// Capacity (LiveCounts.Imported and ImportedBytes say how much): each
// process simulates its own device, and cannot see when the other lets go.
// MemSetAccess with MemAccessRead maps read-only (mprotect PROT_READ), and a
// copy into such a mapping is refused. An exported file's size is sealed, so
// that neither process can cut the memory under the other's mapping (which
// would kill it with SIGBUS); an import refuses a file whose size and seals
// are not sealed, and imports memory sealed against writes read-only. See
// docs/sharing.md.
//
// # Strictness
//
// The driver is as strict as the strictest device: it enforces ACL's rules
// with ACL's codes (docs/acl.md lists them, and which codes are documented
// and which are the simulator's choice), and CUDA's rule that a mapping has no
// access until MemSetAccess (unless Config.NoSetAccess asks for the behaviour
// of an ACL runtime without that call). Code that passes on it passes on a
// device. It is stricter than a device in one place: it refuses a mapping that
// would take the process's kernel memory areas past Config.MapLimit, because
// at vm.max_map_count the Go runtime itself dies.
//
// # What it cannot show
//
// There is no asynchronous device work, so unmapping never races a kernel;
// fresh physical memory is zeroed here (fallocate) but not on devices; copies
// are plain memory copies.
package host
