package arena_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/logtest"
	"github.com/vmarena/vmarena/internal/sched"
)

const wg = acl.HugePageSize

// tenants is a pool with a budget of 4 chunks and a holder arena that uses
// all of them, for the waiting tests.
type tenants struct {
	d      *host.Driver
	pool   *chunk.Pool
	holder *arena.Arena
}

func newTenants(t *testing.T, drv acl.Driver, d *host.Driver, holder arena.Config) *tenants {
	t.Helper()
	if drv == nil {
		drv = d
	}
	pool, err := chunk.New(drv, chunk.Config{Budget: 4 * wg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	holder.Pool, holder.Reserve = pool, 16<<20
	h := isoArena(t, holder)
	_, err = h.Alloc(4*wg, 1)
	require.NoError(t, err)
	return &tenants{d: d, pool: pool, holder: h}
}

// waiting waits until n growths wait in the pool's queue.
func (e *tenants) waiting(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.pool.Lender().Waiters() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters, want %d", e.pool.Lender().Waiters(), n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// parked waits until n growths wait, every one parked with no wake-up
// pending: whatever woke them has been answered.
func (e *tenants) parked(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l := e.pool.Lender(); l.Waiters() != n || l.Parked() != n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters, %d parked, want %d", l.Waiters(), l.Parked(), n)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// A GrowContext that finds the budget spent waits, holding no lock, until
// another tenant gives memory back, however it does.
func TestGrowContextWokenByRelease(t *testing.T) {
	// Before the wait, promise holds the memory with Grow instead of Len,
	// so that only Shrink gives it up.
	promise := func(t *testing.T, h *arena.Arena) {
		require.NoError(t, h.Truncate(2*wg))
		require.NoError(t, h.Grow(2*wg))
	}
	shrink := func(t *testing.T, h *arena.Arena) { require.NoError(t, h.Shrink()) }
	releases := []struct {
		name    string
		streams bool
		prep    func(t *testing.T, h *arena.Arena)
		drop    func(t *testing.T, h *arena.Arena)
	}{
		{"reset", false, nil, func(t *testing.T, h *arena.Arena) { require.NoError(t, h.Reset()) }},
		{"truncate", false, nil, func(t *testing.T, h *arena.Arena) { require.NoError(t, h.Truncate(wg)) }},
		{"shrink", false, promise, shrink},
		{"shrink with streams", true, promise, shrink},
		{"close", false, nil, func(t *testing.T, h *arena.Arena) { require.NoError(t, h.Close()) }},
	}
	for _, r := range releases {
		t.Run(r.name, func(t *testing.T) {
			d := isoDriver(t, 64<<20)
			var cfg arena.Config
			if r.streams {
				s, err := d.CreateStream()
				require.NoError(t, err)
				t.Cleanup(func() { assert.NoError(t, d.DestroyStream(s)) })
				cfg.Streams = []acl.Stream{s}
			}
			e := newTenants(t, nil, d, cfg)
			if r.prep != nil {
				r.prep(t, e.holder)
			}
			log := &logtest.Recorder{}
			w := isoArena(t, arena.Config{Pool: e.pool, Reserve: 16 << 20, Logger: slog.New(log)})
			done := make(chan error, 1)
			go func() { done <- w.GrowContext(context.Background(), 2*wg) }()
			e.waiting(t, 1)
			select {
			case err := <-done:
				t.Fatalf("GrowContext returned before any release: %v", err)
			default:
			}
			// The arena is usable meanwhile: its lock is free.
			assert.Equal(t, 0, w.Stats().Mapped)
			r.drop(t, e.holder)
			require.NoError(t, <-done)
			assert.GreaterOrEqual(t, w.Cap()-w.Len(), 2*wg)
			act := w.Activity()
			assert.Equal(t, int64(1), act.Waits)
			assert.Positive(t, act.WaitTime)
			assert.Zero(t, act.OOMs, "the tries of a wait that succeeds are no failures")
			assert.Empty(t, log.Find(arena.EventOOM))
			ev := log.Find(arena.EventWait)
			require.Len(t, ev, 1)
			assert.Equal(t, "granted", ev[0].Attrs["outcome"].String())
			assert.Equal(t, slog.LevelInfo, ev[0].Level)
			assert.Zero(t, e.pool.Lender().Waiters())
		})
	}
}

// When ctx is done first, GrowContext fails with an error matching both
// ctx.Err() and ErrOutOfMemory, and the arena and the driver are as they
// were.
func TestGrowContextExpires(t *testing.T) {
	d := isoDriver(t, 64<<20)
	e := newTenants(t, nil, d, arena.Config{})
	log := &logtest.Recorder{}
	w := isoArena(t, arena.Config{Pool: e.pool, Reserve: 16 << 20, Logger: slog.New(log)})
	before, live := w.Stats(), d.Live()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	err := w.GrowContext(ctx, wg)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	require.ErrorIs(t, err, chunk.ErrBudget)
	assert.Equal(t, before, w.Stats())
	assert.Equal(t, live, d.Live())
	assert.Zero(t, e.pool.Lender().Waiters())
	act := w.Activity()
	assert.Equal(t, int64(1), act.OOMs, "counted once")
	assert.Equal(t, int64(1), act.Waits)
	assert.Positive(t, act.WaitTime)
	require.Len(t, log.Find(arena.EventOOM), 1)
	ev := log.Find(arena.EventWait)
	require.Len(t, ev, 1)
	assert.Equal(t, "gave up", ev[0].Attrs["outcome"].String())
	assert.Equal(t, slog.LevelWarn, ev[0].Level)

	// AllocContext too.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	_, err = w.AllocContext(ctx2, wg, 1)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	assert.Equal(t, before, w.Stats())
}

// A growth the budget could never hold, and errors other than memory, fail
// at once: nothing would ever wake them.
func TestGrowContextFailsAtOnce(t *testing.T) {
	d := isoDriver(t, 64<<20)
	e := newTenants(t, nil, d, arena.Config{})
	w := isoArena(t, arena.Config{Pool: e.pool, Reserve: 16 << 20})
	ctx := context.Background() // never done: a wait would hang the test
	require.ErrorIs(t, w.GrowContext(ctx, 5*wg), arena.ErrOutOfMemory)
	require.ErrorIs(t, w.GrowContext(ctx, 32<<20), arena.ErrExhausted)
	require.ErrorIs(t, w.GrowContext(ctx, -1), arena.ErrInvalid)
	_, err := w.AllocContext(ctx, 64, 3)
	require.ErrorIs(t, err, arena.ErrInvalid)
	assert.Zero(t, w.Activity().Waits)
	assert.Equal(t, int64(1), w.Activity().OOMs)
	var nilArena *arena.Arena
	require.ErrorIs(t, nilArena.GrowContext(ctx, 1), arena.ErrClosed)
	_, err = nilArena.AllocContext(ctx, 1, 1)
	require.ErrorIs(t, err, arena.ErrClosed)
	require.NoError(t, w.Close())
	require.ErrorIs(t, w.GrowContext(ctx, wg), arena.ErrClosed)
}

// Waiters are served in order: a large growth at the head is not overtaken
// by a smaller one behind it that would fit first.
func TestGrowContextFirstComeFirstServed(t *testing.T) {
	d := isoDriver(t, 64<<20)
	e := newTenants(t, nil, d, arena.Config{})
	big := isoArena(t, arena.Config{Pool: e.pool, Reserve: 16 << 20})
	small := isoArena(t, arena.Config{Pool: e.pool, Reserve: 16 << 20})
	// The order is recorded where the pool serves a waiter, before it leaves
	// the queue and the next waiter's turn comes.
	var mu sync.Mutex
	var order []string
	names := map[any]string{big: "big", small: "small"}
	defer sched.Set(func(p sched.Point, who any) {
		if p == sched.WaitServed {
			mu.Lock()
			order = append(order, names[who])
			mu.Unlock()
		}
	})()
	var wgr sync.WaitGroup
	grow := func(name string, a *arena.Arena, n int) {
		defer wgr.Done()
		assert.NoError(t, a.GrowContext(context.Background(), n), name)
	}
	wgr.Add(2)
	go grow("big", big, 3*wg)
	e.waiting(t, 1)
	go grow("small", small, wg)
	e.waiting(t, 2)

	// One chunk comes free: enough for the small growth, not the big one,
	// which is first. Nobody gets it yet. Truncate wakes whom it wakes
	// before it returns; once both waiters are parked again with no
	// wake-up pending, every wake-up was answered and nobody was served.
	require.NoError(t, e.holder.Truncate(3*wg))
	e.parked(t, 2)
	assert.Equal(t, 2, e.pool.Lender().Waiters())
	mu.Lock()
	assert.Empty(t, order)
	mu.Unlock()

	require.NoError(t, e.holder.Reset())
	wgr.Wait()
	assert.Equal(t, []string{"big", "small"}, order)
	assert.Equal(t, 3*wg, big.Cap())
	assert.Equal(t, wg, small.Cap())
}

// Faults injected into the driver through the waiting path: an injected
// out-of-memory makes the growth wait, and a release lets it through; an
// injected failure of another kind ends the wait with that error, the arena
// as it was.
func TestGrowContextFaults(t *testing.T) {
	d := isoDriver(t, 64<<20)
	fd := faultdriver.New(d)
	e := newTenants(t, fd, d, arena.Config{})
	require.NoError(t, e.holder.Truncate(2*wg)) // two chunks free to reclaim
	w := isoArena(t, arena.Config{Pool: e.pool, Reserve: 16 << 20})

	// A device out of memory, then a release.
	fd.FailAfter(faultdriver.MapMem, 0, acl.ErrCodeRTMemoryAllocation)
	done := make(chan error, 1)
	go func() { done <- w.GrowContext(context.Background(), wg) }()
	e.waiting(t, 1)
	fd.Clear()
	require.NoError(t, e.holder.Truncate(wg))
	require.NoError(t, <-done)
	assert.Equal(t, wg, w.Cap())

	// The holder uses the other three chunks; waiting, then a map failure
	// that is not out of memory.
	require.NoError(t, e.holder.Grow(2*wg))
	_, err := e.holder.Alloc(2*wg, 1)
	require.NoError(t, err)
	require.Equal(t, 3*wg, e.holder.Len())
	before := w.Stats()
	go func() { done <- w.GrowContext(context.Background(), 2*wg) }()
	e.waiting(t, 1)
	fd.FailNth(faultdriver.MapMem, 1, 0)
	require.NoError(t, e.holder.Truncate(wg))
	err = <-done
	require.Error(t, err)
	assert.True(t, isInjected(err), "%v", err)
	assert.NotErrorIs(t, err, arena.ErrOutOfMemory)
	after := w.Stats()
	before.Maps, before.Unmaps = after.Maps, after.Unmaps
	assert.Equal(t, before, after)
	assert.Equal(t, (w.Cap()+e.holder.Cap())/wg, d.Live().Mappings, "nothing mapped is lost")
	assert.Zero(t, e.pool.Lender().Waiters())
}

// A waiting AllocContext returns the buffer it waited for.
func TestAllocContextWaits(t *testing.T) {
	d := isoDriver(t, 64<<20)
	e := newTenants(t, nil, d, arena.Config{})
	w := isoArena(t, arena.Config{Pool: e.pool, Reserve: 16 << 20})
	type result struct {
		b   arena.Buffer
		err error
	}
	done := make(chan result, 1)
	go func() {
		b, err := w.AllocContext(context.Background(), 3*wg, 64)
		done <- result{b, err}
	}()
	e.waiting(t, 1)
	require.NoError(t, e.holder.Reset())
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, 3*wg, r.b.Len())
	require.NoError(t, arena.CopyIn(r.b, []byte("waited")))
}

// Closing the pool wakes its waiters, whose tries then fail at once.
func TestGrowContextPoolClosed(t *testing.T) {
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: wg})
	require.NoError(t, err)
	h := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, h.Grow(wg))
	w := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	done := make(chan error, 1)
	go func() { done <- w.GrowContext(context.Background(), wg) }()
	for pool.Lender().Waiters() != 1 {
		time.Sleep(100 * time.Microsecond)
	}
	_ = pool.Close() // reports h's chunk still in use
	select {
	case err := <-done:
		require.Error(t, err)
		assert.NotErrorIs(t, err, arena.ErrOutOfMemory)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the waiter")
	}
}

// Many tenants growing, waiting and dropping under one budget all get
// their turn, with no deadlock and no race.
func TestGrowContextStress(t *testing.T) {
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 4 * wg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) }) // after the arenas'
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var all sync.WaitGroup
	waits := make([]int64, 4)
	for i := range 4 {
		a := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
		all.Add(1)
		go func() {
			defer all.Done()
			for j := range 30 {
				n := (1 + (i+j)%3) * wg
				if err := a.GrowContext(ctx, n); err != nil {
					t.Error(fmt.Errorf("tenant %d, round %d: %w", i, j, err))
					return
				}
				if _, err := a.Alloc(n, 1); err != nil { // promised by GrowContext
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(i*50) * time.Microsecond)
				if err := a.Reset(); err != nil {
					t.Error(err)
					return
				}
			}
			waits[i] = a.Activity().Waits
		}()
	}
	all.Wait()
	assert.Zero(t, pool.Lender().Waiters())
	t.Logf("waits per tenant: %v", waits)
}

// A Close (or a Sleep) that comes between a GrowContext's try and its joining
// the queue of waiters wakes the arena's waiters it finds, which this one is
// not yet among, and behind another tenant's waiter nothing else wakes it;
// the growth must still see the arena closed (asleep) and return, not wait
// for memory that would be of no use to it.
func TestGrowContextClosedBeforeItQueues(t *testing.T) {
	for _, end := range []string{"close", "sleep"} {
		t.Run(end, func(t *testing.T) {
			d := isoDriver(t, 64<<20)
			e := newTenants(t, nil, d, arena.Config{})
			first := isoArena(t, arena.Config{Pool: e.pool, Reserve: 16 << 20})
			fctx, fcancel := context.WithCancel(context.Background())
			firstDone := make(chan error, 1)
			go func() { firstDone <- first.GrowContext(fctx, 2*wg) }()
			e.waiting(t, 1) // another tenant waits at the head of the queue
			defer func() {
				fcancel()
				require.ErrorIs(t, <-firstDone, context.Canceled)
			}()
			w, err := arena.New(arena.Config{Pool: e.pool, Reserve: 16 << 20})
			require.NoError(t, err)
			var once sync.Once
			ended := make(chan error, 1)
			defer sched.Set(func(p sched.Point, who any) {
				if p != sched.WaitJoining || who != w {
					return
				}
				once.Do(func() {
					if end == "close" {
						ended <- w.Close()
					} else {
						ended <- w.Sleep(context.Background(), arena.Discard)
					}
				})
			})()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err = w.GrowContext(ctx, 2*wg)
			require.NoError(t, <-ended)
			if end == "close" {
				require.ErrorIs(t, err, arena.ErrClosed)
			} else {
				require.ErrorIs(t, err, arena.ErrAsleep)
				require.NoError(t, w.Close())
			}
			require.NotErrorIs(t, err, context.DeadlineExceeded, "it waited for memory for an arena that had ended")
			assert.Equal(t, 1, e.pool.Lender().Waiters(), "the other tenant's")
		})
	}
}

// TestGrowContextClosedBeforeItQueues for a Wake: its arena closed between
// its failed try and its joining the queue, behind another tenant's waiter,
// it must return ErrClosed, not wait for memory.
func TestWakeClosedBeforeItQueues(t *testing.T) {
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 4 * wg})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	v, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	_, err = v.Alloc(2*wg, 1)
	require.NoError(t, err)
	require.NoError(t, v.Sleep(context.Background(), arena.Discard))
	holder := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	_, err = holder.Alloc(4*wg, 1) // the whole budget, in use
	require.NoError(t, err)

	first := isoArena(t, arena.Config{Pool: pool, Reserve: 16 << 20})
	fctx, fcancel := context.WithCancel(context.Background())
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.GrowContext(fctx, 2*wg) }()
	e := &tenants{d: d, pool: pool, holder: holder}
	e.waiting(t, 1) // another tenant waits at the head of the queue
	defer func() {
		fcancel()
		require.ErrorIs(t, <-firstDone, context.Canceled)
	}()

	var once sync.Once
	closed := make(chan error, 1)
	defer sched.Set(func(p sched.Point, who any) {
		if p == sched.WaitJoining && who == v {
			once.Do(func() { closed <- v.Close() })
		}
	})()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err = v.Wake(ctx)
	require.NoError(t, <-closed)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "it waited for memory for an arena that was closed")
	require.ErrorIs(t, err, arena.ErrClosed)
}
