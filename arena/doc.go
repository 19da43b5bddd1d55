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
// ErrOutOfMemory. Errors from the driver carry the ACL operation and code
// (*acl.Error).
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
