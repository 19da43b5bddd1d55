//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/ascend"
)

// UnmapMem is the bare aclrtUnmapMem: it synchronises nothing. Unmapping a
// range that a running kernel touches succeeds, counts a fault, and fails the
// kernel's stream at its next synchronisation, once.
func TestUnmapIsBare(t *testing.T) {
	d, dbl := openDouble(t, variantPath(t, "full"), 1<<30, ascend.Config{})
	base, h := mapped(t, d, 1)
	s, err := d.CreateStream()
	require.NoError(t, err)
	before := dbl.Stats()

	done := make(chan struct{})
	require.NoError(t, dbl.Launch(0, s, base+4096, 8192, done))
	require.NoError(t, d.UnmapMem(base), "the unmap succeeds, as on the NPU")
	after := dbl.Stats()
	assert.Equal(t, before.SyncDeviceCalls, after.SyncDeviceCalls, "UnmapMem synchronised the device")
	assert.Equal(t, before.Faults+1, after.Faults, "the kernel touches unmapped memory")
	assert.Equal(t, int64(1), after.PendingWork, "the unmap did not wait for the kernel")

	close(done)
	e := requireACLError(t, d.SynchronizeStream(s), "aclrtSynchronizeStream", acl.ErrCodeRTDrvInternal)
	assert.Contains(t, e.Msg, "illegal address")
	require.NoError(t, d.SynchronizeStream(s), "the error is reported once")
	require.NoError(t, d.DestroyStream(s))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
}

// A memset queued behind a kernel, whose range is unmapped before it runs,
// writes nothing, even when the range is mapped again by then.
func TestMemsetAsyncAfterUnmapWritesNothing(t *testing.T) {
	d, dbl := openDouble(t, variantPath(t, "full"), 1<<30, ascend.Config{})
	base, h := mapped(t, d, 1)
	require.NoError(t, d.MemcpyHtoD(base, []byte("before")))
	s, err := d.CreateStream()
	require.NoError(t, err)
	faults := dbl.faults()

	done := make(chan struct{})
	require.NoError(t, dbl.Launch(0, s, base+acl.DevicePtr(g/2), 4096, done))
	require.NoError(t, d.MemsetAsync(base, 0x11, g, s))
	require.NoError(t, d.UnmapMem(base))
	assert.Equal(t, faults+2, dbl.faults(), "the running kernel and the queued memset touch the unmapped range")
	require.NoError(t, d.MapMem(base, g, 0, h, 0), "mapped again before the memset runs")
	close(done)
	requireACLError(t, d.SynchronizeStream(s), "aclrtSynchronizeStream", acl.ErrCodeRTDrvInternal)
	got := make([]byte, 6)
	require.NoError(t, d.MemcpyDtoH(got, base))
	assert.Equal(t, "before", string(got), "the faulted memset wrote nothing")
	require.NoError(t, d.DestroyStream(s))
	unmapped(t, d, base, h)
}

// The synchronous calls wait for no stream: with a kernel in flight they
// return at once, never synchronise the device, and race only when they
// touch what the kernel touches.
func TestSynchronousCallsWaitForNoStream(t *testing.T) {
	d, dbl := openDouble(t, variantPath(t, "full"), 1<<30, ascend.Config{})
	base, h := mapped(t, d, 4)
	defer unmapped(t, d, base, h)
	s, err := d.CreateStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyStream(s)) }()
	done := make(chan struct{})
	require.NoError(t, dbl.Launch(0, s, base, g, done)) // the first chunk
	before := dbl.Stats()

	other := base + acl.DevicePtr(2*g)
	require.NoError(t, d.MemcpyHtoD(other, []byte("elsewhere")))
	buf := make([]byte, 9)
	require.NoError(t, d.MemcpyDtoH(buf, other))
	require.NoError(t, d.Memset(other, 7, 64))
	require.NoError(t, d.MemcpyDtoD(other+acl.DevicePtr(g), other, 4096), "on the private copy stream")
	after := dbl.Stats()
	assert.Equal(t, before.Faults, after.Faults, "nothing touched the kernel's range")
	assert.Equal(t, before.SyncDeviceCalls, after.SyncDeviceCalls)
	assert.Equal(t, int64(1), after.PendingWork, "the kernel is still in flight")

	require.NoError(t, d.Memset(base+100, 1, 10), "the call itself succeeds")
	assert.Equal(t, after.Faults+1, dbl.faults(), "a synchronous memset racing the kernel")
	require.NoError(t, d.MemcpyDtoH(buf, base+g-4))
	assert.Equal(t, after.Faults+2, dbl.faults(), "a synchronous read racing the kernel")
	close(done)
	require.NoError(t, d.SynchronizeStream(s), "a race is not a fault of the stream")
}

// The books refuse what the runtime would dereference blindly: events the
// driver did not create, destroyed streams and events, NULL events, and
// destroying an object another call is using. Destroying a stream the driver
// did not create is refused too: its owner destroys it.
func TestBooksRefuseHandles(t *testing.T) {
	d, dbl := openDouble(t, variantPath(t, "full"), 1<<30, ascend.Config{})
	base, h := mapped(t, d, 1)
	defer unmapped(t, d, base, h)

	foreign := dbl.Foreign(t, 0)
	err := d.DestroyStream(foreign)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid)
	assert.Contains(t, err.Error(), "not created by this driver: its owner destroys it")
	acltest.RequireCode(t, d.DestroyStream(0), acl.ErrCodeInvalidParam, "the default stream")
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	for what, err := range map[string]error{
		"record":  d.RecordEvent(0, 0),
		"sync":    d.SynchronizeEvent(0),
		"destroy": d.DestroyEvent(0),
	} {
		acltest.RequireCode(t, err, acl.ErrCodeInvalidParam, what)
	}
	_, err = d.QueryEvent(0)
	acltest.RequireCode(t, err, acl.ErrCodeInvalidParam)
	_, err = d.QueryEvent(acl.Event(foreign)) // a stream is not an event
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid)
	assert.Contains(t, err.Error(), "was not created by this driver")

	// An object in use by a call in progress is not destroyed under it.
	s, err := d.CreateStream()
	require.NoError(t, err)
	done := make(chan struct{})
	require.NoError(t, dbl.Launch(0, s, base, 4096, done))
	require.NoError(t, d.RecordEvent(ev, s))
	waits := make(chan error, 2)
	go func() { waits <- d.SynchronizeEvent(ev) }()
	go func() { waits <- d.SynchronizeStream(s) }()
	require.Eventually(t, func() bool {
		su, eu := ascend.Users(d, s, ev)
		return su == 1 && eu == 1
	}, 5*time.Second, time.Millisecond, "both calls hold their handle")
	err = d.DestroyEvent(ev)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid)
	assert.Contains(t, err.Error(), "in use by 1 calls in progress")
	acltest.RequireCode(t, d.DestroyStream(s), acl.ErrCodeRTParamInvalid)
	close(done)
	require.NoError(t, <-waits)
	require.NoError(t, <-waits)
	require.NoError(t, d.DestroyEvent(ev))
	require.NoError(t, d.DestroyStream(s))

	// Destroyed: refused before the runtime, which would read freed memory.
	ev2, err := d.CreateEvent()
	require.NoError(t, err)
	for what, err := range map[string]error{
		"record":  d.RecordEvent(ev2, s),
		"sync":    d.SynchronizeStream(s),
		"memset":  d.MemsetAsync(base, 0, 64, s),
		"destroy": d.DestroyStream(s),
	} {
		acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, what)
		assert.Contains(t, err.Error(), "was destroyed", what)
		var e *acl.Error
		require.ErrorAs(t, err, &e)
		assert.NotContains(t, e.Msg, "fakeacl", "%s: refused by the books, not the runtime", what)
	}
	require.NoError(t, d.DestroyEvent(ev2))
	assert.Zero(t, d.Live().Streams+d.Live().Events)
	assert.Zero(t, dbl.Live().Streams, "the foreign stream is not the runtime's aclrtCreateStream count either")
	assert.Equal(t, int64(1), dbl.Stats().ForeignStreams)
}

// A stream created outside the driver, as the caller's own CANN code creates
// its streams, is passed to the runtime as it is: events recorded on it,
// memsets queued on it and its synchronisation work, and order with work
// launched on it, as on any stream. The driver neither counts it nor
// destroys it, and Close leaves it to its owner.
func TestForeignStreams(t *testing.T) {
	path := freshCopy(t, "full", "", "libascendcl.so")
	d, dbl := openDouble(t, path, 1<<30, ascend.Config{})
	c := counted{d, dbl, t}
	refs := dbl.Stats().DeviceRefs
	t.Cleanup(func() { // after the foreign stream's own cleanup destroyed it
		s := dbl.Stats()
		assert.Zero(t, s.ForeignStreams)
		assert.Equal(t, refs-1, s.DeviceRefs, "the driver's and the owner's references are gone")
		assert.Zero(t, s.PendingWork)
	})
	fs := dbl.Foreign(t, 0)
	assert.Equal(t, refs+1, dbl.Stats().DeviceRefs, "the foreign code's own device reference")
	assert.True(t, c.Live().Zero(), "not in the books: %+v", c.Live())
	base, h := mapped(t, d, 2)
	ev, err := d.CreateEvent()
	require.NoError(t, err)

	// Record, query, synchronise, memset on an idle foreign stream.
	require.NoError(t, d.MemsetAsync(base, 0x5A, g, fs))
	require.NoError(t, d.RecordEvent(ev, fs))
	require.NoError(t, d.SynchronizeEvent(ev))
	complete, err := d.QueryEvent(ev)
	require.NoError(t, err)
	assert.True(t, complete)
	require.NoError(t, d.SynchronizeStream(fs))
	got := make([]byte, 2)
	require.NoError(t, d.MemcpyDtoH(got, base+acl.DevicePtr(g-2)))
	assert.Equal(t, []byte{0x5A, 0x5A}, got)

	// Work in flight on it: the event recorded after a kernel completes only
	// once the kernel has, and a memset queued behind it runs after it.
	done := make(chan struct{})
	require.NoError(t, dbl.Launch(0, fs, base, g, done))
	require.NoError(t, d.MemsetAsync(base+acl.DevicePtr(g), 7, 8, fs))
	require.NoError(t, d.RecordEvent(ev, fs))
	complete, err = d.QueryEvent(ev)
	require.NoError(t, err)
	assert.False(t, complete, "behind the kernel")
	waits := make(chan error, 2)
	go func() { waits <- d.SynchronizeEvent(ev) }()
	go func() { waits <- d.SynchronizeStream(fs) }()
	select {
	case err := <-waits:
		t.Fatalf("a wait returned (%v) while the kernel on the foreign stream was in flight", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(done)
	require.NoError(t, <-waits)
	require.NoError(t, <-waits)
	complete, err = d.QueryEvent(ev)
	require.NoError(t, err)
	assert.True(t, complete)
	require.NoError(t, d.MemcpyDtoH(got, base+acl.DevicePtr(g)))
	assert.Equal(t, []byte{7, 7}, got, "the memset ran after the kernel")

	// The Launcher of the conformance suite takes it too.
	l := launcher{dbl, 0}
	done = make(chan struct{})
	require.NoError(t, l.Launch(fs, base, g, done))
	require.NoError(t, d.RecordEvent(ev, fs))
	time.AfterFunc(10*time.Millisecond, func() { close(done) })
	require.NoError(t, d.SynchronizeEvent(ev))
	assert.Zero(t, l.Faults())

	// Destroying it is its owner's business: refused before the runtime.
	err = d.DestroyStream(fs)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid)
	assert.Contains(t, err.Error(), "not created by this driver: its owner destroys it")
	assert.Equal(t, int64(1), dbl.Stats().ForeignStreams)

	require.NoError(t, d.DestroyEvent(ev))
	unmapped(t, d, base, h)
	assert.True(t, c.Live().Zero(), "%+v", c.Live())
	require.NoError(t, d.Close(), "a foreign stream is no leak")
	s := dbl.Stats()
	assert.Equal(t, int64(1), s.ForeignStreams, "Close leaves it to its owner")
	assert.Equal(t, refs, s.DeviceRefs, "the driver's reference is gone, the owner's is not")
}

// The NPU's check of a stream made with aclrtCreateStream behind the books,
// on the double.
func TestRawForeignStream(t *testing.T) {
	d, _ := openDouble(t, variantPath(t, "full"), 1<<30, ascend.Config{})
	testRawForeignStream(t, d)
}

// A stream the driver destroyed stays refused until the runtime hands its
// pointer out again: to the driver, it is then simply the new stream; to the
// caller's own code, the driver cannot tell, and refuses it (the documented
// limit).
func TestDestroyedStreamPointerReused(t *testing.T) {
	path := freshCopy(t, "full", "", "libascendcl.so")
	d, dbl := openDouble(t, path, 1<<30, ascend.Config{})
	c := counted{d, dbl, t}
	dbl.setReuseStreams(1)
	base, h := mapped(t, d, 1)
	defer unmapped(t, d, base, h)
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyEvent(ev)) }()

	s, err := d.CreateStream()
	require.NoError(t, err)
	require.NoError(t, d.DestroyStream(s))
	acltest.RequireCode(t, d.SynchronizeStream(s), acl.ErrCodeRTParamInvalid)
	again, err := d.CreateStream()
	require.NoError(t, err)
	require.Equal(t, s, again, "the runtime handed the pointer out again")
	require.NoError(t, d.RecordEvent(ev, again), "the new stream")
	require.NoError(t, d.SynchronizeStream(again))
	assert.Equal(t, 1, c.Live().Streams)
	require.NoError(t, d.DestroyStream(again))

	fs := dbl.Foreign(t, 0)
	require.Equal(t, s, fs, "handed to the caller's own code this time")
	err = d.RecordEvent(ev, fs)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "the limit")
	assert.Contains(t, err.Error(), "was destroyed")
}

// DestroyStream refuses a stream with work pending, asking aclrtStreamQuery,
// or an event where the runtime lacks it. A runtime with neither leaves the
// check to the runtime (the double refuses too, with its own message).
func TestDestroyStreamPending(t *testing.T) {
	for _, tc := range []struct {
		variant, msg string
	}{
		{"full", "has work pending"},
		{"nostreamquery", "has work pending"},
		{"noevents", "fakeacl aclrtDestroyStream: stream"},
	} {
		t.Run(tc.variant, func(t *testing.T) {
			d, dbl := openDouble(t, variantPath(t, tc.variant), 1<<30, ascend.Config{})
			base, h := mapped(t, d, 1)
			defer unmapped(t, d, base, h)
			s, err := d.CreateStream()
			require.NoError(t, err)
			done := make(chan struct{})
			require.NoError(t, dbl.Launch(0, s, base, g, done))
			live, dblLive := d.Live(), dbl.Live()
			err = d.DestroyStream(s)
			acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid)
			assert.Contains(t, err.Error(), tc.msg)
			assert.Equal(t, live, d.Live(), "the stream is still in the books")
			assert.Equal(t, dblLive, dbl.Live(), "and in the runtime; no probe event is left")
			close(done)
			require.NoError(t, d.SynchronizeStream(s))
			require.NoError(t, d.DestroyStream(s))
			assert.Zero(t, dbl.Live().Streams)
		})
	}
}

// A runtime without the event calls: every event method fails with 207000
// (acl.ErrNotSupported) naming the missing symbols, and the rest works.
func TestNoEventSymbols(t *testing.T) {
	path := variantPath(t, "noevents")
	d, dbl := openDouble(t, path, 1<<30, ascend.Config{})
	_, err := d.CreateEvent()
	acltest.RequireCode(t, err, acl.ErrCodeRTFeatureNotSupport)
	require.ErrorIs(t, err, acl.ErrNotSupported)
	for _, name := range []string{"aclrtCreateEvent", "aclrtRecordEvent", "aclrtQueryEventStatus", "aclrtSynchronizeEvent", "aclrtDestroyEvent"} {
		assert.Contains(t, err.Error(), name)
	}
	assert.Contains(t, err.Error(), path)
	_, err = d.QueryEvent(1)
	require.ErrorIs(t, err, acl.ErrNotSupported)
	require.ErrorIs(t, d.RecordEvent(1, 0), acl.ErrNotSupported)
	require.ErrorIs(t, d.SynchronizeEvent(1), acl.ErrNotSupported)
	require.ErrorIs(t, d.DestroyEvent(1), acl.ErrNotSupported)

	base, h := mapped(t, d, 1)
	s, err := d.CreateStream()
	require.NoError(t, err)
	require.NoError(t, d.MemsetAsync(base, 0x3C, g, s))
	require.NoError(t, d.SynchronizeStream(s))
	require.NoError(t, d.SynchronizeDevice())
	got := make([]byte, 4)
	require.NoError(t, d.MemcpyDtoH(got, base+acl.DevicePtr(g-4)))
	assert.Equal(t, bytes.Repeat([]byte{0x3C}, 4), got)
	require.NoError(t, d.DestroyStream(s))
	unmapped(t, d, base, h)
	require.NoError(t, cycle(d, 0, 0))
	assert.True(t, counted{d, dbl, t}.Live().Zero())
}

// Every new ACL call, failing in the runtime, returns its typed error and
// leaves the driver's books and the runtime's objects as they were; the call
// then succeeds when tried again.
func TestInjectedStreamFailures(t *testing.T) {
	type env struct {
		d    *ascend.Driver
		dbl  *double
		base acl.DevicePtr
		s    acl.Stream
		ev   acl.Event
	}
	cases := []struct {
		fn, variant string
		call        func(e *env) error
	}{
		{"aclrtCreateStream", "full", func(e *env) error {
			s, err := e.d.CreateStream()
			if err == nil {
				err = e.d.DestroyStream(s)
			}
			return err
		}},
		{"aclrtDestroyStream", "full", func(e *env) error { return e.d.DestroyStream(e.s) }},
		{"aclrtStreamQuery", "full", func(e *env) error { return e.d.DestroyStream(e.s) }},
		{"aclrtCreateEvent", "nostreamquery", func(e *env) error { return e.d.DestroyStream(e.s) }},
		{"aclrtRecordEvent", "nostreamquery", func(e *env) error { return e.d.DestroyStream(e.s) }},
		{"aclrtQueryEventStatus", "nostreamquery", func(e *env) error { return e.d.DestroyStream(e.s) }},
		{"aclrtSynchronizeStream", "full", func(e *env) error { return e.d.SynchronizeStream(e.s) }},
		{"aclrtSynchronizeDevice", "full", func(e *env) error { return e.d.SynchronizeDevice() }},
		{"aclrtCreateEvent", "full", func(e *env) error {
			ev, err := e.d.CreateEvent()
			if err == nil {
				err = e.d.DestroyEvent(ev)
			}
			return err
		}},
		{"aclrtRecordEvent", "full", func(e *env) error { return e.d.RecordEvent(e.ev, e.s) }},
		{"aclrtQueryEventStatus", "full", func(e *env) error { _, err := e.d.QueryEvent(e.ev); return err }},
		{"aclrtSynchronizeEvent", "full", func(e *env) error { return e.d.SynchronizeEvent(e.ev) }},
		{"aclrtDestroyEvent", "full", func(e *env) error { return e.d.DestroyEvent(e.ev) }},
		{"aclrtMemsetAsync", "full", func(e *env) error { return e.d.MemsetAsync(e.base, 9, 4096, e.s) }},
	}
	for _, tc := range cases {
		t.Run(tc.fn+"/"+tc.variant, func(t *testing.T) {
			path := freshCopy(t, tc.variant, "", "libascendcl.so")
			d, dbl := openDouble(t, path, 1<<30, ascend.Config{})
			c := counted{d, dbl, t}
			base, h := mapped(t, d, 1)
			s, err := d.CreateStream()
			require.NoError(t, err)
			ev, err := d.CreateEvent()
			require.NoError(t, err)
			require.NoError(t, d.RecordEvent(ev, s)) // a recorded event, so that its sync reaches the runtime
			e := &env{d, dbl, base, s, ev}

			before := c.Live()
			dbl.Inject(t, tc.fn, 1, acl.ErrCodeRTInternal)
			ae := requireACLError(t, tc.call(e), tc.fn, acl.ErrCodeRTInternal)
			assert.Contains(t, ae.Msg, "injected fault")
			assert.Equal(t, before, c.Live(), "the failed call changed nothing")
			require.NoError(t, tc.call(e), "a second try succeeds")

			if d.Live().Events > 0 {
				require.NoError(t, d.DestroyEvent(ev))
			}
			if d.Live().Streams > 0 {
				require.NoError(t, d.DestroyStream(s))
			}
			unmapped(t, d, base, h)
			assert.True(t, c.Live().Zero(), "leaked: %+v", c.Live())
		})
	}
}

// Close destroys the streams and events the caller leaked, after letting
// their work finish, and reports them and the memory still held.
func TestCloseReleasesLeaks(t *testing.T) {
	path := freshCopy(t, "full", "", "libascendcl.so")
	dbl := control(t, path)
	d, err := ascend.Open(ascend.Config{Library: path})
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(g, prop(0), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	var streams []acl.Stream
	for range 2 {
		s, err := d.CreateStream()
		require.NoError(t, err)
		streams = append(streams, s)
	}
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	done := make(chan struct{})
	require.NoError(t, dbl.Launch(0, streams[1], base, g, done))
	require.NoError(t, d.RecordEvent(ev, streams[1]))
	time.AfterFunc(20*time.Millisecond, func() { close(done) })

	err = d.Close()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "2 streams and 1 events were still live: destroyed them")
	assert.Contains(t, err.Error(), "1 mappings (2097152 bytes)")
	assert.Contains(t, err.Error(), "1 physical allocations not freed")
	assert.Contains(t, err.Error(), "1 reservations (4194304 bytes)")
	live := dbl.Live()
	assert.Zero(t, live.Streams, "the leaked streams were destroyed")
	assert.Zero(t, live.Events, "and the event")
	assert.Equal(t, 1, live.Mappings, "memory is left to the runtime")
	assert.Zero(t, dbl.Stats().PendingWork, "the work finished first")
	require.NoError(t, d.Close(), "a second Close does nothing")
	_, err = d.CreateStream()
	require.ErrorIs(t, err, acl.ErrNoContext)
}
