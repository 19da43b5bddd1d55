package arena_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/model"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/regtest"
	"github.com/vmarena/vmarena/internal/sched"
	"github.com/vmarena/vmarena/internal/sched/schedtest"
)

var errRefused = errors.New("injected: the library refuses")

// A fake registration table (the registration double of acl/acltest, in
// front of the driver) follows two arenas through growths, refills, shrinks
// with and without streams, reliefs of a third arena's growth, Discard and
// Offload sleeps and wakes, TrapStale truncations, closes, with driver
// faults and a library that refuses registrations (regtest.RunRegistration),
// on the host driver and on the device model: no registered range ever
// covers unmapped memory (the double records any Register of memory not
// mapped with access, and any unmap of a registered mapping), and at rest
// every mapping is registered once, but for the strays a double fault
// leaves (mapped, not in use, perhaps without access). The HCCL and NCCL
// registrars run it over their doubles (acl/hccl, acl/nccl), and the ACL
// and CUDA bindings over theirs.
func TestBackingRegistrationTable(t *testing.T) {
	steps := envInt("VMARENA_REGISTER_STEPS", 1500)
	if testing.Short() || raceEnabled {
		steps /= 3
	}
	seeds := envInt("VMARENA_REGISTER_SEEDS", 2)
	t.Run("host", func(t *testing.T) {
		regtest.RunRegistration(t, regtest.Registration{Steps: steps, Seeds: seeds,
			Open: func(t testing.TB, c uintptr) acl.Driver {
				d, err := host.New(host.Config{Capacity: c})
				require.NoError(t, err)
				return d
			}})
	})
	t.Run("model", func(t *testing.T) {
		regtest.RunRegistration(t, regtest.Registration{Steps: steps / 3, Seeds: 1,
			Open: func(t testing.TB, c uintptr) acl.Driver {
				d, err := model.New(model.Config{Untimed: true, Capacity: c})
				require.NoError(t, err)
				return d
			}})
	})
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

// ExportDMABuf says what it cannot do: ErrNotSupported on a driver without
// dma-buf export (the host driver), ErrCallback from the arena's own
// callback, ErrClosed on a nil arena. (acl/cuda's TestArenaExportDMABuf
// exports through the CUDA binding.)
func TestExportDMABufRefusals(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{})
	require.NoError(t, a.Grow(sleepChunk))
	_, err := a.ExportDMABuf()
	require.ErrorIs(t, err, acl.ErrNotSupported)
	var inside error
	require.NoError(t, a.OnBackingChange(func(arena.BackingChange) error {
		_, inside = a.ExportDMABuf()
		return nil
	}))
	require.ErrorIs(t, inside, arena.ErrCallback)
	var nilArena *arena.Arena
	_, err = nilArena.ExportDMABuf()
	require.ErrorIs(t, err, arena.ErrClosed)
}

// A Close whose ReleaseMemAddress fails keeps the arena, mapped and
// registered as it was: the registrar, told the range was going, is told it
// stays (BackingReserved, cause BackingUndo) before the chunks are mapped
// back and registered again; the next Close ends it all.
func TestCloseReleaseFailsKeepsRegistration(t *testing.T) {
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	reg := acltest.NewRegistrations(hd, nil)
	fd := faultdriver.New(reg.Driver())
	pool, err := chunk.New(fd, chunk.Config{})
	require.NoError(t, err)
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	require.NoError(t, a.OnBackingChange(arena.RegisterWith(reg)))
	require.NoError(t, a.Grow(6<<20))

	fd.FailNth(faultdriver.ReleaseMemAddress, 1, 0)
	require.Error(t, a.Close())
	fd.Clear()
	require.Empty(t, reg.Violations())
	require.NoError(t, reg.Check(), "mapped and registered again")
	require.Equal(t, acltest.RegistrationCounts{Ranges: 1, Mappings: 3, Bytes: 6 << 20}, reg.Live())

	require.NoError(t, a.Close())
	require.Empty(t, reg.Violations())
	require.True(t, reg.Live().Zero(), "%+v", reg.Live())
	require.NoError(t, pool.Close())
	require.True(t, hd.Live().Zero(), "%+v", hd.Live())
	require.NoError(t, hd.Close())
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

// A first callback is told at attach of the arena's chunks the pool still
// holds mapped, waiting for the device (Lender.PendingIn). The pool's
// worker, unmapping them once the device is done, runs without the arena's
// lock: stopped as it is about to tell the arena (sched.BackingUnmap) while
// the callback is being told, it must not find "no callback" and unmap
// unannounced, which left the callback holding registrations of memory gone
// (the double saw each unmapped while registered).
func TestBackingAttachRacesPoolUnmap(t *testing.T) {
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	reg := acltest.NewRegistrations(hd, nil)
	pool, err := chunk.New(reg.Driver(), chunk.Config{})
	require.NoError(t, err)
	s, err := hd.CreateStream()
	require.NoError(t, err)
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20, Streams: []acl.Stream{s}})
	require.NoError(t, err)

	require.NoError(t, a.Grow(2*wg))
	kernel := make(chan struct{})
	require.NoError(t, hd.Launch(s, a.Base(), 2*wg, kernel))
	require.NoError(t, a.Shrink()) // both chunks wait in the pool, mapped, behind the kernel
	require.Equal(t, 0, a.Cap())

	telling := make(chan struct{}, 16)
	defer sched.Set(func(p sched.Point, who any) {
		if p == sched.BackingUnmap && who == a {
			telling <- struct{}{}
		}
	})()
	entered, release := make(chan struct{}), make(chan struct{})
	inner := arena.RegisterWith(reg)
	var once sync.Once
	attached := make(chan error, 1)
	go func() {
		attached <- a.OnBackingChange(func(c arena.BackingChange) error {
			err := inner(c)
			if c.Phase == arena.BackingMapped && c.Cause == arena.BackingAttach {
				once.Do(func() { close(entered); <-release })
			}
			return err
		})
	}()
	<-entered     // the callback holds the chunks, and the arena is not yet counted as having one
	close(kernel) // the device is done with them: the worker unmaps
	select {
	case <-telling:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not come to unmap the chunks")
	}
	// The worker waits for the attach: blocked on the arena's lock of its
	// callbacks, it cannot unmap until the callback returns.
	schedtest.WaitBlocked(t, "sync.Mutex.Lock", "github.com/vmarena/vmarena/arena.client.Unmapping")
	close(release)
	require.NoError(t, <-attached)
	pool.Lender().Settle()
	require.Empty(t, reg.Violations(), "a registered mapping unmapped without an Unmapping event")
	require.NoError(t, reg.Check())

	require.NoError(t, a.Close())
	require.NoError(t, pool.Close())
	require.NoError(t, hd.DestroyStream(s))
	require.True(t, hd.Live().Zero(), "%+v", hd.Live())
	require.NoError(t, hd.Close())
}
