package arena

import (
	"context"
	"fmt"

	"github.com/vmarena/vmarena/internal/units"
)

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
// An arena without Config.Headroom has no worker serving it: there Prefetch
// only checks its argument. It fails with ErrInvalid for a negative n,
// ErrExhausted when Len+n passes the reservation, ErrImported on an
// Imported arena, ErrAsleep while the arena sleeps and ErrClosed after
// Close.
func (a *Arena) Prefetch(n int) error {
	switch {
	case a == nil:
		return ErrClosed
	case a.drv == nil:
		return errNotMade
	case n < 0:
		return fmt.Errorf("arena: prefetch: %w: negative size %d", ErrInvalid, n)
	case a.closed.Load():
		return ErrClosed
	case a.imp != nil:
		return errFixed
	case a.sl.asleep.Load():
		return fmt.Errorf("arena: prefetch: %w", ErrAsleep)
	}
	l := a.state.Load() & lenMask
	if uint64(n) > a.reserved-l {
		return fmt.Errorf("arena: prefetch %s at %d: %w: %s reserved", units.Bytes(int64(n)), l, ErrExhausted,
			units.Ubytes(a.reserved))
	}
	want := l + uint64(n)
	if n == 0 || a.headroom == 0 || want <= a.cap.Load() {
		return nil
	}
	for p := a.prefetch.Load(); p < want; p = a.prefetch.Load() {
		if a.prefetch.CompareAndSwap(p, want) {
			a.member.WantRefill()
			break
		}
	}
	return nil
}

// refillLocked maps, with memory free now, the headroom above Len and a
// prefetch the worker has not served yet: the work of the worker's Refill.
// A prefetch is served once, all of it or, without room for all of it, not
// at all (the headroom is still refilled). Call with mu held.
func (a *Arena) refillLocked() {
	target := min(a.state.Load()&lenMask+a.headroom, a.reserved)
	if p := min(a.prefetch.Swap(0), a.reserved); p > target && p > a.cap.Load() {
		if a.growLocked(context.Background(), p, true) == nil {
			a.refills++
			return
		}
	}
	if target <= a.cap.Load() {
		return
	}
	if a.growLocked(context.Background(), target, true) == nil {
		a.refills++
	}
}
