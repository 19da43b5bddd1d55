package arena_test

import (
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
)

// AllocN cuts what as many Allocs one after another would: the same
// offsets, lengths and Len, from an unaligned Len, for sizes that are and
// are not multiples of the alignment, and zero-byte buffers; the buffers
// are usable (a copy into the last lands where an Alloc's would).
func TestAllocNIsAllocsInARow(t *testing.T) {
	for _, c := range []struct{ n, size, align int }{
		{1, 100, 64},
		{160, 2048, 256},
		{7, 100, 64}, // stride 128: gaps between the buffers, as Alloc leaves
		{5, 0, 16},
		{3, 1, 1},
	} {
		d := isoDriver(t, 64<<20)
		want := isoArena(t, arena.Config{Driver: d, Reserve: 16 << 20})
		got := isoArena(t, arena.Config{Driver: d, Reserve: 16 << 20})
		for _, a := range []*arena.Arena{want, got} {
			_, err := a.Alloc(3, 1) // Len off every alignment
			require.NoError(t, err)
		}
		var each []arena.Buffer
		for range c.n {
			b, err := want.Alloc(c.size, c.align)
			require.NoError(t, err)
			each = append(each, b)
		}
		batch := make([]arena.Buffer, c.n)
		require.NoError(t, got.AllocN(batch, c.size, c.align))
		for i := range batch {
			assert.Equal(t, each[i].Offset(), batch[i].Offset(), "%+v: buffer %d", c, i)
			assert.Equal(t, each[i].Len(), batch[i].Len(), "%+v: buffer %d", c, i)
		}
		assert.Equal(t, want.Len(), got.Len(), "%+v", c)
		if c.size > 0 {
			last := batch[len(batch)-1]
			require.NoError(t, arena.CopyIn(last, make([]byte, last.Len())))
		}
	}
}

// A failed AllocN cuts nothing and leaves dst as it was: past the
// reservation (including spans too large to compute), on bad arguments, on
// a closed arena; an empty dst cuts nothing and succeeds.
func TestAllocNAllOrNothing(t *testing.T) {
	d := isoDriver(t, 64<<20)
	a := isoArena(t, arena.Config{Driver: d, Reserve: 4 << 20})
	_, err := a.Alloc(10, 1)
	require.NoError(t, err)
	cap0 := a.Cap()

	dst := make([]arena.Buffer, 3)
	sentinel, err := a.Slice(0, 10)
	require.NoError(t, err)
	for i := range dst {
		dst[i] = sentinel
	}
	untouched := func(what string) {
		t.Helper()
		assert.Equal(t, 10, a.Len(), "%s: Len", what)
		assert.Equal(t, cap0, a.Cap(), "%s: Cap", what)
		for i := range dst {
			assert.Equal(t, sentinel, dst[i], "%s: dst[%d]", what, i)
		}
	}

	require.ErrorIs(t, a.AllocN(dst, 2<<20, 64), arena.ErrExhausted) // 3 × 2 MiB past 4 MiB
	untouched("past the reservation")
	require.ErrorIs(t, a.AllocN(dst, math.MaxInt/2, 1), arena.ErrExhausted)
	untouched("a span that does not fit a word")
	require.ErrorIs(t, a.AllocN(dst, math.MaxInt, 1<<20), arena.ErrExhausted)
	untouched("a stride that does not fit a word")
	require.ErrorIs(t, a.AllocN(dst[:1], 8<<20, 1), arena.ErrExhausted)
	untouched("one buffer past the reservation")
	require.ErrorIs(t, a.AllocN(dst, -1, 1), arena.ErrInvalid)
	untouched("a negative size")
	require.ErrorIs(t, a.AllocN(dst, 1, 3), arena.ErrInvalid)
	untouched("an alignment that is not a power of two")
	require.ErrorIs(t, a.AllocN(nil, -1, 1), arena.ErrInvalid, "arguments are checked even with nothing to cut")
	require.NoError(t, a.AllocN(nil, 64, 64))
	untouched("nothing to cut")

	require.NoError(t, a.Close())
	require.ErrorIs(t, a.AllocN(dst, 1, 1), arena.ErrClosed)
	var none *arena.Arena
	require.ErrorIs(t, none.AllocN(dst, 1, 1), arena.ErrClosed)
}

// AllocN maps what its span needs, as Alloc does, when the mapped space is
// used up.
func TestAllocNGrows(t *testing.T) {
	d := isoDriver(t, 64<<20)
	a := isoArena(t, arena.Config{Driver: d, Reserve: 16 << 20})
	dst := make([]arena.Buffer, 5)
	require.NoError(t, a.AllocN(dst, 1<<20, 1<<20))
	assert.Equal(t, 5<<20, a.Len())
	assert.GreaterOrEqual(t, a.Cap(), 5<<20)
}

// AllocNs and Allocs from several goroutines at once never cut one byte
// twice: every batch is one span.
func TestAllocNConcurrent(t *testing.T) {
	d := isoDriver(t, 64<<20)
	a := isoArena(t, arena.Config{Driver: d, Reserve: 32 << 20})
	require.NoError(t, a.Grow(16<<20))
	const workers, rounds, n, size = 4, 200, 8, 96
	var mu sync.Mutex
	var all []arena.Buffer
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var mine []arena.Buffer
			dst := make([]arena.Buffer, n)
			for range rounds {
				if w%2 == 0 {
					if err := a.AllocN(dst, size, 32); err != nil {
						t.Error(err)
						return
					}
					mine = append(mine, dst...)
				} else {
					b, err := a.Alloc(size, 32)
					if err != nil {
						t.Error(err)
						return
					}
					mine = append(mine, b)
				}
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	owner := make(map[int]bool, len(all)*size)
	for _, b := range all {
		for off := b.Offset(); off < b.Offset()+b.Len(); off++ {
			require.False(t, owner[off], "byte %d cut twice", off)
			owner[off] = true
		}
	}
	assert.Len(t, all, workers/2*rounds*n+workers/2*rounds)
}
