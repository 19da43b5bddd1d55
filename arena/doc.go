// Package arena provides growable device memory for tensors: one large
// reservation of device virtual address space, backed lazily by physical
// chunks, from which tensor buffers are cut with a bump allocator.
//
// # Address space
//
// New reserves Config.Reserve bytes of device virtual address space once. The
// base address never changes. Each chunk-sized granule of the range is in one
// of these states:
//
//	reserved   owned by the arena, backed by nothing; any access faults
//	mapped     backed by a physical chunk, accessible, not yet allocated
//	in use     mapped and handed out by Alloc (below Len)
//
//	reserved ──Grow / Alloc (map chunks)──▶ mapped ──Alloc──▶ in use
//	reserved ◀──Shrink (unmap chunks)────── mapped ◀──Truncate/Reset── in use
//	all ──Close──▶ released (chunks back to the pool, range back to the driver)
//
// Len is the bytes in use, Cap the bytes mapped (a multiple of the chunk
// size), and Len ≤ Cap ≤ Reserved always holds. Growing maps chunks at Cap and
// never moves data: a Buffer's device pointer stays valid, and its contents
// intact, until a Truncate or Reset drops it or Close releases the arena.
// Shrink unmaps only chunks wholly above Len, and returns them to the pool,
// whose reuse cache makes the next growth skip the physical allocation.
//
// # Hot path
//
// Alloc within Cap is a compare-and-swap on one word: no driver call, no lock,
// no Go heap allocation. Only when it needs memory does it take the slow path,
// map chunks (from the pool's cache first), and retry.
//
// # Failure
//
// Every operation either succeeds or leaves the arena as it was: a Grow that
// runs out of device memory in the middle of a multi-chunk growth unmaps what
// it mapped and returns the chunks before it returns an error matching
// ErrOutOfMemory; a Shrink or Close whose unmap or release fails maps back
// what it had unmapped (the physical memory was kept, so no byte is lost), and
// a failed Close leaves the arena open, to be closed again. Errors from the
// driver carry the ACL operation and code (*acl.Error).
//
// Should the undo itself fail (a second fault in one operation), the arena
// stays consistent with the driver and loses only what it was undoing: a
// chunk it cannot unmap is kept as a stray above Cap (Stats.Strays) and
// unmapped by the next Grow, Shrink or Close; a chunk it cannot map back
// lowers Cap, and Len with it if need be. Bytes below Len never change.
//
// Bad arguments (negative or overflowing sizes, alignments that are not
// powers of two, ranges outside the bytes in use, overlapping copies, an
// Arena not made by New) return an error matching ErrInvalid or ErrRange,
// change nothing and never panic; a closed arena returns ErrClosed, and a nil
// *Arena behaves as a closed one in every method that returns an error.
//
// # Tenants
//
// Arenas that share a pool are tenants of it: the pool's budget caps what
// they hold together (a tenant that hits it gets ErrOutOfMemory, and nobody
// else is disturbed), and a chunk one arena gives back reaches another only
// scrubbed (see package chunk). Each arena owns its reservation, so a pointer
// into another arena's memory, or into a tail Shrink unmapped, faults rather
// than reading the bytes the chunk holds next.
//
// Config.TrapStale is a debug mode that extends this to Truncate and Reset:
// the chunks they drop are unmapped at once and the dropped bytes of the
// chunk kept in part are filled with PoisonByte, so a stale pointer faults or
// reads poison.
//
// # Sharing with other processes
//
// Share lends the whole chunks that hold a buffer to one other process, over
// a Unix socket, with no copy; Import, on the other end, maps them into a
// reservation of exactly their size and returns an Imported, whose Buffer is a
// Buffer like any other, at an address that never changes, in an arena of
// fixed size (Alloc, Grow, Truncate, Reset and Shrink fail with
// ErrImported; a read-only import's writes with ErrReadOnly). Only the process
// ShareOptions names, as the kernel vouches for it, may import (ErrRefused
// otherwise); on ACL the device enforces it too, with an allow-list.
//
// The memory lives while either process holds it: a producer that shrinks,
// closes or dies pulls nothing from under the import (its pool frees shared
// chunks instead of caching them), and a consumer that closes its import or
// dies frees nothing of the producer's. The producer's pool counts a shared
// chunk until the arena gives it back; the consumer's import counts against
// ImportConfig.Budget or the pool it names. Imported.Close orders its
// unmaps like any arena's. See docs/sharing.md.
//
// # Devices
//
// On real hardware, work queued on the device that may still read a range
// must finish before the range is unmapped; the device drivers wait for it in
// UnmapMem. The host driver, the default, has no such work.
//
// # Concurrency
//
// An Arena is safe for concurrent use. Alloc runs lock-free; Grow, Shrink,
// Truncate, Reset and Close serialise on a mutex held while they call the
// driver.
package arena
