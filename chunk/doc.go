// Package chunk hands out physical device memory in fixed-size chunks, keeps
// released chunks in a bounded reuse cache, and enforces a byte budget shared
// by everyone using the pool.
//
// # Chunk states
//
// A chunk is one physical allocation (one aclrtMallocPhysical handle) of
// exactly the pool's chunk size, and is mapped whole or not at all, because
// ACL maps and unmaps only whole allocations:
//
//	none ──Get (miss: MallocPhysical)──▶ out ──Map──▶ mapped
//	     ◀──Put (cache full: FreePhysical)──  out ◀──Unmap── mapped
//	cached ──Get (hit)──▶ out;  out ──Put──▶ cached
//	cached ──Trim/Close (FreePhysical)──▶ none
//
// Only unmapped chunks go back with Put. A chunk in the cache holds physical
// memory but no mapping, so the next Get skips the driver's most expensive
// call. The chunk size trades shrink granularity against driver calls per
// GiB: 2 MiB (the ACL granularity) unmaps finely; 64 MiB maps a GiB in 16 calls.
//
// # Budget
//
// Config.Budget caps the physical bytes the pool holds, in use and cached
// together. A Get that would pass it fails with an error matching both
// [ErrBudget] and acl.ErrOutOfMemory, before any driver call, and disturbs no
// other user of the pool.
//
// A Pool is safe for concurrent use; no lock is held across a driver call.
package chunk
