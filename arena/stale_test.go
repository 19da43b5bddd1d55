package arena_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/arena/tensor"
	"github.com/vmarena/vmarena/internal/sched"
)

func staleArena(t *testing.T, cfg arena.Config) (*arena.Arena, *host.Driver) {
	t.Helper()
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	cfg.Driver = d
	if cfg.Reserve == 0 {
		cfg.Reserve = 16 << 20
	}
	a, err := arena.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Close())
		assert.True(t, d.Live().Zero(), "%+v", d.Live())
		require.NoError(t, d.Close())
	})
	return a, d
}

// requireStale checks that every use of b fails with ErrStale (and not
// ErrRange: the range may be in use again) and changes nothing.
func requireStale(t *testing.T, b, other arena.Buffer) {
	t.Helper()
	is := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, arena.ErrStale, what)
		assert.NotErrorIs(t, err, arena.ErrRange, what)
		assert.NotErrorIs(t, err, arena.ErrInvalid, what)
		assert.NotErrorIs(t, err, arena.ErrAsleep, what)
	}
	is("CopyIn", arena.CopyIn(b, []byte("stale write")))
	is("CopyOut", arena.CopyOut(make([]byte, 4), b))
	is("Copy into", arena.Copy(b, other))
	is("Copy from", arena.Copy(other, b))
	is("Fill", arena.Fill(b, 0xee))
	_, err := b.Slice(0, 1)
	is("Slice", err)
	_, err = tensor.View[float32](b, 4)
	is("View", err)
	if uc, f, err := ipc.Socketpair(); err == nil { // Linux
		defer uc.Close()
		defer f.Close()
		is("Share", b.Share(uc, arena.ShareOptions{PID: os.Getpid()}))
	}
}

// The bug this guards against: a buffer kept after Truncate(0), whose offset
// the next Alloc hands out again, wrote into the new allocation (its copy
// saw a range below Len and returned nil).
func TestStaleBufferCannotWriteTheNextAllocation(t *testing.T) {
	a, _ := staleArena(t, arena.Config{})
	old, err := a.Alloc(4096, 64)
	require.NoError(t, err)
	view, err := old.Slice(96, 200)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(old, []byte("sequence A")))
	require.NoError(t, a.Truncate(0))
	next, err := a.Alloc(4096, 64)
	require.NoError(t, err)
	require.Equal(t, old.Offset(), next.Offset(), "the same range, cut again")
	require.NoError(t, arena.CopyIn(next, []byte("sequence B")))
	other, err := a.Alloc(4096, 64)
	require.NoError(t, err)

	requireStale(t, old, other)
	requireStale(t, view, other)

	got := make([]byte, 10)
	require.NoError(t, arena.CopyOut(got, next))
	assert.Equal(t, "sequence B", string(got), "the new allocation is untouched")

	// A view of what lies there now is a new allocation's.
	again, err := a.Slice(old.Offset(), old.Offset()+old.Len())
	require.NoError(t, err)
	require.NoError(t, arena.CopyOut(got, again))
	assert.Equal(t, "sequence B", string(got))
}

// Each way an allocation is dropped makes its buffers stale, and only those:
// buffers below a Truncate, across a Shrink, an Offload sleep or a reclaim
// stay valid.
func TestStaleAfterEachDrop(t *testing.T) {
	type bufs struct{ low, high, highView, lowView arena.Buffer }
	for _, tc := range []struct {
		name     string
		drop     func(t *testing.T, a *arena.Arena, b bufs)
		lowStale bool
	}{
		{"Truncate", func(t *testing.T, a *arena.Arena, b bufs) { require.NoError(t, a.Truncate(b.high.Offset())) }, false},
		{"Truncate into it", func(t *testing.T, a *arena.Arena, b bufs) { require.NoError(t, a.Truncate(b.high.Offset()+1)) }, false},
		{"Reset", func(t *testing.T, a *arena.Arena, b bufs) { require.NoError(t, a.Reset()) }, true},
		{"Truncate and Shrink", func(t *testing.T, a *arena.Arena, b bufs) {
			require.NoError(t, a.Truncate(b.high.Offset()))
			require.NoError(t, a.Shrink())
		}, false},
		{"Sleep(Discard) and Wake", func(t *testing.T, a *arena.Arena, b bufs) {
			require.NoError(t, a.Sleep(context.Background(), arena.Discard))
			require.ErrorIs(t, arena.CopyIn(b.low, []byte{1}), arena.ErrAsleep, "asleep first")
			require.NoError(t, a.Wake(context.Background()))
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := staleArena(t, arena.Config{})
			var b bufs
			var err error
			b.low, err = a.Alloc(a.ChunkSize(), 64)
			require.NoError(t, err)
			b.high, err = a.Alloc(a.ChunkSize(), a.ChunkSize())
			require.NoError(t, err)
			b.highView, err = b.high.Slice(8, 24)
			require.NoError(t, err)
			b.lowView, err = b.low.Slice(8, 24)
			require.NoError(t, err)
			tc.drop(t, a, b)
			_, err = a.Alloc(3*a.ChunkSize(), 64) // the ranges in use again
			require.NoError(t, err)
			other, err := a.Alloc(100, 64)
			require.NoError(t, err)
			requireStale(t, b.high, other)
			requireStale(t, b.highView, other)
			if tc.lowStale {
				requireStale(t, b.low, other)
				requireStale(t, b.lowView, other)
				return
			}
			for _, x := range []arena.Buffer{b.low, b.lowView} {
				require.NoError(t, arena.CopyIn(x, []byte("kept")))
				require.NoError(t, arena.CopyOut(make([]byte, 4), x))
				_, err := x.Slice(0, 1)
				require.NoError(t, err)
			}
		})
	}
}

// Survivors: Shrink gives back only what lies above Len, an Offload sleep
// keeps the bytes, a reclaim takes only idle memory: no buffer goes stale.
func TestNotStaleAfterShrinkOffloadReclaim(t *testing.T) {
	a, _ := staleArena(t, arena.Config{})
	b, err := a.Alloc(4096, 64)
	require.NoError(t, err)
	v, err := b.Slice(0, 8)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(b, []byte("weights!")))
	require.NoError(t, a.Grow(4*a.ChunkSize()))
	require.NoError(t, a.Shrink())
	require.NoError(t, a.Sleep(context.Background(), arena.Offload))
	require.NoError(t, a.Wake(context.Background()))
	got := make([]byte, 8)
	require.NoError(t, arena.CopyOut(got, v))
	assert.Equal(t, "weights!", string(got))
	require.NoError(t, a.Truncate(a.Len())) // a drop of nothing
	require.NoError(t, arena.CopyOut(got, b))
}

// Close drops every allocation: the copies fail with ErrClosed, which is
// ErrStale too.
func TestStaleAfterClose(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer d.Close()
	a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20})
	require.NoError(t, err)
	b, err := a.Alloc(4096, 64)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	err = arena.CopyIn(b, []byte{1})
	assert.ErrorIs(t, err, arena.ErrClosed)
	assert.ErrorIs(t, err, arena.ErrStale)
	_, err = b.Slice(0, 1)
	assert.ErrorIs(t, err, arena.ErrStale)
}

// A KV cache that rolls back speculative tokens: each step truncates to a
// Len above the last one's. Every buffer is judged by the drops after it was
// cut, and a Reset leaves one record.
func TestStaleRisingTruncates(t *testing.T) {
	a, _ := staleArena(t, arena.Config{})
	type kept struct {
		b     arena.Buffer
		stale bool
	}
	var all []kept
	for step := range 50 {
		acc, err := a.Alloc(64, 1) // accepted
		require.NoError(t, err)
		all = append(all, kept{b: acc})
		l := a.Len()
		rej, err := a.Alloc(64+step, 1) // rejected, rolled back
		require.NoError(t, err)
		all = append(all, kept{b: rej, stale: true})
		require.NoError(t, a.Truncate(l))
	}
	for i, k := range all {
		err := arena.CopyIn(k.b, []byte{byte(i)})
		if k.stale {
			require.ErrorIs(t, err, arena.ErrStale, "buffer %d", i)
		} else {
			require.NoError(t, err, "buffer %d", i)
		}
	}
	assert.Equal(t, 50, arena.DropRecords(a))
	require.NoError(t, a.Reset())
	assert.Equal(t, 1, arena.DropRecords(a))
	for i, k := range all {
		require.ErrorIs(t, arena.CopyIn(k.b, []byte{byte(i)}), arena.ErrStale, "buffer %d", i)
	}
}

// The check reads the drops without a lock while Truncates rewrite them:
// buffers below every drop never read as stale, buffers above one always do.
func TestStaleCheckRacesDrops(t *testing.T) {
	a, _ := staleArena(t, arena.Config{})
	low, err := a.Alloc(4096, 64)
	require.NoError(t, err)
	base := a.Len()
	high, err := a.Alloc(64, 1)
	require.NoError(t, err)
	require.NoError(t, a.Truncate(base))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Rising truncates pile records up; a drop to base clears them.
			if _, err := a.Alloc(64+i%7, 1); err != nil {
				t.Error(err)
				return
			}
			l := a.Len()
			if _, err := a.Alloc(32, 1); err != nil {
				t.Error(err)
				return
			}
			to := l
			if i%50 == 49 {
				to = base
			}
			if err := a.Truncate(to); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	src := bytes.Repeat([]byte{7}, 64)
	for range 20000 {
		if err := arena.CopyIn(low, src); err != nil {
			t.Fatal(err)
		}
		if err := arena.CopyIn(high, src[:1]); err == nil {
			t.Fatal("a stale buffer wrote")
		}
	}
	close(stop)
	wg.Wait()
}

// The state word holds 22 bits of the epoch; the era above them is kept
// beside the low-water mark. A buffer cut 2^22 freezes before another, at the
// same place, is told from it; and one cut just after the 22 bits wrap is
// younger than a drop just before.
func TestStaleAcrossEpochWrap(t *testing.T) {
	const wrap = 1 << 22
	a, _ := staleArena(t, arena.Config{Headroom: 2 << 20})
	require.NoError(t, a.Grow(1<<20))

	arena.SetEpoch(a, 5*wrap+100)
	old, err := a.Alloc(64, 1)
	require.NoError(t, err)
	require.NoError(t, a.Truncate(0))
	arena.SetEpoch(a, 6*wrap+100) // the 22 bits are old's again
	next, err := a.Alloc(64, 1)
	require.NoError(t, err)
	require.Equal(t, old.Offset(), next.Offset())
	require.ErrorIs(t, arena.CopyIn(old, []byte{1}), arena.ErrStale)
	require.NoError(t, arena.CopyIn(next, []byte{2}))

	arena.SetEpoch(a, 8*wrap-1) // the last epoch before a wrap
	before, err := a.Alloc(64, 1)
	require.NoError(t, err)
	require.NoError(t, a.Truncate(before.Offset())) // the freeze that wraps
	after, err := a.Alloc(128, 1)
	require.NoError(t, err)
	require.Equal(t, before.Offset(), after.Offset())
	require.ErrorIs(t, arena.CopyIn(before, []byte{3}), arena.ErrStale)
	require.NoError(t, arena.CopyIn(after, []byte{4}), "cut after the drop")
	require.NoError(t, arena.CopyIn(next, []byte{5}), "below every drop")
	v, err := after.Slice(0, 8)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(v, []byte{6}))
	assert.Equal(t, 2<<20, arena.LowWater(a), "the low-water mark beside the era is intact")
}

// Random allocations and drops, each buffer's staleness predicted from the
// whole history of drops (the lowest Len since it was cut): the records and
// their search (the walk from the newest, then the binary search) agree with
// it for every buffer after every step.
func TestStaleAgainstHistory(t *testing.T) {
	a, _ := staleArena(t, arena.Config{})
	rng := rand.New(rand.NewPCG(25, 1))
	type cut struct {
		b   arena.Buffer
		low int // the lowest Len since it was cut
	}
	var cuts []cut
	for step := range 3000 {
		switch r := rng.IntN(10); {
		case r < 6 && a.Len() < 1<<20:
			b, err := a.Alloc(1+rng.IntN(300), 1)
			require.NoError(t, err)
			cuts = append(cuts, cut{b, 1 << 40})
		default:
			n := a.Len() - rng.IntN(min(a.Len(), 200)+1)
			if rng.IntN(50) == 0 {
				n = rng.IntN(a.Len() + 1) // now and then, a deep drop
			}
			require.NoError(t, a.Truncate(n))
			for i := range cuts {
				cuts[i].low = min(cuts[i].low, n)
			}
		}
		if step%7 != 0 {
			continue
		}
		for i, c := range cuts {
			end := c.b.Offset() + c.b.Len()
			_, err := c.b.Slice(0, 0)
			if c.low < end {
				require.ErrorIs(t, err, arena.ErrStale, "step %d, buffer %d [%d, %d), lowest Len since %d", step, i, c.b.Offset(), end, c.low)
			} else {
				require.NoError(t, err, "step %d, buffer %d [%d, %d), lowest Len since %d", step, i, c.b.Offset(), end, c.low)
			}
		}
	}
	t.Logf("%d buffers, %d drop records at the end", len(cuts), arena.DropRecords(a))
}

// Arena.Slice racing a Truncate: the drop is recorded before the word that
// lowers Len is stored, and a view cut in between, stamped with the newest
// drop and checked against the old Len, was never stale: it wrote into the
// allocation cut there next. Stopped between the two (sched.DropRecorded),
// a Slice of the dropped range now fails, or its view is stale.
func TestSliceRacesTruncate(t *testing.T) {
	a, _ := staleArena(t, arena.Config{})
	_, err := a.Alloc(128, 1)
	require.NoError(t, err)
	type cut struct {
		b   arena.Buffer
		err error
	}
	got := make(chan cut, 1)
	waits := make(chan struct{}, 1)
	var once sync.Once
	defer sched.Set(func(p sched.Point, who any) {
		if p == sched.ViewWaits && who == a {
			waits <- struct{}{}
		}
		if p != sched.DropRecorded || who != a {
			return
		}
		once.Do(func() {
			go func() {
				b, err := a.Slice(64, 128)
				got <- cut{b, err}
			}()
			// The Slice either returns before this Truncate goes on (a view
			// stamped against the old word, which must then be stale), or
			// waits for it (sched.ViewWaits).
			select {
			case c := <-got:
				got <- c
			case <-waits:
			}
		})
	})()
	require.NoError(t, a.Truncate(64))
	c := <-got
	if c.err != nil {
		require.ErrorIs(t, c.err, arena.ErrRange, "cut after the drop")
		return
	}
	next, err := a.Alloc(64, 1)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(next, []byte("next")))
	require.ErrorIs(t, arena.CopyIn(c.b, []byte("STALE")), arena.ErrStale, "a view of the dropped range")
	out := make([]byte, 4)
	require.NoError(t, arena.CopyOut(out, next))
	assert.Equal(t, "next", string(out))
}
