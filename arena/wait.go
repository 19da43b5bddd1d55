package arena

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/trace"
	"time"

	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// GrowContext is Grow for a caller that would rather wait than fail: when
// the memory runs out (the pool's budget, or the device), it waits for other
// tenants of the pool to give memory back, and tries again, until it
// succeeds or ctx is done. For schedulers that queue a request rather than
// preempt another.
//
// It holds no lock while it waits: the arena and the pool work as usual
// meanwhile (other tenants allocate, drop and close; the pool reclaims). It
// is woken, never polling, when memory may have come back to the pool: a
// chunk put back or freed, a Shrink, a Truncate or Reset of a member (whose
// dropped memory a retry reclaims), a release that waited for the device.
// Waiters are served first come, first served (see package chunk): only the
// oldest retries, so a large growth is not starved by smaller ones, which
// wait behind it. A Grow that does not wait is not held back by them.
//
// When ctx is done first, the arena is as it was and the error wraps both
// ctx.Err() and the last try's error, which matches ErrOutOfMemory. A growth
// that could never fit the pool's budget, and every other error (ErrExhausted,
// ErrInvalid, ErrClosed), returns at once, as from Grow. The first try does
// not look at ctx: memory that is there is taken even if ctx is done.
func (a *Arena) GrowContext(ctx context.Context, n int) error {
	if n >= 0 && a.mapped(uint64(n)) {
		return nil // Grow's fast path
	}
	return a.wait(ctx, uint64(max(n, 0)), func(ctx context.Context) error { return a.grow(ctx, n) })
}

// AllocContext is Alloc that waits for memory as GrowContext does, when
// mapping size more bytes runs out of memory. Within Cap it is Alloc's fast
// path.
func (a *Arena) AllocContext(ctx context.Context, size, align int) (Buffer, error) {
	if a.fits(size, align) {
		// Alloc's fast path, unless another Alloc took the room meanwhile.
		if b, err := a.Alloc(size, align); !errors.Is(err, ErrOutOfMemory) {
			return b, err
		}
	}
	if a == nil {
		return Buffer{}, errClosed
	}
	if size < 0 || align <= 0 || align&(align-1) != 0 || uint64(align) > a.maxAlign {
		return Buffer{}, a.badAlloc(size, align)
	}
	var b Buffer
	err := a.wait(ctx, uint64(size), func(ctx context.Context) (err error) {
		b, err = a.allocSlowContext(ctx, uint64(size), uint64(align))
		return err
	})
	return b, err
}

// fits reports whether Alloc(size, align) fits in Cap now.
func (a *Arena) fits(size, align int) bool {
	if a == nil || size < 0 || align <= 0 || align&(align-1) != 0 {
		return false
	}
	s := a.state.Load()
	start := (s&lenMask + uint64(align) - 1) &^ (uint64(align) - 1)
	return s&frozen == 0 && start+uint64(size) <= a.cap.Load()
}

// wait tries until try, which needs asked more bytes, succeeds, fails for
// another reason than memory, or ctx is done; between tries it waits in the
// pool's queue.
func (a *Arena) wait(ctx context.Context, asked uint64, try func(context.Context) error) error {
	if a == nil || a.drv == nil {
		return try(ctx) // the error Grow and Alloc give
	}
	return a.waitFor(ctx, &a.growth, func() (int, uint64, bool) {
		if b := a.pool.Budget(); b > 0 && a.roundUnit(a.state.Load()&lenMask+asked) > uint64(b) {
			return 0, asked, true // more than the budget could ever give this arena
		}
		need := 1
		if l, c := a.state.Load()&lenMask, a.cap.Load(); l+asked > c {
			need = int((a.roundUnit(l+asked) - c) / a.unit)
		}
		return need, asked, false
	}, try)
}

// waitFor is the wait of a growth g of the arena (GrowContext's, or a
// Wake's) for memory: it tries until try succeeds, fails for another reason
// than memory, or ctx is done, and between tries it waits in the pool's
// queue as a growth that lacks the n chunks need says after its first try,
// of asked bytes (never: it can never fit the budget, and fails at once).
func (a *Arena) waitFor(ctx context.Context, g *chunk.Growth, need func() (n int, asked uint64, never bool), try func(context.Context) error) error {
	o := &a.obs
	// The tries' failures are this wait's, counted once (not the failures
	// of other growths of the arena meanwhile): they run with a ctx that
	// says so (observer.begin).
	tctx := context.WithValue(ctx, quietKey{}, true)
	mark := a.lend.Mark()
	err := try(tctx)
	if !errors.Is(err, ErrOutOfMemory) {
		return err
	}
	n, asked, never := need()
	if never {
		o.oom(a, asked, err)
		return err
	}
	sched.At(sched.WaitJoining, a)
	w, qerr := a.member.Enqueue(mark, g, n)
	if qerr != nil {
		o.oom(a, asked, err) // the try was quiet, and no wait will count it
		return errors.Join(err, fmt.Errorf("arena: wait for memory: %w", qerr))
	}
	defer w.Done()
	if l := a.lifeNow(); g == &a.growth && l != lifeOpen ||
		g == &a.sl.growth && (l == lifeClosing || l == lifeClosed || l == lifeOpen) {
		// A Close or a Sleep that began after the try woke the arena's
		// waiters (Member.Interrupt) before this one joined them (or,
		// for a Wake, another Wake woke the arena meanwhile), and nothing
		// else need wake it: the retry says why it cannot grow, or that
		// the arena is awake. (A Close or Sleep sets the state before it
		// interrupts, and this waiter joined before it looked.)
		return try(tctx)
	}
	defer trace.StartRegion(ctx, RegionWait).End()
	start, tries := time.Now(), 1
	o.waits.Add(1)
	for {
		if werr := w.Wait(ctx); werr != nil {
			d := o.waited(a, start, asked, tries, "gave up", err)
			o.oom(a, asked, err)
			return fmt.Errorf("%w (waited %v for memory: %w)", err, d.Round(time.Microsecond), werr)
		}
		tries++
		last := err
		err = try(tctx)
		if err == nil {
			sched.At(sched.WaitServed, a)
			o.waited(a, start, asked, tries, "granted", nil)
			return nil
		}
		if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) && !errors.Is(err, ErrOutOfMemory) {
			// The retry found ctx done before it tried: the wait gave up
			// for want of memory, as the last try said.
			d := o.waited(a, start, asked, tries, "gave up", last)
			o.oom(a, asked, last)
			return fmt.Errorf("%w (waited %v for memory: %w)", last, d.Round(time.Microsecond), err)
		}
		if !errors.Is(err, ErrOutOfMemory) {
			o.waited(a, start, asked, tries, "failed", err)
			return err
		}
	}
}

// waited records the end of a wait and returns how long it took.
func (o *observer) waited(a *Arena, start time.Time, asked uint64, tries int, outcome string, err error) time.Duration {
	d := time.Since(start)
	o.waitNS.Add(int64(d))
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelWarn
	}
	if o.on(level) {
		attrs := []slog.Attr{slog.Uint64("asked", asked), slog.Duration("dur", d), slog.Int("tries", tries),
			slog.String("outcome", outcome)}
		if err != nil {
			attrs = append(attrs, slog.Any("err", err))
		}
		o.emit(a, level, EventWait, attrs...)
	}
	return d
}
