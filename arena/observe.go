package arena

import (
	"context"
	"errors"
	"log/slog"
	"math/bits"
	"runtime/trace"
	"sync"
	"sync/atomic"
	"time"
)

// Observability: events, trace regions, and the counters Stats adds for
// them. Everything here runs on slow paths only (a growth that maps, a
// Shrink, a reclaim, a wait); Alloc within Cap and Grow within Cap never
// reach it.

// Messages of the arena's log records (Config.Logger). Sizes are bytes,
// durations time.Duration values; every record has base, the arena's base
// address, to tell arenas apart (or give each arena a logger With a name).
const (
	// EventGrow: a growth on a caller's path (Grow, or Alloc beyond Cap)
	// mapped chunks (Debug). Attributes: from, to (Cap), chunks, dur; err
	// when it failed for another reason than memory.
	EventGrow = "arena.grow"
	// EventRefill: the pool's worker mapped headroom (Debug). As EventGrow.
	EventRefill = "arena.refill"
	// EventShrink: Shrink gave chunks back (Debug). Attributes: from, to
	// (Cap), chunks.
	EventShrink = "arena.shrink"
	// EventReclaim: the pool took chunks back under pressure (Debug). As
	// EventShrink.
	EventReclaim = "arena.reclaim"
	// EventOOM: a growth failed for want of memory (Warn). Attributes: asked
	// (bytes beyond Len the call needed), len, cap, reserved, held (bytes the
	// pool holds), budget, in_use and cached (the pool's chunks), err.
	EventOOM = "arena.oom"
	// EventWait: a GrowContext or AllocContext that waited for memory is
	// done (Info when it got the memory, Warn when it gave up). Attributes:
	// asked, dur, tries, outcome ("granted", "gave up" or "failed"), err.
	EventWait = "arena.wait"
)

// Names of the runtime/trace regions the arena's slow paths run in. The
// pool's regions (package chunk) and its driver calls ("acl.MapMem", …)
// nest inside them.
const (
	RegionGrow    = "vmarena.grow"    // a growth that maps chunks (Grow, Alloc beyond Cap)
	RegionRefill  = "vmarena.refill"  // the worker's refill of an arena's headroom
	RegionShrink  = "vmarena.shrink"  // Shrink
	RegionReclaim = "vmarena.reclaim" // the pool takes chunks back from the arena
	RegionClose   = "vmarena.close"   // Close
	RegionWait    = "vmarena.wait"    // GrowContext or AllocContext waiting for memory (in the caller's task)
	RegionCopy    = "vmarena.copy"    // CopyIn, CopyOut, Copy, Fill (a synchronous driver copy)
)

// observer is the arena's share of events, trace regions and counters.
type observer struct {
	log      *slog.Logger // Config.Logger; nil: no events
	mu       sync.Mutex   // guards growTime, so that Activity never waits for a growth
	growTime Histogram
	timed    atomic.Bool // someone asked (Activity) or listens (Logger): time the growths
	shrinks  atomic.Int64
	ooms     atomic.Int64
	waits    atomic.Int64
	waitNS   atomic.Int64
}

// Activity counts what the arena's callers saw, failures included, beyond
// the state Stats describes.
type Activity struct {
	Shrinks  int64         // Shrinks that gave chunks back
	OOMs     int64         // growths on a caller's path that failed for want of memory (a wait that gives up counts once)
	Waits    int64         // GrowContext and AllocContext calls that waited for memory
	WaitTime time.Duration // the time they waited, in all
	GrowTime Histogram     // how long the growths that mapped took on callers' paths (Grow, Alloc beyond Cap; not the worker's refills), failed ones included, since the first Activity call (or New, with a Logger): until then the arena reads no clock
}

// Activity returns the arena's activity counters. It takes no lock the
// arena's operations hold, so it never waits for a growth. It is safe on a
// nil *Arena (all zero).
func (a *Arena) Activity() Activity {
	if a == nil {
		return Activity{}
	}
	o := &a.obs
	o.timed.Store(true) // from now on, growths are timed
	o.mu.Lock()
	h := o.growTime
	o.mu.Unlock()
	return Activity{Shrinks: o.shrinks.Load(), OOMs: o.ooms.Load(), Waits: o.waits.Load(),
		WaitTime: time.Duration(o.waitNS.Load()), GrowTime: h}
}

// region starts a trace region with no task; End it.
func region(name string) *trace.Region { return trace.StartRegion(context.Background(), name) }

func (o *observer) on(level slog.Level) bool {
	return o.log != nil && o.log.Enabled(context.Background(), level)
}

func (o *observer) emit(a *Arena, level slog.Level, msg string, attrs ...slog.Attr) {
	attrs = append(attrs, slog.String("base", a.base.String()))
	o.log.LogAttrs(context.Background(), level, msg, attrs...)
}

// growth is a growth under way: growLocked starts one with begin and ends
// it with end.
type growth struct {
	start time.Time
	r     *trace.Region
	quiet bool // a try of a wait for memory: its failure is the wait's to count (waitFor)
}

// quietKey marks the ctx of a wait's tries (waitFor).
type quietKey struct{}

func (o *observer) begin(ctx context.Context, speculative bool) growth {
	name := RegionGrow
	if speculative {
		name = RegionRefill
	}
	g := growth{r: trace.StartRegion(ctx, name), quiet: ctx.Value(quietKey{}) != nil}
	if o.timed.Load() {
		g.start = time.Now()
	}
	return g
}

// end records a growth from Cap c towards target that ended with err. Call
// with Arena.mu held.
func (o *observer) end(a *Arena, g growth, c, target uint64, speculative bool, err error) {
	g.r.End()
	var d time.Duration
	if !g.start.IsZero() {
		d = time.Since(g.start)
		if !speculative {
			o.mu.Lock()
			o.growTime.Add(d)
			o.mu.Unlock()
		}
	}
	if err != nil && !speculative && errors.Is(err, ErrOutOfMemory) {
		if !g.quiet {
			o.oom(a, target-min(target, a.state.Load()&lenMask), err)
		}
		return
	}
	msg, level := EventGrow, slog.LevelDebug
	if speculative {
		msg = EventRefill
	}
	if !o.on(level) {
		return
	}
	now := a.cap.Load()
	attrs := []slog.Attr{slog.Uint64("from", c), slog.Uint64("to", now),
		slog.Uint64("chunks", uint64(a.geo.n()-min(a.geo.n(), a.geo.index(c)))), slog.Duration("dur", d)}
	if err != nil {
		attrs = append(attrs, slog.Any("err", err))
	}
	o.emit(a, level, msg, attrs...)
}

// oom counts a failure for want of memory and reports it with what was
// asked and what was held.
func (o *observer) oom(a *Arena, asked uint64, err error) {
	o.ooms.Add(1)
	if !o.on(slog.LevelWarn) {
		return
	}
	s := a.pool.Stats()
	o.emit(a, slog.LevelWarn, EventOOM, slog.Uint64("asked", asked),
		slog.Uint64("len", a.state.Load()&lenMask), slog.Uint64("cap", a.cap.Load()),
		slog.Uint64("reserved", a.reserved), slog.Int64("held", s.HeldBytes), slog.Int64("budget", s.Budget),
		slog.Int("in_use", s.InUse), slog.Int("cached", s.Cached), slog.Any("err", err))
}

// gaveBack reports n chunks given back from Cap c (Shrink or a reclaim).
func (o *observer) gaveBack(a *Arena, msg string, c uint64, n int) {
	now := a.cap.Load()
	if now >= c {
		return
	}
	if msg == EventShrink {
		o.shrinks.Add(1)
	}
	if o.on(slog.LevelDebug) {
		o.emit(a, slog.LevelDebug, msg, slog.Uint64("from", c), slog.Uint64("to", now),
			slog.Uint64("chunks", uint64(n)))
	}
}

// Histogram counts durations in buckets of doubling width, from 1 µs:
// Counts[i] counts the durations in (HistogramBound(i-1), HistogramBound(i)],
// and the last bucket those above every bound. Adding costs a clock
// difference and a few instructions.
type Histogram struct {
	Counts [HistogramBuckets]uint64
	Count  uint64        // durations added
	Sum    time.Duration // their total
}

// HistogramBuckets is the number of buckets of a Histogram: bounds from 1 µs
// to about 4.2 s, and one bucket above.
const HistogramBuckets = 24

// HistogramBound returns the upper bound of bucket i (0 ≤ i <
// HistogramBuckets-1): 1 µs × 2^i.
func HistogramBound(i int) time.Duration { return time.Microsecond << i }

// Add counts d.
func (h *Histogram) Add(d time.Duration) {
	h.Counts[histogramBucket(d)]++
	h.Count++
	h.Sum += d
}

func histogramBucket(d time.Duration) int {
	us := (max(d, 0) + time.Microsecond - 1) / time.Microsecond // rounded up
	if us <= 1 {
		return 0
	}
	return min(bits.Len64(uint64(us-1)), HistogramBuckets-1)
}
