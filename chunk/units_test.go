package chunk_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// On a pool of one size a unit is a chunk: an Ask's Large is ignored, and
// every count (the chunks taken, Fits, a growth's Missing, the books) is
// what it was in chunks.
func TestAskOnOneSizePool(t *testing.T) {
	p, err := chunk.New(newDriver(t, 64<<20), chunk.Config{Size: 2 * g, Budget: 8 * g})
	require.NoError(t, err)
	defer func() { assert.NoError(t, p.Close()) }()
	l, tn := p.Lender(), chunk.NewTenant()
	require.Equal(t, p.ChunkSize(), p.TailSize(), "one size: the unit is the chunk")

	for _, large := range []int{0, 1, 3, 99, -1} {
		got, err := l.TakeFree(nil, tn, chunk.Ask{Units: 3, Large: large})
		require.NoError(t, err, "Large %d", large)
		require.Len(t, got, 3, "three units are three chunks, whatever Large says")
		for _, c := range got {
			assert.Equal(t, uintptr(2*g), c.Size)
		}
		require.NoError(t, l.PutBack(got))
	}
	st := p.Stats()
	assert.Equal(t, 3, st.Cached)
	assert.Equal(t, int64(3), st.Misses, "the first take allocated, the others took the cache")
	assert.Equal(t, int64(12), st.Hits)
	assert.Equal(t, 2*g, st.TailSize)
	assert.Zero(t, st.Conversions)

	// Four chunks of room: Fits counts units, which are chunks.
	assert.True(t, l.Fits(4))
	assert.False(t, l.Fits(5))
	got, err := l.TryAcquire(nil, tn, chunk.Ask{Units: 4})
	require.NoError(t, err)
	require.Len(t, got, 4)
	_, err = l.TakeFree(nil, tn, chunk.Ask{Units: 1})
	require.ErrorIs(t, err, chunk.ErrBudget)
	_, err = l.TakeFree(nil, tn, chunk.Ask{Units: -1})
	require.ErrorIs(t, err, acl.ErrInvalidParam)

	// A growth short of one chunk says it lacks one unit.
	var gr chunk.Growth
	tk := &taking{p: l, g: &gr, n: 1, spec: true}
	tk.mu.Lock()
	err = l.Grow(context.Background(), &gr, 0, tk, chunk.Speculative)
	tk.mu.Unlock()
	require.ErrorIs(t, err, chunk.ErrBudget)
	assert.ErrorContains(t, err, "4 MiB asked", "one unit of 4 MiB")
	require.NoError(t, l.PutBack(got))

	// Acquire counts chunks, as it always did.
	cs, err := l.Acquire(tn, 4)
	require.NoError(t, err)
	assert.Len(t, cs, 4)
	require.NoError(t, l.PutBack(cs))
	assert.Equal(t, 4, p.Stats().Cached)
}

// released maps cs at base (one after the other, each at its size) and
// releases them after a kernel on s that runs until the returned channel is
// closed.
func released(t *testing.T, d *host.Driver, l chunk.Lender, base acl.DevicePtr, s acl.Stream, cs []chunk.Chunk) (kernel chan struct{}, ms []chunk.Mapped) {
	t.Helper()
	_, err := l.MapRange(base, cs, nil)
	require.NoError(t, err)
	at := base
	for _, c := range cs {
		ms = append(ms, chunk.Mapped{At: at, C: c})
		at = at.Add(c.Size)
	}
	kernel = make(chan struct{})
	require.NoError(t, d.Launch(s, base, uintptr(at-base), kernel))
	require.NoError(t, l.ReleaseAfter(ms, []acl.Stream{s}))
	return kernel, ms
}

// ReclaimSpan takes every chunk waiting in its span or none: with one of
// them claimed by a relief, it takes none (and allocates nothing), and says
// which to wait for; a span without it takes the rest, in address order,
// after what dst held.
func TestReclaimSpanAllOrNothing(t *testing.T) {
	d, p, base, s := poolReserving(t, 64<<20, chunk.Config{Budget: 3 * g}, nil, 3*g)
	l, tn := p.Lender(), chunk.NewTenant()
	cs, err := l.Acquire(tn, 3)
	require.NoError(t, err)
	// The top chunk is released first, so that a relief claims its batch
	// (the oldest) and leaves the two below waiting.
	k2, _ := released(t, d, l, base.Add(2*g), s, cs[2:])
	k01, _ := released(t, d, l, base, s, cs[:2])

	// The budget is full: an Acquire of one chunk relieves, claims the top
	// chunk's batch, and waits for its kernel.
	selected := make(chan struct{}, 1)
	defer sched.Set(func(pt sched.Point, _ any) {
		if pt == sched.ReliefSelect {
			select {
			case selected <- struct{}{}:
			default:
			}
		}
	})()
	done := make(chan error, 1)
	var handed []chunk.Chunk
	go func() {
		var err error
		handed, err = l.Acquire(tn, 1)
		done <- err
	}()
	<-selected // the relief claimed the top chunk, and waits for its kernel
	var buf [4]chunk.Mapped

	sentinel := chunk.Mapped{At: 1, C: chunk.Chunk{Size: 1}}
	dst := append(buf[:0], sentinel)
	ms, busy := l.ReclaimSpan(base, base.Add(3*g), dst)
	require.False(t, busy.IsZero(), "the claimed chunk is in the span")
	assert.Equal(t, []chunk.Mapped{sentinel}, ms, "none taken, dst as it was")
	assert.True(t, l.Pending(base), "the free chunks below still wait")
	assert.True(t, l.Pending(base.Add(g)))
	assert.Zero(t, testing.AllocsPerRun(10, func() { ms, busy = l.ReclaimSpan(base, base.Add(3*g), dst[:1]) }))
	// A long span, which the pool reads by looking at each waiting chunk,
	// is all or nothing too.
	ms, busy = l.ReclaimSpan(base, base.Add(64*g), dst[:1])
	require.False(t, busy.IsZero())
	assert.Equal(t, []chunk.Mapped{sentinel}, ms)
	assert.Zero(t, testing.AllocsPerRun(10, func() { ms, busy = l.ReclaimSpan(base, base.Add(64*g), dst[:1]) }))
	assert.True(t, l.Pending(base))

	ms, busy = l.ReclaimSpan(base, base.Add(2*g), dst[:1])
	require.True(t, busy.IsZero())
	assert.Equal(t, []chunk.Mapped{sentinel, {At: base, C: cs[0]}, {At: base.Add(g), C: cs[1]}}, ms,
		"both taken back, in address order, after dst's")
	assert.False(t, l.Pending(base))
	ms, busy = l.ReclaimSpan(base, base.Add(2*g), buf[:0])
	assert.Empty(t, ms, "taken once")
	assert.True(t, busy.IsZero())

	close(k2)
	require.NoError(t, <-done)
	require.Equal(t, []chunk.Chunk{cs[2]}, handed, "the relief handed the claimed chunk over")
	close(k01)
	require.NoError(t, d.SynchronizeStream(s))
	require.NoError(t, l.Release(base, cs[0]))
	require.NoError(t, l.Release(base.Add(g), cs[1]))
	require.NoError(t, p.Lender().PutBack(append(cs[:2:2], handed...)))
}
