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
//
// A device pointer is a host address, so [Driver.Bytes] exposes mapped device
// memory to Go code, and touching a range after UnmapMem faults.
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
