package chunk_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
	"github.com/vmarena/vmarena/internal/sched/schedtest"
)

// spanDriver is a host driver that allows one access call over adjacent
// mappings, wrapped to count calls.
func spanDriver(t *testing.T, span bool) (*host.Driver, *faultdriver.Driver) {
	t.Helper()
	d, err := host.New(host.Config{Capacity: 64 << 20, AccessSpan: span})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.True(t, d.Live().Zero(), "leaked: %+v", d.Live())
		assert.NoError(t, d.Close())
	})
	return d, faultdriver.New(d)
}

// A multi-chunk MapRange grants access with one call where the driver
// allows it, and with one call per chunk where it does not.
func TestMapRangeAccessSpan(t *testing.T) {
	for _, span := range []bool{false, true} {
		t.Run(fmt.Sprint("span=", span), func(t *testing.T) {
			d, fd := spanDriver(t, span)
			p, err := chunk.New(fd, chunk.Config{})
			require.NoError(t, err)
			defer p.Close()
			base, err := d.ReserveMemAddress(8*g, 0, 0, 0)
			require.NoError(t, err)
			defer d.ReleaseMemAddress(base)
			cs, err := p.Lender().Acquire(0, 4)
			require.NoError(t, err)
			_, err = p.Lender().MapRange(base, cs, nil)
			require.NoError(t, err)
			want := int64(4)
			if span {
				want = 1
			}
			assert.Equal(t, want, fd.Calls(faultdriver.MemSetAccess))
			require.NoError(t, d.MemcpyHtoD(base+acl.DevicePtr(4*g-8), []byte("all four")))
			require.NoError(t, p.Lender().SyncDevice())
			for i := 3; i >= 0; i-- {
				require.NoError(t, p.Lender().Release(base+acl.DevicePtr(i*g), cs[i]))
				require.NoError(t, p.Lender().Put(cs[i]))
			}
		})
	}
}

// A failing access call over a span unmaps the whole run: nothing is left
// mapped, and the chunks go back whole.
func TestMapRangeFailureUndoesRun(t *testing.T) {
	d, fd := spanDriver(t, true)
	p, err := chunk.New(fd, chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	base, err := d.ReserveMemAddress(8*g, 0, 0, 0)
	require.NoError(t, err)
	defer d.ReleaseMemAddress(base)
	cs, err := p.Lender().Acquire(0, 3)
	require.NoError(t, err)
	fd.FailNth(faultdriver.MemSetAccess, 1, 0)
	_, err = p.Lender().MapRange(base, cs, nil)
	require.Error(t, err)
	assert.Zero(t, d.Live().Mappings)

	fd.FailNth(faultdriver.MemSetAccess, 1, 0)
	fd.FailNth(faultdriver.UnmapMem, 2, 0) // the second of the three undo unmaps
	_, err = p.Lender().MapRange(base, cs, nil)
	var left *chunk.LeftMappedError
	require.ErrorAs(t, err, &left)
	require.ErrorIs(t, err, chunk.ErrMapped)
	require.Len(t, left.Left, 1)
	assert.Equal(t, base+acl.DevicePtr(g), left.Left[0].At, "the middle chunk stayed mapped")
	assert.Equal(t, 1, d.Live().Mappings)
	require.NoError(t, p.Lender().Unmap(left.Left[0].At))
	for _, c := range cs {
		require.NoError(t, p.Lender().Put(c))
	}
}

// freshDriver says its fresh memory may hold only this process's bytes,
// under a device name of its own (the tenant history is per device).
type freshDriver struct {
	acl.Driver
	name string
}

func (d *freshDriver) Name() string   { return d.name }
func (d *freshDriver) Caps() acl.Caps { return acl.Caps{Fresh: acl.FreshProcess} }

var freshDevices atomic.Int64

// Where the device clears memory between processes, fresh memory needs no
// clear while the device has had a single tenant; once a second tenant has
// held memory, fresh chunks are cleared for everyone.
func TestFreshProcessMemory(t *testing.T) {
	d := scrubDriver(t, 64<<20)
	fd := &freshDriver{Driver: d, name: fmt.Sprintf("fresh-test-%d", freshDevices.Add(1))}
	p, err := chunk.New(fd, chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	defer d.ReleaseMemAddress(base)
	cycle := func(tn chunk.Tenant) {
		c, err := p.Lender().GetFor(tn)
		require.NoError(t, err)
		require.NoError(t, p.Lender().Map(base, c))
		require.NoError(t, p.Lender().Release(base, c))
		require.NoError(t, p.Lender().Put(c))
		require.NoError(t, p.Trim()) // back to the driver: the next one is fresh again
	}
	a, b := chunk.NewTenant(), chunk.NewTenant()
	cycle(a)
	cycle(a)
	s := p.Stats()
	assert.Zero(t, s.Scrubs, "a single tenant reads only its own freed bytes")
	cycle(b)
	s = p.Stats()
	assert.Equal(t, int64(1), s.Scrubs, "a second tenant: fresh memory may hold the first's bytes")
	assert.Equal(t, int64(1), s.ScrubsFresh)
	cycle(a)
	assert.Equal(t, int64(2), p.Stats().ScrubsFresh, "and from then on for every tenant")
}

// The worker keeps Config.Ahead fresh chunks in the cache, within the
// budget, and refills it after Gets.
func TestAhead(t *testing.T) {
	d := newDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{Ahead: 3, Budget: 4 * g})
	require.NoError(t, err)
	p.Lender().Settle()
	s := p.Stats()
	assert.Equal(t, 3, s.Cached)
	assert.Equal(t, int64(3), s.Ahead)
	c, err := p.Lender().Get()
	require.NoError(t, err)
	assert.Equal(t, int64(1), p.Stats().Hits, "served from the chunks allocated ahead")
	p.Lender().Settle()
	assert.Equal(t, 3, p.Stats().Cached, "refilled")
	c2, err := p.Lender().Get()
	require.NoError(t, err)
	p.Lender().Settle()
	s = p.Stats()
	assert.Equal(t, 2, s.Cached, "the budget (4 chunks) stops the refill at 2 in use + 2 cached")
	assert.LessOrEqual(t, s.HeldBytes, s.Budget)
	require.NoError(t, p.Lender().Put(c))
	require.NoError(t, p.Lender().Put(c2))
	require.NoError(t, p.Close())
}

// When the device is out of memory, a pool asks the other pools on the
// device to free their caches, and tries again.
func TestPeerPoolsGiveBackTheirCache(t *testing.T) {
	d := newDriver(t, 4*g)
	p1, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	defer p1.Close()
	p2, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	defer p2.Close()
	cs, err := p1.Lender().Acquire(0, 4)
	require.NoError(t, err)
	for _, c := range cs {
		require.NoError(t, p1.Lender().Put(c)) // p1 caches the whole device
	}
	got, err := p2.Lender().Acquire(0, 3)
	require.NoError(t, err, "p1's cache was freed for p2")
	assert.Equal(t, int64(4), p2.Stats().PeerTrimmed, "p1 freed its whole cache")
	assert.Zero(t, p1.Stats().Cached)
	for _, c := range got {
		require.NoError(t, p2.Lender().Put(c))
	}
	_, err = p2.Lender().Acquire(0, 5)
	require.ErrorIs(t, err, acl.ErrOutOfMemory, "more than the device has")
	assert.Equal(t, 4, p2.Stats().Cached, "a failed Acquire keeps what it allocated in the cache")
}

// streamed sets up a pool and a mapped chunk with a stream whose work reads
// it, for the stream-ordered release tests.
type streamed struct {
	d        *host.Driver
	fd       *faultdriver.Driver
	p        *chunk.Pool
	base     acl.DevicePtr
	s, other acl.Stream
	c        chunk.Chunk
}

func newStreamed(t *testing.T) *streamed {
	t.Helper()
	d := scrubDriver(t, 64<<20)
	fd := faultdriver.New(d)
	p, err := chunk.New(fd, chunk.Config{})
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	s, err := d.CreateStream()
	require.NoError(t, err)
	other, err := d.CreateStream()
	require.NoError(t, err)
	c, err := p.Lender().Get()
	require.NoError(t, err)
	require.NoError(t, p.Lender().Map(base, c))
	t.Cleanup(func() {
		assert.NoError(t, d.SynchronizeDevice())
		assert.NoError(t, p.Close())
		assert.NoError(t, d.ReleaseMemAddress(base))
		assert.NoError(t, d.DestroyStream(s))
		assert.NoError(t, d.DestroyStream(other))
		assert.Zero(t, d.Faults(), "no unmap under work in flight")
	})
	return &streamed{d: d, fd: fd, p: p, base: base, s: s, other: other, c: c}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// polled waits until the driver has been asked n more times whether an
// event has completed: the worker has looked at a release's event and, for
// all but the last look, decided what to do on what it heard.
func polled(t *testing.T, fd *faultdriver.Driver, n int64) {
	t.Helper()
	q := fd.Calls(faultdriver.QueryEvent)
	waitFor(t, func() bool { return fd.Calls(faultdriver.QueryEvent) >= q+n }, "the worker to look at the event")
}

// ReleaseAfter returns at once; the chunk stays mapped, held and lent to
// nobody until the work queued on its stream has run, then the worker
// unmaps it into the cache. Work on another stream is never waited for, and
// the device is never synchronised.
func TestReleaseAfterWaitsForItsStreamOnly(t *testing.T) {
	e := newStreamed(t)
	// Unrelated work on another stream reads another chunk, and is never
	// finished while the release waits.
	c2, err := e.p.Lender().Get()
	require.NoError(t, err)
	require.NoError(t, e.p.Lender().Map(e.base+acl.DevicePtr(g), c2))
	kernel, unrelated := make(chan struct{}), make(chan struct{})
	defer func() {
		close(unrelated)
		require.NoError(t, e.d.SynchronizeStream(e.other))
		require.NoError(t, e.p.Lender().Release(e.base+acl.DevicePtr(g), c2))
		require.NoError(t, e.p.Lender().Put(c2))
	}()
	require.NoError(t, e.d.Launch(e.s, e.base, g, kernel))
	require.NoError(t, e.d.Launch(e.other, e.base+acl.DevicePtr(g), 4096, unrelated))
	require.NoError(t, e.p.Lender().ReleaseAfter([]chunk.Mapped{{At: e.base, C: e.c}}, []acl.Stream{e.s}))
	s := e.p.Stats()
	assert.Equal(t, 1, s.Pending)
	assert.Equal(t, 2, s.InUse, "held, and lent to nobody")
	assert.Equal(t, 2, e.d.Live().Mappings, "still mapped while the kernel reads it")
	got, err := e.p.Lender().TryAcquire(nil, 0, chunk.Ask{Units: 1, Large: 1})
	require.NoError(t, err)
	assert.NotEqual(t, e.c, got[0], "a waiting chunk is handed to nobody")
	require.NoError(t, e.p.Lender().Put(got[0]))

	polled(t, e.fd, 2)
	assert.True(t, e.p.Lender().Pending(e.base), "the worker waits for the kernel")
	close(kernel)
	waitFor(t, func() bool { return !e.p.Lender().Pending(e.base) }, "the worker to unmap the chunk")
	s = e.p.Stats()
	assert.Equal(t, int64(1), s.Ordered)
	assert.Zero(t, s.DeviceSyncs, "no device-wide wait")
	assert.Zero(t, e.fd.Calls(faultdriver.SynchronizeDevice))
	assert.Equal(t, 2, s.Cached)
	assert.Equal(t, 1, e.d.Live().Mappings, "only the unrelated chunk is still mapped")
}

func TestLaunchRefusesEmptyRange(t *testing.T) {
	d := scrubDriver(t, 8<<20)
	require.Error(t, d.Launch(0, 0, 0, nil))
}

// A tenant that grows into a chunk still waiting for the device takes it
// back where it lies: no driver call, no wait.
func TestReclaimInPlace(t *testing.T) {
	e := newStreamed(t)
	kernel := make(chan struct{})
	require.NoError(t, e.d.Launch(e.s, e.base, g, kernel))
	require.NoError(t, e.p.Lender().ReleaseAfter([]chunk.Mapped{{At: e.base, C: e.c}}, []acl.Stream{e.s}))
	// (The worker polls the event meanwhile: count the calls that map.)
	maps, unmaps := e.fd.Calls(faultdriver.MapMem), e.fd.Calls(faultdriver.UnmapMem)
	c, ok, busy := e.p.Lender().Reclaim(e.base)
	require.True(t, ok)
	require.True(t, busy.IsZero())
	assert.Equal(t, e.c, c)
	assert.Equal(t, maps, e.fd.Calls(faultdriver.MapMem), "no map")
	assert.Equal(t, unmaps, e.fd.Calls(faultdriver.UnmapMem), "no unmap")
	assert.Zero(t, e.p.Stats().Pending)
	_, ok, _ = e.p.Lender().Reclaim(e.base)
	assert.False(t, ok, "taken once")
	close(kernel)
	require.NoError(t, e.d.SynchronizeStream(e.s))
	require.NoError(t, e.p.Lender().SyncDevice())
	require.NoError(t, e.p.Lender().Release(e.base, c))
	require.NoError(t, e.p.Lender().Put(c))
}

// When an event cannot be made or recorded, ReleaseAfter says so and
// changes nothing, so that the caller can fall back to waiting for the
// device; a failing query in the worker falls back to SyncDevice itself.
func TestReleaseAfterEventFailures(t *testing.T) {
	for _, op := range []faultdriver.Op{faultdriver.CreateEvent, faultdriver.RecordEvent} {
		t.Run(op.String(), func(t *testing.T) {
			e := newStreamed(t)
			e.fd.FailNth(op, 1, 0)
			err := e.p.Lender().ReleaseAfter([]chunk.Mapped{{At: e.base, C: e.c}}, []acl.Stream{e.s})
			require.ErrorIs(t, err, chunk.ErrNoOrder)
			assert.Zero(t, e.p.Stats().Pending, "nothing changed")
			assert.Equal(t, int64(1), e.p.Stats().SyncFallbacks)
			require.NoError(t, e.p.Lender().SyncDevice())
			require.NoError(t, e.p.Lender().Release(e.base, e.c))
			require.NoError(t, e.p.Lender().Put(e.c))
		})
	}
	t.Run("QueryEvent", func(t *testing.T) {
		e := newStreamed(t)
		e.fd.FailAfter(faultdriver.QueryEvent, 0, 0)
		require.NoError(t, e.p.Lender().ReleaseAfter([]chunk.Mapped{{At: e.base, C: e.c}}, []acl.Stream{e.s}))
		waitFor(t, func() bool { return !e.p.Lender().Pending(e.base) }, "the fallback to settle the chunk")
		s := e.p.Stats()
		assert.GreaterOrEqual(t, s.SyncFallbacks, int64(1))
		assert.GreaterOrEqual(t, s.DeviceSyncs, int64(1), "said so in the stats")
		e.fd.Clear()
	})
	t.Run("UnmapMem", func(t *testing.T) {
		e := newStreamed(t)
		e.fd.FailNth(faultdriver.UnmapMem, 1, 0)
		require.NoError(t, e.p.Lender().ReleaseAfter([]chunk.Mapped{{At: e.base, C: e.c}}, []acl.Stream{e.s}))
		waitFor(t, func() bool { return !e.p.Lender().Pending(e.base) }, "the retry to unmap the chunk")
		assert.Equal(t, int64(1), e.p.Stats().ReleaseErrors, "the failed unmap was counted, and retried")
	})
}

// WaitStreams honours its context while the device is busy, and returns as
// soon as the streams' work is done.
func TestWaitStreamsDeadline(t *testing.T) {
	e := newStreamed(t)
	kernel := make(chan struct{})
	require.NoError(t, e.d.Launch(e.s, e.base, g, kernel))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	err := e.p.Lender().WaitStreams(ctx, []acl.Stream{e.s})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	close(kernel)
	require.NoError(t, e.p.Lender().WaitStreams(context.Background(), []acl.Stream{e.s}))
	require.NoError(t, e.p.Lender().Release(e.base, e.c))
	require.NoError(t, e.p.Lender().Put(e.c))
	assert.Zero(t, e.p.Stats().DeviceSyncs)
}

// A pool's Close waits for the chunks still waiting for the device.
func TestCloseSettlesPending(t *testing.T) {
	e := newStreamed(t)
	kernel := make(chan struct{})
	require.NoError(t, e.d.Launch(e.s, e.base, g, kernel))
	require.NoError(t, e.p.Lender().ReleaseAfter([]chunk.Mapped{{At: e.base, C: e.c}}, []acl.Stream{e.s}))
	time.AfterFunc(5*time.Millisecond, func() { close(kernel) })
	require.NoError(t, e.p.Close())
	assert.Zero(t, e.d.Live().Mappings)
	assert.Zero(t, e.d.Live().Handles)
	assert.Zero(t, e.d.Live().Events, "the pool's events are destroyed")
}

// CloseContext's wait for the device ends with its ctx, while a kernel
// still reads the chunks: the pool is closed, those chunks stay mapped, and
// a later Close, once the kernel ended, unmaps and frees them.
func TestCloseContextEndsItsWait(t *testing.T) {
	e := newStreamed(t)
	kernel := make(chan struct{})
	require.NoError(t, e.d.Launch(e.s, e.base, g, kernel))
	require.NoError(t, e.p.Lender().ReleaseAfter([]chunk.Mapped{{At: e.base, C: e.c}}, []acl.Stream{e.s}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := e.p.CloseContext(ctx) // the kernel runs until the test ends it: a wait that ignored ctx would hang here
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "1 chunks still wait for the device")
	assert.Equal(t, 1, e.d.Live().Mappings, "still mapped under the kernel")
	_, err = e.p.Lender().Acquire(0, 1)
	require.ErrorIs(t, err, chunk.ErrClosed, "closed all the same")
	close(kernel)
	require.NoError(t, e.p.Close(), "a later Close finishes")
	assert.Zero(t, e.d.Live().Mappings)
	assert.Zero(t, e.d.Live().Handles)
	assert.Zero(t, e.d.Live().Events)
}

func TestAcquireArguments(t *testing.T) {
	d := newDriver(t, 8<<20)
	p, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Lender().Acquire(0, -1)
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	cs, err := p.Lender().Acquire(0, 0)
	require.NoError(t, err)
	assert.Empty(t, cs)
	require.NoError(t, p.Close())
	_, err = p.Lender().Acquire(0, 1)
	require.True(t, errors.Is(err, chunk.ErrClosed))
	_, err = p.Lender().Join(nil, false)
	require.ErrorIs(t, err, chunk.ErrClosed)
}

// Warm fills the cache with fresh chunks, within the budget and the cache's
// bound, and any tenant takes them without a MallocPhysical.
func TestWarm(t *testing.T) {
	d := newDriver(t, 64<<20)
	fd := faultdriver.New(d)
	p, err := chunk.New(fd, chunk.Config{Budget: 6 * g, MaxCached: 4})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Warm(-1)
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	n, err := p.Warm(10)
	require.NoError(t, err)
	assert.Equal(t, 4, n, "the cache holds 4")
	assert.Equal(t, 4, p.Stats().Cached)
	mallocs := fd.Calls(faultdriver.MallocPhysical)
	cs, err := p.Lender().Acquire(chunk.NewTenant(), 4)
	require.NoError(t, err)
	assert.Equal(t, mallocs, fd.Calls(faultdriver.MallocPhysical), "served from the warm cache")
	n, err = p.Warm(10)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the budget (6 chunks) stops it")
	for _, c := range cs {
		require.NoError(t, p.Lender().Put(c))
	}
	fd.FailNth(faultdriver.MallocPhysical, 1, acl.ErrCodeRTDrvInternal)
	require.NoError(t, p.Trim())
	n, err = p.Warm(1)
	require.Error(t, err, "a driver failure other than out of memory is reported")
	assert.Zero(t, n)
}

// releasedUnderKernel maps a chunk of p at base, launches a kernel over it on
// s that runs until the returned channel is closed, and releases the chunk
// to wait for it.
func releasedUnderKernel(t *testing.T, d *host.Driver, p *chunk.Pool, base acl.DevicePtr, s acl.Stream) chan struct{} {
	t.Helper()
	c, err := p.Lender().Get()
	require.NoError(t, err)
	require.NoError(t, p.Lender().Map(base, c))
	kernel := make(chan struct{})
	require.NoError(t, d.Launch(s, base, g, kernel))
	require.NoError(t, p.Lender().ReleaseAfter([]chunk.Mapped{{At: base, C: c}}, []acl.Stream{s}))
	return kernel
}

// reliefChose returns a channel closed when a relief of p has chosen the
// chunks it takes (sched.ReliefSelect), until the test ends.
func reliefChose(t *testing.T, p *chunk.Pool) <-chan struct{} {
	chose := make(chan struct{})
	var once sync.Once
	t.Cleanup(sched.Set(func(pt sched.Point, who any) {
		if who == p && pt == sched.ReliefSelect {
			once.Do(func() { close(chose) })
		}
	}))
	return chose
}

// acquireOne acquires one chunk of p in the background and puts it back,
// and sends the outcome.
func acquireOne(p *chunk.Pool) <-chan error {
	got := make(chan error, 1)
	go func() {
		cs, err := p.Lender().Acquire(chunk.NewTenant(), 1)
		if err == nil {
			err = p.Lender().Put(cs[0])
		}
		got <- err
	}()
	return got
}

// refiller is a Client that counts its refills.
type refiller struct{ n atomic.Int64 }

func (r *refiller) Reclaimable(chunk.Ticket) (int, bool) { return 0, false }
func (r *refiller) Held() int                            { return 0 }
func (r *refiller) Give(int, chunk.Ticket, func([]chunk.Mapped, []acl.Stream)) (int, bool) {
	return 0, false
}
func (r *refiller) Refill() { r.n.Add(1) }
func (r *refiller) waitFor(t *testing.T, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return r.n.Load() >= n }, 5*time.Second, 50*time.Microsecond,
		"refill %d never came", n)
}

// No refill request is lost, whether the worker is parked, polling, or
// between the two (it parks after about 50 ms without a request; requests
// come here at every gap around that).
func TestRefillRequestsNeverLost(t *testing.T) {
	p, err := chunk.New(newDriver(t, 16<<20), chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	r := &refiller{}
	m, err := p.Lender().Join(r, true)
	require.NoError(t, err)
	gaps := []time.Duration{0, 100 * time.Microsecond, time.Millisecond, 3 * time.Millisecond, 45 * time.Millisecond,
		50 * time.Millisecond, 55 * time.Millisecond, 80 * time.Millisecond}
	rounds := 48
	if testing.Short() {
		rounds = 16
	}
	for i := range rounds {
		time.Sleep(gaps[i%len(gaps)])
		m.WantRefill()
		r.waitFor(t, int64(i+1))
	}
}

// A worker that has not been asked for anything lately parks: it stops
// waking up. It is seen deciding to park after the round that refilled, and
// then blocked; a worker that kept polling would never decide so.
func TestIdleWorkerParks(t *testing.T) {
	p, err := chunk.New(newDriver(t, 16<<20), chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	parks := make(chan int64, 64) // the worker's rounds so far at each park
	defer sched.Set(func(pt sched.Point, who any) {
		if who == p && pt == sched.WorkerParks {
			select {
			case parks <- p.Stats().WorkerSpins:
			default:
			}
		}
	})()
	r := &refiller{}
	m, err := p.Lender().Join(r, true)
	require.NoError(t, err)
	before := p.Stats().WorkerSpins
	m.WantRefill()
	r.waitFor(t, 1)
	timeout := time.After(10 * time.Second)
	for parked := false; !parked; {
		select {
		case n := <-parks:
			parked = n > before // after the round that refilled
		case <-timeout:
			t.Fatalf("the worker still wakes up with nothing to do (%d rounds)", p.Stats().WorkerSpins-before)
		}
	}
	spins := p.Stats().WorkerSpins
	schedtest.WaitBlocked(t, "select", "github.com/vmarena/vmarena/chunk.(*Pool).run")
	assert.Equal(t, spins, p.Stats().WorkerSpins, "a parked worker makes no round until it is poked")
}

// budgeted returns a pool with a budget of chunks chunks on a host driver,
// a reservation of two chunks and a stream, all closed when the test ends,
// when the driver must have seen no unmap under work in flight.
func budgeted(t *testing.T, chunks int64) (*host.Driver, *chunk.Pool, acl.DevicePtr, acl.Stream) {
	t.Helper()
	return poolOn(t, 64<<20, chunk.Config{Budget: chunks * g})
}

// poolOn is budgeted for a pool of cfg on a host driver of capacity bytes.
func poolOn(t *testing.T, capacity uintptr, cfg chunk.Config) (*host.Driver, *chunk.Pool, acl.DevicePtr, acl.Stream) {
	t.Helper()
	return poolThrough(t, capacity, cfg, nil)
}

// poolThrough is poolOn with the pool on wrap(the host driver), unless wrap
// is nil.
func poolThrough(t *testing.T, capacity uintptr, cfg chunk.Config, wrap func(*host.Driver) acl.Driver) (*host.Driver, *chunk.Pool, acl.DevicePtr, acl.Stream) {
	t.Helper()
	return poolReserving(t, capacity, cfg, wrap, 2*g)
}

// poolReserving is poolThrough with a reservation of size bytes.
func poolReserving(t *testing.T, capacity uintptr, cfg chunk.Config, wrap func(*host.Driver) acl.Driver, size uintptr) (*host.Driver, *chunk.Pool, acl.DevicePtr, acl.Stream) {
	t.Helper()
	d := scrubDriver(t, capacity)
	var drv acl.Driver = d
	if wrap != nil {
		drv = wrap(d)
	}
	p, err := chunk.New(drv, cfg)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(size, 0, 0, 0)
	require.NoError(t, err)
	s, err := d.CreateStream()
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, p.Close())
		assert.NoError(t, d.ReleaseMemAddress(base))
		assert.NoError(t, d.DestroyStream(s))
		assert.Zero(t, d.Faults(), "no unmap under work in flight")
	})
	return d, p, base, s
}

// Regression: an Acquire short of budget while the only chunks that could
// make room wait for the device must wait for them and get one. The pool's
// relief counted only what members gave back, so chunks it put back from
// waiting did not count, and the Acquire failed with room in the cache.
func TestRegressionReliefCountsSettledChunks(t *testing.T) {
	d, p, base, s := budgeted(t, 1)
	kernel := releasedUnderKernel(t, d, p, base, s)

	chose := reliefChose(t, p)
	got := acquireOne(p)
	<-chose // the Acquire's relief claimed the chunk that waits for the kernel, and waits with it
	close(kernel)
	require.NoError(t, <-got, "the chunk waiting for the device makes room once the kernel is done")
	assert.Equal(t, 1, p.Stats().Cached)
}

// While an Acquire relieves pressure, TryAcquire (the worker's refills)
// takes nothing: the memory the relief frees is for that Acquire, and a
// refill that took it first would leave it short (found by the fuzzer, under
// load). Once the Acquire is done, TryAcquire is itself again.
func TestTryAcquireStandsAsideDuringRelief(t *testing.T) {
	d, p, base, s := budgeted(t, 2)
	cs, err := p.Lender().Acquire(0, 2)
	require.NoError(t, err)
	require.NoError(t, p.Lender().Map(base, cs[0]))
	require.NoError(t, p.Lender().Put(cs[1])) // cached, free
	kernel := make(chan struct{})
	finish := sync.OnceFunc(func() { close(kernel) })
	defer finish() // before Close, should the test fail first
	require.NoError(t, d.Launch(s, base, g, kernel))
	require.NoError(t, p.Lender().ReleaseAfter([]chunk.Mapped{{At: base, C: cs[0]}}, []acl.Stream{s}))

	chosen := make(chan struct{})
	once := sync.OnceFunc(func() { close(chosen) })
	defer sched.Set(func(at sched.Point, who any) {
		if at == sched.ReliefSelect && who == p {
			once()
		}
	})()
	got := make(chan []chunk.Chunk, 1)
	go func() {
		cs, err := p.Lender().Acquire(chunk.NewTenant(), 2) // the cached chunk, and the one the kernel holds
		assert.NoError(t, err)
		got <- cs
	}()
	<-chosen // the relief chose the chunk the kernel holds, and waits for it
	_, err = p.Lender().TryAcquire(nil, 0, chunk.Ask{Units: 1, Large: 1})
	require.Error(t, err, "TryAcquire stands aside")
	assert.Contains(t, err.Error(), "relieving pressure")
	finish()
	cs = <-got
	require.Len(t, cs, 2)
	_, err = p.Lender().TryAcquire(nil, 0, chunk.Ask{Units: 1, Large: 1})
	require.Error(t, err, "the budget is full")
	assert.NotContains(t, err.Error(), "relieving", "no relief under way")
	for _, c := range cs {
		require.NoError(t, p.Lender().Put(c))
	}
}

// meter is a Client that reports the bytes it uses (a chunk.Meter).
type meter struct {
	refiller
	used atomic.Int64
}

func (m *meter) Used() int64 { return m.used.Load() }

// Stats counts the pool's members and adds up the bytes the Meters among
// them use; a member that leaves takes its bytes with it.
func TestStatsMembersAndUsed(t *testing.T) {
	p, err := chunk.New(newDriver(t, 16<<20), chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	a, b := &meter{}, &meter{}
	a.used.Store(3 << 20)
	b.used.Store(1 << 10)
	ma, err := p.Lender().Join(a, false)
	require.NoError(t, err)
	mb, err := p.Lender().Join(b, false)
	require.NoError(t, err)
	mc, err := p.Lender().Join(&refiller{}, false) // not a Meter: a member, using nothing it reports
	require.NoError(t, err)
	s := p.Stats()
	assert.Equal(t, 3, s.Members)
	assert.Equal(t, int64(3<<20+1<<10), s.UsedBytes)
	a.used.Store(5 << 20)
	assert.Equal(t, int64(5<<20+1<<10), p.Stats().UsedBytes, "read at each Stats")
	ma.Leave()
	s = p.Stats()
	assert.Equal(t, 2, s.Members)
	assert.Equal(t, int64(1<<10), s.UsedBytes)
	mb.Leave()
	mc.Leave()
	assert.Equal(t, chunk.Stats{ChunkSize: p.ChunkSize(), TailSize: p.TailSize()}, p.Stats())
}

// AskRefill serves a member that joined without refills: it starts the
// worker, which calls the member's Refill.
func TestAskRefillStartsTheWorker(t *testing.T) {
	p, err := chunk.New(newDriver(t, 16<<20), chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	r := &refiller{}
	m, err := p.Lender().Join(r, false)
	require.NoError(t, err)
	m.WantRefill() // does nothing: no refills were asked for at Join
	p.Lender().Settle()
	assert.Zero(t, r.n.Load())
	m.AskRefill()
	r.waitFor(t, 1)
	require.NoError(t, p.Close())
	m.AskRefill() // a closed pool: nothing
}

// Regressions (found by the fuzzer in CI, timing-dependent): a chunk the
// worker unmaps while a growth is short of memory comes back where the
// growth's relief is not handed it, and the relief counted no progress, so
// the Acquire gave up beside it:
//
//   - cached: the relief claimed the batch whose chunk the worker was
//     unmapping at that moment; the worker put the chunk in the cache;
//   - freed: on a device that is full, with no budget and no cache, the
//     worker freed it: room on the device, not in the cache, which no count
//     of the pool's showed (now its returns count does).
//
// The worker is stopped inside that unmap, then let go once the relief has
// claimed its batch, or as the relief begins, finishing before it looks.
func TestRegressionReliefCountsWhatTheWorkerPutsBack(t *testing.T) {
	for _, pool := range []struct {
		name string
		make func(t *testing.T) (*chunk.Pool, acl.DevicePtr, acl.Stream)
	}{
		{"cached", func(t *testing.T) (*chunk.Pool, acl.DevicePtr, acl.Stream) {
			_, p, base, s := budgeted(t, 1)
			return p, base, s
		}},
		{"freed", func(t *testing.T) (*chunk.Pool, acl.DevicePtr, acl.Stream) {
			_, p, base, s := poolOn(t, g, chunk.Config{MaxCached: -1}) // a full device, no budget, no cache
			return p, base, s
		}},
	} {
		for _, tc := range []struct {
			name string
			at   sched.Point
		}{{"claimed", sched.ReliefSelect}, {"before", sched.ReliefBegin}} {
			t.Run(pool.name+"/"+tc.name, func(t *testing.T) {
				p, base, s := pool.make(t)
				workerPutsBackDuringRelief(t, p, base, s, tc.at)
			})
		}
	}
}

// workerPutsBackDuringRelief maps p's one chunk at base, releases it after
// the idle stream s and stops the worker inside its unmap; an Acquire of
// one chunk then falls short and relieves, and the worker is let go when
// the relief reaches at (at ReliefBegin it finishes before the relief looks
// on). The Acquire must get the chunk.
func workerPutsBackDuringRelief(t *testing.T, p *chunk.Pool, base acl.DevicePtr, s acl.Stream, at sched.Point) {
	l := p.Lender()
	c, err := l.Get()
	require.NoError(t, err)
	require.NoError(t, l.Map(base, c))
	frees := p.Stats().Frees
	unmapping, goOn, reached := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var stop, once sync.Once
	defer sched.Set(func(pt sched.Point, who any) {
		if who != p {
			return
		}
		switch pt {
		case sched.ReleaseUnmap:
			stop.Do(func() { close(unmapping); <-goOn })
		case at:
			once.Do(func() {
				close(reached)
				if at != sched.ReliefBegin {
					return
				}
				// The worker puts the chunk back before the relief looks.
				for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
					if st := p.Stats(); st.Cached > 0 || st.Frees > frees {
						return
					}
				}
			})
		}
	})()
	// The stream is idle: the worker unmaps the chunk at once, and stops there.
	require.NoError(t, l.ReleaseAfter([]chunk.Mapped{{At: base, C: c}}, []acl.Stream{s}))
	<-unmapping
	got := make(chan error, 1)
	go func() {
		cs, err := l.Acquire(chunk.NewTenant(), 1)
		if err == nil {
			err = l.Put(cs[0])
		}
		got <- err
	}()
	<-reached
	close(goOn)
	require.NoError(t, <-got, "the chunk the worker put back serves the Acquire")
}

// A Close of the pool that finds a relief unmapping the chunk it claimed
// waits for that unmap to end (on the channel the item gets when its unmap
// begins) before it goes on. When the relief's unmap fails the chunk goes
// back to waiting, the wait ends all the same, and Close unmaps it itself.
// Either way nothing is left behind.
func TestCloseWaitsOutAReliefsUnmap(t *testing.T) {
	for _, fail := range []bool{false, true} {
		name := "unmapped"
		if fail {
			name = "failed"
		}
		t.Run(name, func(t *testing.T) {
			var fd *faultdriver.Driver
			d, p, base, s := poolThrough(t, 64<<20, chunk.Config{Budget: g}, func(d *host.Driver) acl.Driver {
				fd = faultdriver.New(d)
				return fd
			})
			kernel := releasedUnderKernel(t, d, p, base, s)
			if fail {
				fd.FailNth(faultdriver.UnmapMem, 1, 0)
			}

			chose, unmapping, goOn, awaiting := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
			var chosen, once, awaited sync.Once
			defer sched.Set(func(pt sched.Point, who any) {
				if who != p {
					return
				}
				switch pt {
				case sched.ReliefSelect:
					chosen.Do(func() { close(chose) })
				case sched.ReleaseUnmap:
					once.Do(func() { close(unmapping); <-goOn })
				case sched.UnmapAwaited:
					awaited.Do(func() { close(awaiting) })
				}
			})()
			// The budget is full: the Acquire's relief claims the waiting
			// chunk and, once the kernel is done, unmaps it, and stops there.
			got := acquireOne(p)
			<-chose // the relief claimed the batch and waits for the kernel
			close(kernel)
			<-unmapping
			closed := make(chan error, 1)
			go func() { closed <- p.Close() }()
			select {
			case err := <-closed:
				t.Fatalf("Close returned while the relief was unmapping: %v", err)
			case <-awaiting: // Close found the chunk being unmapped, and waits for that
			case <-time.After(10 * time.Second):
				t.Fatal("Close neither returned nor waited for the relief's unmap")
			}
			close(goOn)
			err := <-got
			if cerr := <-closed; cerr != nil {
				// The Acquire handed the chunk may give it back (its Put, or
				// its own failure on the closed pool) after Close counted it
				// in use; it is freed then.
				assert.ErrorContains(t, cerr, "still in use")
			}
			if err != nil && !errors.Is(err, chunk.ErrClosed) {
				// Close wakes the Acquire's retries, which fail (the chunk it
				// may have got is the pool's again); a relief whose unmap
				// failed found no room.
				require.True(t, fail, "Acquire: %v", err)
				require.ErrorIs(t, err, acl.ErrOutOfMemory)
			}
			require.NoError(t, p.Close())
			assert.Zero(t, p.Stats().Pending)
		})
	}
}

// gatedRefiller is a refiller whose first Refill waits, inside, for out.
type gatedRefiller struct {
	refiller
	in, out chan struct{}
	once    sync.Once
}

func (r *gatedRefiller) Refill() {
	r.once.Do(func() { close(r.in); <-r.out })
	r.refiller.Refill()
}

// An AskRefill made while the worker refills the member is served by a
// refill after that one (the worker clears the request before it refills),
// and the asks made before the worker comes round again are served by one.
func TestAskRefillDuringARefill(t *testing.T) {
	p, err := chunk.New(newDriver(t, 16<<20), chunk.Config{})
	require.NoError(t, err)
	defer p.Close()
	r := &gatedRefiller{in: make(chan struct{}), out: make(chan struct{})}
	m, err := p.Lender().Join(r, false)
	require.NoError(t, err)
	m.AskRefill()
	<-r.in // the worker is inside the first refill
	m.AskRefill()
	m.AskRefill()
	close(r.out)
	r.waitFor(t, 2)
	p.Lender().Settle()
	p.Lender().Settle()
	assert.Equal(t, int64(2), r.n.Load(), "the two asks during the first refill: one more refill")
}
