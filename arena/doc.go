// Package arena provides growable device memory for tensors: one large
// reservation of device virtual address space, backed lazily by physical
// chunks, from which tensor buffers are cut with a bump allocator.
//
// The zero Config runs on DefaultDriver: the device $VMARENA_DEVICE names
// (with the selector of package acl/device linked in), else the host driver.
//
// # The allocator
//
//	New(Config)                  reserve the address space, join a pool
//	a.Alloc(size, align)         cut a Buffer at Len (lock-free within Cap)
//	a.AllocN(dst, size, align)   cut len(dst) Buffers in a row, in one step
//	a.Grow(n)                    map chunks so that n more bytes can be allocated
//	a.Slice(i, j)                a Buffer for the bytes in use [i, j)
//	a.Truncate(n), a.Reset()     drop allocations at or above n (all), keep the memory
//	a.Shrink(), a.ShrinkTo(n)    give back the chunks above Len (max(Len, n))
//	a.Close()                    release everything
//	a.Len(), Cap(), Reserved()   the bytes in use, mapped, reserved
//	a.Stats()                    one snapshot of all of it
//	CopyIn, CopyOut, Copy, Fill  host copies through a Buffer
//
// Its errors are in errors.go: ErrExhausted (past Config.Reserve),
// ErrOutOfMemory (the device or the pool's budget), ErrInvalid and ErrRange
// (bad arguments), ErrStale (a dropped Buffer), ErrClosed.
//
// Beyond the allocator, each concern has its own files and a section at the
// end of this documentation: sleep and wake (sleep.go, backing.go), sharing
// with other processes (share.go, wire.go), watching and waiting
// (observe.go, wait.go). Typed tensors are package arena/tensor, and metrics
// package arena/metrics.
//
// # Address space
//
// New reserves Config.Reserve bytes of device virtual address space once. The
// base address never changes. Each chunk-sized granule of the range is in one
// of these states:
//
//	reserved   owned by the arena, backed by nothing; any access faults
//	mapped     backed by a physical chunk, accessible, not in use: headroom, or
//	           memory dropped and kept for reuse
//	in use     mapped and handed out by Alloc (below Len)
//	waiting    given back, still mapped, until the device work queued on the
//	           arena's streams has run (then the pool unmaps it)
//	asleep     every granule reserved again, its memory freed to the device by
//	           Sleep; Len kept, Cap 0, the contents on the host (Offload) or
//	           dropped (Discard)
//	waking     Wake mapping chunks at the granules they had and restoring the
//	           contents; the arena's calls wait for it or fail with ErrAsleep
//
//	reserved ──Grow / Alloc / the worker's refill (map chunks)──▶ mapped ──Alloc──▶ in use
//	in use ──Truncate/Reset──▶ mapped (kept: reusing it costs no driver call)
//	mapped ──Shrink, ShrinkTo──▶ waiting ──events done──▶ reserved
//	       (no streams: wait for the device holding no lock, unmap) ──▶ reserved
//	mapped ──given to another arena's growth under pressure──▶ claimed ──its events done, unmapped──▶ reserved
//	waiting ──Grow into it again──▶ mapped (taken back where it lies)
//	all ──Close (waits for the device work)──▶ released
//	mapped, in use ──Sleep (waits for the device work; Offload: copy out)──▶ asleep
//	asleep ──Wake──▶ waking ──chunks mapped where they were, contents back──▶ mapped, in use
//
// A growth that finds no room in its pool, the arena's lifecycle (open,
// closing, closed, sleeping, asleep, waking, imported) and every wait on the
// way follow one protocol, told in docs/design.md ("Pressure"): nothing is
// held while anything waits for the device or for memory, and every such
// wait ends with the caller's context.
//
// Every size and offset in the API is an int, as Go's len and slice indices
// are (Config's sizes, Stats, BackingChange included; counters are int64):
// the largest reservation fits an int on the 64-bit platforms the drivers
// run on.
//
// Len is the bytes in use, Cap the bytes mapped (a multiple of TailSize,
// the smallest chunk it maps), and Len ≤ Cap ≤ Reserved holds whenever the
// arena is awake. On a pool of one chunk size TailSize is the chunk size.
// On a pool of two (chunk.Config.TailSize; by default, chunk.DefaultTailSize,
// a pool whose chunk is a multiple of four granules, such as the 16 MiB
// chunks a 16 GiB budget chooses, has tails of a quarter of it) a growth
// maps each whole block
// of ChunkSize it covers, aligned to it, in one large chunk, and the rest
// in tail chunks, so that an arena holds less than a tail chunk above what
// it was asked for while a large cache still maps in few calls; where the
// chunks lie is the arena's layout (layout.go). Such an arena sleeps and
// wakes with every chunk at its offset (a large one the pool cannot give
// back comes back as tail chunks), and Share lends its chunks of both sizes.
// Growing maps chunks at Cap and never moves data: a Buffer's device pointer
// stays valid, and its contents intact, until a Truncate or Reset drops it,
// a Sleep in Discard mode drops its contents, or Close releases the arena.
// From then on the Buffer is stale: copies, views and Share through it fail
// with ErrStale, even once a new allocation holds its range (each Buffer
// carries the epoch it was cut in, and the arena the drops since; see
// ErrStale). Only the bare device pointer escapes the check.
//
// # Deferred reclamation and headroom
//
// Memory a Truncate or Reset drops stays mapped, so the next Alloc uses it
// with no driver call. Shrink gives the chunks above Len back at once, and
// ShrinkTo those above what the arena's next use needs (a slot whose next
// request the caller knows keeps that much mapped, and the rest goes where
// another arena can use it without allocating afresh); a pool
// under pressure takes them back when another arena's growth needs them (see
// package chunk), from idle arenas first, and never below Len or what Grow
// promised. With Config.Headroom the pool's background worker keeps that much
// mapped above Len, in whole chunks: an Alloc that leaves less than the
// low-water mark asks for a refill without blocking, and a decode step finds
// its memory mapped. A headroom smaller than a chunk (a few tokens' bytes of
// a KV cache) maps each next chunk just before Len reaches it. The
// headroom's size is learnt (headroom.go): a growth that has to map on the
// caller's path doubles it, up to Config.MaxHeadroom, and refills without
// such a miss shrink it back towards Config.Headroom. Prefetch asks the worker to map more than the headroom, ahead of a growth
// the caller knows is coming (a prompt at admission), on the same terms.
//
// # Streams
//
// On a device, work queued on streams may still read memory the arena drops.
// With Config.Streams the arena orders every unmap after the work queued on
// those streams (an event on each; the chunks wait in the pool, and the
// caller does not), and queues the clears of chunks that change tenant on the
// first stream, ahead of the caller's next work there; its own host copies
// (CopyIn, CopyOut, Copy, Fill) wait for those clears. Without streams it
// waits for the whole device before unmapping (SynchronizeDevice, once per
// batch; Shrink makes that wait holding no lock) and clears synchronously. Close waits for the streams, under a
// context with CloseContext.
//
// # Hot path
//
// Alloc within Cap is a compare-and-swap on one word: no driver call, no lock,
// no Go heap allocation, no channel operation that can block. Only when it
// needs memory does it take the slow path, map chunks (its own kept chunks
// first, then the pool's cache, then the driver), and retry. Grow, when the
// memory is mapped already, takes no lock either. The compare-and-swap is
// the fast path's whole cost (6–7 ns on this project's machines, where
// bumping a pointer that one goroutine owns costs 1–2), so AllocN cuts a
// batch of buffers, a token's tensors for every layer, with one.
//
// # Failure
//
// A request that cannot fit fails before any driver call: past the
// reservation with ErrExhausted, past the pool's whole budget (counting what
// the arena holds) with ErrOutOfMemory and chunk.ErrBudget.
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
// Arena not made by New) return an error matching ErrInvalid or ErrRange
// (a stale Buffer, ErrStale),
// change nothing and never panic; a closed arena returns ErrClosed, and a nil
// *Arena behaves as a closed one in every method that returns an error.
//
// # Tenants
//
// Arenas that share a pool share its budget: a growth that runs into it first
// reclaims memory other arenas dropped, and fails with ErrOutOfMemory only
// when nothing can be taken, never touching another arena's bytes in use. A
// chunk reaches another tenant only cleared (Config.Tenant: every arena is
// its own tenant unless told otherwise; see package chunk). Each arena owns
// its reservation, so a pointer into another arena's memory, or into a tail
// Shrink unmapped, faults rather than reading the bytes the chunk holds next.
//
// Config.TrapStale is a debug mode that extends this to Truncate and Reset,
// for the pointers no check sees (a Ptr handed to a kernel): the chunks they
// drop are unmapped at once and the dropped bytes of the chunk kept in part
// are filled with PoisonByte, so a stale pointer faults or reads poison.
//
// # Concurrency
//
// An Arena is safe for concurrent use. Alloc runs lock-free; Grow, Shrink,
// Truncate, Reset and Close serialise on a mutex held while they call the
// driver, but never while they wait for memory or for a stream: a growth, a
// Close, a Sleep or a Wake that must wait releases it (growths of one arena
// stay serialised by a second lock, taken first). The pool only tries an
// arena's mutex, and two arenas relieving each other cannot deadlock; an
// arena's mutex is always taken before its pool's. Copies through Buffers
// hold the arena open: a copy that races Close completes first, or fails
// with ErrClosed. See docs/design.md, "Pressure".
//
// # Sleep and wake
//
// Sleep gives all of an arena's memory back to the device and keeps its
// address range; Wake maps memory there again, so every Buffer's Ptr, and
// every device pointer derived from one, is unchanged. In Offload mode the
// bytes in use travel to pinned host memory from the driver
// (acl.Driver.MallocHost) and back, 16 MiB at a time, each copy overlapping
// the unmaps and frees (or the maps) of another step; in Discard mode they
// are dropped. The freed chunks go to the driver, not to the pool's cache,
// so the device's free memory grows by the arena's size. While asleep, Cap
// is 0, Len is kept, and everything that needs the memory fails with
// ErrAsleep; Alloc's fast path falls to the slow path (the state word stays
// frozen), so it costs nothing. Config.Tag groups arenas (weights, KV cache,
// scratch) for SleepTag and WakeTag, which act on every arena of a tag on a
// pool at once (TaggedOn and SleepAll: on a device). Generation and
// OnBackingChange tell whoever registered the memory elsewhere that Sleep,
// Wake or Shrink changed it. A fault in Sleep leaves the arena awake with
// its contents (Offload), a fault in Wake leaves it asleep with its host
// copy, and either can be retried. Sleep refuses an arena that shares
// memory with another process (ErrShared). See docs/sleep.md.
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
// otherwise), and every message of the hand-over must come from that
// process (a connected socket handed on to another is refused); on ACL the
// device enforces it too, with an allow-list. Import checks its producer the
// same way (ImportConfig.ProducerPID, ProducerUser, ProducerCheck), bounds
// every offer before it allocates, and reports a failure the other process
// sent as a *PeerError (ErrPeer); a refused peer is told which check refused
// it, nothing more. ShareContext and ImportContext end the hand-over when
// their context is done.
//
// The memory lives while either process holds it: a producer that shrinks,
// closes or dies pulls nothing from under the import (its pool frees shared
// chunks instead of caching them), and a consumer that closes its import or
// dies frees nothing of the producer's. The producer's pool counts a shared
// chunk until the arena gives it back; the consumer's import counts against
// ImportConfig.Budget or the pool it names. Imported.Close orders its
// unmaps like any arena's. See docs/sharing.md.
//
// # Watching and waiting
//
// Config.Logger receives the arena's events (growths, shrinks, reclaims,
// waits, failures with what was asked and held) through log/slog; the slow
// paths and driver calls run in runtime/trace regions; Activity counts
// failures, waits and the latency of growths, and package metrics exports
// them with Stats through expvar and Prometheus. GrowContext and
// AllocContext wait, under a context, for other tenants of the pool to give
// memory back instead of failing, first come first served; when every arena
// holding the memory waits too, the youngest fails at once (ErrDeadlock).
// None of it costs Alloc anything within Cap. docs/observability.md has the
// details.
//
// # Tensors
//
// Package arena/tensor types an arena's memory: tensor.Alloc allocates by
// element type and shape, tensor.View types a Buffer, and its Float16 and
// BFloat16 convert from and to float32. It uses only this package's public
// API (Alloc, Buffer, CopyIn, CopyOut).
package arena
