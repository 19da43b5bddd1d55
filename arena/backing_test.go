package arena_test

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
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// flakyRegistrar refuses, with probability p, a Register or Deregister of
// an event that is not the undo of another, once per event (it changes
// nothing when it refuses, as a library's call that fails, and the undo of
// the event's calls before it, by RegisterWith, is not refused).
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
		events.Add(1) // shared by the arenas, whose events may run at once
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

// A fake registration table (the registration double of acl/acltest, in
// front of the driver) follows two arenas through growths, refills, shrinks
// with and without streams, reliefs of a third arena's growth, Discard and
// Offload sleeps and wakes, TrapStale truncations, closes, with driver
// faults and a library that refuses registrations: no registered range ever
// covers unmapped memory (the double records any Register of memory not
// mapped with access, and any unmap of a registered mapping), and at rest
// every mapping is registered once, but for the strays a double fault
// leaves (mapped, not in use, perhaps without access).
func TestBackingRegistrationTable(t *testing.T) {
	steps := envInt("VMARENA_REGISTER_STEPS", 1500)
	if testing.Short() || raceEnabled {
		steps /= 3
	}
	for seed := range uint64(envInt("VMARENA_REGISTER_SEEDS", 2)) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { registrationTable(t, seed, steps) })
	}
}

func registrationTable(t *testing.T, seed uint64, steps int) {
	const cs = 2 << 20
	hd, err := host.New(host.Config{Capacity: 256 << 20})
	require.NoError(t, err)
	reg := acltest.NewRegistrations(hd, nil)
	fd := faultdriver.New(reg.Driver())
	pool, err := chunk.New(fd, chunk.Config{Budget: 16 * cs, MaxCached: 4})
	require.NoError(t, err)
	s, err := hd.CreateStream()
	require.NoError(t, err)
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
	faults, hard, soft := 0, 0, 0
	check := func(step int, op string, faulted bool) {
		t.Helper()
		pool.Lender().Settle()
		if v := reg.Violations(); len(v) > 0 {
			t.Fatalf("step %d (%s): the registrations broke the protocol: %v\n%s", step, op, errors.Join(v...), &log)
		}
		hard++
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
			if b, err := a.Alloc(4096, 1); err == nil && x.stream {
				_ = hd.Launch(s, b.Ptr(), 4096, nil)
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
	require.NoError(t, hd.SynchronizeStream(s))
	require.NoError(t, hd.DestroyStream(s))
	require.NoError(t, pool.Close())
	require.True(t, hd.Live().Zero(), "leaked: %+v", hd.Live())
	require.NoError(t, hd.Close())
	refusals := ts[0].flaky.refused + ts[1].flaky.refused
	t.Logf("%d steps, %d with a fault or a refusal (%d driver faults, %d refusals by the library), %d events; the protocol held at every step, every mapping registered at %d rests",
		steps, faults, fd.Injected(faultdriver.Any), refusals, events.Load(), soft)
	_ = hard
}

// A callback that refuses a growth's mappings fails the growth cleanly: the
// arena is as it was, nothing of the growth is left mapped, and the
// callbacks before it that had taken the mappings are told to let go of
// them (cause BackingUndo). A callback that refuses to let go of mappings
// keeps them mapped: the Shrink fails and changes nothing.
func TestBackingRefusals(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{})
	var first []arena.BackingChange
	require.NoError(t, a.OnBackingChange(func(c arena.BackingChange) error { first = append(first, c); return nil }))
	refuse := arena.BackingPhase(0)
	require.NoError(t, a.OnBackingChange(func(c arena.BackingChange) error {
		if c.Phase == refuse {
			return errRefused
		}
		return nil
	}))
	_, err := a.Alloc(sleepChunk, 1)
	require.NoError(t, err)
	before := e.hd.Live()

	refuse = arena.BackingMapped
	err = a.Grow(3 * sleepChunk)
	require.ErrorIs(t, err, errRefused)
	require.Equal(t, sleepChunk, a.Cap(), "the growth is undone")
	require.Equal(t, before.Mappings, e.hd.Live().Mappings, "nothing of it left mapped")
	n := len(first)
	require.GreaterOrEqual(t, n, 2)
	require.Equal(t, arena.BackingMapped, first[n-2].Phase)
	require.Equal(t, arena.BackingGrow, first[n-2].Cause)
	require.Equal(t, arena.BackingUnmapping, first[n-1].Phase, "the first callback lets go of what it took")
	require.Equal(t, arena.BackingUndo, first[n-1].Cause)
	require.Equal(t, first[n-2].Mappings, first[n-1].Mappings)

	refuse = 0
	require.NoError(t, a.Grow(3*sleepChunk))
	require.NoError(t, a.Truncate(sleepChunk))
	refuse = arena.BackingUnmapping
	c0 := a.Cap()
	require.ErrorIs(t, a.Shrink(), errRefused)
	require.Equal(t, c0, a.Cap(), "kept mapped: a callback still holds them")
	refuse = 0
	require.NoError(t, a.Shrink())
	require.Equal(t, sleepChunk, a.Cap())
	require.Equal(t, arena.BackingShrink, first[len(first)-1].Cause)
}

// An arena's events come one at a time, in order of generation, even when
// two goroutines change its backing at once: here the pool's worker, which
// unmaps the chunks a Shrink with streams handed it (without the arena's
// lock), is held inside its Unmapping callback while a TrapStale Truncate
// unmaps the arena's other chunks on the caller's goroutine (under the
// arena's lock). The Truncate's event waits for the worker's to end, and
// comes after it, with a later generation.
func TestBackingEventsInOrderAcrossGoroutines(t *testing.T) {
	e := newSleepEnv(t)
	s, err := e.hd.CreateStream()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.hd.DestroyStream(s)) })
	a := e.arena(t, arena.Config{Streams: []acl.Stream{s}, TrapStale: true})
	_, err = a.Alloc(3*sleepChunk, 1)
	require.NoError(t, err)
	require.NoError(t, a.Grow(2*sleepChunk)) // two chunks of headroom above Len

	entered, release := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	busy := false
	var got []arena.BackingChange
	var overlap []string
	require.NoError(t, a.OnBackingChange(func(c arena.BackingChange) error {
		mu.Lock()
		if busy {
			overlap = append(overlap, fmt.Sprintf("%v %v gen %d", c.Phase, c.Cause, c.Generation))
		}
		busy = true
		got = append(got, c)
		hold := c.Phase == arena.BackingUnmapping && c.Cause == arena.BackingShrink
		mu.Unlock()
		if hold {
			close(entered)
			<-release
		}
		mu.Lock()
		busy = false
		mu.Unlock()
		return nil
	}))
	require.NoError(t, a.Shrink()) // the headroom to the pool, still mapped: its worker unmaps it
	<-entered

	truncated := make(chan error, 1)
	go func() { truncated <- a.Truncate(0) }() // unmaps the three chunks in use
	select {
	case err := <-truncated:
		t.Errorf("Truncate returned (%v) while an event of the arena was being delivered", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if t.Failed() {
		return
	}
	require.NoError(t, <-truncated)
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, overlap, "events delivered during another of the same arena")
	var last uint64
	sawShrink, sawTrap := false, false
	for _, c := range got {
		if c.Cause != arena.BackingAttach { // what was there when it registered: the current generation
			require.Greater(t, c.Generation, last, "event %v %v of generation %d after one of %d", c.Phase, c.Cause, c.Generation, last)
		}
		last = c.Generation
		switch c.Cause {
		case arena.BackingShrink:
			sawShrink = true
		case arena.BackingTrapStale:
			require.True(t, sawShrink, "the Truncate's event came before the worker's")
			sawTrap = true
			require.Len(t, c.Mappings, 3)
			for _, m := range c.Mappings {
				require.NotZero(t, m.Handle, "a mapping's handle")
				require.Equal(t, uintptr(sleepChunk), m.Size)
			}
		}
	}
	require.True(t, sawTrap)
}
