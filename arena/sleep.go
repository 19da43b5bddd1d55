package arena

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/trace"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
	"github.com/vmarena/vmarena/internal/units"
)

// Sleep and wake: giving the device back while keeping every address.
//
// Sleep waits for the work queued on the arena's streams, then unmaps every
// chunk and frees it to the driver (not to the pool's cache: the point is
// that the device, and so other processes, get the memory back), and keeps
// the reservation. Wake maps chunks at the same addresses again, so every
// Buffer's Ptr, and every device pointer a captured graph holds, stays valid.
//
// While asleep the arena keeps, per chunk slot it had mapped, what became of
// it (a slot): gone to the driver, held unmapped (Sleep could not free it),
// or still mapped (a double fault stopped Sleep's undo half-way). Wake, and
// the undo of a failed Sleep, restore whatever is not mapped, so either one
// can be retried after a failure. In Offload mode a chunk is unmapped only
// after its bytes below Len reached the host copy, so every slot that is not
// mapped has its bytes on the host.

// SleepMode says what Sleep does with the arena's contents.
type SleepMode int

const (
	// Discard drops the contents: after Wake the bytes below Len are
	// whatever the pool's scrub rules give a new mapping (zeros, or the
	// arena's own tenant's old bytes; never another tenant's). For KV
	// caches and scratch memory.
	Discard SleepMode = iota + 1
	// Offload copies the bytes in use (below Len) to pinned host memory from
	// the driver (acl.Driver.MallocHost) before their chunks go, and Wake
	// copies them back. For weights.
	Offload
)

// String returns "discard" or "offload".
func (m SleepMode) String() string {
	switch m {
	case Discard:
		return "discard"
	case Offload:
		return "offload"
	}
	return fmt.Sprintf("arena.SleepMode(%d)", int(m))
}

// Tag groups arenas for SleepTag and WakeTag: the weights of a model, its KV
// cache, its scratch memory, or any name of the caller's own.
type Tag string

// Tags the field uses; any other string works as well.
const (
	TagWeights Tag = "weights"
	TagKV      Tag = "kv"
	TagScratch Tag = "scratch"
)

// slot is what became of one chunk of a sleeping arena.
type slot struct {
	c      chunk.Chunk
	state  slotState
	queued bool // slotLeft: clears queued on the arena's first stream may still run on it
}

type slotState uint8

const (
	slotMapped slotState = iota // mapped where it was, with access, its bytes there
	slotHeld                    // unmapped, held (physical memory and bytes kept)
	slotGone                    // freed to the driver
	// slotLeft: mapped by a Wake (or an undo) that failed and could not
	// unmap it again. Nothing about it is trusted (its access, its scrub,
	// its bytes: chunk.LeftState): the next Wake or Sleep unmaps it, after
	// the clears queued on it when queued is set, and a Wake maps it again
	// as a held chunk, with the scrub its lease calls for.
	slotLeft
)

// sleepState is a sleeping arena's record.
type sleepState struct {
	mode  SleepMode
	slots []slot   // chunk i of the arena, for every chunk it had mapped
	ends  []uint64 // ends[i]: the offset past slot i (a.geo's when it fell asleep), whatever became of its chunk
	len   uint64   // Len when it fell asleep: the bytes the host copy holds (Offload)
}

// off returns the offset of slot i in the arena; off(len(slots)) is the
// offset past the last.
func (st *sleepState) off(i int) uint64 {
	if i == 0 {
		return 0
	}
	return st.ends[i-1]
}

// at returns the device address of slot i.
func (st *sleepState) at(a *Arena, i int) acl.DevicePtr { return a.base.Add(uintptr(st.off(i))) }

// size returns the bytes of slot i.
func (st *sleepState) size(i int) uint64 { return st.ends[i] - st.off(i) }

// keep returns how many slots hold the bytes [0, x).
func (st *sleepState) keep(x uint64) int {
	if x == 0 {
		return 0
	}
	return min(sort.Search(len(st.ends), func(i int) bool { return st.ends[i] > x-1 })+1, len(st.slots))
}

// sleeper is the arena's sleep and wake state (see Arena.sl).
type sleeper struct {
	growth chunk.Growth // Wake's, in the protocol's loop
	tag    Tag
	st     *sleepState // under mu
	host   []byte      // the pinned host copy: kept for the next Offload after a Wake, freed by Close or DropHostCopy
}

// count returns the slots in state s.
func (st *sleepState) count(s slotState) int {
	n := 0
	for _, sl := range st.slots {
		if sl.state == s {
			n++
		}
	}
	return n
}

// mappedOf returns the slots in state s as mappings in a's range.
func (st *sleepState) mappedOf(a *Arena, s slotState) []chunk.Mapped {
	var ms []chunk.Mapped
	for i, sl := range st.slots {
		if sl.state == s {
			ms = append(ms, chunk.Mapped{At: st.at(a, i), C: sl.c})
		}
	}
	return ms
}

// mapped returns the slots still mapped (slotMapped, slotLeft): above Cap,
// counted with the strays.
func (st *sleepState) mapped() int { return st.count(slotMapped) + st.count(slotLeft) }

// Tag returns the arena's Config.Tag.
func (a *Arena) Tag() Tag {
	if a == nil {
		return ""
	}
	return a.sl.tag
}

// Asleep reports whether the arena is asleep: Sleep gave its memory back and
// Wake has not brought it back.
func (a *Arena) Asleep() bool {
	if a == nil {
		return false
	}
	l := a.lifeNow()
	return l == lifeAsleep || l == lifeWaking
}

// HostCopy returns the bytes of pinned host memory the arena holds for its
// offloads: the host copy of a sleeping arena's contents, or, after a Wake,
// the buffer kept for the next Offload (so that pinning happens once, as a
// caching host allocator does).
func (a *Arena) HostCopy() int {
	if a == nil || a.ev.owner.Load() != 0 && a.inCallback() {
		return 0
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.sl.host)
}

// DropHostCopy frees the pinned host buffer an awake arena keeps for its
// next Offload. It fails with ErrAsleep while the arena is asleep in Offload
// mode (the buffer holds its contents).
func (a *Arena) DropHostCopy() error {
	if a == nil || a.drv == nil {
		return nil
	}
	if a.ev.owner.Load() != 0 && a.inCallback() {
		return errCallback
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.sl.st != nil && a.sl.st.mode == Offload { // asleep, or waking
		return fmt.Errorf("arena: drop host copy: %w: it holds the contents", ErrAsleep)
	}
	return a.freeHost()
}

// freeHost frees the kept host buffer. Call with mu held.
func (a *Arena) freeHost() error {
	if a.sl.host == nil {
		return nil
	}
	if err := a.drv.FreeHost(a.sl.host); err != nil {
		return fmt.Errorf("arena: free host copy: %w", err)
	}
	a.sl.host = nil
	return nil
}

// hostFor makes sure the host buffer holds n bytes, reusing the kept one
// when it is large enough. Call with mu held.
func (a *Arena) hostFor(n uint64) error {
	if uint64(len(a.sl.host)) >= n {
		return nil
	}
	if err := a.freeHost(); err != nil {
		return err
	}
	b, err := a.drv.MallocHost(uintptr(n))
	if err != nil {
		return fmt.Errorf("arena: host copy of %s: %w", units.Ubytes(n), err)
	}
	a.sl.host = b
	return nil
}

// Sleep gives the arena's memory back to the device and keeps its address
// range: it waits for the work queued on Config.Streams (without streams, for
// the device), then unmaps every chunk and frees it to the driver, not to
// the pool's cache (a private pool's cache is freed too). In Offload mode
// the bytes in use are first copied to pinned host memory, 16 MiB at a
// time, each copy overlapping the unmaps and frees of the chunks the copy
// before it moved. Afterwards Cap is 0, Len is kept, and Alloc, Grow, Truncate,
// Reset, Shrink and the copies fail with ErrAsleep until Wake.
//
// Sleep refuses, changing nothing, an arena that shares memory with another
// process (ErrShared) or is an import (ErrImported). Waiting for the streams
// honours ctx. A fault in Offload mode, or before the first chunk is freed in
// Discard mode, leaves the arena awake with its contents intact (the chunks
// freed already are mapped again and refilled from the host copy); should
// that undo fail too, the arena stays asleep, with its host copy intact, and
// Wake brings it back. A failed free in Discard mode leaves the arena asleep
// holding the chunks it could not free, and returns the error: Sleep again
// tries once more. Sleep of a sleeping arena does only that.
func (a *Arena) Sleep(ctx context.Context, mode SleepMode) error {
	if mode != Discard && mode != Offload {
		return fmt.Errorf("arena: sleep: %w: mode %v", ErrInvalid, mode)
	}
	l, err := a.lockSleep(ctx)
	if err != nil {
		return wrapOp("arena: sleep", err)
	}
	err = a.sleepLocked(ctx, l, mode)
	a.mu.Unlock()
	if err != nil {
		return wrapOp(fmt.Sprintf("arena: sleep (%v)", mode), err)
	}
	return nil
}

// lockSleep takes mu for Sleep or Wake, once a transition under way (a
// Close, a Sleep, a Wake) has ended, and returns the arena's state: asleep
// or open. It says why it cannot: closed, imported, or ctx done while it
// waited.
func (a *Arena) lockSleep(ctx context.Context) (lifecycle, error) {
	if a == nil {
		return 0, errClosed
	}
	if a.drv == nil {
		return 0, errNotMade
	}
	l, err := a.awaitTransition(ctx)
	if err != nil {
		return 0, err
	}
	if l == lifeClosed || l == lifeImported {
		a.mu.Unlock()
		return 0, l.err()
	}
	return l, nil
}

// sharedErr refuses to sleep an arena that lends a chunk to another process.
// Call with mu held.
func (a *Arena) sharedErr() error {
	for _, c := range a.geo.cs {
		if a.lend.Shared(c) {
			return fmt.Errorf("%w: a chunk is exported; Sleep refuses until the arena gives the shared memory back", ErrShared)
		}
	}
	return nil
}

// sleepLocked is Sleep of an arena in state l (open or asleep), with mu
// held; it returns with mu held, having released it while it waited for the
// device (the arena sleeping meanwhile).
func (a *Arena) sleepLocked(ctx context.Context, l lifecycle, mode SleepMode) error {
	again := l == lifeAsleep
	if again && a.sl.st.mapped() == 0 {
		return a.sleepAgain(a.sl.st) // only frees to retry: no device work to wait for
	}
	if !again {
		if err := a.sharedErr(); err != nil {
			return err
		}
	}
	defer trace.StartRegion(ctx, RegionSleep).End()
	s := a.freeze()
	n := s & lenMask
	undo := func(err error) error { // the Sleep did not happen: the arena is as it was
		if again {
			a.setLife(lifeAsleep)
			return err
		}
		a.setLife(lifeOpen)
		a.thaw(s, n)
		a.member.Wake()
		return err
	}
	a.setLife(lifeSleeping) // growths and reliefs for the arena stop
	a.mu.Unlock()
	if !again {
		a.member.Interrupt() // its waiters' retries fail with ErrAsleep
	}
	// A pool whose members all sleep keeps nothing ahead: wait for the
	// chunks its worker is allocating ahead, so that the Trim below frees
	// them too (a private pool's are kept on this arena's behalf).
	werr := a.member.Sleep(ctx)
	// The chunks still waiting in the pool for the device lie in the
	// reservation: take them back, to free with the rest once the device is
	// done with them, waiting (holding nothing) for a relief to unmap those it
	// took.
	var back []chunk.Mapped
	if werr == nil {
		back, werr = a.reclaimAll(ctx)
	}
	if werr == nil {
		werr = a.lend.WaitStreams(ctx, a.streams)
	}
	// Copies under way end first, as for Close; later ones find the arena
	// sleeping (ErrAsleep) once they have the lock, never memory the sleep
	// copied out, or unmapped, under them.
	a.users.Lock()
	defer a.users.Unlock()
	a.mu.Lock()
	if werr != nil {
		return undo(errors.Join(werr, a.dropMapped(BackingUndo, back)))
	}
	for _, m := range back {
		a.maps++ // strays: mapped above Cap
		a.strays = append(a.strays, stray{m.At, m.C})
	}
	if again {
		err := a.sleepAgain(a.sl.st)
		a.setLife(lifeAsleep)
		return err
	}
	if err := a.sharedErr(); err != nil {
		return undo(err)
	}
	if err := a.freeStrays(); err != nil {
		return undo(err)
	}
	if a.ownPool {
		if err := a.pool.Trim(); err != nil {
			return undo(err)
		}
	}
	if mode == Offload && n > 0 {
		if err := a.hostFor(n); err != nil {
			return undo(err)
		}
	}
	st := &sleepState{mode: mode, slots: make([]slot, a.geo.n()), ends: slices.Clone(a.geo.ends), len: n}
	ms := make([]chunk.Mapped, a.geo.n())
	for i, c := range a.geo.cs {
		st.slots[i] = slot{c: c}
		ms[i] = chunk.Mapped{At: st.at(a, i), C: c}
	}
	// Whatever registered the memory lets go of it first, all of it: a
	// refusal changes nothing.
	if _, err := a.letGo(BackingSleep, ms); err != nil {
		return undo(err)
	}
	// Every chunk is unmapped (an Offload's after its bytes reached the
	// host) before any is freed: until the first free, a failure is undone
	// with the arena's own chunks, mapped back where they were, and needs no
	// memory that a growth waiting meanwhile may have taken.
	var err error
	if mode == Offload {
		err = a.offload(st)
	} else {
		err = a.unmapAll(st)
	}
	if err == nil {
		err = a.freeHeldOf(st)
	}
	if err != nil && !st.asleep() {
		// Put back what went: the arena wakes as it was.
		if werr := a.restore(st, true, nil); werr != nil {
			err = errors.Join(err, fmt.Errorf("and the undo left it asleep: %w", werr))
		}
	}
	if err != nil && st.awake() {
		// Every chunk is mapped again, where it was, and registered again
		// (the ones never unmapped were let go of too). (Without an error
		// nothing is mapped: every chunk went, or there was none, and an
		// arena that held nothing sleeps like any other.)
		return undo(errors.Join(err, a.announce(BackingUndo, ms)))
	}
	if err != nil {
		// Asleep after all: what stays mapped with its bytes is held again.
		err = errors.Join(err, a.announce(BackingUndo, st.mappedOf(a, slotMapped)))
	}
	// Asleep: Cap 0, Len kept, the state word frozen for good (every Alloc
	// goes to the slow path and finds ErrAsleep). Slots a double fault left
	// mapped count with the strays.
	a.geo.reset()
	a.setCap()
	e := a.nextEpoch(s)
	if mode == Discard && n > 0 {
		a.dropped(e, 0) // the bytes are gone: every buffer is stale
	}
	a.state.Store(e | n | frozen)
	a.sl.st = st
	a.setLife(lifeAsleep)
	if err != nil && a.ownPool {
		err = errors.Join(err, a.pool.Trim()) // nothing kept on the arena's behalf
	}
	a.member.Dropped() // growths waiting for memory may take it now
	a.logSleep(EventSleep, mode, len(st.slots))
	return err
}

// sleepAgain is Sleep of a sleeping arena: it gives back what an earlier
// failure left, with the device's work on it waited for. Slots still mapped
// are unmapped (in Offload mode after their bytes below Len are copied to
// the host again: a slot Sleep never unmapped may not have them there),
// then every held chunk is freed, and a private pool's cache with them.
// What fails stays with the arena, and the error says so. Call with mu held.
func (a *Arena) sleepAgain(st *sleepState) error {
	var errs []error
	for i := len(st.slots) - 1; i >= 0; i-- {
		sl := &st.slots[i]
		if sl.state != slotMapped && sl.state != slotLeft {
			continue
		}
		if err := a.saveMapped(st, i); err != nil {
			errs = append(errs, err)
			continue // its bytes are only there: it stays mapped
		}
		m := []chunk.Mapped{{At: st.at(a, i), C: sl.c}}
		was := a.heldOf(m)[0]
		if free, err := a.letGoHeld(BackingSleep, m); !free[0] {
			errs = append(errs, err)
			continue
		}
		if err := a.lend.Unmap(st.at(a, i)); err != nil {
			errs = append(errs, err)
			if was {
				errs = append(errs, a.stillMapped(m))
			}
			continue
		}
		a.unmaps++
		sl.state, sl.queued = slotHeld, false
	}
	errs = append(errs, a.freeHeldOf(st))
	if a.ownPool {
		errs = append(errs, a.pool.Trim())
	}
	return errors.Join(errs...)
}

// saveMapped copies the bytes below Len of slot i, still mapped after a
// failure (slotMapped), to the host copy of an Offload sleep, before it is
// unmapped: a slot the Sleep never unmapped may not have them there.
func (a *Arena) saveMapped(st *sleepState, i int) error {
	lo, hi := st.off(i), min(st.off(i+1), st.len)
	if st.slots[i].state != slotMapped || st.mode != Offload || lo >= hi {
		return nil
	}
	if err := a.drv.MemcpyDtoH(a.sl.host[lo:hi], st.at(a, i)); err != nil {
		return fmt.Errorf("copy to the host at chunk %d: %w", i, err)
	}
	return nil
}

// logSleep reports a sleep or a wake to Config.Logger.
func (a *Arena) logSleep(ev string, mode SleepMode, chunks int) {
	if a.obs.on(slog.LevelInfo) {
		a.obs.emit(a, slog.LevelInfo, ev, slog.String("mode", mode.String()), slog.Int("chunks", chunks))
	}
}

// asleep reports whether a failed Sleep must stay asleep: it freed chunks
// (their bytes are on the host, or dropped by request), and putting them
// back would take memory a growth may have taken since.
func (st *sleepState) asleep() bool { return st.count(slotGone) > 0 }

// awake reports whether every chunk is mapped with its bytes.
func (st *sleepState) awake() bool {
	for _, s := range st.slots {
		if s.state != slotMapped {
			return false
		}
	}
	return true
}

// freeStrays unmaps the strays and frees them to the driver; their device
// work has been waited for. One that cannot be unmapped stays a stray; one
// that cannot be freed goes to the pool. Call with mu held.
func (a *Arena) freeStrays() error {
	return a.unmapStrays(func(c chunk.Chunk) error {
		if err := a.lend.Free(c); err != nil {
			return errors.Join(err, a.lend.Put(c))
		}
		return nil
	})
}

// pipeStep is the most bytes one copy of Sleep's and Wake's pipelines
// moves: large enough that a copy runs at the link's speed and costs one
// call, small enough that the unmaps (or maps) of one step overlap the
// copy of the next.
const pipeStep = 16 << 20

// runEnd returns the slot past the pipeline step that starts at slot i and
// ends by slot end: the slots from i that span at most pipeStep bytes, one
// at least (a step is a count of bytes, whatever the sizes of the chunks).
func (st *sleepState) runEnd(i, end int) int {
	j := i + 1
	for j < end && st.off(j+1)-st.off(i) <= pipeStep {
		j++
	}
	return j
}

// offload copies the bytes below Len to the host copy, a step of chunks at
// a time, on a goroutine of its own, while this one unmaps the chunks whose
// copy is done: the copy of step j+1 overlaps the unmaps of step j. It
// frees nothing (the caller frees every chunk once all are unmapped), and
// stops at the first failure, leaving st to say what is held.
func (a *Arena) offload(st *sleepState) error {
	data := st.keep(st.len) // chunks holding bytes in use
	var ends []int          // the slot past each step
	for i := 0; i < data; i = ends[len(ends)-1] {
		ends = append(ends, st.runEnd(i, data))
	}
	steps := len(ends)
	done := make(chan error, steps)
	var stop atomic.Bool
	go func() {
		from := 0
		for _, to := range ends {
			if stop.Load() {
				done <- errStopped
				continue
			}
			lo, hi := st.off(from), min(st.off(to), st.len)
			done <- a.drv.MemcpyDtoH(a.sl.host[lo:hi], st.at(a, from))
			from = to
		}
	}()
	waited := 0 // steps whose copy was received
	drain := func() {
		stop.Store(true)
		for ; waited < steps; waited++ {
			<-done
		}
	}
	next := 0 // the slot where the next step starts
	for i := range st.slots {
		if i < data && i == next {
			err := <-done
			next = ends[waited]
			waited++
			if err != nil {
				drain()
				return fmt.Errorf("copy to the host at chunk %d: %w", i, err)
			}
			sched.At(sched.SleepCopied, a)
		}
		if err := a.lend.Unmap(st.at(a, i)); err != nil {
			drain()
			return err
		}
		a.unmaps++
		st.slots[i].state = slotHeld
	}
	return nil
}

var errStopped = errors.New("stopped")

// unmapAll unmaps every chunk, top down, for a Discard: a failed unmap
// leaves the bytes intact (the undo maps the held chunks back).
func (a *Arena) unmapAll(st *sleepState) error {
	for i := len(st.slots) - 1; i >= 0; i-- {
		if err := a.lend.Unmap(st.at(a, i)); err != nil {
			return err
		}
		a.unmaps++
		st.slots[i].state = slotHeld
	}
	return nil
}

// freeHeldOf frees the held chunks of st, top down. Those the driver refuses
// stay held, and the error says how many.
func (a *Arena) freeHeldOf(st *sleepState) error {
	var errs []error
	for i := len(st.slots) - 1; i >= 0; i-- {
		if st.slots[i].state != slotHeld {
			continue
		}
		if err := a.lend.Free(st.slots[i].c); err != nil {
			errs = append(errs, err)
			continue
		}
		st.slots[i] = slot{state: slotGone}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d chunks could not be freed (they stay with the sleeping arena; Sleep again to retry): %w",
			len(errs), errors.Join(errs...))
	}
	return nil
}

// Wake brings a sleeping arena's memory back: it maps chunks at exactly the
// addresses they had (so every Buffer's Ptr is unchanged), for Len and what
// Grow promised (the headroom above comes back as the arena grows), and, in
// Offload mode, copies the contents back from the host copy, 16 MiB at a
// time, each copy overlapping the acquiring and mapping of the next step's
// chunks. In Discard mode the chunks are cleared as the pool's scrub rules
// say (Config.Streams: the clears are queued on the first stream, as Grow's
// are). Wake returns when the memory is usable, after the OnBackingChange
// callbacks; the pinned host buffer is kept for the next Offload
// (DropHostCopy frees it).
//
// The chunks come from the pool as a growth's do (the protocol's loop: the
// cache, room in the budget and on the device, then a relief that takes
// memory other arenas hold unused), and when there is not enough, Wake
// waits for memory as GrowContext does, in the pool's queue, until ctx is
// done: it then fails with an error that matches ErrOutOfMemory and wraps
// ctx.Err(). A failure (no memory, a driver fault, ctx) leaves the arena
// asleep with its host copy intact, and Wake can be retried. Wake of an
// awake arena does nothing; ctx is checked before any driver call.
func (a *Arena) Wake(ctx context.Context) error {
	if _, _, err := a.wake(ctx); err != nil {
		return wrapOp("arena: wake", err)
	}
	return nil
}

// wake is Wake; it reports whether this call woke the arena (it was
// asleep), and the mode the arena had slept in.
func (a *Arena) wake(ctx context.Context) (woke bool, mode SleepMode, err error) {
	var need int
	var asked uint64
	var never bool
	try := func(ctx context.Context) error {
		l, err := a.lockSleep(ctx)
		if err != nil {
			return err
		}
		if l == lifeAsleep {
			mode = a.sl.st.mode
			if err = a.wakeLocked(ctx); err == nil {
				woke = true
			} else {
				need, asked, never = a.wakeNeed()
			}
		}
		a.mu.Unlock()
		return err
	}
	if a == nil || a.drv == nil {
		return false, 0, try(ctx)
	}
	err = a.waitFor(ctx, &a.sl.growth, func() (int, uint64, bool) { return need, asked, never }, try)
	return woke, mode, err
}

// wakeNeed says what a Wake that failed for want of memory lacks: the
// units of the chunks it must get from the pool, their bytes, and whether the pool's
// budget could never hold what the arena maps once awake. Call with mu
// held, the arena asleep.
func (a *Arena) wakeNeed() (need int, asked uint64, never bool) {
	st := a.sl.st
	if st == nil {
		return 1, a.unit, false
	}
	var gone uint64
	for i, sl := range st.slots {
		if sl.state == slotGone {
			gone += st.size(i)
		}
	}
	need = max(1, int(gone/a.unit))
	b := uint64(a.pool.Budget())
	return need, uint64(need) * a.unit, b > 0 && st.off(len(st.slots)) > b
}

// wakeLocked wakes a sleeping arena, with mu held: it maps the slots back
// through the protocol's loop (chunk.Lender.Grow), which releases mu while it
// waits for memory (the arena waking meanwhile), and returns with mu held.
func (a *Arena) wakeLocked(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	defer trace.StartRegion(ctx, RegionWake).End()
	st := a.sl.st
	if err := a.trimSlots(st); err != nil {
		return err
	}
	a.setLife(lifeWaking)
	err := a.lend.Grow(ctx, &a.sl.growth, a.tenant, &waker{a, st}, chunk.MayRelieve)
	a.sl.growth.End()
	if err != nil {
		a.setLife(lifeAsleep)
		if a.ownPool {
			// The chunks the undo gave back are kept on the arena's
			// behalf: a sleeping arena's private pool holds nothing.
			err = errors.Join(err, a.pool.Trim())
		}
		return err
	}
	// Awake: the chunks are where they were, and Len with them.
	a.geo.reset()
	for i, s := range st.slots {
		a.geo.push(s.c, st.size(i))
	}
	a.setCap()
	a.sl.st = nil
	a.member.Wake()
	a.setLife(lifeOpen)
	s := a.state.Load()
	a.thaw(s, s&lenMask)
	a.logSleep(EventWake, st.mode, len(st.slots))
	a.wantHeadroom(s & lenMask)
	sched.At(sched.WakeAsked, a)
	return nil
}

// waker is Wake's side of its growth (a chunk.Placer): restore the slots of
// st, under mu. The arena is waking meanwhile: nothing else changes it.
type waker struct {
	a  *Arena
	st *sleepState
}

func (w *waker) Place(have []chunk.Chunk) (chunk.Step, error) {
	// restore maps a step at a time, taking each step's chunks as it goes,
	// and undoes every map when a later step finds the pool short. When
	// what the slots lack is plainly not there (what a relief found, the
	// cache, the budget's room), the try ends here, before any driver call:
	// a Wake retried under pressure would otherwise map and unmap, and
	// allocate and free, the same chunks on every try.
	a := w.a
	gone, large := a.goneOf(w.st, 0, len(w.st.slots))
	// What a relief handed that no gone slot can take goes back first: the
	// pool may then turn it into chunks of the size the slots lack.
	var spare []chunk.Chunk
	have, spare, lack, _ := a.useHanded(have, have[:0], nil, gone, large)
	if err := a.putChunks(spare); err != nil {
		return chunk.Step{}, errors.Join(err, a.putChunks(have))
	}
	if lack > 0 && !a.lend.Fits(lack) {
		err := fmt.Errorf("%w: %w: %s to map back, %s of it at hand, and the pool has not the rest free", chunk.ErrBudget,
			ErrOutOfMemory, units.Ubytes(uint64(gone)*a.unit), units.Ubytes(uint64(gone-lack)*a.unit))
		if perr := a.putChunks(have); perr != nil {
			return chunk.Step{}, errors.Join(err, perr)
		}
		return chunk.Step{Missing: gone, Short: err}, nil
	}
	err := a.restore(w.st, false, &have)
	perr := a.putChunks(have) // what the relief found beyond the need
	if err == nil || perr != nil || !errors.Is(err, ErrOutOfMemory) {
		return chunk.Step{}, errors.Join(err, perr)
	}
	missing := int(w.st.goneBytes() / a.unit)
	if missing == 0 {
		return chunk.Step{}, err
	}
	return chunk.Step{Missing: missing, Short: err}, nil
}

func (w *waker) Unlock() <-chan struct{} {
	stop := w.a.lifeChanged()
	w.a.mu.Unlock()
	return stop
}

func (w *waker) Lock() { w.a.mu.Lock() }

// goneBytes returns the bytes of the slots whose chunks went to the driver.
func (st *sleepState) goneBytes() uint64 {
	var n uint64
	for i, sl := range st.slots {
		if sl.state == slotGone {
			n += st.size(i)
		}
	}
	return n
}

// goneOf returns what the gone slots among [i, j) of st lack: units, and
// how many of the slots are large (a chunk of the pool's large size fits
// them, or tail chunks laid in their place).
func (a *Arena) goneOf(st *sleepState, i, j int) (want, large int) {
	for x := i; x < j; x++ {
		if st.slots[x].state == slotGone {
			want += int(st.size(x) / a.unit)
			if a.isLarge(st.size(x)) {
				large++
			}
		}
	}
	return want, large
}

// fillRun gets the chunks for the gone slots of the run [i, j) of st: from
// *have first (what a relief handed; what the run cannot use stays there),
// then memory free in the pool now (TakeFree: it never waits, since mu is
// held; those it takes are added to taken). A large slot the pool has no
// large chunk for is laid as tail slots, as place lays a growth: st gains
// the slots, and every byte keeps its offset. It returns the run's chunks,
// held and new, in slot order, and the slot past the run.
func (a *Arena) fillRun(st *sleepState, i, j int, have *[]chunk.Chunk, taken map[acl.PhysicalHandle]bool) ([]chunk.Chunk, int, error) {
	want, large := a.goneOf(st, i, j)
	var fresh []chunk.Chunk
	if have != nil && want > 0 {
		fresh, *have, want, large = a.useHanded(*have, nil, (*have)[:0], want, large)
	}
	if want > 0 {
		n := len(fresh)
		var err error
		if fresh, err = a.lend.TakeFree(fresh, a.tenant, chunk.Ask{Units: want, Large: min(large, want/a.per())}); err != nil {
			return nil, j, errors.Join(err, a.putChunks(fresh))
		}
		for _, c := range fresh[n:] {
			taken[c.Handle] = true
		}
	}
	slices.SortStableFunc(fresh, func(x, y chunk.Chunk) int { return cmp.Compare(y.Size, x.Size) })
	nl := 0
	for nl < len(fresh) && a.isLarge(uint64(fresh[nl].Size)) {
		nl++
	}
	run := make([]chunk.Chunk, 0, j-i)
	li, ti := 0, nl
	for x := i; x < j; x++ {
		sl := st.slots[x]
		switch {
		case sl.state != slotGone:
			run = append(run, sl.c)
			continue
		case a.isLarge(st.size(x)) && li < nl:
			run = append(run, fresh[li])
			li++
			continue
		case a.isLarge(st.size(x)):
			st.retile(x, a.unit)
			j += a.per() - 1
		}
		if ti == len(fresh) {
			break
		}
		run = append(run, fresh[ti])
		ti++
	}
	if li != nl || ti != len(fresh) || len(run) != j-i {
		return nil, j, errors.Join(fmt.Errorf("arena: wake: %w: the pool lent chunks that do not tile the slots", ErrInvalid),
			a.putChunks(fresh))
	}
	return run, j, nil
}

// retile lays gone slot x, a large one, as gone slots of unit bytes each.
func (st *sleepState) retile(x int, unit uint64) {
	lo, hi := st.off(x), st.ends[x]
	k := int((hi - lo) / unit)
	st.slots = slices.Insert(st.slots, x+1, make([]slot, k-1)...)
	ends := make([]uint64, k-1)
	for y := range ends {
		st.slots[x+1+y].state = slotGone
		ends[y] = lo + uint64(y+1)*unit
	}
	st.ends = slices.Insert(st.ends, x, ends...)
}

// trimSlots drops the slots a Wake need not map back: those above Len and
// what Grow promised, which held only headroom or memory the arena had
// dropped (a pool under pressure could have taken them anyway, and the
// arena maps them again as it grows). A slot still holding a chunk there is
// kept, or its chunk given back: held ones are freed, and mapped ones (a
// double fault's) keep every slot below them. Call with mu held.
func (a *Arena) trimSlots(st *sleepState) error {
	keep := st.keep(a.keepBytes(a.state.Load()&lenMask, math.MaxUint64))
	for i := len(st.slots) - 1; i >= keep; i-- {
		switch st.slots[i].state {
		case slotMapped, slotLeft:
			keep = i + 1
		case slotHeld:
			if err := a.lend.Free(st.slots[i].c); err != nil {
				return err
			}
			st.slots[i] = slot{state: slotGone}
		}
	}
	if keep < len(st.slots) {
		clear(st.slots[keep:])
		st.slots, st.ends = st.slots[:keep], st.ends[:keep]
	}
	return nil
}

// restore maps every slot of st that is not mapped, from the bottom up, a
// run of up to a step of adjacent slots at a time: held chunks as they
// are, gone ones with chunks from have (what a relief found), then memory
// free in the pool now (TakeFree: it never waits, since mu is held), a run
// at a time. Slots an earlier failure left mapped are not trusted: it first
// unmaps them (after the clears queued on them) and maps them as held ones.
// In Offload mode it copies each run's bytes below st.len back from the
// host copy, on a goroutine of its own while the next run is mapped (a held
// chunk may be one a failed Wake left, whose bytes were never restored).
// With undo set (a failed
// Sleep putting back what it took) nothing is queued on the streams. On
// failure it unmaps what it mapped (gone slots' new chunks go back to the
// pool, held ones stay held), once the clears it queued have run, so st is
// as it was, and returns the error; a chunk it cannot unmap, or must not
// (the wait for its clears failed), stays mapped as a slotLeft. Call with
// mu held.
func (a *Arena) restore(st *sleepState, undo bool, have *[]chunk.Chunk) error {
	if err := a.settleLeft(st); err != nil {
		return err
	}
	offload := st.mode == Offload
	// Scrubs queued on a stream would race the host copy's synchronous
	// writes: an offload's chunks are cleared synchronously, if at all.
	streams := a.streams
	if offload || undo {
		streams = nil
	}
	type job struct{ lo, hi uint64 }
	jobs := make(chan job, len(st.slots))
	done := make(chan error, len(st.slots))
	if offload {
		go func() {
			for j := range jobs {
				done <- a.drv.MemcpyHtoD(a.base.Add(uintptr(j.lo)), a.sl.host[j.lo:j.hi])
			}
		}()
	}
	copyRun := func(from, to int) int { // queue the copy of slots [from, to)
		lo, hi := st.off(from), min(st.off(to), st.len)
		if !offload || lo >= hi {
			return 0
		}
		jobs <- job{lo, hi}
		return 1
	}
	var mapped []int // slots this call mapped (and, last, those a failed map left)
	var unplaced []chunk.Chunk
	taken := map[acl.PhysicalHandle]bool{}  // chunks this call took from the pool (fillRun)
	placed := map[acl.PhysicalHandle]bool{} // chunks this call put in gone slots: they go back on undo
	scrubbed, copies := 0, 0
	leftQueued := false
	var err error
	for i := 0; i < len(st.slots) && err == nil; {
		if st.slots[i].state == slotMapped {
			i++
			continue
		}
		// A run of up to a step of slots to map; the chunks for the gone
		// ones come from the pool now, while the copy of the run before
		// runs.
		end := i
		for end < len(st.slots) && (st.slots[end].state == slotHeld || st.slots[end].state == slotGone) {
			end++
		}
		j := st.runEnd(i, end)
		var run []chunk.Chunk
		if run, j, err = a.fillRun(st, i, j, have, taken); err != nil {
			break
		}
		for x, c := range run {
			if st.slots[i+x].state == slotGone {
				placed[c.Handle] = true
			}
		}
		sc, merr := a.lend.MapRange(st.at(a, i), run, streams)
		if merr != nil {
			err = merr
			left := map[acl.DevicePtr]chunk.LeftState{}
			var lm *chunk.LeftMappedError
			if errors.As(merr, &lm) {
				for _, m := range lm.Left {
					left[m.At] = m.State
				}
			}
			for x, c := range run {
				if state, ok := left[st.at(a, i+x)]; ok {
					// Mapped, and not to be trusted: the undo below
					// tries to unmap it once more.
					a.maps++
					queued := state == chunk.LeftQueued
					leftQueued = leftQueued || queued
					st.slots[i+x] = slot{c: c, state: slotLeft, queued: queued}
					mapped = append(mapped, i+x)
				} else if placed[c.Handle] {
					unplaced = append(unplaced, c)
				}
			}
			break
		}
		a.maps += uint64(len(run))
		scrubbed += sc
		for x, c := range run {
			st.slots[i+x] = slot{c: c, state: slotLeft} // mapped; its bytes not yet restored
			mapped = append(mapped, i+x)
		}
		copies += copyRun(i, j)
		i = j
	}
	close(jobs)
	for ; copies > 0; copies-- {
		err = errors.Join(err, <-done)
	}
	if err == nil && scrubbed > 0 {
		err = a.fence.record(a.drv, a.streams[0])
	}
	ms := make([]chunk.Mapped, len(mapped))
	for x, i := range mapped {
		ms[x] = chunk.Mapped{At: st.at(a, i), C: st.slots[i].c}
	}
	if err == nil {
		cause := BackingWake
		if undo {
			cause = BackingUndo
		}
		err = a.announce(cause, ms) // mapped, access granted, bytes back: register now
	}
	if err == nil {
		for _, i := range mapped {
			st.slots[i].state = slotMapped
		}
		return nil
	}
	// Undo: unmap what this call mapped, after the clears it queued; the
	// chunks it took from the pool go back there. Should the wait for the
	// clears fail, they may still run: nothing is unmapped, and every slot
	// this call mapped is left, queued.
	synced := true
	if scrubbed > 0 || leftQueued {
		if werr := a.drv.SynchronizeStream(a.streams[0]); werr != nil {
			err = errors.Join(err, fmt.Errorf("wait for the clears queued: %w", werr))
			synced = false
		}
	}
	// A callback that took them and could not give them back keeps them
	// mapped.
	free, lerr := a.letGoHeld(BackingUndo, ms)
	err = errors.Join(err, lerr)
	for x, i := range slices.Backward(mapped) {
		sl := &st.slots[i]
		if !synced && (scrubbed > 0 || sl.queued) {
			sl.state, sl.queued = slotLeft, true
			continue
		}
		if !free[len(mapped)-1-x] {
			sl.state = slotLeft
			continue
		}
		if uerr := a.lend.Unmap(st.at(a, i)); uerr != nil {
			err = errors.Join(err, uerr)
			sl.state, sl.queued = slotLeft, false
			continue
		}
		a.unmaps++
		if placed[sl.c.Handle] {
			unplaced = append(unplaced, sl.c)
			*sl = slot{state: slotGone}
		} else {
			*sl = slot{c: sl.c, state: slotHeld}
		}
	}
	// What this call took from the pool goes back without waking the
	// pool's waiters, this Wake among them: nothing came back that was not
	// free before it tried. What a relief handed it is memory that came
	// back, and goes back with Put.
	var back []chunk.Chunk
	for _, c := range unplaced {
		if taken[c.Handle] {
			back = append(back, c)
		} else {
			err = errors.Join(err, a.lend.Put(c))
		}
	}
	return errors.Join(err, a.lend.PutBack(back))
}

// settleLeft unmaps the slots an earlier failure left mapped (slotLeft),
// after the clears queued on them, so that restore maps them again as held
// chunks: nothing is trusted that a failed map left. It stops at the first
// failure, which restore returns (the Wake fails, changing nothing more).
func (a *Arena) settleLeft(st *sleepState) error {
	synced := false
	for i := len(st.slots) - 1; i >= 0; i-- {
		sl := &st.slots[i]
		if sl.state != slotLeft {
			continue
		}
		if sl.queued && !synced {
			if err := a.drv.SynchronizeStream(a.streams[0]); err != nil {
				return fmt.Errorf("wait for the clears queued on a chunk a failed wake left mapped: %w", err)
			}
			synced = true
		}
		if free, err := a.letGoHeld(BackingUndo, []chunk.Mapped{{At: st.at(a, i), C: sl.c}}); !free[0] {
			return err
		}
		if err := a.lend.Unmap(st.at(a, i)); err != nil {
			return fmt.Errorf("unmap a chunk a failed wake left mapped: %w", err)
		}
		a.unmaps++
		sl.state, sl.queued = slotHeld, false
	}
	return nil
}

// closeAsleep gives back what a sleeping arena still holds, for Close: the
// chunks still mapped (a double fault's) are unmapped, in Offload mode after
// their bytes below Len are copied to the host (as sleepAgain does: a Close
// that fails later leaves the arena asleep, and its Wake restores them from
// there), and every chunk held goes to the pool. It leaves the arena
// asleep, with what it could not give back, on failure. Call with mu held,
// the device's work waited for.
func (a *Arena) closeAsleep() error {
	st := a.sl.st
	var errs []error
	for i := len(st.slots) - 1; i >= 0; i-- {
		s := st.slots[i]
		switch s.state {
		case slotMapped, slotLeft:
			if err := a.saveMapped(st, i); err != nil {
				errs = append(errs, err)
				continue // its bytes are only there: it stays mapped
			}
			m := []chunk.Mapped{{At: st.at(a, i), C: s.c}}
			was := a.heldOf(m)[0]
			if free, err := a.letGoHeld(BackingClose, m); !free[0] {
				errs = append(errs, err)
				continue
			}
			if err := a.lend.Unmap(st.at(a, i)); err != nil {
				errs = append(errs, err)
				if was {
					errs = append(errs, a.stillMapped(m))
				}
				continue
			}
			a.unmaps++
			fallthrough
		case slotHeld:
			errs = append(errs, a.lend.Put(s.c))
			st.slots[i] = slot{state: slotGone}
		}
	}
	return errors.Join(errs...)
}

// Tagged returns the open arenas of tag that draw from pool (every pool,
// when pool is nil), in the order they were made.
func Tagged(pool *chunk.Pool, tag Tag) []*Arena {
	tags.mu.Lock()
	defer tags.mu.Unlock()
	var out []*Arena
	for _, a := range tags.all {
		if a.sl.tag == tag && (pool == nil || a.pool == pool) {
			out = append(out, a)
		}
	}
	return out
}

// TaggedOn returns the open arenas of tag on the device drv drives (those
// whose Driver is drv), whatever their pool, in the order they were made.
func TaggedOn(drv acl.Driver, tag Tag) []*Arena {
	var out []*Arena
	for _, a := range Tagged(nil, tag) {
		if a.drv == drv {
			out = append(out, a)
		}
	}
	return out
}

// SleepTag puts every arena of tag on pool (every pool, when pool is nil) to
// sleep in mode, concurrently, and returns when all are done, with their
// errors joined (an arena that failed is as its Sleep says).
func SleepTag(ctx context.Context, pool *chunk.Pool, tag Tag, mode SleepMode) error {
	return SleepAll(ctx, Tagged(pool, tag), mode)
}

// WakeTag wakes every sleeping arena of tag on pool (every pool, when pool
// is nil), as WakeAll does: all of them, or none.
func WakeTag(ctx context.Context, pool *chunk.Pool, tag Tag) error {
	return WakeAll(ctx, Tagged(pool, tag))
}

// SleepAll puts the arenas to sleep in mode, each on a goroutine of its
// own (say, TaggedOn's, for every arena of a tag on a device), and returns
// when all are done, with their errors joined.
func SleepAll(ctx context.Context, as []*Arena, mode SleepMode) error {
	return each(as, func(a *Arena) error { return a.Sleep(ctx, mode) })
}

// WakeAll wakes the arenas, each on a goroutine of its own, each waiting
// for memory as Wake does until ctx is done, and returns when all are
// usable. It is all or nothing: when one fails, the arenas this call woke
// are put back to sleep, in the mode each had slept in (their Offload
// contents copied out again), so that none is left awake for the half of
// a model that woke; the error joins the failures, and any arena that
// could not be put back to sleep (it is then awake, as its Sleep says).
func WakeAll(ctx context.Context, as []*Arena) error {
	woke := make([]bool, len(as))
	modes := make([]SleepMode, len(as))
	errs := make([]error, len(as))
	var wg sync.WaitGroup
	for i, a := range as {
		wg.Add(1)
		go func() {
			defer wg.Done()
			woke[i], modes[i], errs[i] = a.wake(ctx)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("arena: wake: %w", errs[i])
			}
		}()
	}
	wg.Wait()
	err := errors.Join(errs...)
	if err == nil {
		return nil
	}
	back := context.WithoutCancel(ctx) // ctx may be what ended the wake
	var undo []*Arena
	var undoModes []SleepMode
	for i, a := range as {
		if woke[i] {
			undo, undoModes = append(undo, a), append(undoModes, modes[i])
		}
	}
	uerrs := make([]error, len(undo))
	for i, a := range undo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if e := a.Sleep(back, undoModes[i]); e != nil {
				uerrs[i] = fmt.Errorf("and an arena this call woke could not be put back to sleep: %w", e)
			}
		}()
	}
	wg.Wait()
	return errors.Join(err, errors.Join(uerrs...))
}

func each(as []*Arena, fn func(*Arena) error) error {
	errs := make([]error, len(as))
	var wg sync.WaitGroup
	for i, a := range as {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(a)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// tags lists the open arenas, for Tagged.
var tags struct {
	mu  sync.Mutex
	all []*Arena
}

// enlist adds a new arena to the list Tagged reads.
func (a *Arena) enlist() {
	tags.mu.Lock()
	tags.all = append(tags.all, a)
	tags.mu.Unlock()
}

// delist takes a closed arena off the list.
func (a *Arena) delist() {
	tags.mu.Lock()
	defer tags.mu.Unlock()
	for i, b := range tags.all {
		if b == a {
			tags.all = append(tags.all[:i], tags.all[i+1:]...)
			clear(tags.all[len(tags.all):cap(tags.all)][:1])
			return
		}
	}
}

// Events and trace regions of sleep and wake (see observe.go).
const (
	// EventSleep: Sleep gave the arena's memory back (Info). Attributes:
	// mode, chunks.
	EventSleep = "arena.sleep"
	// EventWake: Wake mapped it again (Info). As EventSleep.
	EventWake = "arena.wake"

	RegionSleep = "vmarena.sleep" // Sleep
	RegionWake  = "vmarena.wake"  // Wake
)

// errAsleep is the error of an operation refused while asleep.
var errAsleep = fmt.Errorf("%w: Wake it first", ErrAsleep)

// errAsleepAlone is errAsleep as an operation returns it alone.
var errAsleepAlone = fmt.Errorf("arena: %w", errAsleep)
