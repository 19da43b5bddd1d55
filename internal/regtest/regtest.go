// Package regtest runs registered arenas through every change of their
// memory, under driver faults and library refusals, and checks the
// registration protocol (acl.Registrar) at every step with the registration
// double of acl/acltest: RunRegistration. The arena's tests run it on the
// host driver and the device model, those of acl/hccl and acl/nccl with
// their libraries' doubles behind it, on the bindings over theirs.
package regtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// Capacity is the device memory a run asks Open for.
const Capacity = 256 << 20

// Registration is what RunRegistration runs on.
type Registration struct {
	// Open returns a fresh driver whose device holds capacity bytes
	// (Capacity); the run closes it.
	Open func(t testing.TB, capacity uintptr) acl.Driver
	// Next returns the library's registrar (acl/hccl, acl/nccl over their
	// test doubles) for memory of d, or nil: the registration double alone.
	// The caller closes it and checks its library once the run is over
	// (t.Cleanup runs after the run's own checks).
	Next func(t testing.TB, d acl.Driver) acl.Registrar
	// Bytes, with Next, returns the bytes the library holds registered,
	// as it (or its double) counts them: at every rest they must be the
	// bytes registered, no more (no padding) and no fewer. nil: not checked.
	Bytes func() uintptr
	// Steps and Seeds size the run: random operations per seed (default
	// 300), and seeds (default 1).
	Steps, Seeds int
}

// RunRegistration follows two registered arenas with the registration double
// (acltest.Registrations, in front of the driver and, with Next, of a
// library's registrar) through growths, refills on the pool's worker,
// shrinks with and without streams, reliefs of a third arena's growth,
// Discard and Offload sleeps and wakes, TrapStale truncations, resets and
// closes, with random driver faults (acl/faultdriver) and a library that
// refuses registrations and deregistrations: no registered range ever covers
// memory that is not mapped with access (the double records any Register of
// such memory and any unmap of a registered mapping), at rest every mapping
// is registered once but for what double faults leave (strays), and
// nothing is left registered, set or allocated at the end.
func RunRegistration(t *testing.T, r Registration) {
	steps, seeds := r.Steps, r.Seeds
	if steps <= 0 {
		steps = 300
	}
	if seeds <= 0 {
		seeds = 1
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { registrationTable(t, r, seed, steps) })
	}
}

// flakyRegistrar refuses, with probability p, a Register or Deregister (or
// a batch of them) of an event that is not the undo of another, once per
// event (it changes nothing when it refuses, as a library's call that
// fails, and the undo of the event's calls before it is not refused).
type flakyRegistrar struct {
	acl.Registrar
	mu      sync.Mutex
	rng     *rand.Rand
	p       float64
	undo    bool // the event under way is an undo
	refused int
}

var errRefused = errors.New("injected: the library refuses")

func (f *flakyRegistrar) refuse() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.undo || f.rng.Float64() >= f.p {
		return false
	}
	f.refused++
	f.undo = true // what follows in this event undoes what it did
	return true
}

func (f *flakyRegistrar) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused
}

func (f *flakyRegistrar) Register(m acl.Mapping) error {
	if f.refuse() {
		return errRefused
	}
	return f.Registrar.Register(m)
}

func (f *flakyRegistrar) Deregister(m acl.Mapping) error {
	if f.refuse() {
		return errRefused
	}
	return f.Registrar.Deregister(m)
}

// RegisterBatch passes a whole event on (acl.RegisterAll), refused as one.
func (f *flakyRegistrar) RegisterBatch(ms []acl.Mapping) error {
	if f.refuse() {
		return errRefused
	}
	return acl.RegisterAll(f.Registrar, ms)
}

// DeregisterBatch passes a whole event on (acl.DeregisterAll), refused as one.
func (f *flakyRegistrar) DeregisterBatch(ms []acl.Mapping) error {
	if f.refuse() {
		return errRefused
	}
	return acl.DeregisterAll(f.Registrar, ms)
}

// callback is the arena's callback: arena.RegisterWith on the flaky
// registrar, which is told whether the event is an undo. It checks that the
// arena's events come one at a time, in order of generation.
func (f *flakyRegistrar) callback(t *testing.T, events *atomic.Int64, log *eventLog) func(arena.BackingChange) error {
	reg := arena.RegisterWith(f)
	var mu sync.Mutex
	busy, last := false, uint64(0)
	return func(ch arena.BackingChange) error {
		mu.Lock()
		if busy {
			t.Errorf("two events of %v at once", ch.Arena.Base())
		}
		if ch.Generation < last {
			t.Errorf("event of generation %d after one of %d", ch.Generation, last)
		}
		busy, last = true, ch.Generation
		events.Add(1)
		var ps []string
		for _, m := range ch.Mappings {
			ps = append(ps, fmt.Sprintf("%#x", uintptr(m.Ptr)))
		}
		log.add("%v %v %v gen %d %v", ch.Base, ch.Phase, ch.Cause, ch.Generation, ps)
		mu.Unlock()
		defer func() { mu.Lock(); busy = false; mu.Unlock() }()
		f.mu.Lock()
		f.undo = ch.Cause == arena.BackingUndo
		f.mu.Unlock()
		return reg(ch)
	}
}

// eventLog keeps the last events and steps, for a failure's message.
type eventLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *eventLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == 40 {
		l.lines = append(l.lines[:0], l.lines[1:]...)
	}
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *eventLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// wakeNow wakes a without waiting for memory: when there is none, the Wake
// joins its pool's queue of waiters, and its context ends right then (a
// sched hook), so it fails instead of waiting for a release this
// single-threaded run would never make (a short deadline would do the same
// only on an idle machine). It replaces any sched hook for its duration.
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

func registrationTable(t *testing.T, r Registration, seed uint64, steps int) {
	d := r.Open(t, Capacity)
	require.NotNil(t, d)
	var next acl.Registrar
	if r.Next != nil {
		next = r.Next(t, d)
	}
	reg := acltest.NewRegistrations(d, next)
	fd := faultdriver.New(reg.Driver())
	const g = acl.HugePageSize // the granularity of every driver here
	pool, err := chunk.New(fd, chunk.Config{Budget: int64(16 * g), MaxCached: 4})
	require.NoError(t, err)
	cs := pool.ChunkSize()
	s, err := d.CreateStream()
	require.NoError(t, err)
	launcher, _ := d.(acl.Launcher)
	rng := rand.New(rand.NewPCG(seed, 7))

	type tenant struct {
		a      *arena.Arena
		flaky  *flakyRegistrar
		stream bool
	}
	var events atomic.Int64
	var log eventLog
	mk := func(cfg arena.Config) tenant {
		cfg.Pool, cfg.Reserve = pool, 32*cs
		a, err := arena.New(cfg)
		require.NoError(t, err)
		f := &flakyRegistrar{Registrar: reg, rng: rand.New(rand.NewPCG(seed, uint64(len(cfg.Streams)))), p: 0.04}
		require.NoError(t, a.OnBackingChange(f.callback(t, &events, &log)))
		return tenant{a, f, len(cfg.Streams) > 0}
	}
	ts := []tenant{
		mk(arena.Config{Streams: []acl.Stream{s}, Headroom: cs}), // refills on the worker; shrinks ordered by events
		mk(arena.Config{TrapStale: true}),                        // shrinks and truncations that unmap at once
	}
	c, err := arena.New(arena.Config{Pool: pool, Reserve: 32 * cs}) // unregistered: its growths relieve
	require.NoError(t, err)

	ctx := context.Background()
	faults, soft := 0, 0
	check := func(step int, op string, faulted bool) {
		t.Helper()
		pool.Lender().Settle()
		if v := reg.Violations(); len(v) > 0 {
			t.Fatalf("step %d (%s): the registrations broke the protocol: %v\n%s", step, op, errors.Join(v...), &log)
		}
		if faulted {
			return
		}
		// At rest: every mapping in a set range registered once, but for
		// what double faults left (strays, a sleeping arena's slots).
		strays := 0
		for _, x := range ts {
			strays += x.a.Stats().Strays
		}
		// The pool's worker unmaps released chunks whenever the device
		// is done with them, which no step orders: a chunk it has let go
		// of and not yet unmapped is mapped and not registered for a
		// moment. Such a view passes once the worker is done; a real
		// mismatch stays.
		var err error
		for try := 0; try < 100; try++ {
			if err = reg.Check(); err == nil {
				soft++
				if r.Bytes != nil {
					require.Equal(t, reg.Live().Bytes, r.Bytes(), "step %d (%s): the library holds other bytes than the mappings registered\n%s", step, op, &log)
				}
				return
			}
			if n := strings.Count(err.Error(), "is not registered"); n <= strays && strings.Count(err.Error(), "\n")+1 == n {
				return // what double faults left
			}
			pool.Lender().Settle()
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("step %d (%s): at rest, with %d strays: %v\n%s", step, op, strays, err, &log)
	}
	for step := range steps {
		x := ts[rng.IntN(len(ts))]
		a := x.a
		if rng.IntN(4) == 0 {
			fd.FailRandom(faultdriver.Any, 0.15, uint64(step), 0)
		}
		refused, injected := ts[0].flaky.count()+ts[1].flaky.count(), fd.Injected(faultdriver.Any)
		var op string
		switch k := rng.IntN(20); {
		case k < 5:
			op = "alloc"
			if b, err := a.Alloc(1+rng.IntN(3*cs), 1<<rng.IntN(7)); err == nil {
				_ = arena.CopyIn(b, []byte{byte(step)})
			}
		case k < 7:
			op = "grow"
			_ = a.Grow(rng.IntN(4 * cs))
		case k < 9:
			op = "truncate"
			_ = a.Truncate(rng.IntN(a.Len() + 1))
		case k < 11:
			op = "shrink"
			_ = a.Shrink()
		case k < 13:
			op = "relief"
			_ = c.Grow(rng.IntN(12 * cs))
			_ = c.Reset()
			_ = c.Shrink()
		case k < 15:
			op = "sleep"
			mode := []arena.SleepMode{arena.Discard, arena.Offload}[rng.IntN(2)]
			_ = a.Sleep(ctx, mode)
		case k < 17:
			op = "wake"
			_ = wakeNow(a)
		case k < 18:
			op = "reset"
			_ = a.Reset()
		default:
			op = "kernel"
			if b, err := a.Alloc(4096, 1); err == nil && x.stream && launcher != nil {
				_ = launcher.Launch(s, b.Ptr(), 4096, nil)
			}
		}
		fd.Clear()
		pool.Lender().Settle() // the worker's unmaps and refills, which refusals may hit too
		refusedNow := ts[0].flaky.count() + ts[1].flaky.count()
		log.add("step %d: %v %s: injected %d refused %d len %d cap %d", step, a.Base(), op, fd.Injected(faultdriver.Any)-injected, refusedNow-refused, a.Len(), a.Cap())
		faulted := fd.Injected(faultdriver.Any) != injected || refusedNow != refused
		if faulted {
			faults++
		}
		check(step, op, faulted)
	}
	for _, x := range append(ts, tenant{a: c, flaky: &flakyRegistrar{}}) {
		for i := 0; ; i++ {
			err := x.a.Close()
			if err == nil {
				break
			}
			require.Less(t, i, 10, "Close keeps failing: %v", err)
		}
	}
	require.NoError(t, reg.Check())
	require.True(t, reg.Live().Zero(), "left registered: %+v", reg.Live())
	require.NoError(t, d.SynchronizeStream(s))
	require.NoError(t, d.DestroyStream(s))
	require.NoError(t, pool.Close())
	if lc, ok := d.(acl.Counter); ok {
		require.True(t, lc.Live().Zero(), "leaked: %+v", lc.Live())
	}
	require.NoError(t, d.Close())
	refusals := ts[0].flaky.count() + ts[1].flaky.count()
	t.Logf("%s: %d steps, %d with a fault or a refusal (%d driver faults, %d refusals by the library), %d events; the protocol held at every step, every mapping registered at %d rests",
		d.Name(), steps, faults, fd.Injected(faultdriver.Any), refusals, events.Load(), soft)
}
