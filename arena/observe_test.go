package arena_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/arena/tensor"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/logtest"
)

// The arena reports growths, shrinks, reclaims and failures with what was
// asked and held, and counts them in Activity; its private pool logs to
// the same logger.
func TestEvents(t *testing.T) {
	const g = acl.HugePageSize
	d := isoDriver(t, 64<<20)
	log := &logtest.Recorder{}
	a := isoArena(t, arena.Config{Driver: d, Reserve: 16 << 20, Chunk: chunk.Config{Budget: 4 * g},
		Logger: slog.New(log)})

	require.NoError(t, a.Grow(3*g))
	grows := log.Find(arena.EventGrow)
	require.Len(t, grows, 1)
	e := grows[0].Attrs
	assert.Equal(t, uint64(0), e["from"].Uint64())
	assert.Equal(t, uint64(3*g), e["to"].Uint64())
	assert.Equal(t, uint64(3), e["chunks"].Uint64())
	assert.Equal(t, a.Base().String(), e["base"].String())
	assert.Positive(t, e["dur"].Duration())
	require.NoError(t, a.Grow(g), "within Cap: no growth, no event")
	assert.Len(t, log.Find(arena.EventGrow), 1)

	_, err := a.Alloc(g, 1)
	require.NoError(t, err)
	require.NoError(t, a.Shrink())
	shrinks := log.Find(arena.EventShrink)
	require.Len(t, shrinks, 1)
	assert.Equal(t, uint64(3*g), shrinks[0].Attrs["from"].Uint64())
	assert.Equal(t, uint64(g), shrinks[0].Attrs["to"].Uint64())
	assert.Equal(t, uint64(2), shrinks[0].Attrs["chunks"].Uint64())

	// Past the budget: 1 chunk in use, 4 more asked of a 4-chunk budget.
	err = a.Grow(5*g - a.Len())
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	ooms := log.Find(arena.EventOOM)
	require.Len(t, ooms, 1)
	o := ooms[0]
	assert.Equal(t, slog.LevelWarn, o.Level)
	assert.Equal(t, uint64(4*g), o.Attrs["asked"].Uint64())
	assert.Equal(t, uint64(g), o.Attrs["len"].Uint64())
	assert.Equal(t, uint64(g), o.Attrs["cap"].Uint64())
	assert.Equal(t, int64(4*g), o.Attrs["budget"].Int64())
	// Held: the chunk in use and the two Shrink gave back to the cache.
	// More than the budget can ever hold fails before the pool is asked,
	// so the growth took nothing and the pool has nothing to report.
	assert.Equal(t, int64(3*g), o.Attrs["held"].Int64())
	assert.Equal(t, int64(1), o.Attrs["in_use"].Int64())
	assert.Equal(t, int64(2), o.Attrs["cached"].Int64())
	assert.ErrorIs(t, o.Attrs["err"].Any().(error), arena.ErrOutOfMemory)
	assert.Empty(t, log.Find(chunk.EventOOM), "the pool was never asked")

	act := a.Activity()
	assert.Equal(t, int64(1), act.Shrinks)
	assert.Equal(t, int64(1), act.OOMs)
	assert.Equal(t, uint64(2), act.GrowTime.Count, "the failed growth is timed too")
	var n uint64
	for _, c := range act.GrowTime.Counts {
		n += c
	}
	assert.Equal(t, act.GrowTime.Count, n)
	assert.Positive(t, act.GrowTime.Sum)
}

// A reclaim under pressure is reported by the arena that gave the memory.
func TestEventReclaim(t *testing.T) {
	const g = acl.HugePageSize
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 2 * g})
	require.NoError(t, err)
	defer pool.Close()
	log := &logtest.Recorder{}
	idle := isoArena(t, arena.Config{Pool: pool, Reserve: 8 << 20, Logger: slog.New(log)})
	busy := isoArena(t, arena.Config{Pool: pool, Reserve: 8 << 20})
	require.NoError(t, idle.Grow(2*g))
	require.NoError(t, idle.Reset()) // mapped, unused: reclaimable
	require.NoError(t, busy.Grow(g))
	rs := log.Find(arena.EventReclaim)
	require.Len(t, rs, 1)
	assert.Equal(t, uint64(1), rs[0].Attrs["chunks"].Uint64())
	assert.Empty(t, log.Find(arena.EventShrink))
	assert.Zero(t, idle.Activity().Shrinks, "a reclaim is not a Shrink")
}

// A refill by the worker is reported as such, and not timed as a caller's
// growth.
func TestEventRefill(t *testing.T) {
	const g = acl.HugePageSize
	d := isoDriver(t, 64<<20)
	log := &logtest.Recorder{}
	a := isoArena(t, arena.Config{Driver: d, Reserve: 16 << 20, Headroom: 2 * g, Logger: slog.New(log)})
	a.Pool().Lender().Settle()
	require.Len(t, log.Find(arena.EventRefill), 1)
	assert.Empty(t, log.Find(arena.EventGrow))
	assert.Zero(t, a.Activity().GrowTime.Count)
}

// Histogram buckets double from 1 µs; the last takes everything above.
func TestHistogram(t *testing.T) {
	var h arena.Histogram
	for _, c := range []struct {
		d      time.Duration
		bucket int
	}{{0, 0}, {time.Microsecond, 0}, {1500 * time.Nanosecond, 1}, {2 * time.Microsecond, 1},
		{3 * time.Microsecond, 2}, {time.Millisecond, 10}, {arena.HistogramBound(22), 22},
		{arena.HistogramBound(22) + 1, 23}, {time.Hour, 23}} {
		before := h.Counts[c.bucket]
		h.Add(c.d)
		assert.Equal(t, before+1, h.Counts[c.bucket], "%v", c.d)
	}
	assert.Equal(t, uint64(9), h.Count)
	assert.Equal(t, 1024*time.Microsecond, arena.HistogramBound(10))
}

// Observability costs Alloc nothing: with a logger set, Alloc within Cap
// still allocates nothing, and neither do GrowContext and AllocContext
// when the memory is mapped.
func TestObservabilityAllocFree(t *testing.T) {
	d := isoDriver(t, 64<<20)
	a := isoArena(t, arena.Config{Driver: d, Reserve: 16 << 20, Logger: slog.New(&logtest.Recorder{})})
	require.NoError(t, a.Grow(8<<20))
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := a.Alloc(64, 64); err != nil {
			t.Fatal(err)
		}
		if err := a.GrowContext(ctx, 64); err != nil {
			t.Fatal(err)
		}
		if _, err := a.AllocContext(ctx, 64, 64); err != nil {
			t.Fatal(err)
		}
	})
	assert.Zero(t, allocs)
}

// Faults injected into the driver under a growth are reported at Debug with
// the error, not as out of memory.
func TestEventGrowFault(t *testing.T) {
	const g = acl.HugePageSize
	d := isoDriver(t, 64<<20)
	fd := faultdriver.New(d)
	log := &logtest.Recorder{}
	a := isoArena(t, arena.Config{Driver: fd, Reserve: 16 << 20, Logger: slog.New(log)})
	fd.FailNth(faultdriver.MapMem, 2, 0)
	require.Error(t, a.Grow(3*g))
	grows := log.Find(arena.EventGrow)
	require.Len(t, grows, 1)
	assert.Contains(t, grows[0].Attrs["err"].String(), "injected")
	assert.Equal(t, uint64(0), grows[0].Attrs["to"].Uint64(), "rolled back")
	assert.Empty(t, log.Find(arena.EventOOM))
	assert.Zero(t, a.Activity().OOMs)
}

// observedArena is BenchmarkAlloc's arena with a logger set.
func observedArena(b *testing.B) *arena.Arena {
	a := benchArena(b, arena.Config{Driver: benchDriver(b), Reserve: 64 << 20, Logger: slog.New(&logtest.Recorder{})})
	if err := a.Grow(64 << 20); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	return a
}

// BenchmarkAllocLogged is BenchmarkAlloc with a logger set: Alloc within
// Cap never reaches it. Compare the two in one run.
func BenchmarkAllocLogged(b *testing.B) {
	a := observedArena(b)
	i := 0
	for b.Loop() {
		if _, err := a.Alloc(256, 64); err != nil {
			b.Fatal(err)
		}
		if i++; i == (64<<20)/256 {
			i = 0
			a.Reset()
		}
	}
}

// BenchmarkAllocContext is AllocContext within Cap: a check, then Alloc's
// fast path.
func BenchmarkAllocContext(b *testing.B) {
	a := observedArena(b)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		if _, err := a.AllocContext(ctx, 256, 64); err != nil {
			b.Fatal(err)
		}
		if i++; i == (64<<20)/256 {
			i = 0
			a.Reset()
		}
	}
}

// BenchmarkTensorAlloc allocates a 2×64 bfloat16 tensor (256 bytes) within
// Cap.
func BenchmarkTensorAlloc(b *testing.B) {
	a := observedArena(b)
	i := 0
	for b.Loop() {
		if _, err := tensor.Alloc[tensor.BFloat16](a, 2, 64); err != nil {
			b.Fatal(err)
		}
		if i++; i == (64<<20)/256 {
			i = 0
			a.Reset()
		}
	}
}
