package arena_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// mixedPool is a pool of 8 MiB chunks with 2 MiB tails on a host driver of
// capacity bytes, under budget (0: none).
func mixedPool(t *testing.T, capacity uintptr, budget int64) (*chunk.Pool, *host.Driver) {
	t.Helper()
	d := isoDriver(t, capacity)
	pool, err := chunk.New(d, chunk.Config{Size: 8 << 20, TailSize: 2 << 20, Budget: budget})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	return pool, d
}

// An arena on a pool of two sizes maps the whole 8 MiB blocks of a growth
// in large chunks and the rest in 2 MiB ones: a large chunk only ever on a
// block of its own, Cap the growth rounded up to 2 MiB, and the bytes
// written across every kind of boundary stay.
func TestMixedGrowthLayout(t *testing.T) {
	const u, c = 2 << 20, 8 << 20
	pool, d := mixedPool(t, 256<<20, 0)
	for _, step := range []struct {
		grow int   // bytes Grow makes room for beyond Len
		want []int // the layout after it
	}{
		{3 << 20, []int{u, u}},
		{c, []int{c}},
		{10 << 20, []int{c, u}},
		{40 << 20, []int{c, c, c, c, c}},
		{c + 1, []int{c, u}},
		{17 << 20, []int{c, c, u}},
	} {
		a := isoArena(t, arena.Config{Pool: pool, Reserve: 128 << 20})
		require.NoError(t, a.Grow(step.grow))
		assert.Equal(t, step.want, arena.Layout(a), "Grow(%d) on an empty arena", step.grow)
		assert.Equal(t, (step.grow+u-1)/u*u, a.Cap())
		assert.Equal(t, u, a.TailSize())
		assert.Equal(t, c, a.ChunkSize())
		assert.Equal(t, len(step.want), a.Stats().Chunks)
	}

	// Growing in steps: tails up to the next block, then blocks.
	a := isoArena(t, arena.Config{Pool: pool, Reserve: 128 << 20})
	var data []byte
	for i, n := range []int{5 << 20, 5 << 20, 20 << 20, 1 << 20, 9 << 20} {
		buf, err := a.Alloc(n, 1)
		require.NoError(t, err)
		p := bytes.Repeat([]byte{byte(i + 1)}, n)
		require.NoError(t, arena.CopyIn(buf, p))
		data = append(data, p...)
	}
	assert.Equal(t, []int{u, u, u, u, u, u, u, u, c, u, u, u, u, c}, arena.Layout(a),
		"tails to 16 MiB, a block, tails to 32 MiB (a growth by less than a block), a block")
	assert.Equal(t, 40<<20, a.Cap())
	assert.Equal(t, data, readAll(t, d, a)[:len(data)], "the bytes stay across tail and large chunks")
}

// Many arenas grown to sizes of no pattern keep less than a tail chunk
// above their length each: the tail waste that one large size would make
// half a chunk on average.
func TestMixedTailWaste(t *testing.T) {
	const u = 2 << 20
	pool, _ := mixedPool(t, 1<<30, 0)
	r := rand.New(rand.NewPCG(1, 2))
	for range 16 {
		a := isoArena(t, arena.Config{Pool: pool, Reserve: 64 << 20})
		for range 1 + r.IntN(5) {
			_, err := a.Alloc(1+r.IntN(12<<20), 1)
			require.NoError(t, err)
		}
		assert.Less(t, a.Cap()-a.Len(), u, "Cap %d for Len %d", a.Cap(), a.Len())
		requireCanonical(t, a)
	}
}

// Truncate and Shrink keep the chunks that hold Len, a large one whole;
// TrapStale poisons the rest of the chunk kept in part and unmaps the rest.
func TestMixedShrinkTruncateTrapStale(t *testing.T) {
	const u, c = 2 << 20, 8 << 20
	pool, d := mixedPool(t, 256<<20, 0)
	a := isoArena(t, arena.Config{Pool: pool, Reserve: 128 << 20, TrapStale: true})
	buf, err := a.Alloc(22<<20, 1)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(buf, bytes.Repeat([]byte{7}, buf.Len())))
	require.Equal(t, []int{c, c, u, u, u}, arena.Layout(a))

	require.NoError(t, a.Truncate(c+1)) // one byte into the second block
	assert.Equal(t, []int{c, c}, arena.Layout(a), "the large chunk holding Len stays whole")
	mem := readAll(t, d, a)
	assert.Equal(t, bytes.Repeat([]byte{7}, c+1), mem[:c+1], "the bytes under Len stay")
	assert.Equal(t, bytes.Repeat([]byte{arena.PoisonByte}, c-1), mem[c+1:], "the rest of the chunk is poisoned")

	require.NoError(t, a.Truncate(3<<20))
	require.NoError(t, a.Shrink())
	assert.Equal(t, []int{c}, arena.Layout(a))
	_, err = a.Alloc(7<<20, 1) // to 10 MiB: a tail after the block
	require.NoError(t, err)
	assert.Equal(t, []int{c, u}, arena.Layout(a))
	require.NoError(t, a.Reset())
	require.NoError(t, a.Shrink())
	assert.Zero(t, a.Cap())
	assert.Empty(t, arena.Layout(a))
}

// Under a budget, a growth takes what another arena holds idle: the relief
// counts in tail units, takes large and tail chunks alike, and the growth
// gets its whole blocks large or laid as tails, never past the budget.
func TestMixedReliefAcrossSizes(t *testing.T) {
	const u, c = 2 << 20, 8 << 20
	pool, d := mixedPool(t, 256<<20, 32<<20)
	a := isoArena(t, arena.Config{Pool: pool, Reserve: 64 << 20})
	b := isoArena(t, arena.Config{Pool: pool, Reserve: 64 << 20})
	buf, err := a.Alloc(26<<20, 1) // c, c, c, u
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(buf, bytes.Repeat([]byte{3}, buf.Len())))
	require.NoError(t, a.Truncate(4<<20)) // idle: all but the first block
	require.NoError(t, b.GrowContext(context.Background(), 18<<20))
	assert.GreaterOrEqual(t, b.Cap(), 18<<20)
	assert.LessOrEqual(t, pool.Stats().HeldBytes, int64(32<<20), "within the budget")
	assert.GreaterOrEqual(t, a.Cap(), 4<<20, "a keeps what holds its Len")
	assert.Equal(t, bytes.Repeat([]byte{3}, 4<<20), readAll(t, d, a)[:4<<20], "a's bytes under Len stay")
	assert.Equal(t, make([]byte, 18<<20), readAll(t, d, b)[:18<<20], "none of a's bytes reach b")
	_ = u
}

// Sleep and Wake on a pool of two sizes: the driver holds nothing physical
// meanwhile, and every chunk comes back at its offset, of its size, with
// its bytes (Offload), through pipeline steps that mix the sizes.
func TestMixedSleepKeepsLayoutAndBytes(t *testing.T) {
	const u, c = 2 << 20, 8 << 20
	for _, mode := range []arena.SleepMode{arena.Offload, arena.Discard} {
		t.Run(mode.String(), func(t *testing.T) {
			pool, d := mixedPool(t, 256<<20, 0)
			a := isoArena(t, arena.Config{Pool: pool, Reserve: 128 << 20})
			var data []byte
			var bufs []arena.Buffer
			for i, n := range []int{5 << 20, 19 << 20, 3<<20 + 5} {
				buf, err := a.Alloc(n, 1)
				require.NoError(t, err)
				p := bytes.Repeat([]byte{byte(i + 1), byte(i * 7)}, n/2+1)[:n]
				require.NoError(t, arena.CopyIn(buf, p))
				data, bufs = append(data, p...), append(bufs, buf)
			}
			layout := []int{u, u, u, u, c, c, u, u}
			require.Equal(t, layout, arena.Layout(a))
			ptrs := make([]acl.DevicePtr, len(bufs))
			for i, b := range bufs {
				ptrs[i] = b.Ptr()
			}

			require.NoError(t, a.Sleep(context.Background(), mode))
			require.Zero(t, a.Cap())
			assert.Zero(t, d.Live().Handles, "%+v", d.Live())
			assert.Zero(t, pool.Stats().HeldBytes)

			require.NoError(t, a.Wake(context.Background()))
			assert.Equal(t, layout, arena.Layout(a), "every chunk at its offset, of its size")
			assert.Equal(t, 28<<20, a.Cap())
			for i, b := range bufs {
				assert.Equal(t, ptrs[i], b.Ptr())
			}
			if mode == arena.Offload {
				assert.Equal(t, data, readAll(t, d, a)[:len(data)], "the bytes, across both sizes")
			}
			requireCanonical(t, a)
		})
	}
}

// A Wake the pool has no large chunk for lays the large slot as tail
// chunks, every byte at its address: from tails in the cache, from tails a
// relief hands, and, for tail slots, from a large chunk a relief hands,
// which goes back to the pool and comes out converted.
func TestMixedWakeRetiles(t *testing.T) {
	const u, c = 2 << 20, 8 << 20
	for _, tc := range []struct {
		name        string
		budget      int64
		slept       int // the bytes the sleeper holds
		other       func(t *testing.T, o *arena.Arena)
		want        []int
		relieved    bool // a relief took the other arena's idle chunks
		conversions bool // the pool turned a large chunk into tails
	}{
		{"tails cached", 2 * c, c, func(t *testing.T, o *arena.Arena) {
			growByTails(t, o, 5)
			require.NoError(t, o.Truncate(u))
			require.NoError(t, o.Shrink()) // 4 tails to the cache; 6 MiB of room, less than a block
		}, []int{u, u, u, u}, false, false},
		{"tails relieved", 2 * c, c, func(t *testing.T, o *arena.Arena) {
			growByTails(t, o, 5)
			require.NoError(t, o.Truncate(u)) // 4 tails idle, 6 MiB of room
		}, []int{u, u, u, u}, true, false},
		{"large chunk relieved for tails", c, 3 << 20, func(t *testing.T, o *arena.Arena) {
			require.NoError(t, o.Grow(c))
			require.NoError(t, o.Truncate(0)) // a large chunk idle, no room
		}, []int{u, u}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, d := mixedPool(t, 256<<20, tc.budget)
			a := isoArena(t, arena.Config{Pool: pool, Reserve: 64 << 20})
			o := isoArena(t, arena.Config{Pool: pool, Reserve: 64 << 20})
			buf, err := a.Alloc(tc.slept, 1)
			require.NoError(t, err)
			want := bytes.Repeat([]byte{1, 2, 3}, tc.slept/3+1)[:tc.slept]
			require.NoError(t, arena.CopyIn(buf, want))
			ptr := buf.Ptr()
			require.NoError(t, a.Sleep(context.Background(), arena.Offload))
			tc.other(t, o)

			require.NoError(t, a.Wake(context.Background()))
			assert.Equal(t, tc.want, arena.Layout(a))
			assert.Equal(t, ptr, buf.Ptr())
			assert.Equal(t, want, readAll(t, d, a)[:tc.slept], "every byte at its address")
			assert.LessOrEqual(t, pool.Stats().HeldBytes, tc.budget)
			assert.Equal(t, tc.relieved, pool.Stats().Reclaimed > 0, "%+v", pool.Stats())
			assert.Equal(t, tc.conversions, pool.Stats().Conversions > 0, "%+v", pool.Stats())
			requireCanonical(t, a)
			requireCanonical(t, o)
		})
	}
}

// growByTails grows o by n tail chunks, one growth each.
func growByTails(t *testing.T, o *arena.Arena, n int) {
	t.Helper()
	for range n {
		_, err := o.Alloc(o.TailSize(), 1)
		require.NoError(t, err)
	}
	require.Equal(t, slices.Repeat([]int{o.TailSize()}, n), arena.Layout(o))
}

// A fault at any driver call of a growth that lays tail and large chunks,
// with a stream (clears queued) and without, leaves the arena as it was:
// Cap, layout and bytes; the growth succeeds when retried, and nothing
// leaks.
func TestMixedGrowFaultEveryCall(t *testing.T) {
	for _, withStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", withStream), func(t *testing.T) {
			failures := 0
			for n := 1; ; n++ {
				hd, err := host.New(host.Config{Capacity: 128 << 20})
				require.NoError(t, err)
				fd := faultdriver.New(hd)
				pool, err := chunk.New(fd, chunk.Config{Size: 8 << 20, TailSize: 2 << 20})
				require.NoError(t, err)
				var ss []acl.Stream
				if withStream {
					s, err := hd.CreateStream()
					require.NoError(t, err)
					ss = []acl.Stream{s}
				}
				a, err := arena.New(arena.Config{Pool: pool, Reserve: 64 << 20, Streams: ss})
				require.NoError(t, err)
				buf, err := a.Alloc(5<<20, 1) // u, u, u
				require.NoError(t, err)
				want := bytes.Repeat([]byte{9}, buf.Len())
				require.NoError(t, arena.CopyIn(buf, want))
				layout, capBefore := arena.Layout(a), a.Cap()

				fd.FailNth(faultdriver.Any, n, 0)
				gerr := a.Grow(27 << 20) // to 32 MiB: u, then three blocks
				reached := fd.Injected(faultdriver.Any) > 0
				fd.Clear()
				if gerr != nil {
					failures++
					require.Equal(t, capBefore, a.Cap(), "a failed Grow keeps Cap (call %d): %v", n, gerr)
					require.Equal(t, layout, arena.Layout(a), "and the layout")
					require.NoError(t, a.Grow(27<<20), "the retry")
				}
				if gerr == nil && !reached {
					require.Equal(t, []int{2 << 20, 2 << 20, 2 << 20, 2 << 20, 8 << 20, 8 << 20, 8 << 20}, arena.Layout(a))
				}
				requireCanonical(t, a) // a large chunk the device refused is laid as tails
				got := make([]byte, buf.Len())
				require.NoError(t, arena.CopyOut(got, buf))
				require.Equal(t, want, got, "the bytes under Len (call %d)", n)
				require.NoError(t, a.Close())
				require.NoError(t, pool.Close())
				for _, s := range ss {
					require.NoError(t, hd.DestroyStream(s))
				}
				require.True(t, hd.Live().Zero(), "leaked after call %d: %+v", n, hd.Live())
				require.NoError(t, hd.Close())
				if !reached {
					require.Greater(t, n, 1, "no driver call in the growth")
					break
				}
			}
			require.Positive(t, failures, "some injected fault must fail the growth")
		})
	}
}

// requireCanonical checks a's layout (canonical).
func requireCanonical(t *testing.T, a *arena.Arena) {
	t.Helper()
	if msg := canonical(a); msg != "" {
		require.Fail(t, msg)
	}
}

// canonical checks a's layout: its chunks add up to Cap, each of the
// pool's sizes, and a large one only on a block of its own. It says what
// is wrong, or "".
func canonical(a *arena.Arena) string {
	layout, c := arena.LayoutAndCap(a)
	off := 0
	for _, s := range layout {
		switch {
		case s == a.TailSize():
		case s == a.ChunkSize() && off%s != 0:
			return fmt.Sprintf("a large chunk at %d, off its block: %v", off, layout)
		case s != a.ChunkSize():
			return fmt.Sprintf("a chunk of neither size, %d bytes at %d: %v", s, off, layout)
		}
		off += s
	}
	if c != off {
		return fmt.Sprintf("the chunks add up to %d, Cap is %d: %v", off, c, layout)
	}
	return ""
}

// A growth into a block whose large chunk still waits for the device takes
// it back whole, where it lies, with no driver call: the growth ends past
// its target by the rest of that chunk (Cap a large chunk further, not a
// tail), and the bytes the arena kept are intact.
func TestMixedGrowTakesBackLargeWhole(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{Size: 2 * cg, TailSize: cg})
	a := e.arena(t, arena.Config{Streams: []acl.Stream{e.s}})
	b, err := a.Alloc(4*cg, 256)
	require.NoError(t, err)
	require.Equal(t, []int{2 * cg, 2 * cg}, arena.Layout(a))
	want := bytes.Repeat([]byte("kept in the first block "), cg/24+1)[:cg]
	head, err := b.Slice(0, cg)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(head, want))
	kernel := make(chan struct{})
	done := sync.OnceFunc(func() { close(kernel) })
	defer done() // a failure below must not leave the kernel running
	require.NoError(t, e.hd.Launch(e.s, b.Ptr(), uintptr(b.Len()), kernel))
	require.NoError(t, a.Truncate(cg))
	require.NoError(t, a.Shrink())
	require.Equal(t, 2*cg, a.Cap(), "the first block's large chunk holds Len")
	require.Equal(t, 1, e.pool.Stats().Pending, "the second block's waits for the kernel")

	maps, mallocs, access := e.fd.Calls(faultdriver.MapMem), e.fd.Calls(faultdriver.MallocPhysical), e.fd.Calls(faultdriver.MemSetAccess)
	require.NoError(t, a.Grow(2*cg)) // to 3 granules: a tail's worth into the second block
	assert.Equal(t, 4*cg, a.Cap(), "the large chunk taken back whole: past the target by a tail")
	assert.Equal(t, []int{2 * cg, 2 * cg}, arena.Layout(a))
	assert.Equal(t, maps, e.fd.Calls(faultdriver.MapMem), "taken back in place: no map")
	assert.Equal(t, mallocs, e.fd.Calls(faultdriver.MallocPhysical))
	assert.Equal(t, access, e.fd.Calls(faultdriver.MemSetAccess))
	assert.Zero(t, e.pool.Stats().Pending)
	done()
	require.NoError(t, e.hd.SynchronizeStream(e.s)) // the kernel is done with b
	got := make([]byte, cg)
	require.NoError(t, arena.CopyOut(got, head))
	assert.Equal(t, want, got)
}
