package acltest

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

// live returns d's live counts, if it keeps them.
func live(d acl.Driver) (acl.LiveCounts, bool) {
	if c, ok := d.(acl.Counter); ok {
		return c.Live(), true
	}
	return acl.LiveCounts{}, false
}

// launcher returns the factory's way of queueing work on d; without one it
// skips t on Hardware and fails it on a simulator.
func launcher(t *testing.T, d acl.Driver, f Factory) acl.Launcher {
	t.Helper()
	var l acl.Launcher
	if f.Launcher != nil {
		l = f.Launcher(d)
	} else if dl, ok := d.(acl.Launcher); ok {
		l = dl
	}
	if l == nil {
		simulatorOnly(t, f, "no way to queue stand-in device work on "+d.Name())
	}
	return l
}

func newStream(t testing.TB, d acl.Driver) acl.Stream {
	t.Helper()
	s, err := d.CreateStream()
	require.NoError(t, err)
	require.NotZero(t, s)
	t.Cleanup(func() {
		assert.NoError(t, d.SynchronizeStream(s))
		assert.NoError(t, d.DestroyStream(s))
	})
	return s
}

func newEvent(t testing.TB, d acl.Driver) acl.Event {
	t.Helper()
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	require.NotZero(t, ev)
	t.Cleanup(func() { assert.NoError(t, d.DestroyEvent(ev)) })
	return ev
}

func testStreams(t *testing.T, d acl.Driver, f Factory) {
	before, counted := live(d)
	s, err := d.CreateStream()
	require.NoError(t, err)
	require.NotZero(t, s)
	if now, _ := live(d); counted {
		assert.Equal(t, before.Streams+1, now.Streams, "a created stream is counted")
	}
	require.NoError(t, d.SynchronizeStream(s), "an empty stream")
	require.NoError(t, d.SynchronizeStream(0), "the default stream")
	require.NoError(t, d.SynchronizeDevice())
	require.NoError(t, d.DestroyStream(s))
	if now, _ := live(d); counted {
		assert.Equal(t, before.Streams, now.Streams, "a destroyed stream is not counted")
	}
	requireFail(t, f, d.DestroyStream(s), acl.ErrCodeRTParamInvalid, "destroy twice")
	requireFail(t, f, d.SynchronizeStream(s), acl.ErrCodeRTParamInvalid, "synchronise a destroyed stream")
}

func testEvents(t *testing.T, d acl.Driver, f Factory) {
	s := newStream(t, d)
	before, counted := live(d)
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	require.NotZero(t, ev)
	if now, _ := live(d); counted {
		assert.Equal(t, before.Events+1, now.Events, "a created event is counted")
	}
	for _, on := range []acl.Stream{s, 0} {
		require.NoError(t, d.RecordEvent(ev, on))
		require.NoError(t, d.SynchronizeEvent(ev))
		done, err := d.QueryEvent(ev)
		require.NoError(t, err)
		assert.True(t, done, "an event recorded on an idle stream completes")
	}
	require.NoError(t, d.DestroyEvent(ev))
	if now, _ := live(d); counted {
		assert.Equal(t, before.Events, now.Events, "a destroyed event is not counted")
	}
	requireFail(t, f, d.DestroyEvent(ev), acl.ErrCodeRTParamInvalid, "destroy twice")
	requireFail(t, f, d.RecordEvent(ev, s), acl.ErrCodeRTParamInvalid, "record a destroyed event")
	_, err = d.QueryEvent(ev)
	requireFail(t, f, err, acl.ErrCodeRTParamInvalid, "query a destroyed event")
	requireFail(t, f, d.DestroyEvent(0), acl.ErrCodeInvalidParam, "destroy NULL")

	ev2 := newEvent(t, d)
	gone, err := d.CreateStream()
	require.NoError(t, err)
	require.NoError(t, d.DestroyStream(gone))
	requireFail(t, f, d.RecordEvent(ev2, gone), acl.ErrCodeRTParamInvalid, "record on a destroyed stream")
}

func testMemsetAsync(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	s := newStream(t, d)
	base := reserve(t, d, 2*g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h := mapChunk(t, d, base, g)
	defer unmapFree(t, d, base, h)

	require.NoError(t, d.MemsetAsync(base, 0x5A, g, s))
	require.NoError(t, d.MemsetAsync(base+16, 0x01, 8, s), "queued after the first, runs after it")
	require.NoError(t, d.SynchronizeStream(s))
	got := make([]byte, 32)
	require.NoError(t, d.MemcpyDtoH(got, base))
	want := bytes.Repeat([]byte{0x5A}, 32)
	copy(want[16:24], bytes.Repeat([]byte{0x01}, 8))
	require.Equal(t, want, got)

	require.NoError(t, d.MemsetAsync(base, 0x00, g, 0), "on the default stream")
	require.NoError(t, d.SynchronizeStream(0))
	require.NoError(t, d.MemcpyDtoH(got, base+acl.DevicePtr(g-32)))
	require.Equal(t, make([]byte, 32), got)

	require.NoError(t, d.MemsetAsync(base, 0, 0, s), "nothing to set")
	require.Error(t, d.MemsetAsync(base+acl.DevicePtr(g), 0, 8, s), "unmapped memory is refused when queued")
	require.Error(t, d.MemsetAsync(base+acl.DevicePtr(g-4), 0, 8, s), "past the mapping")
}

func testAccessSpan(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	base := reserve(t, d, 4*g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	var hs []acl.PhysicalHandle
	for i := range 2 {
		h, err := d.MallocPhysical(g, prop(d), 0)
		require.NoError(t, err)
		require.NoError(t, d.MapMem(base+acl.DevicePtr(uintptr(i)*g), g, 0, h, 0))
		hs = append(hs, h)
	}
	defer func() {
		for i, h := range hs {
			unmapFree(t, d, base+acl.DevicePtr(uintptr(i)*g), h)
		}
	}()
	err := d.MemSetAccess(base, 2*g, acl.ReadWrite(d.Device()))
	if errors.Is(err, acl.ErrNotSupported) {
		return // mappings are accessible as made on this runtime
	}
	if !d.Caps().AccessSpan {
		requireFail(t, f, err, acl.ErrCodeRTParamInvalid, "one access call over two mappings, on a device that does not allow it")
		setAccess(t, d, base, g)
		setAccess(t, d, base+acl.DevicePtr(g), g)
	} else {
		require.NoError(t, err, "one access call over two adjacent mappings")
	}
	msg := []byte("across the seam")
	at := base + acl.DevicePtr(g-4)
	require.NoError(t, d.MemcpyHtoD(at, msg))
	got := make([]byte, len(msg))
	require.NoError(t, d.MemcpyDtoH(got, at))
	require.Equal(t, msg, got)
	requireFail(t, f, d.MemSetAccess(base, 3*g, acl.ReadWrite(d.Device())), acl.ErrCodeRTParamInvalid, "a span over unmapped memory")
}

// testFresh checks the promise of a driver whose fresh memory reads zero
// (Run lists it only for those).
func testFresh(t *testing.T, d acl.Driver, f Factory) {
	require.Equal(t, acl.FreshZeroed, d.Caps().Fresh)
	g := granule(t, d)
	base := reserve(t, d, g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	for range 2 {
		h := mapChunk(t, d, base, g)
		got := make([]byte, g)
		require.NoError(t, d.MemcpyDtoH(got, base))
		require.Equal(t, make([]byte, g), got, "fresh memory reads zero")
		require.NoError(t, d.Memset(base, 0xEE, g)) // dirty it for the next round
		unmapFree(t, d, base, h)
	}
}

// waitTrue polls cond for up to a few seconds.
func waitTrue(t testing.TB, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func testInFlight(t *testing.T, d acl.Driver, f Factory) {
	l := launcher(t, d, f)
	g := granule(t, d)
	s1, s2 := newStream(t, d), newStream(t, d)
	ev1, ev2 := newEvent(t, d), newEvent(t, d)
	base := reserve(t, d, 2*g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h := mapChunk(t, d, base, g)
	defer unmapFree(t, d, base, h)
	faults := l.Faults()

	done := make(chan struct{})
	require.NoError(t, l.Launch(s1, base, g, done))
	require.NoError(t, d.RecordEvent(ev1, s1))
	require.NoError(t, d.RecordEvent(ev2, s2))
	// Work on s1 holds ev1 back; s2 is unrelated and is never held by it.
	require.NoError(t, d.SynchronizeEvent(ev2))
	require.NoError(t, d.SynchronizeStream(s2))
	complete, err := d.QueryEvent(ev1)
	require.NoError(t, err)
	assert.False(t, complete, "an event behind work in flight is not complete")

	waited := make(chan error, 1)
	go func() { waited <- d.SynchronizeEvent(ev1) }()
	select {
	case err := <-waited:
		t.Fatalf("SynchronizeEvent returned (%v) while the work before it was in flight", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(done)
	require.NoError(t, <-waited)
	complete, err = d.QueryEvent(ev1)
	require.NoError(t, err)
	assert.True(t, complete)

	// SynchronizeDevice waits for every stream.
	done = make(chan struct{})
	require.NoError(t, l.Launch(s2, base, g, done))
	start := time.Now()
	time.AfterFunc(20*time.Millisecond, func() { close(done) })
	require.NoError(t, d.SynchronizeDevice())
	assert.GreaterOrEqual(t, time.Since(start), 15*time.Millisecond, "SynchronizeDevice waited for the work")
	assert.Equal(t, faults, l.Faults(), "no fault: nothing was unmapped under work")
}

func testUnmapFault(t *testing.T, d acl.Driver, f Factory) {
	l := launcher(t, d, f)
	g := granule(t, d)
	s := newStream(t, d)
	base := reserve(t, d, g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h := mapChunk(t, d, base, g)
	faults := l.Faults()
	done := make(chan struct{})
	require.NoError(t, l.Launch(s, base, g, done))
	require.NoError(t, d.UnmapMem(base), "the unmap itself succeeds, as on a device")
	close(done)
	err := d.SynchronizeStream(s)
	waitTrue(t, func() bool { return l.Faults() > faults }, "the device to report the work's fault")
	if err == nil {
		// The fault may be reported by the next synchronisation instead.
		_ = d.SynchronizeStream(s)
	}
	require.NoError(t, d.FreePhysical(h))
}

func testCopyRaceFault(t *testing.T, d acl.Driver, f Factory) {
	l := launcher(t, d, f)
	g := granule(t, d)
	s := newStream(t, d)
	base := reserve(t, d, g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h := mapChunk(t, d, base, g)
	defer unmapFree(t, d, base, h)
	faults := l.Faults()
	done := make(chan struct{})
	require.NoError(t, l.Launch(s, base, g, done))
	require.NoError(t, d.MemsetAsync(base, 0, g, s), "a clear queued behind the work")
	// A synchronous copy into memory that queued work will still write races
	// with it: the simulators report it.
	_ = d.MemcpyHtoD(base, []byte("racing"))
	assert.Greater(t, l.Faults(), faults, "a synchronous copy racing queued writes is a fault")
	close(done)
	require.NoError(t, d.SynchronizeStream(s))
	// Ordered properly, the same copy is no fault.
	faults = l.Faults()
	require.NoError(t, d.MemcpyHtoD(base, []byte("ordered")))
	assert.Equal(t, faults, l.Faults())
}
