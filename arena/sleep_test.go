package arena_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

const sleepChunk = 2 << 20

// sleepEnv is a host driver behind a fault driver, and a shared pool.
type sleepEnv struct {
	hd   *host.Driver
	fd   *faultdriver.Driver
	pool *chunk.Pool
}

func newSleepEnv(t *testing.T) *sleepEnv { return newSleepEnvOf(t, chunk.Config{}) }

// newSleepEnvOf is newSleepEnv with a pool of cfg.
func newSleepEnvOf(t *testing.T, cfg chunk.Config) *sleepEnv {
	t.Helper()
	hd, err := host.New(host.Config{Capacity: 256 << 20})
	require.NoError(t, err)
	e := &sleepEnv{hd: hd, fd: faultdriver.New(hd)}
	e.pool, err = chunk.New(e.fd, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, e.pool.Close())
		require.True(t, hd.Live().Zero(), "leaked: %+v", hd.Live())
		require.NoError(t, hd.Close())
	})
	return e
}

// budgetPool returns a pool on e's driver with a budget of n chunks, closed
// after the arenas the test makes in it.
func (e *sleepEnv) budgetPool(t *testing.T, n int) *chunk.Pool {
	t.Helper()
	pool, err := chunk.New(e.fd, chunk.Config{Budget: int64(n) * sleepChunk})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, pool.Close()) }) // after the arenas, made later
	return pool
}

func (e *sleepEnv) arena(t *testing.T, cfg arena.Config) *arena.Arena {
	t.Helper()
	if cfg.Pool == nil {
		cfg.Pool = e.pool
	}
	if cfg.Reserve == 0 {
		cfg.Reserve = 64 << 20
	}
	a, err := arena.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

// fill allocates n bytes and writes a pattern seeded by seed into them.
func fill(t *testing.T, a *arena.Arena, n int, seed byte) (arena.Buffer, []byte) {
	t.Helper()
	b, err := a.Alloc(n, 1)
	require.NoError(t, err)
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*31+i>>9) ^ seed
	}
	require.NoError(t, arena.CopyIn(b, want))
	return b, want
}

func contents(t *testing.T, b arena.Buffer) []byte {
	t.Helper()
	got := make([]byte, b.Len())
	require.NoError(t, arena.CopyOut(got, b))
	return got
}

// The pool holds nothing physical for a sleeping arena: its chunks went to
// the driver, not to the cache.
func requireNothingHeld(t *testing.T, e *sleepEnv) {
	t.Helper()
	l := e.hd.Live()
	require.Zero(t, l.Handles, "%+v", l)
	require.Zero(t, l.PhysicalBytes, "%+v", l)
	require.Zero(t, l.Mappings, "%+v", l)
	s := e.pool.Stats()
	require.Zero(t, s.HeldBytes, "%+v", s)
}

func TestSleepOffloadKeepsAddressesAndBytes(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{Tag: arena.TagWeights})
	b, want := fill(t, a, 5*sleepChunk+12345, 7)
	ptr, c := b.Ptr(), a.Cap()
	var seen []arena.BackingChange
	require.NoError(t, a.OnBackingChange(func(c arena.BackingChange) error { seen = append(seen, c); return nil }))
	g0 := a.Generation()

	require.NoError(t, a.Sleep(context.Background(), arena.Offload))
	require.True(t, a.Asleep())
	require.Zero(t, a.Cap())
	requireNothingHeld(t, e)
	require.Equal(t, 1, e.hd.Live().HostBuffers, "the host copy")

	// Everything that needs memory says so, and changes nothing.
	_, err := a.Alloc(1, 1)
	require.ErrorIs(t, err, arena.ErrAsleep)
	require.ErrorIs(t, a.Grow(1), arena.ErrAsleep)
	require.ErrorIs(t, a.Truncate(0), arena.ErrAsleep)
	require.ErrorIs(t, a.Shrink(), arena.ErrAsleep)
	require.ErrorIs(t, arena.CopyIn(b, want[:1]), arena.ErrAsleep)
	require.ErrorIs(t, arena.CopyOut(make([]byte, 1), b), arena.ErrAsleep)
	require.NoError(t, a.Sleep(context.Background(), arena.Offload), "asleep already")

	require.NoError(t, a.Wake(context.Background()))
	require.False(t, a.Asleep())
	require.Equal(t, ptr, b.Ptr())
	require.Equal(t, c, a.Cap())
	require.True(t, bytes.Equal(want, contents(t, b)), "contents after wake")
	require.Equal(t, g0+2, a.Generation(), "a sleep and a wake")
	require.Len(t, seen, 4)
	require.Equal(t, arena.BackingReserved, seen[0].Phase, "attached: the range")
	require.Equal(t, arena.BackingMapped, seen[1].Phase, "and what was mapped")
	require.Equal(t, arena.BackingAttach, seen[1].Cause)
	require.Len(t, seen[1].Mappings, c/sleepChunk)
	require.Equal(t, arena.BackingUnmapping, seen[2].Phase)
	require.Equal(t, arena.BackingSleep, seen[2].Cause)
	require.Equal(t, seen[1].Mappings, seen[2].Mappings, "every mapping let go of before the sleep")
	require.Equal(t, arena.BackingMapped, seen[3].Phase)
	require.Equal(t, arena.BackingWake, seen[3].Cause)
	require.Len(t, seen[3].Mappings, c/sleepChunk)
	require.Equal(t, g0+2, seen[3].Generation)
	// Usable again, at the same base.
	_, err = a.Alloc(sleepChunk, 1)
	require.NoError(t, err)
	require.NoError(t, a.Wake(context.Background()), "awake already")
	require.NoError(t, a.DropHostCopy())
	require.Zero(t, e.hd.Live().HostBuffers)
}

func TestSleepDiscard(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{Tag: arena.TagKV})
	b, _ := fill(t, a, 3*sleepChunk, 1)
	ptr := b.Ptr()
	require.NoError(t, a.Sleep(context.Background(), arena.Discard))
	requireNothingHeld(t, e)
	require.Zero(t, e.hd.Live().HostBuffers, "discard copies nothing")
	require.NoError(t, a.Wake(context.Background()))
	require.Equal(t, ptr, b.Ptr())
	// The allocation went with the bytes: the buffer is stale, and a view
	// of what lies there now reads the host driver's fresh memory, zero.
	require.ErrorIs(t, arena.CopyOut(make([]byte, 1), b), arena.ErrStale)
	now, err := a.Slice(b.Offset(), b.Offset()+b.Len())
	require.NoError(t, err)
	require.Equal(t, make([]byte, b.Len()), contents(t, now))
}

// A hundred cycles leave nothing behind: no physical byte while asleep, the
// same pointers and the same bytes after every wake, and nothing at the end.
func TestSleepHundredCycles(t *testing.T) {
	e := newSleepEnv(t)
	w := e.arena(t, arena.Config{Tag: arena.TagWeights})
	kv := e.arena(t, arena.Config{Tag: arena.TagKV})
	bw, want := fill(t, w, 4*sleepChunk+100, 3)
	bk, _ := fill(t, kv, 2*sleepChunk, 4)
	pw, pk := bw.Ptr(), bk.Ptr()
	ctx := context.Background()
	for i := range 100 {
		require.NoError(t, arena.SleepTag(ctx, e.pool, arena.TagWeights, arena.Offload), "cycle %d", i)
		require.NoError(t, arena.SleepTag(ctx, e.pool, arena.TagKV, arena.Discard), "cycle %d", i)
		requireNothingHeld(t, e)
		require.NoError(t, arena.WakeTag(ctx, e.pool, arena.TagWeights), "cycle %d", i)
		require.NoError(t, arena.WakeTag(ctx, e.pool, arena.TagKV), "cycle %d", i)
		require.Equal(t, pw, bw.Ptr())
		require.Equal(t, pk, bk.Ptr())
		require.True(t, bytes.Equal(want, contents(t, bw)), "cycle %d", i)
	}
	require.Equal(t, uint64(1+200), w.Generation(), "its growth, then a sleep and a wake per cycle")
	require.Equal(t, 1, e.hd.Live().HostBuffers, "one pinned buffer, reused every cycle")
}

// Tagged finds arenas by tag and pool, and SleepTag sleeps them together.
func TestSleepTags(t *testing.T) {
	e := newSleepEnv(t)
	a1 := e.arena(t, arena.Config{Tag: "mine"})
	a2 := e.arena(t, arena.Config{Tag: "mine"})
	other := e.arena(t, arena.Config{Tag: "other"})
	for _, a := range []*arena.Arena{a1, a2, other} {
		require.NoError(t, a.Grow(sleepChunk))
	}
	require.ElementsMatch(t, []*arena.Arena{a1, a2}, arena.Tagged(e.pool, "mine"))
	require.Empty(t, arena.Tagged(e.pool, "nobody"))
	require.NoError(t, arena.SleepTag(context.Background(), e.pool, "mine", arena.Discard))
	require.True(t, a1.Asleep())
	require.True(t, a2.Asleep())
	require.False(t, other.Asleep())
	require.NoError(t, arena.WakeTag(context.Background(), nil, "mine"))
	require.False(t, a1.Asleep())

	// On a device: every pool's arenas of the tag.
	p2, err := chunk.New(e.fd, chunk.Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, p2.Close()) }()
	a3, err := arena.New(arena.Config{Pool: p2, Reserve: 16 << 20, Tag: "mine"})
	require.NoError(t, err)
	defer func() { require.NoError(t, a3.Close()) }()
	require.NoError(t, a3.Grow(sleepChunk))
	require.ElementsMatch(t, []*arena.Arena{a1, a2, a3}, arena.TaggedOn(e.fd, "mine"))
	require.Empty(t, arena.TaggedOn(e.hd, "mine"), "another driver")
	require.NoError(t, arena.SleepAll(context.Background(), arena.TaggedOn(e.fd, "mine"), arena.Discard))
	require.True(t, a3.Asleep())
	require.True(t, a1.Asleep())
	require.NoError(t, arena.WakeAll(context.Background(), arena.TaggedOn(e.fd, "mine")))
	require.False(t, a3.Asleep())
}

// With streams, Sleep orders its unmaps after the work queued on them: a
// kernel in flight finishes before its memory goes, and nothing faults.
func TestSleepWaitsForStreams(t *testing.T) {
	e := newSleepEnv(t)
	s, err := e.hd.CreateStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, e.hd.DestroyStream(s)) }()
	a := e.arena(t, arena.Config{Streams: []acl.Stream{s}})
	b, want := fill(t, a, 2*sleepChunk, 9)
	done := make(chan struct{})
	require.NoError(t, e.hd.Launch(s, b.Ptr(), uintptr(b.Len()), done))
	slept := make(chan error)
	go func() { slept <- a.Sleep(context.Background(), arena.Offload) }()
	select {
	case err := <-slept:
		t.Fatalf("Sleep returned before the kernel ended: %v", err)
	default:
	}
	// A deadline that passes changes nothing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	a2 := e.arena(t, arena.Config{Streams: []acl.Stream{s}})
	require.NoError(t, a2.Grow(sleepChunk))
	require.ErrorIs(t, a2.Sleep(ctx, arena.Discard), context.Canceled)
	require.False(t, a2.Asleep())
	close(done)
	require.NoError(t, <-slept)
	require.Zero(t, e.hd.Faults())
	require.NoError(t, a.Wake(context.Background()))
	require.True(t, bytes.Equal(want, contents(t, b)))
}

// Sleep refuses an arena that shares memory with another process.
func TestSleepRefusesShared(t *testing.T) {
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer hd.Close()
	pool, err := chunk.New(hd, chunk.Config{Shareable: true})
	require.NoError(t, err)
	defer pool.Close()
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	defer a.Close()
	b, err := a.Alloc(sleepChunk, 1)
	require.NoError(t, err)
	require.NoError(t, a.Sleep(context.Background(), arena.Discard), "nothing shared yet")
	require.NoError(t, a.Wake(context.Background()))
	_, err = pool.Lender().Export(chunkOf(t, a, pool, b), int32(1))
	require.NoError(t, err)
	err = a.Sleep(context.Background(), arena.Offload)
	require.ErrorIs(t, err, arena.ErrShared)
	require.False(t, a.Asleep())
}

// chunkOf finds the chunk that backs b's first byte, by asking the pool
// which of its out chunks is mapped there: Shrink-free arenas map chunk i at
// base + i×size, so the test exports through the arena's own Share path
// instead when it can.
func chunkOf(t *testing.T, a *arena.Arena, pool *chunk.Pool, b arena.Buffer) chunk.Chunk {
	t.Helper()
	c, ok := arena.ChunkAt(a, b.Ptr())
	require.True(t, ok)
	return c
}

// A fault at any driver call of Sleep leaves the arena awake with its
// contents intact (Offload), and one at any call of Wake leaves it asleep
// with its host copy intact, and Wake can be retried; nothing leaks. On a
// pool of two sizes (a large chunk and tails) too, where a large chunk the
// device refuses is laid as tails.
func TestSleepFaultEveryCall(t *testing.T) {
	for _, pool := range []struct {
		name string
		cfg  chunk.Config
		fill int
	}{
		{"one size", chunk.Config{}, 3*sleepChunk + 777},
		{"two sizes", chunk.Config{Size: 8 << 20, TailSize: 2 << 20}, 12<<20 + 777}, // a large chunk, 3 tails
	} {
		for _, mode := range []arena.SleepMode{arena.Offload, arena.Discard} {
			for _, streams := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%v/streams=%v", pool.name, mode, streams), func(t *testing.T) {
					faultEveryCall(t, pool.cfg, pool.fill, mode, streams)
				})
			}
		}
	}
}

func faultEveryCall(t *testing.T, cfg chunk.Config, size int, mode arena.SleepMode, withStreams bool) {
	ctx := context.Background()
	run := func(phase string, n int) (sleepFailed, wakeFailed, reached bool) {
		e := newSleepEnvOf(t, cfg)
		var ss []acl.Stream
		if withStreams {
			s, err := e.hd.CreateStream()
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, e.hd.DestroyStream(s)) })
			ss = []acl.Stream{s}
		}
		a, err := arena.New(arena.Config{Pool: e.pool, Reserve: 32 << 20, Streams: ss})
		require.NoError(t, err)
		defer func() { require.NoError(t, a.Close()) }()
		b, want := fill(t, a, size, 5)
		ptr := b.Ptr()
		if phase == "sleep" {
			e.fd.FailNth(faultdriver.Any, n, 0)
		}
		serr := a.Sleep(ctx, mode)
		if phase == "sleep" {
			reached = e.fd.Injected(faultdriver.Any) > 0
			e.fd.Clear()
		}
		if serr != nil {
			sleepFailed = true
			if !a.Asleep() {
				require.True(t, bytes.Equal(want, contents(t, b)), "a failed Sleep left it awake with other bytes: %v", serr)
				return
			}
			// Only a Sleep that had freed memory when it failed (a free
			// the driver refused, the others done) stays asleep: its
			// contents are on the host, or dropped by request.
			require.ErrorContains(t, serr, "could not be freed", "a failed Sleep stays asleep only after a free")
			require.NoError(t, a.Sleep(ctx, mode), "Sleep again frees what is left")
		}
		require.True(t, a.Asleep())
		requireNothingHeld(t, e)
		if phase == "wake" {
			e.fd.FailNth(faultdriver.Any, n, 0)
		}
		werr := wakeNow(a) // an injected out-of-memory would wait for memory that never comes
		if phase == "wake" {
			reached = e.fd.Injected(faultdriver.Any) > 0
			e.fd.Clear()
		}
		if werr != nil {
			wakeFailed = true
			require.True(t, a.Asleep(), "a failed Wake leaves it asleep: %v", werr)
			require.NoError(t, a.Wake(ctx), "Wake again")
		}
		require.False(t, a.Asleep())
		require.Equal(t, ptr, b.Ptr())
		requireCanonical(t, a)
		if mode == arena.Offload {
			require.True(t, bytes.Equal(want, contents(t, b)), "contents after the cycle")
		}
		return
	}
	for _, phase := range []string{"sleep", "wake"} {
		failures := 0
		for n := 1; ; n++ {
			sf, wf, reached := run(phase, n)
			if !reached {
				require.Greater(t, n, 1, "no driver call in %s", phase)
				break
			}
			if sf || wf {
				failures++
			}
		}
		require.Positive(t, failures, "%s: some injected fault must fail it", phase)
	}
}

// Wake gets its memory from the pool like Grow: under a budget another
// sleeping arena's memory is what makes room.
func TestSleepMakesRoomUnderBudget(t *testing.T) {
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer hd.Close()
	pool, err := chunk.New(hd, chunk.Config{Budget: 8 << 20})
	require.NoError(t, err)
	defer pool.Close()
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	defer a.Close()
	b, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	defer b.Close()
	ba, want := fill(t, a, 8<<20, 2)
	require.ErrorIs(t, b.Grow(2<<20), arena.ErrOutOfMemory)
	require.NoError(t, a.Sleep(context.Background(), arena.Offload))
	require.NoError(t, b.Grow(8<<20))
	// No memory comes back: the Wake waits until its deadline.
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = a.Wake(short)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, a.Asleep())
	require.NoError(t, b.Sleep(context.Background(), arena.Discard))
	require.NoError(t, a.Wake(context.Background()))
	require.True(t, bytes.Equal(want, contents(t, ba)))
}

// Growth and Shrink advance the generation and tell the callbacks, which
// cannot call the arena back (ErrCallback instead of a deadlock).
func TestShrinkIsABackingChange(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{})
	var mu sync.Mutex
	var got []arena.BackingChange
	require.NoError(t, a.OnBackingChange(func(c arena.BackingChange) error {
		mu.Lock()
		got = append(got, c)
		mu.Unlock()
		_ = c.Arena.Stats()                                    // refused nothing, waits for nothing
		require.ErrorIs(t, c.Arena.Grow(1), arena.ErrCallback) // it would wait for itself
		return nil
	}))
	require.NoError(t, a.Grow(3*sleepChunk))
	require.Equal(t, uint64(1), a.Generation())
	require.NoError(t, a.Shrink())
	require.Equal(t, uint64(2), a.Generation())
	require.NoError(t, a.Shrink(), "nothing to give back")
	require.Equal(t, uint64(2), a.Generation())
	require.Len(t, got, 3)
	require.Equal(t, arena.BackingReserved, got[0].Phase)
	require.Equal(t, arena.BackingGrow, got[1].Cause)
	require.Len(t, got[1].Mappings, 3)
	require.Equal(t, arena.BackingShrink, got[2].Cause)
	require.Equal(t, arena.BackingUnmapping, got[2].Phase)
	require.Equal(t, got[1].Mappings, got[2].Mappings)
}

func TestSleepBadInput(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{})
	require.ErrorIs(t, a.Sleep(context.Background(), 0), arena.ErrInvalid)
	require.ErrorIs(t, a.Sleep(context.Background(), 99), arena.ErrInvalid)
	var nilA *arena.Arena
	require.ErrorIs(t, nilA.Sleep(context.Background(), arena.Discard), arena.ErrClosed)
	require.ErrorIs(t, nilA.Wake(context.Background()), arena.ErrClosed)
	require.ErrorIs(t, (&arena.Arena{}).Sleep(context.Background(), arena.Discard), arena.ErrInvalid)
	// Close of a sleeping arena frees everything, the host copy included.
	c, err := arena.New(arena.Config{Pool: e.pool, Reserve: 16 << 20})
	require.NoError(t, err)
	fill(t, c, sleepChunk, 1)
	require.NoError(t, c.Sleep(context.Background(), arena.Offload))
	require.NoError(t, c.Close())
	require.ErrorIs(t, c.Wake(context.Background()), arena.ErrClosed)
	require.Zero(t, e.hd.Live().HostBuffers)
	require.True(t, errors.Is(c.Sleep(context.Background(), arena.Discard), arena.ErrClosed))
}

// TestSleepRandom mixes Sleep and Wake with the other operations on three
// arenas that share a budgeted pool, with a fault injected at one of the
// first calls of half the operations, and checks after every step: an awake
// arena's bytes below Len are what was written (unless a Discard dropped
// them), a sleeping one has Cap 0, pointers never move, and with every arena
// asleep the driver holds no physical memory at all.
func TestSleepRandom(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { sleepRandom(t, seed, chunk.Config{Budget: 24 << 20, MaxCached: 4}, 3<<20) })
	}
	// Two sizes, with allocations that span whole blocks: wakes under the
	// budget lay large slots as tails.
	for seed := range uint64(2) {
		t.Run(fmt.Sprintf("two sizes/%d", seed), func(t *testing.T) {
			sleepRandom(t, seed, chunk.Config{Size: 8 << 20, TailSize: 2 << 20, Budget: 40 << 20, MaxCached: 8}, 14<<20)
		})
	}
}

// retiled reports whether a large chunk (larger than tail) of layout
// before lies, in after, where tail chunks do: a large slot came back as
// tails.
func retiled(before, after []int, tail int) bool {
	top := 0
	large := map[int]bool{}
	for _, n := range after {
		large[top] = n > tail
		top += n
	}
	off := 0
	for _, n := range before {
		if n > tail && off < top && !large[off] {
			return true
		}
		off += n
	}
	return false
}

// sleepRandom runs random allocations (of up to most bytes), truncations,
// shrinks, sleeps and wakes, with faults, on three arenas of a pool of cfg.
func sleepRandom(t *testing.T, seed uint64, cfg chunk.Config, most int) {
	rng := rand.New(rand.NewPCG(seed, 18))
	hd, err := host.New(host.Config{Capacity: 256 << 20})
	require.NoError(t, err)
	defer hd.Close()
	fd := faultdriver.New(hd)
	pool, err := chunk.New(fd, cfg)
	require.NoError(t, err)
	type model struct {
		a      *arena.Arena
		want   []byte // the bytes below Len, when known
		known  bool
		base   acl.DevicePtr
		layout []int // when it last fell asleep
	}
	ms := make([]*model, 3)
	for i := range ms {
		a, err := arena.New(arena.Config{Pool: pool, Reserve: max(16<<20, 2*most)})
		require.NoError(t, err)
		ms[i] = &model{a: a, known: true, base: a.Base()}
	}
	ctx := context.Background()
	var slept, woke, faulted, relaid int
	for step := range 400 {
		m := ms[rng.IntN(len(ms))]
		a := m.a
		if rng.IntN(2) == 0 {
			fd.FailNth(faultdriver.Any, 1+rng.IntN(6), 0)
		}
		switch op := rng.IntN(7); op {
		case 0, 1: // allocate and write
			n := 1 + rng.IntN(most)
			b, err := a.Alloc(n, 1)
			if err != nil {
				break
			}
			data := make([]byte, n)
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			if err := arena.CopyIn(b, data); err != nil {
				m.known = false // a failed copy may have written part
				m.want = append(m.want, make([]byte, n)...)
				break
			}
			m.want = append(m.want, data...)
		case 2:
			n := rng.IntN(a.Len() + 1)
			if a.Truncate(n) == nil {
				m.want = m.want[:n]
				m.known = m.known || n == 0
			}
		case 3:
			_ = a.Shrink()
		case 4:
			mode := arena.Offload
			if rng.IntN(3) == 0 {
				mode = arena.Discard
			}
			wasAsleep := a.Asleep()
			if !wasAsleep {
				m.layout = arena.Layout(a)
			}
			err := a.Sleep(ctx, mode)
			if (err == nil || a.Asleep()) && mode == arena.Discard && !wasAsleep {
				m.known = false
			}
			if err == nil && !wasAsleep {
				slept++
			}
		case 5, 6:
			if a.Asleep() && wakeNow(a) == nil {
				woke++
				if retiled(m.layout, arena.Layout(a), a.TailSize()) {
					relaid++
				}
			}
		}
		fd.Clear()
		for i, x := range ms {
			require.Equal(t, x.base, x.a.Base())
			if x.a.Asleep() {
				require.Zero(t, x.a.Cap(), "step %d arena %d", step, i)
				continue
			}
			require.LessOrEqual(t, x.a.Len(), x.a.Cap(), "step %d arena %d", step, i)
			require.Equal(t, len(x.want), x.a.Len(), "step %d arena %d", step, i)
			requireCanonical(t, x.a)
			if x.known && x.a.Len() > 0 {
				got := make([]byte, x.a.Len())
				whole, err := x.a.Slice(0, x.a.Len())
				require.NoError(t, err)
				require.NoError(t, arena.CopyOut(got, whole))
				require.True(t, bytes.Equal(x.want, got), "step %d arena %d: bytes changed", step, i)
			}
		}
		if step%50 == 49 {
			// Everything asleep: the driver holds nothing physical.
			// (A sleeping arena's Sleep frees what an earlier one could not.)
			for _, x := range ms {
				require.NoError(t, x.a.Sleep(ctx, arena.Offload))
			}
			require.NoError(t, pool.Trim())
			require.Zero(t, hd.Live().Handles, "%+v", hd.Live())
			for _, x := range ms {
				if err := wakeNow(x.a); err != nil {
					// The arenas may hold more than the budget between them.
					require.ErrorIs(t, err, arena.ErrOutOfMemory)
					require.True(t, x.a.Asleep())
				}
			}
		}
	}
	faulted = int(fd.Injected(faultdriver.Any))
	t.Logf("%d sleeps and %d wakes succeeded (%d laid out anew), %d faults injected", slept, woke, relaid, faulted)
	require.Greater(t, slept, 5)
	require.Greater(t, woke, 5)
	require.Greater(t, faulted, 10)
	for _, x := range ms {
		require.NoError(t, x.a.Close())
	}
	require.NoError(t, pool.Close())
	require.True(t, hd.Live().Zero(), "%+v", hd.Live())
}

// A sleeping arena holds nothing the pool could reclaim, and the worker
// refills no headroom into it; after the wake the headroom comes back.
func TestSleepWithHeadroom(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{Headroom: 4 * sleepChunk})
	e.pool.Lender().Settle()
	require.Equal(t, 4*sleepChunk, a.Cap(), "the worker mapped the headroom")
	b, want := fill(t, a, sleepChunk, 6)
	require.NoError(t, a.Sleep(context.Background(), arena.Offload))
	e.pool.Lender().Settle()
	require.Zero(t, a.Cap())
	require.Zero(t, a.Stats().Reclaimable)
	requireNothingHeld(t, e)
	require.NoError(t, a.Wake(context.Background()))
	require.True(t, bytes.Equal(want, contents(t, b)))
	e.pool.Lender().Settle()
	require.GreaterOrEqual(t, a.Cap(), a.Len()+4*sleepChunk, "the headroom is back")
}

// An arena that holds nothing sleeps like any other: until Wake its
// operations fail with ErrAsleep and the worker maps no headroom into it.
// (Sleep once returned with such an arena still awake; the model test found
// it.)
func TestSleepEmpty(t *testing.T) {
	e := newSleepEnv(t)
	for _, mode := range []arena.SleepMode{arena.Discard, arena.Offload} {
		a := e.arena(t, arena.Config{})
		require.Zero(t, a.Cap())
		require.NoError(t, a.Sleep(context.Background(), mode))
		require.True(t, a.Asleep(), "%v", mode)
		_, err := a.Alloc(1, 1)
		require.ErrorIs(t, err, arena.ErrAsleep)
		require.ErrorIs(t, a.Grow(1), arena.ErrAsleep)
		require.NoError(t, a.Wake(context.Background()))
		require.False(t, a.Asleep())
		_, err = a.Alloc(1, 1)
		require.NoError(t, err)
	}
}

// A Close whose free of the host copy fails: an awake arena's copy (kept
// for the next Offload) is freed first, so the Close changes nothing and can
// be retried; a sleeping arena's (its contents) is freed last, after the
// reservation is released, so the arena is closed and the next Close frees
// it. (Close once returned with the arena closed and the copy kept for
// nobody; the model test found it.)
func TestCloseFreesTheHostCopy(t *testing.T) {
	for _, asleep := range []bool{false, true} {
		t.Run(map[bool]string{false: "awake", true: "asleep"}[asleep], func(t *testing.T) {
			e := newSleepEnv(t)
			a, err := arena.New(arena.Config{Pool: e.pool, Reserve: 16 << 20})
			require.NoError(t, err)
			b, want := fill(t, a, sleepChunk, 2)
			require.NoError(t, a.Sleep(context.Background(), arena.Offload))
			if !asleep {
				require.NoError(t, a.Wake(context.Background()))
			}
			require.Positive(t, a.HostCopy())
			e.fd.FailNth(faultdriver.FreeHost, 1, 0)
			require.Error(t, a.Close())
			if asleep {
				require.True(t, a.Stats().Closed, "the reservation went first")
			} else {
				require.False(t, a.Stats().Closed, "nothing changed")
				require.True(t, bytes.Equal(want, contents(t, b)))
			}
			require.NoError(t, a.Close())
			require.True(t, a.Stats().Closed)
			require.Zero(t, e.hd.Live().HostBuffers)
		})
	}
}

// Wake asks the worker to refill the headroom while it still holds the
// arena's lock, so the worker's first try finds the arena busy. The refill
// must not be lost: the worker asks again on its next round. The worker's
// round runs at that very moment (the test settles it from inside the
// Wake), then the Wake ends, and one more round must bring the headroom.
func TestWakeRefillNotLost(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{Headroom: 2 * sleepChunk, MaxHeadroom: 2 * sleepChunk})
	e.pool.Lender().Settle()
	fill(t, a, 3*sleepChunk/2, 3)
	require.NoError(t, a.Sleep(context.Background(), arena.Offload))
	tried := false
	t.Cleanup(sched.Set(func(p sched.Point, who any) {
		if p == sched.WakeAsked && who == a && !tried {
			tried = true
			e.pool.Lender().Settle() // the worker's round, while Wake holds the lock
		}
	}))
	require.NoError(t, a.Wake(context.Background()))
	require.True(t, tried)
	e.pool.Lender().Settle()
	require.GreaterOrEqual(t, a.Cap(), a.Len()+2*sleepChunk, "the headroom came back")
}

// wakeNow wakes a without waiting for memory: when there is none, the Wake
// joins its pool's queue of waiters, and its context ends right then (a
// sched hook), so it fails (matching ErrOutOfMemory) instead of waiting for a
// release this single-threaded test would never make. A deadline would do
// the same only on an idle machine: under load a Wake can spend it before
// its first driver call. It replaces any sched hook for its duration.
func wakeNow(a *arena.Arena) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := a.Pool()
	defer sched.Set(func(p sched.Point, who any) {
		if p == sched.WaitEnqueued && who == pool {
			cancel()
		}
	})()
	return a.Wake(ctx)
}
