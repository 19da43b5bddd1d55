package arena_test

// Forcing tests of sleep and wake at their edges: copies racing a Sleep, a
// private pool that keeps chunks ahead, faults that hit an undo, frees that
// race a growth that gets the freed handle back, waits for memory.

import (
	"bytes"
	"context"
	"fmt"
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

// gatedCopy blocks the MemcpyHtoD calls to one address, once armed, until
// release: a copy that has passed its checks and is inside the driver.
type gatedCopy struct {
	acl.Driver
	mu      sync.Mutex
	at      acl.DevicePtr
	entered chan struct{}
	release chan struct{}
}

// arm gates the next copy to at, and returns the channels: closed when it
// enters, to close to let it go.
func (d *gatedCopy) arm(at acl.DevicePtr) (entered, release chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at, d.entered, d.release = at, make(chan struct{}), make(chan struct{})
	return d.entered, d.release
}

func (d *gatedCopy) MemcpyHtoD(dst acl.DevicePtr, src []byte) error {
	d.mu.Lock()
	gate := d.entered != nil && dst == d.at
	entered, release := d.entered, d.release
	if gate {
		d.entered = nil
	}
	d.mu.Unlock()
	if gate {
		close(entered)
		<-release
	}
	return d.Driver.MemcpyHtoD(dst, src)
}

func (d *gatedCopy) Unwrap() acl.Driver { return d.Driver }

// A CopyIn already under way when an Offload Sleep begins (past its checks,
// inside the driver) ends before the sleep copies the arena to the host:
// were the sleep to copy and go on meanwhile, the copy would land after the
// sleep's copy of those bytes and return nil, and the wake would bring the
// old bytes back. Forced: the copy is held inside the driver while the
// sleep starts; should the sleep reach the end of its first copy step
// meanwhile, the copy is let go there, before the unmap.
func TestCopyUnderWayBeforeSleepIsNotLost(t *testing.T) {
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer func() { require.True(t, hd.Live().Zero(), "%+v", hd.Live()); require.NoError(t, hd.Close()) }()
	d := &gatedCopy{Driver: hd}
	a, err := arena.New(arena.Config{Driver: d, Reserve: 32 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	b, old := fill(t, a, 3*sleepChunk, 4)
	fresh := bytes.Repeat([]byte{0xA5}, b.Len())

	entered, release := d.arm(b.Ptr())
	copyDone := make(chan struct{})
	copyErr := make(chan error, 1)
	go func() { copyErr <- arena.CopyIn(b, fresh); close(copyDone) }()
	<-entered
	copied := make(chan struct{})
	defer sched.Set(func(p sched.Point, who any) {
		if p == sched.SleepCopied && who == a {
			select {
			case <-copied:
			default:
				close(copied) // the sleep copied while the CopyIn was under way
				<-copyDone
			}
		}
	})()
	slept := make(chan error, 1)
	go func() { slept <- a.Sleep(context.Background(), arena.Offload) }()
	select {
	case <-copied:
	case <-time.After(200 * time.Millisecond): // the sleep waits for the copy
	}
	close(release)
	err = <-copyErr
	require.NoError(t, <-slept)
	require.NoError(t, a.Wake(context.Background()))
	got := contents(t, b)
	if err != nil {
		require.ErrorIs(t, err, arena.ErrAsleep)
		require.True(t, bytes.Equal(old, got), "a refused copy changed the bytes")
		return
	}
	require.True(t, bytes.Equal(fresh, got), "CopyIn returned nil, and after the wake its bytes are lost")
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

// A Wake whose access grant fails, and whose undo's unmap fails too, leaves
// a chunk mapped without access. The next Wake, the faults over, must not
// trust it: it maps it again, and wakes.
func TestWakeAfterDoubleFaultNoAccess(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{})
	b, want := fill(t, a, 2*sleepChunk, 6)
	require.NoError(t, a.Sleep(context.Background(), arena.Offload))

	e.fd.FailNth(faultdriver.MemSetAccess, 1, 0)
	e.fd.FailAfter(faultdriver.UnmapMem, 0, 0) // every unmap of the undo
	err := a.Wake(context.Background())
	require.Error(t, err)
	require.True(t, a.Asleep())
	assert.Equal(t, 2, a.Stats().Strays, "the chunks the undo could not unmap: %v", err)
	e.fd.Clear()

	require.NoError(t, a.Wake(context.Background()), "the faults are over")
	require.True(t, bytes.Equal(want, contents(t, b)))
	require.Zero(t, a.Stats().Strays)
}

// A tenant boundary holds under two faults in one Wake: a chunk another
// tenant gave back, mapped for this arena, whose scrub fails and whose undo
// cannot unmap it, is cleared before the arena reads it, however the next
// Wake goes.
func TestWakeAfterDoubleFaultNoForeignBytes(t *testing.T) {
	e := newSleepEnv(t)
	x := e.arena(t, arena.Config{})
	v := e.arena(t, arena.Config{})
	secret := bytes.Repeat([]byte("X-SECRET"), sleepChunk/8)
	xb, err := x.Alloc(sleepChunk, 1)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(xb, secret))
	vb, err := v.Alloc(100, 1)
	require.NoError(t, err)
	require.NoError(t, v.Sleep(context.Background(), arena.Discard))
	require.NoError(t, x.Reset())
	require.NoError(t, x.Shrink()) // x's chunk, with its bytes, goes to the pool's cache
	require.Equal(t, 1, e.pool.Stats().Cached)

	e.fd.FailNth(faultdriver.Memset, 1, 0)     // the scrub of x's chunk for v
	e.fd.FailAfter(faultdriver.UnmapMem, 0, 0) // and every unmap of the undo
	require.Error(t, v.Wake(context.Background()))
	assert.Equal(t, 1, v.Stats().Strays, "x's chunk, left mapped unscrubbed")
	e.fd.Clear()
	require.NoError(t, v.Wake(context.Background()))
	vb, err = v.Slice(0, vb.Len()) // the Discard dropped the old buffer: a view of the new memory
	require.NoError(t, err)
	got := make([]byte, vb.Len())
	require.NoError(t, arena.CopyOut(got, vb))
	require.NotContains(t, string(got), "X-SEC", "tenant v reads tenant x's bytes")
	mem, err := e.hd.Bytes(v.Base(), sleepChunk)
	require.NoError(t, err)
	require.False(t, bytes.Contains(mem, []byte("X-SECRET")), "tenant x's bytes in v's memory")
}

// gate runs a test's hook at a sched point of one arena, once.
func gateAt(p sched.Point, a *arena.Arena, n int) (reached, resume chan struct{}, restore func()) {
	reached, resume = make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	seen := 0
	restore = sched.Set(func(q sched.Point, who any) {
		if q != p || who != a {
			return
		}
		mu.Lock()
		seen++
		hit := seen == n
		mu.Unlock()
		if hit {
			close(reached)
			<-resume
		}
	})
	return reached, resume, restore
}

// One fault in an Offload Sleep leaves the arena awake with its contents,
// even when a growth waits for memory meanwhile: Sleep frees nothing until
// every chunk is copied and unmapped, so the growth cannot take the memory
// the undo needs.
func TestSleepFaultUnderPressureLeavesItAwake(t *testing.T) {
	e := newSleepEnv(t)
	pool := e.budgetPool(t, 12)
	k := e.arena(t, arena.Config{Pool: pool})
	w := e.arena(t, arena.Config{Pool: pool})
	b, want := fill(t, k, 10*sleepChunk, 8) // two steps of the pipeline
	_, err := w.Alloc(2*sleepChunk, 1)
	require.NoError(t, err)

	// w waits for 8 chunks: the budget has none.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	grown := make(chan error, 1)
	go func() { grown <- w.GrowContext(ctx, 8*sleepChunk) }()

	reached, resume, restore := gateAt(sched.SleepCopied, k, 2) // the second step copied
	defer restore()
	e.fd.FailNth(faultdriver.UnmapMem, 10, 0) // the last chunk's unmap
	slept := make(chan error, 1)
	go func() { slept <- k.Sleep(context.Background(), arena.Offload) }()
	<-reached
	select { // give the waiter every chance to take what the first step freed
	case err := <-grown:
		require.NoError(t, err)
	case <-time.After(100 * time.Millisecond):
	}
	close(resume)
	require.Error(t, <-slept)
	e.fd.Clear()
	require.False(t, k.Asleep(), "one fault leaves the arena awake")
	require.True(t, bytes.Equal(want, contents(t, b)))
	cancel()
	<-grown
}

// A Sleep whose copy fails, and whose undo then fails, leaves the arena
// asleep with chunks still mapped; Sleep again gives back all of it (their
// bytes first copied to the host), and a private pool keeps nothing.
func TestSleepAgainAfterDoubleFault(t *testing.T) {
	for _, own := range []bool{false, true} {
		t.Run(map[bool]string{false: "shared-pool", true: "private-pool"}[own], func(t *testing.T) {
			e := newSleepEnv(t)
			cfg := arena.Config{}
			if own {
				cfg.Driver = e.fd
				cfg.Pool = nil
			}
			a := newArena(t, e, cfg, own)
			b, want := fill(t, a, 10*sleepChunk, 2)
			e.fd.FailNth(faultdriver.MemcpyDtoH, 2, 0) // the second step's copy
			e.fd.FailNth(faultdriver.MapMem, 1, 0)     // and the undo's first map
			require.Error(t, a.Sleep(context.Background(), arena.Offload))
			e.fd.Clear()
			require.True(t, a.Asleep(), "the undo failed: asleep")

			require.NoError(t, a.Sleep(context.Background(), arena.Offload), "Sleep again")
			l := e.hd.Live()
			require.Zero(t, l.Mappings, "asleep after a Sleep that returned nil: %+v", l)
			require.Zero(t, l.Handles, "%+v", l)
			require.Zero(t, a.Pool().Stats().HeldBytes)
			require.NoError(t, a.Wake(context.Background()))
			require.True(t, bytes.Equal(want, contents(t, b)))
		})
	}
}

// newArena makes an arena on e's pool, or, with own set, on a private pool
// of e's fault driver, closed at the end of the test.
func newArena(t *testing.T, e *sleepEnv, cfg arena.Config, own bool) *arena.Arena {
	t.Helper()
	if !own {
		return e.arena(t, cfg)
	}
	cfg.Reserve = 64 << 20
	a, err := arena.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

// The undo of a growth, and of a Wake, whose clears were queued on the
// arena's stream unmaps nothing while the wait for those clears fails: they
// may still run (here they wait behind a kernel), and an unmap under them
// makes the device fault. The chunks stay mapped above Cap (strays, or a
// sleeping arena's slots) until the stream has been waited for.
func TestUndoKeepsChunksUnderQueuedClears(t *testing.T) {
	for _, op := range []string{"grow", "wake"} {
		t.Run(op, func(t *testing.T) {
			e := newSleepEnv(t)
			s, err := e.hd.CreateStream()
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, e.hd.DestroyStream(s)) })
			x := e.arena(t, arena.Config{})
			v := e.arena(t, arena.Config{Streams: []acl.Stream{s}})
			k := e.arena(t, arena.Config{Streams: []acl.Stream{s}})
			kb, err := k.Alloc(4096, 1)
			require.NoError(t, err)
			if op == "grow" {
				_, err = v.Alloc(100, 1)
			} else {
				_, err = v.Alloc(2*sleepChunk, 1)
			}
			require.NoError(t, err)
			if op == "wake" {
				require.NoError(t, v.Sleep(context.Background(), arena.Discard))
			}
			// Two chunks of x's bytes in the cache: v's growth (or wake)
			// takes them, and clears them on its stream.
			fill(t, x, 2*sleepChunk, 1)
			require.NoError(t, x.Reset())
			require.NoError(t, x.Shrink())
			// A kernel on the stream, which the clears queue behind.
			done := make(chan struct{})
			end := sync.OnceFunc(func() { close(done) })
			defer end()
			require.NoError(t, e.hd.Launch(s, kb.Ptr(), 4096, done))

			e.fd.FailNth(faultdriver.CreateEvent, 1, 0)         // the fence after the clears
			e.fd.FailAfter(faultdriver.SynchronizeStream, 0, 0) // and every wait for the stream
			if op == "grow" {
				err = v.Grow(2 * sleepChunk)
			} else {
				err = v.Wake(context.Background())
			}
			require.Error(t, err)
			require.Zero(t, e.hd.Faults(), "an unmap under queued clears: %v", err)
			assert.Equal(t, 2, v.Stats().Strays, "kept mapped until the stream is waited for")
			e.fd.Clear()
			end() // the kernel ends
			if op == "grow" {
				require.NoError(t, v.Grow(2*sleepChunk))
			} else {
				require.NoError(t, v.Wake(context.Background()))
			}
			require.Zero(t, v.Stats().Strays)
			require.Zero(t, e.hd.Faults())
		})
	}
}

// wakeScene is an arena asleep on a budgeted pool, most of whose budget a
// second arena holds in use, and one asleep on a pool with room.
type wakeScene struct {
	e          *sleepEnv
	pool       *chunk.Pool
	k, v, o    *arena.Arena
	kb         arena.Buffer
	kwant      []byte
	oHoldsFree func() // o drops and gives back what it holds
}

func newWakeScene(t *testing.T) *wakeScene {
	t.Helper()
	e := newSleepEnv(t)
	pool := e.budgetPool(t, 4)
	sc := &wakeScene{e: e, pool: pool}
	sc.k = e.arena(t, arena.Config{Tag: "w-weights"}) // e's pool: room enough
	sc.v = e.arena(t, arena.Config{Pool: pool, Tag: "w-kv"})
	sc.o = e.arena(t, arena.Config{Pool: pool})
	sc.kb, sc.kwant = fill(t, sc.k, sleepChunk, 7)
	fill(t, sc.v, 3*sleepChunk, 8)
	require.NoError(t, sc.k.Sleep(context.Background(), arena.Offload))
	require.NoError(t, sc.v.Sleep(context.Background(), arena.Discard))
	fill(t, sc.o, 3*sleepChunk, 9) // in use: nothing a relief can take
	sc.oHoldsFree = func() {
		require.NoError(t, sc.o.Reset())
		require.NoError(t, sc.o.Shrink())
	}
	return sc
}

// Wake waits for memory, as GrowContext does, instead of failing at once
// when the pool has none: it is served when another tenant gives memory
// back.
func TestWakeWaitsForMemory(t *testing.T) {
	sc := newWakeScene(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	woke := make(chan error, 1)
	go func() { woke <- sc.v.Wake(ctx) }() // needs 3 chunks; 1 is free
	select {
	case err := <-woke:
		t.Fatalf("Wake returned before memory came back: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	sc.oHoldsFree()
	require.NoError(t, <-woke)
	require.False(t, sc.v.Asleep())
}

// A Wake that its ctx cuts short says so: its error matches
// ErrOutOfMemory and wraps ctx's, and the arena is still asleep.
func TestWakeCutShortCarriesItsContext(t *testing.T) {
	sc := newWakeScene(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := sc.v.Wake(ctx)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, sc.v.Asleep())
	sc.oHoldsFree()
	require.NoError(t, sc.v.Wake(context.Background()))
}

// WakeAll is all or nothing: when one arena cannot wake before ctx is
// done, the ones this call woke go back to sleep (their Offload contents
// kept), and a later WakeAll wakes them all.
func TestWakeAllIsAllOrNothing(t *testing.T) {
	sc := newWakeScene(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := arena.WakeAll(ctx, []*arena.Arena{sc.k, sc.v}) // k fits, v does not
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	require.True(t, sc.v.Asleep())
	require.True(t, sc.k.Asleep(), "k woke, and the failed WakeAll left it awake: half a model")
	sc.oHoldsFree()
	require.NoError(t, arena.WakeTag(context.Background(), nil, "w-weights"))
	require.NoError(t, arena.WakeAll(context.Background(), []*arena.Arena{sc.k, sc.v}))
	require.True(t, bytes.Equal(sc.kwant, contents(t, sc.kb)))
}

// A Wake of an arena on a private pool whose map fails gives the chunks it
// took back to the pool, and frees them (a sleeping arena's private pool
// holds nothing); should those frees fail too, the chunks stay in the
// pool's cache. Sleep again, which returns nil only when nothing is held on
// the arena's behalf, frees them.
func TestSleepAgainFreesWhatAFailedWakeCached(t *testing.T) {
	e := newSleepEnv(t)
	a := newArena(t, e, arena.Config{Driver: e.fd}, true)
	b, want := fill(t, a, 4*sleepChunk, 5)
	require.NoError(t, a.Sleep(context.Background(), arena.Offload))
	require.Zero(t, e.hd.Live().Handles)

	e.fd.FailNth(faultdriver.MapMem, 2, 0)         // the wake's second map
	e.fd.FailAfter(faultdriver.FreePhysical, 0, 0) // and every free of the chunks it gives back
	require.Error(t, a.Wake(context.Background()))
	e.fd.Clear()
	require.True(t, a.Asleep())
	require.NotZero(t, a.Pool().Stats().Cached, "the double fault left chunks in the private pool's cache")

	require.NoError(t, a.Sleep(context.Background(), arena.Offload), "Sleep again")
	l := e.hd.Live()
	require.Zero(t, l.Handles, "asleep after a Sleep that returned nil, with chunks kept for it: %+v", l)
	require.Zero(t, l.Mappings, "%+v", l)
	require.Zero(t, a.Pool().Stats().HeldBytes)
	require.NoError(t, a.Wake(context.Background()))
	require.True(t, bytes.Equal(want, contents(t, b)))
}

// twoPools is a device of n chunks with two pools on it, and a maker of
// arenas in either pool that closes them at the end.
func twoPools(t *testing.T, n int) (fd *faultdriver.Driver, mine, other *chunk.Pool, newArena func(*chunk.Pool) *arena.Arena) {
	hd, err := host.New(host.Config{Capacity: uintptr(n) * sleepChunk})
	require.NoError(t, err)
	fd = faultdriver.New(hd)
	mine, err = chunk.New(fd, chunk.Config{})
	require.NoError(t, err)
	other, err = chunk.New(fd, chunk.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, mine.Close())
		require.NoError(t, other.Close())
		require.True(t, hd.Live().Zero(), "leaked: %+v", hd.Live())
		require.NoError(t, hd.Close())
	})
	newArena = func(p *chunk.Pool) *arena.Arena {
		a, err := arena.New(arena.Config{Pool: p, Reserve: 32 << 20})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, a.Close()) })
		return a
	}
	return fd, mine, other, newArena
}

// waitIsQuiet runs wait, a wait for 3 chunks on a device where the other
// pool holds 3 of 4 in use, and checks it ends out of memory after a few
// tries, not one per wake-up of its own.
func waitIsQuiet(t *testing.T, fd *faultdriver.Driver, wait func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	before := fd.Calls(faultdriver.MallocPhysical)
	require.ErrorIs(t, wait(ctx), arena.ErrOutOfMemory)
	mallocs := fd.Calls(faultdriver.MallocPhysical) - before
	t.Logf("allocations during the wait: %d", mallocs)
	assert.LessOrEqual(t, mallocs, int64(8), "a wait that nothing serves makes a few tries, not one per wake-up of its own")
}

// A Wake waiting for memory that nobody gives back waits quietly: what its
// own failed try gives back (the chunks it got before the device ran out,
// freed again) does not wake it, so it does not spin allocating and freeing
// until its deadline.
func TestWakeWaitIsQuiet(t *testing.T) {
	fd, mine, other, newArena := twoPools(t, 4)
	v := newArena(mine)
	fill(t, v, 3*sleepChunk, 1)
	require.NoError(t, v.Sleep(context.Background(), arena.Discard))
	require.NoError(t, mine.Trim())
	fill(t, newArena(other), 3*sleepChunk, 2)
	waitIsQuiet(t, fd, v.Wake)
	require.True(t, v.Asleep())
}

// A Wake the pool cannot serve whole maps and allocates nothing. Wake maps
// a step at a time, taking each step's chunks as it goes; a try that found
// the pool short only at a later step undid every map before it, and freed
// what it had allocated once the cache was full, on every try of a Wake
// retried under pressure (a bench run with several models spent seconds so).
func TestWakeShortMapsNothing(t *testing.T) {
	e := newSleepEnv(t)
	pool := e.budgetPool(t, 16)
	v := e.arena(t, arena.Config{Pool: pool})
	o := e.arena(t, arena.Config{Pool: pool})
	fill(t, v, 12*sleepChunk, 1) // more than one step of Wake's
	require.NoError(t, v.Sleep(context.Background(), arena.Discard))
	fill(t, o, 6*sleepChunk, 2) // in use: 10 chunks of the budget are left, v wants 12
	maps, mallocs := e.fd.Calls(faultdriver.MapMem), e.fd.Calls(faultdriver.MallocPhysical)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, v.Wake(ctx), arena.ErrOutOfMemory)
	assert.Zero(t, e.fd.Calls(faultdriver.MapMem)-maps, "maps by a Wake the pool could not serve")
	assert.Zero(t, e.fd.Calls(faultdriver.MallocPhysical)-mallocs, "allocations by a Wake the pool could not serve")
	wakesOnceFreed(t, v, o)
}

// wakesOnceFreed checks that v, asleep after a Wake that could not be
// served, wakes once o gives back what it holds (and its pools, the pools
// of o's chunks, trim their caches).
func wakesOnceFreed(t *testing.T, v, o *arena.Arena, trim ...*chunk.Pool) {
	t.Helper()
	require.True(t, v.Asleep())
	require.NoError(t, o.Reset())
	require.NoError(t, o.Shrink())
	for _, p := range trim {
		require.NoError(t, p.Trim())
	}
	require.NoError(t, v.Wake(context.Background()))
	require.Equal(t, 12*sleepChunk, v.Cap())
}

// Where the device runs out first (no budget: the pool cannot know), a Wake
// that finds it short at a later step undoes its maps, but does not take
// the chunks its undo gave back for memory that came back: it waits for
// others' as quietly as TestWakeWaitIsQuiet's, trying again only when
// memory came back.
func TestWakeShortOnTheDeviceWaitsQuietly(t *testing.T) {
	fd, mine, other, newArena := twoPools(t, 16)
	v, o := newArena(mine), newArena(other)
	fill(t, v, 12*sleepChunk, 1) // more than one step of Wake's
	require.NoError(t, v.Sleep(context.Background(), arena.Discard))
	require.NoError(t, mine.Trim())
	fill(t, o, 6*sleepChunk, 2) // in use: the device has 10 chunks left, v wants 12
	maps := fd.Calls(faultdriver.MapMem)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, v.Wake(ctx), arena.ErrOutOfMemory)
	tries := (fd.Calls(faultdriver.MapMem) - maps) / 8 // a step's maps per try
	t.Logf("tries that mapped: %d", tries)
	assert.LessOrEqual(t, tries, int64(4), "a Wake woken by its own undo tries again at once, until its deadline")
	wakesOnceFreed(t, v, o, other)
}

// A Wake whose try fell short is served by memory another arena gives back
// before the relief that follows looks for any, without joining the queue
// of waiters: its growth reads the pool's count of returns before the try,
// so what another arena gives back counts, and what its own try gave back
// quietly (PutBack) does not. The memory comes back at the relief's first
// point (a sched hook, on the Wake's goroutine). Under a budget the try ends
// at the pool's Fits, before any driver call; on a device without a budget
// it maps a step and undoes it when the next one finds the device full.
func TestWakeShortServedByMemoryBackBeforeItsRelief(t *testing.T) {
	for _, budget := range []bool{true, false} {
		t.Run(fmt.Sprintf("budget=%v", budget), func(t *testing.T) {
			var pool *chunk.Pool
			if budget {
				pool = newSleepEnv(t).budgetPool(t, 16)
			} else {
				_, pool, _, _ = twoPools(t, 16) // the device's 16 chunks, no budget
			}
			newArena := func() *arena.Arena {
				a, err := arena.New(arena.Config{Pool: pool, Reserve: 32 << 20})
				require.NoError(t, err)
				t.Cleanup(func() { require.NoError(t, a.Close()) })
				return a
			}
			v, o := newArena(), newArena()
			fill(t, v, 12*sleepChunk, 1) // more than one step of Wake's
			require.NoError(t, v.Sleep(context.Background(), arena.Discard))
			require.NoError(t, pool.Trim())
			fill(t, o, 6*sleepChunk, 2) // in use: 10 chunks are left, v wants 12
			gave, queued := false, false
			defer sched.Set(func(p sched.Point, who any) {
				switch {
				case p == sched.ReliefBegin && who == pool && !gave:
					gave = true
					require.NoError(t, o.Reset())
					require.NoError(t, o.Shrink())
				case p == sched.WaitJoining:
					queued = true
				}
			})()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			require.NoError(t, v.Wake(ctx))
			assert.True(t, gave, "the Wake's first try was not short")
			assert.False(t, queued, "the memory o gave back did not count: the Wake joined the queue of waiters")
			require.Equal(t, 12*sleepChunk, v.Cap())
		})
	}
}

// GrowContext waits as quietly as Wake does (TestWakeWaitIsQuiet).
func TestGrowWaitIsQuiet(t *testing.T) {
	fd, mine, other, newArena := twoPools(t, 4)
	v := newArena(mine)
	fill(t, newArena(other), 3*sleepChunk, 2)
	waitIsQuiet(t, fd, func(ctx context.Context) error { return v.GrowContext(ctx, 3*sleepChunk) })
}

// An Offload sleep that failed twice (a copy to the host, then the undo's
// map) leaves chunks mapped whose bytes are not on the host; a Close that
// then fails (here the release of the range) must leave the arena asleep
// with those bytes, as a failed Close changes nothing: it unmapped them
// without copying them first, and the next Wake restored garbage there.
func TestFailedCloseOfDoubleFaultedSleepKeepsBytes(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{})
	b, want := fill(t, a, 10*sleepChunk, 2)
	e.fd.FailNth(faultdriver.MemcpyDtoH, 2, 0) // the second step's copy
	e.fd.FailNth(faultdriver.MapMem, 1, 0)     // and the undo's first map
	require.Error(t, a.Sleep(context.Background(), arena.Offload))
	e.fd.Clear()
	require.True(t, a.Asleep(), "the undo failed: asleep")

	e.fd.FailNth(faultdriver.ReleaseMemAddress, 1, 0)
	require.Error(t, a.Close(), "the release of the range fails")
	e.fd.Clear()
	require.True(t, a.Asleep(), "a failed Close leaves it as it was")

	require.NoError(t, a.Wake(context.Background()))
	got := contents(t, b)
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("bytes lost across a failed Close: first at %d (chunk %d)", i, i/sleepChunk)
		}
	}
}

// A Wake that finds no memory, and whose arena is closed between its failed
// try and its joining the queue of waiters (Close wakes the arena's waiters
// it finds: not this one yet), must see the arena closed and return, as a
// GrowContext does since the WaitJoining fix; behind another tenant's
// waiter nothing else wakes it, and it waits for memory for an arena that
// is gone until its ctx ends.
