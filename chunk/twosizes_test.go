package chunk_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/logtest"
	"github.com/vmarena/vmarena/internal/sched"
)

// The pools of two sizes below: large chunks of big, tail chunks of g, k
// units to a large chunk.
const (
	big = 4 * g
	k   = big / g
)

// twoSizes returns a pool of two sizes (big and g) made with cfg on a host
// driver counted by a fault driver, closed at the end of the test.
func twoSizes(t *testing.T, cfg chunk.Config) (*faultdriver.Driver, *chunk.Pool) {
	t.Helper()
	fd := faultdriver.New(newDriver(t, 64<<20))
	cfg.Size, cfg.TailSize = big, g
	p, err := chunk.New(fd, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return fd, p
}

// sizes returns the Sizes of cs.
func sizes(cs []chunk.Chunk) []uintptr {
	out := make([]uintptr, len(cs))
	for i, c := range cs {
		out[i] = c.Size
	}
	return out
}

// The cache keeps one list per size: a chunk goes back to the list of the
// size it was lent with, a tail ask takes tail chunks (the last put back
// first) and leaves the large ones, an exact ask (Acquire) takes large ones
// only, the bound counts both by their bytes (MaxCached large chunks' worth),
// and Trim frees both.
func TestTailCacheBySize(t *testing.T) {
	fd, p := twoSizes(t, chunk.Config{MaxCached: 2})
	l, tn := p.Lender(), chunk.NewTenant()
	require.Equal(t, big, p.ChunkSize())
	require.Equal(t, g, p.TailSize())
	require.Equal(t, g, p.Stats().TailSize)

	cs, err := l.TakeFree(nil, tn, chunk.Ask{Units: k + 2, Large: 1})
	require.NoError(t, err)
	require.Equal(t, []uintptr{big, g, g}, sizes(cs), "the large chunk first, then the tail ones")
	for _, c := range cs {
		require.NoError(t, l.Put(c))
	}
	st := p.Stats()
	assert.Equal(t, 3, st.Cached)
	assert.Equal(t, int64(big+2*g), st.CachedBytes)

	allocs := fd.Calls(faultdriver.MallocPhysical)
	got, err := l.TakeFree(nil, tn, chunk.Ask{Units: 1})
	require.NoError(t, err)
	assert.Equal(t, []chunk.Chunk{cs[2]}, got, "the tail chunk put back last")
	lg, err := l.Acquire(tn, 1)
	require.NoError(t, err)
	assert.Equal(t, []chunk.Chunk{cs[0]}, lg, "the large chunk, not the tail one on top of the cache")
	assert.Equal(t, allocs, fd.Calls(faultdriver.MallocPhysical), "all from the cache")
	st = p.Stats()
	assert.Equal(t, 1, st.Cached, "the other tail chunk")
	assert.Equal(t, int64(g), st.CachedBytes)
	assert.Equal(t, int64(2), st.Hits)

	// The large chunk, then five tail chunks (the one cached, three fresh
	// and the first), come back to a cache of two large chunks' bytes: the
	// large one and four tail ones are cached, the fifth freed. Counted in
	// chunks, the bound would have cached a tail chunk and freed four.
	more, err := l.TakeFree(nil, tn, chunk.Ask{Units: 4})
	require.NoError(t, err)
	require.Equal(t, []uintptr{g, g, g, g}, sizes(more))
	require.NoError(t, l.Put(lg[0]))
	for _, c := range append(more, got...) {
		require.NoError(t, l.Put(c))
	}
	st = p.Stats()
	assert.Equal(t, 5, st.Cached, "the bound counts the bytes of chunks of both sizes")
	assert.Equal(t, int64(2*big), st.CachedBytes)
	assert.Equal(t, int64(1), st.Evictions)
	assert.Equal(t, st.CachedBytes, st.HeldBytes)

	require.NoError(t, p.Trim())
	st = p.Stats()
	assert.Zero(t, st.Cached)
	assert.Zero(t, st.CachedBytes)
	assert.Zero(t, st.HeldBytes)
	assert.Zero(t, st.Conversions)
}

// With no large chunk cached and no room for a fresh one, tail chunks from
// the cache stand in for the large ones an ask allows, with no driver call;
// with room, a fresh large chunk comes before the cached tail ones.
func TestTakeStandsInTailChunks(t *testing.T) {
	fd, p := twoSizes(t, chunk.Config{Budget: 2 * big})
	l, tn := p.Lender(), chunk.NewTenant()
	tails, err := l.TakeFree(nil, tn, chunk.Ask{Units: k})
	require.NoError(t, err)
	lg, err := l.Acquire(tn, 1)
	require.NoError(t, err)
	require.NoError(t, l.PutBack(tails)) // k tail chunks cached, the budget full

	calls := fd.Calls(faultdriver.Any)
	got, err := l.TakeFree(nil, tn, chunk.Ask{Units: k, Large: 1})
	require.NoError(t, err)
	assert.Equal(t, []uintptr{g, g, g, g}, sizes(got), "tail chunks stand in for the large one")
	assert.Equal(t, calls, fd.Calls(faultdriver.Any), "no driver call")
	assert.Zero(t, p.Stats().Conversions)
	assert.Zero(t, p.Stats().Cached)
	require.NoError(t, l.PutBack(got))

	// Room for a large chunk: a fresh one comes first.
	require.NoError(t, l.Free(lg[0]))
	got, err = l.TakeFree(nil, tn, chunk.Ask{Units: k, Large: 1})
	require.NoError(t, err)
	assert.Equal(t, []uintptr{big}, sizes(got))
	assert.Equal(t, k, p.Stats().Cached, "the tail chunks stay cached")
	require.NoError(t, l.PutBack(got))
}

// A budget full of cached large chunks serves a tail ask by conversion: the
// cached large chunk it cannot use is freed and tail chunks are allocated
// in its room. While it is freed its bytes stay held for the conversion: the
// pool never holds more than its budget, and no other take (a TakeFree, or
// an Acquire that relieves) gets the room. An exact ask converts cached tail
// chunks the same way.
func TestTakeConvertsCachedChunks(t *testing.T) {
	hd := &holdFree{Driver: newDriver(t, 64<<20)}
	p, err := chunk.New(hd, chunk.Config{Size: big, TailSize: g, Budget: 2 * big})
	require.NoError(t, err)
	defer func() { assert.NoError(t, p.Close()) }()
	l, tn := p.Lender(), chunk.NewTenant()
	lg, err := l.Acquire(tn, 2)
	require.NoError(t, err)
	require.NoError(t, l.Put(lg[1])) // one large chunk in use, one cached: the budget full

	awaits := make(chan struct{}, 1)
	defer sched.Set(func(pt sched.Point, _ any) {
		if pt == sched.FreesAwaited {
			select {
			case awaits <- struct{}{}:
			default:
			}
		}
	})()
	var got []chunk.Chunk
	acquired := make(chan error, 1)
	entered, release := hd.hold()
	converted := make(chan error, 1)
	go func() {
		var err error
		got, err = l.TakeFree(nil, tn, chunk.Ask{Units: 1})
		converted <- err
	}()
	select {
	case <-entered: // the conversion frees the cached large chunk
	case err := <-converted:
		close(release) // the next free, the pool's Close's, goes through
		t.Fatalf("the take freed nothing: %v", err)
	}
	func() {
		defer close(release)
		st := p.Stats()
		assert.Equal(t, int64(2*big), st.HeldBytes, "the large chunk's bytes are held for the conversion")
		assert.Equal(t, 1, st.Freeing)
		assert.Zero(t, st.Cached)
		assert.False(t, l.Fits(1))
		_, err := l.TakeFree(nil, tn, chunk.Ask{Units: 1})
		assert.ErrorIs(t, err, chunk.ErrBudget, "no room while the conversion frees")
		go func() {
			_, err := l.Acquire(tn, 1)
			acquired <- err
		}()
		<-awaits // the Acquire's relief waits for the free
		assert.Equal(t, int64(2*big), p.Stats().HeldBytes)
	}()
	require.NoError(t, <-converted)
	assert.Equal(t, []uintptr{g}, sizes(got))
	require.ErrorIs(t, <-acquired, chunk.ErrBudget, "the room left is less than a large chunk")
	st := p.Stats()
	assert.Equal(t, int64(1), st.Conversions)
	assert.Equal(t, int64(big+g), st.HeldBytes, "the rest of the converted chunk went back to the driver")
	assert.Equal(t, int64(big+g), st.InUseBytes)
	assert.Zero(t, st.Cached)

	// k-1 more tail chunks fill the budget; cached, their k tail chunks
	// are converted for a large one.
	tails, err := l.TakeFree(got, tn, chunk.Ask{Units: k - 1})
	require.NoError(t, err)
	require.Len(t, tails, k)
	require.NoError(t, l.PutBack(tails))
	assert.Equal(t, int64(2*big), p.Stats().HeldBytes)
	more, err := l.Acquire(tn, 1)
	require.NoError(t, err)
	assert.Equal(t, []uintptr{big}, sizes(more), "tail chunks never stand in for an exact ask")
	st = p.Stats()
	assert.Equal(t, int64(1+k), st.Conversions)
	assert.Equal(t, int64(2*big), st.HeldBytes)
	assert.Zero(t, st.Cached)
	require.NoError(t, l.PutBack(append(more, lg[0])))
}

// A take the cache and the budget cannot make whole, even with the cached
// chunks it would convert, takes, allocates and frees nothing; Fits counts
// the cached chunks of both sizes.
func TestTakeAllOrNothingTwoSizes(t *testing.T) {
	fd, p := twoSizes(t, chunk.Config{Budget: 2 * big})
	l, tn := p.Lender(), chunk.NewTenant()
	lg, err := l.Acquire(tn, 1)
	require.NoError(t, err)
	one, err := l.TakeFree(nil, tn, chunk.Ask{Units: 1})
	require.NoError(t, err)
	require.NoError(t, l.PutBack(one)) // a tail chunk cached, room for k-1 more units

	assert.True(t, l.Fits(k))
	assert.False(t, l.Fits(k+1))
	check := func(units, large int) {
		t.Helper()
		calls, st := fd.Calls(faultdriver.Any), p.Stats()
		for _, take := range []func([]chunk.Chunk, chunk.Tenant, chunk.Ask) ([]chunk.Chunk, error){l.TakeFree, l.TryAcquire} {
			got, err := take(nil, tn, chunk.Ask{Units: units, Large: large})
			require.ErrorIs(t, err, chunk.ErrBudget)
			assert.Empty(t, got)
		}
		assert.Equal(t, calls, fd.Calls(faultdriver.Any), "no driver call")
		after := p.Stats()
		assert.Equal(t, st.Cached, after.Cached)
		assert.Equal(t, st.HeldBytes, after.HeldBytes)
		assert.Equal(t, st.Hits, after.Hits, "nothing taken and put back")
		assert.Equal(t, st.Conversions, after.Conversions)
	}
	check(k+1, 1)
	check(k+1, 0)
	got, err := l.TakeFree(nil, tn, chunk.Ask{Units: k, Large: 1})
	require.NoError(t, err)
	assert.Equal(t, []uintptr{g, g, g, g}, sizes(got), "the cached tail chunk and k-1 fresh ones")
	require.NoError(t, l.PutBack(got))

	// The large chunk cached, a tail chunk in use: 2k-1 units fit by
	// conversion, 2k do not, and cost nothing.
	require.NoError(t, l.Put(lg[0]))
	in, err := l.TakeFree(nil, tn, chunk.Ask{Units: 1})
	require.NoError(t, err)
	require.NoError(t, p.Trim()) // the other tail chunks
	lg, err = l.Acquire(tn, 1)
	require.NoError(t, err)
	require.NoError(t, l.Put(lg[0]))
	require.Equal(t, int64(big+g), p.Stats().HeldBytes)
	assert.True(t, l.Fits(2*k-1))
	assert.False(t, l.Fits(2*k))
	check(2*k, 0)
	got, err = l.TakeFree(nil, tn, chunk.Ask{Units: 2*k - 1})
	require.NoError(t, err)
	assert.Len(t, got, 2*k-1)
	assert.Equal(t, int64(1), p.Stats().Conversions)
	assert.Equal(t, int64(2*big), p.Stats().HeldBytes)
	require.NoError(t, l.PutBack(append(got, in...)))
}

// giver is a Client that holds chunks mapped, lowest first, uses none of
// them and gives them whole from the top, counting units of unit bytes. One
// growth at a time uses it (its relief runs on the growth's goroutine).
type giver struct {
	unit uintptr
	ms   []chunk.Mapped
}

func (c *giver) held() int {
	n := 0
	for _, m := range c.ms {
		n += int(m.C.Size / c.unit)
	}
	return n
}

func (c *giver) Reclaimable(chunk.Ticket) (int, bool) { return c.held(), true }

func (c *giver) Held() int { return c.held() }

func (c *giver) Give(n int, _ chunk.Ticket, take func([]chunk.Mapped, []acl.Stream)) (int, bool) {
	i, given := len(c.ms), 0
	for i > 0 && given < n {
		i--
		given += int(c.ms[i].C.Size / c.unit)
	}
	if given > 0 {
		take(slices.Clone(c.ms[i:]), nil)
		c.ms = c.ms[:i]
	}
	return given, false
}

func (c *giver) Refill() {}

// unitTaking is taking (protocol_test.go) counted in units of unit bytes: a
// growth of n units, which keeps what a relief hands it when that makes n.
type unitTaking struct {
	taking
	unit uintptr
}

func (tk *unitTaking) Place(have []chunk.Chunk) (chunk.Step, error) {
	tk.states = append(tk.states, tk.g.State())
	h := 0
	for _, c := range have {
		h += int(c.Size / tk.unit)
	}
	if h >= tk.n {
		tk.got = have
		return chunk.Step{}, nil
	}
	got, err := tk.p.TakeFree(have, 0, chunk.Ask{Units: tk.n - h, Large: (tk.n - h) / k})
	if err != nil {
		if err := tk.p.PutBack(have); err != nil {
			return chunk.Step{}, err
		}
		return chunk.Step{Missing: tk.n - h, Short: err}, nil
	}
	tk.got = got
	return chunk.Step{}, nil
}

// A relief counts units: what a growth lacks, what a member can give and
// gives (whole chunks of both sizes, past what was asked), and what a chunk
// waiting for the device holds (a large one serves a growth of several
// tail units).
func TestReliefCountsUnits(t *testing.T) {
	t.Run("member", func(t *testing.T) {
		d := scrubDriver(t, 64<<20)
		log := &logtest.Recorder{}
		p, err := chunk.New(d, chunk.Config{Size: big, TailSize: g, Budget: 2 * big, Logger: slog.New(log)})
		require.NoError(t, err)
		defer func() { assert.NoError(t, p.Close()) }()
		base, err := d.ReserveMemAddress(2*big, 0, 0, 0)
		require.NoError(t, err)
		defer func() { assert.NoError(t, d.ReleaseMemAddress(base)) }()
		l, tn := p.Lender(), chunk.NewTenant()
		cs, err := l.TakeFree(nil, tn, chunk.Ask{Units: k + 2, Large: 1})
		require.NoError(t, err)
		_, err = l.MapRange(base, cs, nil)
		require.NoError(t, err)
		gv := &giver{unit: g, ms: []chunk.Mapped{{At: base, C: cs[0]}, {At: base.Add(big), C: cs[1]}, {At: base.Add(big + g), C: cs[2]}}}
		m, err := l.Join(gv, false)
		require.NoError(t, err)
		defer m.Leave()

		// k+1 units, room for two: the relief asks the member for k-1, and
		// it gives its two tail chunks and its large one, k+2 units.
		var gr chunk.Growth
		tk := &unitTaking{taking: taking{p: l, g: &gr, n: k + 1}, unit: g}
		tk.mu.Lock()
		err = l.Grow(context.Background(), &gr, tn, tk, chunk.MayRelieve)
		tk.mu.Unlock()
		require.NoError(t, err)
		assert.ElementsMatch(t, cs, tk.got, "the member's chunks, handed over")
		assert.Equal(t, []chunk.GrowthState{chunk.GrowLocked, chunk.GrowRelieving, chunk.GrowLocked}, tk.states)
		relief := log.Find(chunk.EventRelieve)
		require.Len(t, relief, 1)
		assert.Equal(t, int64(k+1), relief[0].Attrs["need"].Int64(), "units")
		assert.Equal(t, int64(k+2), relief[0].Attrs["freed"].Int64(), "units")
		assert.Equal(t, int64(3), relief[0].Attrs["reclaimed"].Int64(), "chunks")
		assert.Equal(t, int64(3), p.Stats().Reclaimed)
		assert.Zero(t, gv.Held())
		require.NoError(t, l.PutBack(tk.got))
	})
	t.Run("waiting", func(t *testing.T) {
		d := scrubDriver(t, 64<<20)
		p, err := chunk.New(d, chunk.Config{Size: big, TailSize: g, Budget: 2 * big})
		require.NoError(t, err)
		defer func() { assert.NoError(t, p.Close()) }()
		base, err := d.ReserveMemAddress(big, 0, 0, 0)
		require.NoError(t, err)
		defer func() { assert.NoError(t, d.ReleaseMemAddress(base)) }()
		l, tn := p.Lender(), chunk.NewTenant()
		lg, err := l.Acquire(tn, 2)
		require.NoError(t, err)
		require.NoError(t, l.Map(base, lg[0]))
		m, err := l.Join(&giver{unit: g}, false)
		require.NoError(t, err)
		defer m.Leave()
		require.NoError(t, m.ReleaseAfterDevice([]chunk.Mapped{{At: base, C: lg[0]}}))

		// k-1 units, no room: the large chunk waiting for the device holds
		// k, and the relief takes it.
		var gr chunk.Growth
		tk := &unitTaking{taking: taking{p: l, g: &gr, n: k - 1}, unit: g}
		tk.mu.Lock()
		err = l.Grow(context.Background(), &gr, tn, tk, chunk.MayRelieve)
		tk.mu.Unlock()
		require.NoError(t, err)
		assert.Equal(t, []chunk.Chunk{lg[0]}, tk.got)
		require.NoError(t, l.PutBack(append(tk.got, lg[1])))
	})
}

// ReclaimSpan takes back the waiting chunks that start in its span, of
// both sizes: a large one whole, past the span's end, and none that starts
// before it.
func TestReclaimSpanMixedSizes(t *testing.T) {
	d, p, base, s := poolReserving(t, 64<<20, chunk.Config{Size: 2 * g, TailSize: g}, nil, 4*g)
	l, tn := p.Lender(), chunk.NewTenant()
	t0, err := l.TakeFree(nil, tn, chunk.Ask{Units: 1})
	require.NoError(t, err)
	lg, err := l.Acquire(tn, 1)
	require.NoError(t, err)
	t1, err := l.TakeFree(nil, tn, chunk.Ask{Units: 1})
	require.NoError(t, err)
	cs := []chunk.Chunk{t0[0], lg[0], t1[0]} // at base, base+g (to base+3g), base+3g
	kernel, _ := released(t, d, l, base, s, cs)

	// The pool walks a short span place by place, and looks at each waiting
	// chunk for a long one: both take the chunks that start in the span.
	ms, busy := l.ReclaimSpan(base.Add(2*g), base.Add(3*g), nil)
	require.True(t, busy.IsZero())
	assert.Empty(t, ms, "the large chunk starts before the span")
	ms, busy = l.ReclaimSpan(base.Add(2*g), base.Add(64*g), nil)
	require.True(t, busy.IsZero())
	assert.Equal(t, []chunk.Mapped{{At: base.Add(3 * g), C: cs[2]}}, ms, "the large chunk starts before the span")
	ms, busy = l.ReclaimSpan(base, base.Add(3*g), nil)
	require.True(t, busy.IsZero())
	assert.Equal(t, []chunk.Mapped{{At: base, C: cs[0]}, {At: base.Add(g), C: cs[1]}}, ms,
		"the large chunk starts in the span: taken whole, to base+3g")
	assert.Zero(t, p.Stats().Pending)

	close(kernel)
	require.NoError(t, d.SynchronizeStream(s))
	at := base
	for _, c := range cs {
		require.NoError(t, l.Release(at, c))
		at = at.Add(c.Size)
	}
	require.NoError(t, l.PutBack(cs))
}

// Large chunks idle in the cache beyond what the worker keeps ahead become
// tail chunks before the pool holds more: a tail take with room in the
// budget, and none, converts one rather than allocating beside it, and
// leaves the chunks kept ahead.
func TestTakeTurnsIdleLargeChunksIntoTails(t *testing.T) {
	for _, budget := range []int64{0, 8 * big} {
		t.Run(fmt.Sprintf("budget=%d", budget), func(t *testing.T) {
			p, err := chunk.New(newDriver(t, 64<<20), chunk.Config{Size: big, TailSize: g, Budget: budget, Ahead: 1})
			require.NoError(t, err)
			defer func() { assert.NoError(t, p.Close()) }()
			l, tn := p.Lender(), chunk.NewTenant()
			lg, err := l.Acquire(tn, 3)
			require.NoError(t, err)
			l.Settle() // the worker made its chunk ahead
			require.NoError(t, l.PutBack(lg))
			require.Equal(t, 4, p.Stats().Cached, "four cached, one of them the worker's ahead")
			got, err := l.TakeFree(nil, tn, chunk.Ask{Units: 1})
			require.NoError(t, err)
			require.Len(t, got, 1)
			assert.Equal(t, uintptr(g), got[0].Size)
			st := p.Stats()
			assert.Equal(t, int64(1), st.Conversions, "an idle large chunk became the tail")
			assert.Equal(t, int64(3*big+g), st.HeldBytes, "the rest of its bytes went back")
			got, err = l.TakeFree(got, tn, chunk.Ask{Units: 2 * big / g})
			require.NoError(t, err)
			st = p.Stats()
			assert.Equal(t, int64(3), st.Conversions, "the other two idle ones, for these")
			assert.Equal(t, 1, st.Cached, "the chunk kept ahead stays")
			assert.Equal(t, int64(big+(1+2*big/g)*g), st.HeldBytes)
			require.NoError(t, l.PutBack(got))
		})
	}
}

// Warm, like the bound, measures the cache in bytes: tail chunks worth one
// large chunk leave room for one more large chunk under MaxCached 2 (counted
// in chunks, the four tails would have filled the cache).
func TestWarmCountsCachedBytes(t *testing.T) {
	_, p := twoSizes(t, chunk.Config{MaxCached: 2})
	l, tn := p.Lender(), chunk.NewTenant()
	tails, err := l.TakeFree(nil, tn, chunk.Ask{Units: k})
	require.NoError(t, err)
	require.Equal(t, []uintptr{g, g, g, g}, sizes(tails))
	for _, c := range tails {
		require.NoError(t, l.Put(c))
	}
	added, err := p.Warm(10)
	require.NoError(t, err)
	assert.Equal(t, 1, added, "one large chunk: the cache then holds two large chunks' bytes")
	st := p.Stats()
	assert.Equal(t, 5, st.Cached)
	assert.Equal(t, int64(2*big), st.CachedBytes)
	require.NoError(t, p.Trim())
}

// A conversion whose free fails keeps the chunk the driver kept, cached and
// held, and converts nothing with it: a take whose every free fails falls
// short on the budget (no room was made), the books still add up, nothing
// is counted as converted, and the next take converts it; one failed free
// is retried by the take's second pass. A conversion whose allocation fails
// after its free gives the freed room back to the budget.
func TestConversionFaults(t *testing.T) {
	books := func(t *testing.T, p *chunk.Pool) chunk.Stats {
		t.Helper()
		st := p.Stats()
		assert.Equal(t, st.InUseBytes+st.CachedBytes+st.FreeingBytes, st.HeldBytes, "%+v", st)
		return st
	}
	// setup fills the budget: one large chunk in use (returned), one cached.
	setup := func(t *testing.T) (*faultdriver.Driver, *chunk.Pool, chunk.Chunk) {
		t.Helper()
		fd, p := twoSizes(t, chunk.Config{Budget: 2 * big})
		lg, err := p.Lender().Acquire(chunk.NewTenant(), 2)
		require.NoError(t, err)
		require.NoError(t, p.Lender().Put(lg[1]))
		return fd, p, lg[0]
	}
	// take takes a tail chunk, checks the books and the conversions
	// counted so far, and puts it and in back.
	take := func(t *testing.T, p *chunk.Pool, in chunk.Chunk, converted int64) {
		t.Helper()
		got, err := p.Lender().TryAcquire(nil, chunk.NewTenant(), chunk.Ask{Units: 1})
		require.NoError(t, err)
		assert.Equal(t, []uintptr{g}, sizes(got))
		st := books(t, p)
		assert.Equal(t, converted, st.Conversions)
		assert.Equal(t, int64(big+g), st.HeldBytes)
		require.NoError(t, p.Lender().PutBack(append(got, in)))
	}
	t.Run("every free", func(t *testing.T) {
		fd, p, in := setup(t)
		fd.FailAfter(faultdriver.FreePhysical, 0, acl.ErrCodeRTDrvInternal)
		_, err := p.Lender().TryAcquire(nil, chunk.NewTenant(), chunk.Ask{Units: 1})
		require.ErrorIs(t, err, chunk.ErrBudget)
		assert.Positive(t, fd.Injected(faultdriver.FreePhysical))
		st := books(t, p)
		assert.Equal(t, 1, st.Cached, "the chunk the driver kept")
		assert.Equal(t, int64(2*big), st.HeldBytes)
		assert.Zero(t, st.Conversions)
		fd.Clear()
		take(t, p, in, 1)
	})
	t.Run("one free", func(t *testing.T) {
		fd, p, in := setup(t)
		fd.FailNth(faultdriver.FreePhysical, 1, acl.ErrCodeRTDrvInternal)
		take(t, p, in, 1)
		assert.Equal(t, int64(1), fd.Injected(faultdriver.FreePhysical))
	})
	t.Run("allocation", func(t *testing.T) {
		fd, p, in := setup(t)
		fd.FailNth(faultdriver.MallocPhysical, 1, acl.ErrCodeRTDrvInternal)
		_, err := p.Lender().TryAcquire(nil, chunk.NewTenant(), chunk.Ask{Units: 1})
		require.Error(t, err)
		st := books(t, p)
		assert.Equal(t, int64(1), st.Conversions, "the large chunk was freed")
		assert.Zero(t, st.Cached)
		assert.Equal(t, int64(big), st.HeldBytes, "its room went back to the budget")
		take(t, p, in, 1) // the room is there now: a fresh tail
	})
}
