// Package arenatest is the arena-level conformance suite: the guarantees of
// package arena, checked over any acl.Driver. The host driver, the ACL binding
// over its test double and the CUDA binding over its test double all run it.
package arenatest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// Open returns a fresh driver whose device holds capacity bytes. The suite
// closes it.
type Open func(t testing.TB, capacity uintptr) acl.Driver

// Capacity is the device memory the suite asks for, unless a test needs less.
const Capacity = 256 << 20

// Run runs the suite against drivers from open.
func Run(t *testing.T, open Open) {
	tests := []struct {
		name string
		fn   func(*testing.T, acl.Driver)
	}{
		{"StableBaseAndData", testStable},
		{"Invariants", testInvariants},
		{"ShrinkReturnsMemory", testShrink},
		{"ChunkReuse", testReuse},
		{"Exhausted", testExhausted},
		{"TruncateResetSlice", testTruncate},
		{"CloseTwice", testClose},
		{"SharedPoolBudget", testBudget},
		{"Concurrent", testConcurrent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, driver(t, open, Capacity))
		})
	}
	t.Run("OutOfMemoryRollback", func(t *testing.T) {
		testOOM(t, driver(t, open, 8*acl.HugePageSize))
	})
}

// driver opens a driver and checks at the end that nothing leaked.
func driver(t *testing.T, open Open, capacity uintptr) acl.Driver {
	d := open(t, capacity)
	require.NotNil(t, d)
	t.Cleanup(func() {
		if c, ok := d.(acl.Counter); ok {
			assert.True(t, c.Live().Zero(), "%s leaked: %+v", d.Name(), c.Live())
		}
		assert.NoError(t, d.Close())
	})
	return d
}

// New returns an arena on d that the test closes.
func New(t testing.TB, cfg arena.Config) *arena.Arena {
	t.Helper()
	a, err := arena.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, a.Close()) })
	return a
}

// CheckInvariants asserts Len ≤ Cap ≤ Reserved, Cap a chunk multiple.
func CheckInvariants(t testing.TB, a *arena.Arena) {
	t.Helper()
	s := a.Stats()
	require.LessOrEqual(t, s.Used, s.Mapped, "Len ≤ Cap")
	require.LessOrEqual(t, s.Mapped, s.Reserved, "Cap ≤ Reserved")
	require.Zero(t, s.Mapped%s.ChunkSize, "Cap %d is a multiple of the chunk size %d", s.Mapped, s.ChunkSize)
	require.LessOrEqual(t, s.Used, s.Peak)
}

func pattern(seed, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = uint32(seed*2654435761 + i*40503)
	}
	return p
}

func readBack(t testing.TB, b arena.Buffer, want []uint32) {
	t.Helper()
	got := make([]uint32, len(want))
	require.NoError(t, arena.CopyOut(got, b))
	require.Equal(t, want, got, "data of %v changed", b)
}

// testStable grows one chunk at a time while writing into every buffer, then
// checks every earlier buffer kept its address and its bytes.
func testStable(t *testing.T, d acl.Driver) {
	a := New(t, arena.Config{Driver: d, Reserve: 64 << 20})
	base := a.Base()
	type rec struct {
		b    arena.Buffer
		ptr  acl.DevicePtr
		data []uint32
	}
	var recs []rec
	for i := range 48 {
		// 700 KiB buffers straddle chunk boundaries.
		b, err := a.Alloc(700<<10, 256)
		require.NoError(t, err)
		data := pattern(i, b.Len()/4)
		require.NoError(t, arena.CopyIn(b, data))
		recs = append(recs, rec{b, b.Ptr(), data})
		require.Equal(t, base, a.Base(), "base moved")
		require.Zero(t, b.Offset()%256)
		CheckInvariants(t, a)
	}
	require.Greater(t, a.Stats().Grows, int64(10))
	for _, r := range recs {
		require.Equal(t, r.ptr, r.b.Ptr())
		readBack(t, r.b, r.data)
	}
}

func testInvariants(t *testing.T, d acl.Driver) {
	a := New(t, arena.Config{Driver: d, Reserve: 32 << 20})
	cs := a.ChunkSize()
	require.Equal(t, 0, a.Cap(), "New maps nothing")
	require.Equal(t, 32<<20, a.Reserved())
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		switch rng.IntN(5) {
		case 0:
			_ = a.Grow(rng.IntN(3 * cs))
		case 1:
			_, _ = a.Alloc(rng.IntN(cs), 1<<rng.IntN(12))
		case 2:
			require.NoError(t, a.Shrink())
			require.Equal(t, (a.Len()+cs-1)/cs*cs, a.Cap(), "Shrink leaves Len rounded up")
		case 3:
			require.NoError(t, a.Truncate(a.Len()/2))
		case 4:
			n := rng.IntN(cs)
			if err := a.Grow(n); err == nil {
				require.GreaterOrEqual(t, a.Cap()-a.Len(), n, "Grow(n) leaves room for n")
			} else {
				require.ErrorIs(t, err, arena.ErrExhausted)
			}
		}
		CheckInvariants(t, a)
	}
}

func live(d acl.Driver) (acl.LiveCounts, bool) {
	c, ok := d.(acl.Counter)
	if !ok {
		return acl.LiveCounts{}, false
	}
	return c.Live(), true
}

func testShrink(t *testing.T, d acl.Driver) {
	a := New(t, arena.Config{Driver: d, Reserve: 64 << 20, Chunk: chunk.Config{MaxCached: -1}})
	cs := a.ChunkSize()
	keep, err := a.Alloc(cs+100, 1)
	require.NoError(t, err)
	data := pattern(7, keep.Len()/4)
	require.NoError(t, arena.CopyIn(keep, data))
	require.NoError(t, a.Grow(10*cs))
	before, counted := live(d)
	require.NoError(t, a.Shrink())
	require.Equal(t, 2*cs, a.Cap())
	after, _ := live(d)
	if counted {
		assert.Equal(t, before.Mappings-10, after.Mappings, "Shrink unmapped 10 chunks")
		assert.Equal(t, before.PhysicalBytes-uintptr(10*cs), after.PhysicalBytes, "and, with no cache, freed them")
	}
	readBack(t, keep, data)
	s := a.Stats()
	assert.Equal(t, int64(10), s.Unmaps)
	// Reset + Shrink gives everything back.
	require.NoError(t, a.Reset())
	require.NoError(t, a.Shrink())
	require.Equal(t, 0, a.Cap())
	if counted {
		l, _ := live(d)
		assert.Zero(t, l.Mappings)
		assert.Zero(t, l.PhysicalBytes)
	}
}

func testReuse(t *testing.T, d acl.Driver) {
	a := New(t, arena.Config{Driver: d, Reserve: 64 << 20})
	cs := a.ChunkSize()
	require.NoError(t, a.Grow(8*cs))
	require.NoError(t, a.Shrink())
	p := a.Pool().Stats()
	require.Equal(t, 8, p.Cached)
	require.NoError(t, a.Grow(8*cs))
	q := a.Pool().Stats()
	assert.Equal(t, p.Allocs, q.Allocs, "regrowth allocated no physical memory")
	assert.Equal(t, p.Hits+8, q.Hits)
	assert.Equal(t, 0, q.Cached)
}

func testExhausted(t *testing.T, d acl.Driver) {
	a := New(t, arena.Config{Driver: d, Reserve: 8 << 20})
	require.NoError(t, a.Grow(4<<20))
	s := a.Stats()
	err := a.Grow(8<<20 + 1)
	require.ErrorIs(t, err, arena.ErrExhausted)
	_, err = a.Alloc(9<<20, 1)
	require.ErrorIs(t, err, arena.ErrExhausted)
	require.Equal(t, s, a.Stats(), "failed growth changed the arena")
	b, err := a.Alloc(8<<20, 1)
	require.NoError(t, err, "the whole reservation is usable")
	require.Equal(t, 8<<20, b.Len())
}

func testTruncate(t *testing.T, d acl.Driver) {
	a := New(t, arena.Config{Driver: d, Reserve: 16 << 20})
	b1, err := a.Alloc(1000, 8)
	require.NoError(t, err)
	b2, err := a.Alloc(1000, 64)
	require.NoError(t, err)
	require.Equal(t, 1024, b2.Offset())
	s, err := a.Slice(0, 2024)
	require.NoError(t, err)
	require.Equal(t, b1.Ptr(), s.Ptr())
	_, err = a.Slice(1, 2025)
	require.ErrorIs(t, err, arena.ErrRange)
	_, err = a.Slice(-1, 2)
	require.ErrorIs(t, err, arena.ErrRange)
	sub, err := b2.Slice(10, 20)
	require.NoError(t, err)
	require.Equal(t, b2.Ptr()+10, sub.Ptr())
	_, err = b2.Slice(10, 1001)
	require.ErrorIs(t, err, arena.ErrRange)

	require.NoError(t, a.Truncate(1000))
	require.Equal(t, 1000, a.Len())
	require.ErrorIs(t, arena.CopyIn(b2, []byte{1}), arena.ErrStale, "buffer above Len is dropped")
	require.NoError(t, arena.CopyIn(b1, []byte{1}))
	require.ErrorIs(t, a.Truncate(1001), arena.ErrRange)
	require.ErrorIs(t, a.Truncate(-1), arena.ErrRange)
	b3, err := a.Alloc(10, 1)
	require.NoError(t, err)
	require.Equal(t, 1000, b3.Offset(), "allocation resumes at Len")
	b4, err := a.Alloc(2000, 1) // over b2's range again
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(b4, []byte{2}))
	require.ErrorIs(t, arena.CopyIn(b2, []byte{1}), arena.ErrStale, "a dropped buffer stays stale")
	require.ErrorIs(t, arena.CopyIn(sub, []byte{1}), arena.ErrStale, "and its views with it")
	require.NoError(t, a.Reset())
	require.Equal(t, 0, a.Len())
	require.Equal(t, 3010, a.Stats().Peak, "the peak: b3 and b4 above what the Truncate kept")
}

func testClose(t *testing.T, d acl.Driver) {
	a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20})
	require.NoError(t, err)
	b, err := a.Alloc(4<<20, 1)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "second Close")
	_, err = a.Alloc(1, 1)
	require.ErrorIs(t, err, arena.ErrClosed)
	require.ErrorIs(t, a.Grow(1), arena.ErrClosed)
	require.ErrorIs(t, a.Shrink(), arena.ErrClosed)
	require.ErrorIs(t, a.Reset(), arena.ErrClosed)
	_, err = a.Slice(0, 0)
	require.ErrorIs(t, err, arena.ErrClosed)
	require.ErrorIs(t, arena.CopyIn(b, []byte{1}), arena.ErrClosed)
	require.True(t, a.Stats().Closed)
	var nilArena *arena.Arena
	require.NoError(t, nilArena.Close())
	if l, ok := live(d); ok {
		require.True(t, l.Zero(), "Close released everything: %+v", l)
	}
}

func testBudget(t *testing.T, d acl.Driver) {
	pool, err := chunk.New(d, chunk.Config{Budget: 8 * acl.HugePageSize})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	cs := pool.ChunkSize()
	a := New(t, arena.Config{Pool: pool, Reserve: 64 << 20})
	b := New(t, arena.Config{Pool: pool, Reserve: 64 << 20})
	require.NoError(t, a.Grow(6*cs))
	require.NoError(t, b.Grow(2*cs))
	sb := b.Stats()
	err = b.Grow(4 * cs)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	require.ErrorIs(t, err, chunk.ErrBudget)
	require.Equal(t, sb, b.Stats(), "a failed Grow leaves the arena unchanged")
	require.Equal(t, 6*cs, a.Cap(), "the other tenant is undisturbed")
	require.Equal(t, int64(8*cs), pool.Stats().HeldBytes)
	// a gives back; b can now take it, from the cache.
	require.NoError(t, a.Shrink())
	require.NoError(t, b.Grow(6*cs))
	require.Equal(t, 6*cs, b.Cap())
	require.Positive(t, pool.Stats().Hits)
}

func testOOM(t *testing.T, d acl.Driver) {
	a := New(t, arena.Config{Driver: d, Reserve: 64 << 20})
	cs := a.ChunkSize()
	b, err := a.Alloc(3*cs, 1)
	require.NoError(t, err)
	data := pattern(3, b.Len()/4)
	require.NoError(t, arena.CopyIn(b, data))
	before := a.Stats()
	lb, counted := live(d)
	// 3 chunks mapped, 5 left on the device: asking for 6 more fails part-way.
	err = a.Grow(6 * cs)
	require.Error(t, err)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	var ae *acl.Error
	require.True(t, errors.As(err, &ae), "the driver's error is kept: %v", err)
	require.Equal(t, acl.ErrCodeRTMemoryAllocation, ae.Code)
	after := a.Stats()
	before.Maps, before.Unmaps = after.Maps, after.Unmaps // rolled-back maps count as calls
	require.Equal(t, before, after, "the arena is as it was")
	if counted {
		la, _ := live(d)
		require.Equal(t, lb.Mappings, la.Mappings, "no mapping leaked")
	}
	readBack(t, b, data)
	// The rollback returned the chunks: they serve the next, smaller growth.
	require.NoError(t, a.Grow(5*cs))
	_, err = a.Alloc(5*cs, 1)
	require.NoError(t, err)
	_, err = a.Alloc(1, 1)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
}

// testConcurrent allocates, writes and checks from many goroutines while
// another keeps shrinking and growing the same arena.
func testConcurrent(t *testing.T, d acl.Driver) {
	pool, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	arenas := []*arena.Arena{
		New(t, arena.Config{Pool: pool, Reserve: 64 << 20}),
		New(t, arena.Config{Pool: pool, Reserve: 64 << 20}),
	}
	const workers, rounds = 6, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	stop := make(chan struct{})
	go func() { // the shrinker
		for {
			select {
			case <-stop:
				errs <- nil
				return
			default:
			}
			for _, a := range arenas {
				if err := a.Shrink(); err != nil {
					errs <- err
					return
				}
			}
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := arenas[w%len(arenas)]
			var bufs []arena.Buffer
			var datas [][]uint32
			for r := range rounds {
				b, err := a.Alloc(4096*(1+r%7), 64)
				if err != nil {
					errs <- err
					return
				}
				data := pattern(w*1000+r, b.Len()/4)
				if err := arena.CopyIn(b, data); err != nil {
					errs <- err
					return
				}
				bufs, datas = append(bufs, b), append(datas, data)
			}
			for i, b := range bufs {
				got := make([]uint32, len(datas[i]))
				if err := arena.CopyOut(got, b); err != nil {
					errs <- err
					return
				}
				for j := range got {
					if got[j] != datas[i][j] {
						errs <- fmt.Errorf("worker %d buffer %d word %d: %#x, want %#x", w, i, j, got[j], datas[i][j])
						return
					}
				}
			}
			errs <- nil
		}()
	}
	wg.Wait()
	close(stop)
	for range workers + 1 {
		require.NoError(t, <-errs)
	}
	for _, a := range arenas {
		CheckInvariants(t, a)
	}
}
