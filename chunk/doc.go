// Package chunk hands out physical device memory in chunks of one or two
// fixed sizes, keeps
// released chunks in a bounded reuse cache, enforces a byte budget shared by
// everyone using the pool, and takes memory back from its members when
// someone needs it.
//
// # Chunk states
//
// A chunk is one physical allocation (one aclrtMallocPhysical handle) of
// exactly one of the pool's sizes, and is mapped whole or not at all,
// because ACL maps and unmaps only whole allocations. A pool has one size,
// its chunk size, or two (Config.TailSize): large chunks of the chunk size
// and tail chunks of the tail size, which divides it. By default a pool
// whose chunk is a multiple of four granules has tails of a quarter of it
// ([DefaultTailSize]: 4 MiB beside 16 MiB chunks), others one size. Each [Chunk] carries
// its size (Chunk.Size, set by the pool), and the pool's books count bytes
// chunk by chunk at that size (Stats.InUseBytes and the other byte fields):
//
//	none ──Acquire, TakeFree (miss: MallocPhysical)──▶ out ──MapRange──▶ mapped
//	none ──Warm, Config.Ahead (worker; large chunks)──▶ cached
//	cached ──a take (hit)──▶ out;  out ──Put──▶ cached, in the list of its size (cache full: FreePhysical ──▶ none)
//	cached ──converted by a take short of room (FreePhysical, its bytes kept for that take)──▶ none
//	mapped ──SyncDevice, Release──▶ out                   (the device-wide fallback)
//	mapped ──ReleaseAfter, ReleaseAfterDevice, or Give to a relief──▶ waiting for the device ──unmapped──▶ cached, or a growth's
//	cached ──Trim/Close, or a peer pool's device OOM (FreePhysical)──▶ none
//	out ──Free (an arena going to sleep: FreePhysical, never cached)──▶ none
//
// A chunk waiting for the device is waiting, claimed by a relief, or being
// unmapped; its member may take it back where it lies (ReclaimSpan). Those
// states, and the growth's, are the protocol's (protocol.go), told in
// docs/design.md ("Pressure").
//
// Only unmapped chunks go back with Put. A chunk in the cache holds physical
// memory but no mapping, so the next Acquire skips the driver's most
// expensive call. A chunk waiting for the device is still out: the budget
// counts it, and nobody else gets it until it is unmapped. The chunk size
// trades shrink granularity against driver calls per GiB: 2 MiB (the ACL
// granularity) unmaps finely; 32 MiB maps a GiB in 32 calls. A pool given a
// Budget and no Size chooses from the budget ([SizeFor]: the power of two
// nearest Budget/[BudgetChunks], from the granularity to [MaxAutoSize]), so
// that a large cache takes few calls and a small one wastes little; the
// size is fixed at New, whatever SetBudget sets later.
//
// The pool knows which chunks are out, and their sizes: Put, MapRange and
// Release refuse, with acl.ErrInvalidParam, a chunk that is not (put back
// twice, or from another pool), or whose Size is not the one the pool lent
// it out with, so no two holders can ever have one chunk.
//
// # Tenants and scrubbing
//
// A chunk may change hands between arenas, and the bytes one tenant wrote
// must never reach another. A [Tenant] is the unit of isolation: all the
// arenas of one model may be one tenant, and chunks move between them as
// they are. The pool remembers, per chunk, whose bytes it may hold, and
// clears it when needed, according to Config.Scrub:
//
//   - ScrubOnReuse (the default) clears a chunk when MapRange maps it for a
//     tenant other than the one whose bytes it holds. A tenant that takes its
//     own chunk back pays nothing; Acquire prefers such chunks.
//   - ScrubOnRelease clears a chunk when it is released, before the unmap;
//     chunks that come back otherwise (or after the work of several streams,
//     which no one clear can follow) are cleared on reuse.
//   - ScrubNever never clears, for pools that serve a single tenant.
//
// Fresh physical memory may hold what some process freed. What it may hold
// depends on the device (acl.Caps.Fresh): nothing on the host driver, whose
// memory is zeroed; only this process's bytes on a device that clears memory
// between processes (CUDA's kernel driver does), so that a fresh chunk needs
// clearing only once the device has had more than one tenant in this process,
// and only if it was allocated after a pool of the process first freed some
// of the device's memory (before, it holds nobody's bytes); anything where
// nobody says (ACL today), so it is always cleared.
// Config.FreshZeroed promises zeroed memory for a driver that does not say so.
//
// A clear is a memset queued on the tenant's stream (the first of the streams
// MapRange is given): it runs before the tenant's next work there, and nobody
// waits for it. Without a stream it is a synchronous memset, which waits for
// the clear alone, never for the whole device. Stats counts the clears, fresh
// and moved, and those queued.
//
// # Pressure
//
// Memory a tenant drops (an arena's Truncate or Reset) stays mapped where it
// is, so that reusing it costs no driver call. The pool takes it back only
// when someone needs it: a growth that finds the budget or the device full
// runs the protocol's one loop (Lender.Grow, over the member's Placer),
// which waits holding nothing (the member's lock released, no chunk kept)
// while a relief takes idle chunks from the pool's members ([Member],
// [Client]) and chunks waiting for the device, waits for the device to
// finish with those only, and hands them to the growth. Reliefs choose one
// at a time, in ticket order, and a growth a relief chose for is protected
// from younger ones ([Growth], [Ticket]). Nobody waits holding a member's
// lock, a relief never waits for one, and the worker never waits at all.
// The protocol, its states, its invariants and its liveness promise are in
// docs/design.md ("Pressure").
//
// The protocol counts in units of the tail size (Pool.TailSize; on a pool
// of one size a unit is a chunk): a take asks for units ([Ask]), of which
// at most some may come as large chunks, and tail chunks stand in for large
// ones; a growth's Step.Missing, a relief's need, a member's Reclaimable,
// Held and Give, and a waiter's need are units. A member gives whole
// chunks, so what a relief hands a growth may hold chunks of both sizes,
// and more units than it lacks. Where an arena maps chunks of each size is
// the arena's rule (package arena maps a large chunk only on a whole block
// of the large size, aligned); the pool lends them and counts. When a take
// is short of budget or of device memory while the cache holds chunks it
// cannot use (large ones beyond what it asked for; tail ones, for Acquire,
// which asks for large chunks only), the take converts them: it frees
// them, keeping their bytes booked for itself meanwhile so that no other
// growth takes the room, and allocates the chunks it lacks in their room
// (Stats.Conversions). A take's check that it can be whole, Fits and a
// relief count the cached chunks of both sizes as room.
//
// # The pool and its lender
//
// A pool's user (a server that sizes and watches its memory) needs New,
// Close, Stats, Trim, Warm, Budget, SetBudget, ChunkSize and TailSize. The protocol
// with the arenas the pool lends chunks to (taking and giving back chunks,
// mapping them, ordering their unmaps, membership, relief, waiting, sharing)
// is a separate type, [Lender] (Pool.Lender), for those who write an arena of
// their own; package arena is its user here.
//
// # Stream-ordered release
//
// Unmapping memory that queued device work still reads makes the device
// fault, so every unmap is ordered after that work. The fallback is SyncDevice
// (SynchronizeDevice: wait for every stream), once per batch of unmaps. With
// the streams that may touch the memory, ReleaseAfter records an event on
// each and returns at once; the chunks wait in the pool, still mapped, until
// the events complete, and are then unmapped off the caller's path. A failed
// event call falls back to SyncDevice (Stats.SyncFallbacks); a failed unmap
// leaves the chunk waiting, to be tried again (Stats.ReleaseErrors). A member
// without streams that must give chunks back while it holds its own lock
// hands them over with ReleaseAfterDevice: they wait for a device-wide wait
// that whoever needs them next makes, holding nothing (a relief, Close), or
// go back to the member where they lie.
//
// # The worker
//
// Each pool has at most one background goroutine, started on first need and
// stopped by Close (worker.go). It unmaps the chunks whose events completed,
// refills the headroom of members that asked (Member.WantRefill, which an
// arena's lock-free Alloc calls without blocking or allocating) with memory
// that is free now (a speculative growth, TryAcquire: it never reclaims,
// never passes the budget, never waits, and takes nothing while a growth
// relieves pressure or waits for memory), and keeps
// Config.Ahead fresh chunks in the cache. Waking a parked goroutine costs the
// waker a system call (tens of microseconds in a virtual machine), so a
// worker asked for something in the last 50 ms polls instead, every 250 µs
// to 2 ms, and a request then costs its caller one atomic store; idle
// longer, it parks. Its time is counted in Stats.WorkerNS and its rounds
// in Stats.WorkerSpins: work moved off the callers' paths is not free.
//
// Config.WorkerCPU caps that cost at a share of one CPU (workercap.go). The
// worker charges each round's wall time (its CPU and its driver calls; the
// package reads no per-thread CPU clock) to a token bucket that earns the
// share of every second and holds at most 2 ms; overspent, it waits for
// credit before its next round, its polls stretch to match, and requests and
// Settle that come meanwhile are served by the round after the wait. Close
// still stops it at once. The price is answers later: more growths map on
// their callers' paths, and released chunks stay mapped longer.
// Stats.WorkerThrottledNS counts the waits.
//
// # Failures
//
// A MapRange that fails unmaps what it mapped; a chunk whose undo unmap fails
// too is reported in a *[LeftMappedError] (matching [ErrMapped]) and must be
// unmapped before it is Put back. A scrub that fails leaves the chunk marked
// as holding its old tenant's bytes. When the driver fails to free a chunk,
// the pool keeps it in the cache and Trim and Close try again; nothing is lost
// from the driver's or the budget's books.
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
// Config.Budget caps the physical bytes the pool holds: in use, waiting for
// the device, cached, and allocated ahead. An Acquire that cannot be served
// within it, even after reclaiming, fails with an error matching both
// [ErrBudget] and acl.ErrOutOfMemory, and leaves every other member's bytes in
// use untouched.
//
// # Waiting, events and tracing
//
// A growth that would rather wait than fail queues in the pool
// (Lender.Mark, Member.Enqueue, Waiter): first come first served, woken
// without polling whenever memory may have come back in any pool on the
// device, and failed at once (ErrDeadlock) when every member holding the
// memory waits too (wait.go). Config.Logger receives the pool's
// events (scrubs, reliefs, device waits, releases, failures) through
// log/slog (observe.go); every driver call and slow path runs in a
// runtime/trace region (trace.go).
//
// A Pool is safe for concurrent use; its mutex is never held across a
// driver call, and is always taken after an arena's, never before. Its
// reliefMu (one relief choosing at a time) is held only to choose: a member's
// lock is tried under it, never waited for.
package chunk
