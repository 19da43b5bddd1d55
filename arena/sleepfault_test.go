package arena_test

// Forcing tests of sleep and wake at their edges: copies racing a Sleep, a
// private pool that keeps chunks ahead, faults that hit an undo, frees that
// race a growth that gets the freed handle back, waits for memory.

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// A copy into an arena that an Offload Sleep is copying to the host either
// lands before the sleep's copy (and comes back with the wake) or fails with
// ErrAsleep: forced right after the sleep copied the step the buffer lies
// in, before it unmaps it, a CopyIn that returned nil would be lost.
func TestCopyRacingSleepIsNotLost(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{})
	b, old := fill(t, a, 3*sleepChunk, 3)
	fresh := bytes.Repeat([]byte{0x5A}, b.Len())

	copied := make(chan struct{})
	resume := make(chan struct{})
	defer sched.Set(func(p sched.Point, who any) {
		if p == sched.SleepCopied && who == a {
			select {
			case <-copied:
			default:
				close(copied)
				<-resume
			}
		}
	})()
	slept := make(chan error, 1)
	go func() { slept <- a.Sleep(context.Background(), arena.Offload) }()
	<-copied
	copyErr := make(chan error, 1)
	go func() { copyErr <- arena.CopyIn(b, fresh) }()
	var err error
	returned := false
	select {
	case err = <-copyErr: // returned while the sleep held the step it copied
		returned = true
	case <-time.After(50 * time.Millisecond): // it waits for the sleep to end
	}
	close(resume)
	require.NoError(t, <-slept)
	if !returned {
		err = <-copyErr
	}
	require.ErrorIs(t, err, arena.ErrAsleep, "a copy racing the sleep: unless it fails, its bytes are lost")
	require.NoError(t, a.Wake(context.Background()))
	require.True(t, bytes.Equal(old, contents(t, b)), "the wake restored what the sleep copied, and the refused copy changed nothing")
}

// gatedMalloc blocks the first MallocPhysical after arm until release.
type gatedMalloc struct {
	acl.Driver
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (d *gatedMalloc) arm() {
	d.mu.Lock()
	d.armed, d.entered, d.release = true, make(chan struct{}), make(chan struct{})
	d.mu.Unlock()
}

func (d *gatedMalloc) MallocPhysical(size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	d.mu.Lock()
	gate := d.armed
	d.armed = false
	entered, release := d.entered, d.release
	d.mu.Unlock()
	if gate {
		close(entered)
		<-release
	}
	return d.Driver.MallocPhysical(size, prop, flags)
}

func (d *gatedMalloc) Unwrap() acl.Driver { return d.Driver }

// An asleep arena holds nothing, and nothing is held on its behalf: its
// private pool keeps no chunks ahead (chunk.Config.Ahead) while it sleeps,
// neither ones the worker makes afterwards nor one it was making when the
// Sleep began; they come back with the wake.
func TestSleepPrivatePoolKeepsNothingAhead(t *testing.T) {
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer func() { require.True(t, hd.Live().Zero(), "%+v", hd.Live()); require.NoError(t, hd.Close()) }()
	d := &gatedMalloc{Driver: hd}
	a, err := arena.New(arena.Config{Driver: d, Reserve: 32 << 20, Chunk: chunk.Config{Ahead: 2}})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	lend := a.Pool().Lender()
	lend.Settle()
	require.Equal(t, 2, hd.Live().Handles, "two chunks ahead")

	// The growth takes them; the worker's first allocation to make them
	// again is held in the driver while the arena goes to sleep.
	d.arm()
	b, want := fill(t, a, 2*sleepChunk, 9)
	<-d.entered
	slept := make(chan error, 1)
	go func() { slept <- a.Sleep(context.Background(), arena.Offload) }()
	select {
	case err := <-slept:
		close(d.release)
		require.NoError(t, err)
		t.Fatal("Sleep returned while its private pool was allocating a chunk ahead")
	case <-time.After(30 * time.Millisecond):
	}
	close(d.release)
	require.NoError(t, <-slept)
	require.Zero(t, hd.Live().Handles, "asleep: %+v", hd.Live())
	lend.Settle() // a round of the worker: it makes nothing ahead for a sleeping arena
	require.Zero(t, hd.Live().Handles, "asleep, after the worker's round: %+v", hd.Live())
	require.Zero(t, a.Pool().Stats().HeldBytes)

	require.NoError(t, a.Wake(context.Background()))
	require.True(t, bytes.Equal(want, contents(t, b)))
	lend.Settle()
	require.Equal(t, 2, a.Pool().Stats().Cached, "awake: the chunks ahead are back")
}
