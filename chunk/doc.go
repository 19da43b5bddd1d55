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
//	     ◀──Put (cache full: FreePhysical)──  out ◀──Unmap/Release── mapped
//	cached ──Get (hit)──▶ out;  out ──Put──▶ cached
//	cached ──Trim/Close (FreePhysical)──▶ none
//
// Only unmapped chunks go back with Put. A chunk in the cache holds physical
// memory but no mapping, so the next Get skips the driver's most expensive
// call. The chunk size trades shrink granularity against driver calls per
// GiB: 2 MiB (the ACL granularity) unmaps finely; 64 MiB maps a GiB in 16 calls.
//
// The pool knows which chunks are out: Put, Map and Release refuse, with
// acl.ErrInvalidParam, a chunk that is not (put back twice, or from another
// pool), so no two owners can ever hold one chunk.
//
// # Scrubbing
//
// A chunk may change hands between arenas, and the bytes one tenant wrote
// must never reach another. The pool remembers, per chunk, whose bytes it may
// hold (an [Owner]: each arena is one) and clears the chunk with aclrtMemset
// when needed, according to Config.Scrub:
//
//   - ScrubOnReuse (the default) clears a chunk when Map maps it for an owner
//     other than the one whose bytes it holds. An arena that takes its own
//     chunk back pays nothing; GetFor prefers such chunks.
//   - ScrubOnRelease clears a chunk when Release unmaps it, before it goes
//     back; chunks that come back otherwise are cleared on reuse.
//   - ScrubNever never clears, for pools that serve a single tenant.
//
// On-reuse is the default because it never clears more: BenchmarkScrub
// measures 0 clears per chunk when an arena shrinks and regrows, and when
// released chunks are freed unused, against 1 for on-release; both clear
// every chunk that alternates between two tenants (docs/reliability.md has
// the figures).
//
// Fresh physical memory is cleared too, when first mapped: ACL does not
// promise that aclrtMallocPhysical returns zeroed memory, so on a device a
// fresh chunk may hold what this or another process freed. Config.FreshZeroed
// skips that for drivers that do promise it; the host driver's memory is zero
// (fallocate), and arena.New sets it for the private pools it makes there.
//
// # Failures
//
// A Map that fails leaves the chunk unmapped, unless the step after the map
// (access, scrub) failed and so did the unmap undoing it: the error then
// matches [ErrMapped] and the caller must unmap the chunk before Put. A scrub
// that fails leaves the chunk marked as holding its old owner's bytes. When
// the driver fails to free a chunk, the pool keeps it in the cache and Trim
// and Close try again; nothing is lost from the driver's or the budget's
// books.
//
// # Sharing with other processes
//
// A pool made with Config.Shareable allocates chunks another process can
// map. Export gives a chunk's shareable form (exporting it once, and adding
// the consumer to an ACL allow-list); Import lends another process's chunk
// like one of the pool's own, and MapImported maps it (read-only where the
// device can). A shared chunk, exported or imported, is never cached, never
// handed to another tenant and never scrubbed: when it is put back the pool
// frees it, dropping only this process's reference, and the device keeps the
// memory for the other process:
//
//	out ──Export──▶ out, shared ──Put──▶ FreePhysical (never cached)
//	none ──Import──▶ out, imported ──MapImported──▶ mapped ──Release, Put──▶ FreePhysical
//
// An exported chunk counts against the budget of the pool that made it until
// it is put back; an imported one against the budget of the pool that
// imported it, once however many times the same memory is imported.
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
