package arena_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// stressCounts is what a stress run did.
type stressCounts struct {
	ops, allocs, grows, shrinks, truncates, closes, copies, bytesVerified, refused, kernels atomic.Int64
}

// TestStress runs many goroutines against arenas that share one budgeted
// pool: some share an arena (Alloc, Grow, Shrink, copies, and a Reset when
// it is full), some own one (also Truncate, Reset, Close and New) and copy
// from it into the shared ones, and a watcher reads every Stats. Each goroutine checks its own bytes after
// every write; at the end every buffer is read back, the invariants are
// checked, everything is closed and the driver must hold nothing. Run it
// with -race. The "faults" variants fail 2% of driver calls at random. The
// "deferred" variants give the owners' arenas a stream each, on which they
// queue stand-in kernels over their buffers, and headroom to every arena:
// the pool reclaims dropped memory between them under the tight budget, its
// worker refills headroom and unmaps what waits for the kernels, and the
// device must never see memory unmapped under its work.
func TestStress(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fault    float64
		deferred bool
	}{{"clean", 0, false}, {"faults", 0.02, false}, {"deferred", 0, true}, {"deferred-faults", 0.02, true}} {
		t.Run(tc.name, func(t *testing.T) { stress(t, tc.fault, tc.deferred) })
	}
}

// stressBuf is a buffer a goroutine owns and the bytes it wrote there.
type stressBuf struct {
	b    arena.Buffer
	data []byte
	sa   *sharedArena // the shared arena it is in, if it is
	gen  int64        // sa's generation when it was allocated
}

// sharedArena is an arena several goroutines allocate from. They hold mu
// for reading while they work; the one that finds it full takes mu for
// writing and resets it, which drops every buffer: gen counts the resets, so
// the others know to forget theirs.
type sharedArena struct {
	a   *arena.Arena
	mu  sync.RWMutex
	gen int64
}

func stress(t *testing.T, faultP float64, deferred bool) {
	rounds := envInt("VMARENA_STRESS_ROUNDS", 300)
	maxSize := 64 << 10 // bytes per buffer, at most (owners: twice that)
	budgetChunks := 32  // tight on purpose: some Allocs fail for want of memory
	if testing.Short() || raceEnabled {
		rounds /= 2
		maxSize /= 4
		budgetChunks /= 2
	}
	const (
		shared        = 4 // arenas shared by sharers goroutines each
		sharers       = 3
		owners        = 4 // goroutines with an arena of their own
		sharedReserve = 40 << 20
		ownReserve    = 16 << 20
	)
	hd, err := host.New(host.Config{Capacity: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	fd := faultdriver.New(hd)
	pool, err := chunk.New(fd, chunk.Config{Budget: int64(budgetChunks) << 21, MaxCached: 8, FreshZeroed: true})
	if err != nil {
		t.Fatal(err)
	}
	if faultP > 0 {
		fd.FailRandom(faultdriver.Any, faultP, 7, 0)
	}
	var cnt stressCounts
	errc := make(chan error, 64)
	fail := func(err error) {
		select {
		case errc <- err:
		default:
		}
	}
	// expected is an error the run tolerates: out of memory (the budget is
	// tight on purpose), the reservation is full, or an injected fault.
	expected := func(err error) bool {
		return errors.Is(err, arena.ErrOutOfMemory) || errors.Is(err, arena.ErrExhausted) || isInjected(err)
	}
	newArena := func(reserve int64, trap bool, stream acl.Stream) *arena.Arena {
		cfg := arena.Config{Pool: pool, Reserve: int(reserve), TrapStale: trap}
		if deferred {
			cfg.Headroom = 2 << 21
			if stream != 0 {
				cfg.Streams = []acl.Stream{stream}
			}
		}
		for {
			a, err := arena.New(cfg)
			if err == nil {
				return a
			}
			if !isInjected(err) {
				t.Error(err)
				return nil
			}
		}
	}
	arenas := make([]*sharedArena, shared)
	for i := range arenas {
		arenas[i] = &sharedArena{a: newArena(sharedReserve, false, 0)}
	}
	// reset resets a shared arena that gen filled (or that found the pool's
	// budget spent) and gives its memory back, unless someone did already.
	reset := func(sa *sharedArena, gen int64) {
		sa.mu.Lock()
		defer sa.mu.Unlock()
		if sa.gen != gen {
			return
		}
		sa.gen++ // even if Reset fails: a double fault may take buffers with it
		cnt.truncates.Add(1)
		if err := sa.a.Reset(); err != nil && !isInjected(err) {
			fail(err)
		}
		if err := sa.a.Shrink(); err != nil && !isInjected(err) {
			fail(err)
		}
	}

	var wg sync.WaitGroup
	// write fills b with fresh bytes and reads them back.
	write := func(rng *rand.Rand, b arena.Buffer) (stressBuf, error) {
		data := make([]byte, b.Len())
		var seed [32]byte
		binary.LittleEndian.PutUint64(seed[:], rng.Uint64())
		rand.NewChaCha8(seed).Read(data)
		for {
			err := arena.CopyIn(b, data)
			if err == nil {
				break
			}
			if !isInjected(err) {
				return stressBuf{}, err
			}
		}
		cnt.copies.Add(1)
		return stressBuf{b: b, data: data}, nil
	}
	verify := func(s stressBuf) error {
		got := make([]byte, len(s.data))
		for {
			err := arena.CopyOut(got, s.b)
			if err == nil {
				break
			}
			if !isInjected(err) {
				return fmt.Errorf("read back %v: %w", s.b, err)
			}
		}
		if !bytes.Equal(got, s.data) {
			return fmt.Errorf("%v: data changed", s.b)
		}
		cnt.bytesVerified.Add(int64(len(got)))
		return nil
	}
	final := make(chan []stressBuf, shared*sharers+owners)

	// Sharers: Alloc, write, verify, Grow and Shrink on a shared arena, and
	// Reset it when it is full or the budget is spent.
	for g := range shared * sharers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			sa := arenas[g%shared]
			a := sa.a
			var mine []stressBuf
			gen := int64(-1)
			defer func() { final <- mine }()
			for r := range rounds {
				cnt.ops.Add(1)
				sa.mu.RLock()
				if sa.gen != gen {
					mine, gen = nil, sa.gen
				}
				full := false
				switch rng.IntN(10) {
				case 0:
					cnt.grows.Add(1)
					if err := a.Grow(rng.IntN(4 << 20)); err != nil {
						if !expected(err) {
							fail(err)
							sa.mu.RUnlock()
							return
						}
						cnt.refused.Add(1)
						full = !isInjected(err)
					}
				case 1:
					cnt.shrinks.Add(1)
					if err := a.Shrink(); err != nil && !isInjected(err) {
						fail(err)
						sa.mu.RUnlock()
						return
					}
				default:
					b, err := a.Alloc(1+rng.IntN(maxSize), 1<<rng.IntN(10))
					if err != nil {
						if !expected(err) {
							fail(err)
							sa.mu.RUnlock()
							return
						}
						cnt.refused.Add(1)
						full = !isInjected(err)
						break
					}
					cnt.allocs.Add(1)
					s, err := write(rng, b)
					if err != nil {
						fail(err)
						sa.mu.RUnlock()
						return
					}
					s.sa, s.gen = sa, gen
					mine = append(mine, s)
				}
				if len(mine) > 0 {
					if err := verify(mine[rng.IntN(len(mine))]); err != nil {
						fail(fmt.Errorf("sharer %d round %d: %w", g, r, err))
						sa.mu.RUnlock()
						return
					}
				}
				sa.mu.RUnlock()
				if full {
					reset(sa, gen)
				}
			}
		}()
	}

	// Owners: an arena each, with Truncate, Reset, Close and New, and copies
	// from it into the shared arenas' buffers they allocate.
	for g := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 12))
			var stream acl.Stream
			if deferred {
				s, err := hd.CreateStream()
				if err != nil {
					fail(err)
					return
				}
				stream = s
			}
			busy := false // a kernel may be in flight on stream
			quiet := func() {
				if busy {
					if err := hd.SynchronizeStream(stream); err != nil {
						fail(err)
					}
					busy = false
				}
			}
			a := newArena(ownReserve, g%2 == 0, stream)
			var mine, out []stressBuf
			defer func() {
				if stream != 0 {
					defer func() {
						quiet()
						if err := hd.DestroyStream(stream); err != nil {
							fail(err)
						}
					}()
				}
				for {
					err := a.Close()
					if err == nil {
						break
					}
					if !isInjected(err) {
						fail(err)
						break
					}
				}
				final <- out
			}()
			// prune drops the buffers a failed operation took with it:
			// with several faults in one operation, its undo may fail
			// and bring Len down.
			prune := func() {
				l := a.Len()
				for len(mine) > 0 && mine[len(mine)-1].b.Offset()+mine[len(mine)-1].b.Len() > l {
					mine = mine[:len(mine)-1]
				}
			}
			for r := range rounds {
				cnt.ops.Add(1)
				k := rng.IntN(20)
				if deferred && k == 19 && len(mine) > 0 {
					// A kernel reads one of our buffers for a little while.
					s := mine[rng.IntN(len(mine))]
					done := make(chan struct{})
					if err := hd.Launch(stream, s.b.Ptr(), uintptr(s.b.Len()), done); err != nil {
						fail(err)
						return
					}
					time.AfterFunc(time.Duration(rng.IntN(500))*time.Microsecond, func() { close(done) })
					busy = true
					cnt.kernels.Add(1)
					continue
				}
				quiet() // the host touches our memory only once our kernels are done
				switch {
				case k < 2:
					cnt.truncates.Add(1)
					i := rng.IntN(len(mine) + 1)
					off := a.Len()
					if i < len(mine) {
						off = mine[i].b.Offset()
					}
					if err := a.Truncate(off); err != nil {
						if !isInjected(err) {
							fail(err)
							return
						}
						prune()
						break
					}
					mine = mine[:i]
				case k < 3:
					cnt.truncates.Add(1)
					if err := a.Reset(); err != nil {
						if !isInjected(err) {
							fail(err)
							return
						}
						prune()
						break
					}
					mine = nil
				case k < 4:
					cnt.shrinks.Add(1)
					if err := a.Shrink(); err != nil && !isInjected(err) {
						fail(err)
						return
					}
				case k == 4:
					cnt.closes.Add(1)
					if err := a.Close(); err != nil {
						if !isInjected(err) {
							fail(err)
							return
						}
						prune()
						break
					}
					a, mine = newArena(ownReserve, rng.IntN(2) == 0, stream), nil
				case k == 5 && len(mine) > 0:
					// Copy one of ours into a new buffer in a shared arena.
					src := mine[rng.IntN(len(mine))]
					sa := arenas[rng.IntN(shared)]
					sa.mu.RLock()
					dst, err := sa.a.Alloc(src.b.Len(), 64)
					if err != nil {
						sa.mu.RUnlock()
						if !expected(err) {
							fail(err)
							return
						}
						break
					}
					for {
						err = arena.Copy(dst, src.b)
						if err == nil || !isInjected(err) {
							break
						}
					}
					gen := sa.gen
					sa.mu.RUnlock()
					if err != nil {
						fail(err)
						return
					}
					cnt.copies.Add(1)
					out = append(out, stressBuf{b: dst, data: src.data, sa: sa, gen: gen})
				default:
					b, err := a.Alloc(1+rng.IntN(2*maxSize), 1<<rng.IntN(12))
					if err != nil {
						if !expected(err) {
							fail(err)
							return
						}
						cnt.refused.Add(1)
						if errors.Is(err, arena.ErrExhausted) {
							if err := a.Reset(); err == nil {
								mine = nil
							} else if isInjected(err) {
								prune()
							} else {
								fail(err)
								return
							}
						}
						break
					}
					cnt.allocs.Add(1)
					s, err := write(rng, b)
					if err != nil {
						fail(err)
						return
					}
					mine = append(mine, s)
				}
				check := mine
				if r%16 != 0 && len(mine) > 0 { // all of them now and then
					i := rng.IntN(len(mine))
					check = mine[i : i+1]
				}
				for _, s := range check {
					if err := verify(s); err != nil {
						fail(fmt.Errorf("owner %d round %d: %w", g, r, err))
						return
					}
				}
			}
		}()
	}

	// The watcher reads every Stats while the others work.
	stop := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Add(1)
	go func() {
		defer watcher.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, sa := range arenas {
				s := sa.a.Stats()
				if s.Used > s.Mapped || s.Mapped > s.Reserved || s.Mapped%s.ChunkSize != 0 {
					fail(fmt.Errorf("invariants broken: %+v", s))
					return
				}
			}
			if s := pool.Stats(); s.HeldBytes > s.Budget {
				fail(fmt.Errorf("pool over budget: %+v", s))
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	watcher.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	fd.Clear()
	close(final)
	for bufs := range final {
		for _, s := range bufs {
			if s.sa != nil && s.sa.gen != s.gen {
				continue // dropped by a Reset since
			}
			if err := verify(s); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, sa := range arenas {
		s := sa.a.Stats()
		if s.Used > s.Mapped || s.Mapped > s.Reserved || s.Mapped%s.ChunkSize != 0 {
			t.Fatalf("invariants broken: %+v", s)
		}
		if err := sa.a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	ps := pool.Stats()
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	if l := hd.Live(); !l.Zero() {
		t.Fatalf("leaked: %+v", l)
	}
	if f := hd.Faults(); f != 0 {
		t.Fatalf("the device saw %d faults: memory unmapped under its work", f)
	}
	if err := hd.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stress: %d goroutines (+1 watcher), %d operations: %d allocs, %d grows (%d allocs or grows refused: budget, reservation or fault), %d shrinks, %d truncates/resets, %d closes, %d copies; %d bytes verified; %d faults injected; %d kernels, %d chunks reclaimed, %d unmapped after their events; nothing leaked, no device fault",
		shared*sharers+owners, cnt.ops.Load(), cnt.allocs.Load(), cnt.grows.Load(), cnt.refused.Load(), cnt.shrinks.Load(),
		cnt.truncates.Load(), cnt.closes.Load(), cnt.copies.Load(), cnt.bytesVerified.Load(), fd.Injected(faultdriver.Any),
		cnt.kernels.Load(), ps.Reclaimed, ps.Ordered)
}
