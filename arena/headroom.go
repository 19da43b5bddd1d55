package arena

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/units"
)

// The headroom: mapped memory the pool's worker keeps ready above Len.
//
// With Config.Headroom the arena is a pool member that asks for refills: an
// Alloc (or Grow) that leaves less than the low-water mark mapped above Len
// pokes the worker (chunk.Member.WantRefill, which never blocks), and the
// worker maps, with memory free now, the chunks that cover the headroom
// above Len (refillLocked). Prefetch asks it for more, once. The headroom
// is counted in bytes and mapped in chunks: one smaller than a chunk has
// the next chunk mapped once less than the headroom is left above the end
// of the last allocation, so that an arena grown a little at a time (a KV
// cache, token by token) holds what a Prefetch of its next tokens would
// have it hold, without the call.
//
// The headroom's size is learnt from how memory is consumed. It starts at
// Config.Headroom. A growth that has to map on the caller's path (Alloc's
// slow path, or a Grow past Cap) is a miss: the worker did not keep up, or
// kept too little for one allocation, so the size doubles, up to
// Config.MaxHeadroom. Once decayAfter refills have completed since the last
// miss (the one that follows it included), the next refill shrinks the size
// by a quarter (in whole chunks from a chunk up), down to Config.Headroom. A
// miss while the pool had no room for the last refill teaches nothing (a
// larger headroom would not have been mapped either) and leaves the size as
// it is; so does a miss after a relief took the arena's memory, until a
// refill succeeds again. Unless Config.LowWater fixes it, the low-water mark
// is half the learnt size in whole chunks (at least one), or the whole size
// while it is under a chunk. The headroom is never a promise: a pool under
// pressure takes it back like any memory above Len.
//
// A refill maps in steps, holding the arena's mu for each and publishing Cap
// after each, so that the lock-free Grow and Alloc find the first chunks
// mapped before the last are: refillStep chunks first, the memory a caller
// needs soonest, then twice as many at each step, so that a large refill
// still makes few access calls. Between steps it looks whether a growth on
// the caller's path waits for mu; if one does, it lets go and asks the
// worker to come back for the rest, so a caller waits for one step of the
// worker's driver calls at most, never for a whole refill.

// decayAfter is how many completed refills since the last miss shrink the
// learnt headroom by a quarter. Refills come once per low-water's worth of
// consumption, so a size that has grown too large for the load decays after
// it has been refilled this many times unused; a size that is right sees
// one miss per decayAfter refills at most, and grows back. (A variable for
// the tests.)
var decayAfter = 64

// refillStep is how many chunks a refill maps in its first hold of the
// arena's mu (one access call covers them where the driver allows it); each
// later step maps twice as many as the one before.
const refillStep = 2

// defaultMaxHeadroom is how far the learnt headroom may grow by default, in
// multiples of Config.Headroom.
const defaultMaxHeadroom = 8

type headroom struct {
	min, max uint64        // Config.Headroom and the bound of the learnt size, in bytes; min 0: no headroom
	fixedLow uint64        // Config.LowWater; 0: half the learnt size
	size     atomic.Uint64 // the learnt size, in [min, max]; Arena.lowWater goes with it
	// prefetch is the end, above Len, of what Prefetch asked the worker to
	// map and it has not served yet; 0: none.
	prefetch atomic.Uint64
	// waiting counts the growths on callers' paths waiting for the arena's
	// mu: a refill yields it to them between its steps.
	waiting atomic.Int32
	growth  chunk.Growth // a refill's, in the protocol's loop (growLocked)

	// Under the arena's mu:
	quiet  int    // refills since the last miss
	short  bool   // the last refill found no room in the pool, or a relief took memory since
	misses uint64 // growths on the caller's path while the arena keeps headroom
}

// setHeadroom sets the learnt size and the low-water mark that goes with it.
func (a *Arena) setHeadroom(size uint64) {
	a.hr.size.Store(size)
	low := a.hr.fixedLow
	if low == 0 {
		low = max(size/2/a.unit*a.unit, min(size, a.unit))
	}
	a.lowWater.Store(a.lowWater.Load()&^lenMask | low) // the era above is the epoch's (stale.go)
}

// missed records a growth of size bytes on the caller's path (a miss):
// the learnt headroom doubles, unless the pool had no room for the last
// refill. Call with mu held.
func (a *Arena) missed() {
	h := &a.hr
	if h.min == 0 {
		return
	}
	h.misses++
	h.quiet = 0
	if s := h.size.Load(); !h.short && s < h.max {
		a.setHeadroom(min(2*s, h.max))
	}
}

// decayed is the learnt headroom size shrunk by a quarter: in whole units
// from a unit up, in bytes below.
func (a *Arena) decayed(size uint64) uint64 {
	d := size * 3 / 4
	if d < a.unit {
		return d
	}
	return d / a.unit * a.unit
}

// wantHeadroom asks the worker for a refill when the headroom above end is
// below the low-water mark.
func (a *Arena) wantHeadroom(end uint64) {
	if low := a.lowWater.Load() & lenMask; low != 0 && end+low > a.cap.Load() {
		a.member.WantRefill()
	}
}

// Prefetch asks the pool's worker to map n bytes above Len in the
// background, so that a Grow or Alloc of up to n bytes that follows finds
// them mapped and calls no driver. It is for a caller that knows what the
// next work will need before it runs: a server that admits a request knows
// its prompt's length a step before the prefill.
//
// Prefetch returns at once. The worker serves it like a headroom refill:
// with memory that is free now (the pool's cache, or room under the
// budget), never by reclaiming another member's memory or waiting, and all
// of it or, when there is not room for all of it, only the usual headroom.
// What it maps is headroom, not a promise: until a Grow or Alloc claims it,
// a pool under pressure may take it back like any memory above Len. A later
// Prefetch replaces an earlier one that the worker has not served yet, when
// larger. Prefetch of 0 bytes, or of bytes already mapped, does nothing.
//
// An arena without Config.Headroom keeps no headroom, but its Prefetch is
// served the same way: the first one starts the pool's worker if it is not
// running. Prefetch fails with ErrInvalid for a negative n,
// ErrExhausted when Len+n passes the reservation, ErrImported on an
// Imported arena, ErrAsleep while the arena sleeps and ErrClosed after
// Close.
func (a *Arena) Prefetch(n int) error {
	switch {
	case a == nil:
		return errClosed
	case a.drv == nil:
		return errNotMade
	case n < 0:
		return fmt.Errorf("arena: prefetch: %w: negative size %d", ErrInvalid, n)
	case a.lifeNow() == lifeClosed || a.lifeNow() == lifeClosing:
		return errClosed
	case a.lifeNow() == lifeImported:
		return errFixed
	case a.lifeNow() != lifeOpen:
		return fmt.Errorf("arena: prefetch: %w", ErrAsleep)
	}
	l := a.state.Load() & lenMask
	if uint64(n) > a.reserved-l {
		return a.exhausted(fmt.Sprintf("prefetch %s at %d", units.Bytes(int64(n)), l))
	}
	want := l + uint64(n)
	if n == 0 || want <= a.cap.Load() {
		return nil
	}
	for p := a.hr.prefetch.Load(); p < want; p = a.hr.prefetch.Load() {
		if a.hr.prefetch.CompareAndSwap(p, want) {
			a.askRefill()
			break
		}
	}
	return nil
}

// askRefill asks the pool's worker for a refill: without a lock when the
// arena keeps headroom (it joined the pool for refills), else through the
// pool's mutex, which starts the worker for a Prefetch.
func (a *Arena) askRefill() {
	if a.hr.min > 0 {
		a.member.WantRefill()
		return
	}
	a.member.AskRefill()
}

// refillLocked maps, with memory free now, the learnt headroom above Len and
// a prefetch the worker has not served yet: the work of the worker's
// Refill. A prefetch is served once, all of it or, without room for all of
// it, not at all (the headroom is still refilled). The headroom is mapped in
// steps, yielding to callers between them. Each refill that completes
// counts towards shrinking the learnt size, until the next miss. Call with
// mu held.
func (a *Arena) refillLocked() {
	h := &a.hr
	size := h.size.Load()
	if h.quiet >= decayAfter && size > h.min {
		size = max(h.min, a.decayed(size))
		a.setHeadroom(size)
		h.quiet = 0
	}
	target := min(a.state.Load()&lenMask+size, a.reserved)
	if p := min(h.prefetch.Swap(0), a.reserved); p > target && p > a.cap.Load() {
		err := a.growLocked(context.Background(), p, true)
		if err == nil {
			a.refills++
			h.short = false
			h.quiet++
			return
		}
		if errors.Is(err, chunk.ErrBusy) {
			// A relief holds chunks in its way: the worker comes back for it.
			h.prefetch.CompareAndSwap(0, p)
			a.askRefill()
		}
	}
	mapped := false
	step := uint64(refillStep) * a.chunkSize
	for c := a.cap.Load(); c < target; c, step = a.cap.Load(), 2*step {
		if h.waiting.Load() > 0 {
			a.member.WantRefill() // come back for the rest
			break
		}
		if err := a.growLocked(context.Background(), min(target, c+step), true); err != nil {
			if errors.Is(err, chunk.ErrBusy) {
				a.member.WantRefill() // a relief holds chunks in its way: come back
			} else {
				h.short = true
			}
			break
		}
		mapped, h.short = true, false
	}
	if mapped {
		a.refills++
	}
	if a.cap.Load() >= target {
		h.quiet++
	}
}
