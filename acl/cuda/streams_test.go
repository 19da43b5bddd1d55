//go:build linux && (amd64 || arm64)

package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
)

// mapRun maps k adjacent chunks of one granule at base, without access.
func mapRun(t testing.TB, d *Driver, base acl.DevicePtr, k int) []acl.PhysicalHandle {
	t.Helper()
	hs := make([]acl.PhysicalHandle, k)
	for i := range hs {
		var err error
		hs[i], err = d.MallocPhysical(g, prop(), 0)
		require.NoError(t, err)
		require.NoError(t, d.MapMem(base+acl.DevicePtr(i)*g, g, 0, hs[i], 0))
	}
	return hs
}

func unmapRun(t testing.TB, d *Driver, base acl.DevicePtr, hs []acl.PhysicalHandle) {
	t.Helper()
	for i, h := range hs {
		require.NoError(t, d.UnmapMem(base+acl.DevicePtr(i)*g))
		require.NoError(t, d.FreePhysical(h))
	}
}

// Streams are non-blocking and events carry no timing, and both are counted
// in the driver's books and in CUDA's.
func TestStreamAndEventFlags(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	require.Equal(t, acl.Caps{AccessSpan: true, Fresh: acl.FreshProcess, Sharing: acl.SharingFD, ReadOnly: true, MaxReserve: acl.MaxReserve}, d.Caps())
	require.Equal(t, int64(1), f.live().Streams, "the driver's own stream")
	require.Equal(t, int32(cuStreamNonBlocking), f.flags(d.copyStream))
	s, err := d.CreateStream()
	require.NoError(t, err)
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	require.Equal(t, int32(cuStreamNonBlocking), f.flags(uintptr(s)), "the stream is the CUstream, CU_STREAM_NON_BLOCKING")
	d.omu.Lock()
	evcu := d.events[ev].cu
	d.omu.Unlock()
	require.Equal(t, int32(cuEventDisableTiming), f.flags(evcu), "CU_EVENT_DISABLE_TIMING")
	require.Equal(t, acl.LiveCounts{Streams: 1, Events: 1}, d.Live())
	require.Equal(t, int64(2), f.live().Streams)
	require.Equal(t, int64(1), f.live().Events)
	require.NoError(t, d.DestroyEvent(ev))
	require.NoError(t, d.DestroyStream(s))
	require.True(t, d.Live().Zero())

	scrubless, _ := openFake(t, 0, Config{NoScrubOnFree: true})
	require.Equal(t, acl.Caps{AccessSpan: true, Fresh: acl.FreshUnknown, Sharing: acl.SharingFD, ReadOnly: true, MaxReserve: acl.MaxReserve}, scrubless.Caps())
}

// Each new CUDA call, failing, leaves the driver's books and CUDA's state as
// they were, and the call can be retried.
func TestFailedStreamCallsChangeNothing(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	hs := mapRun(t, d, base, 2)
	var s acl.Stream
	var ev acl.Event
	steps := []struct {
		fn string
		do func() error
	}{
		{"cuStreamCreate", func() (err error) { s, err = d.CreateStream(); return err }},
		{"cuEventCreate", func() (err error) { ev, err = d.CreateEvent(); return err }},
		{"cuMemSetAccess", func() error { return d.MemSetAccess(base, 2*g, acl.ReadWrite(0)) }},
		{"cuMemsetD8Async", func() error { return d.MemsetAsync(base, 7, 2*g, s) }},
		{"cuEventRecord", func() error { return d.RecordEvent(ev, s) }},
		{"cuEventQuery", func() error { _, err := d.QueryEvent(ev); return err }},
		{"cuEventSynchronize", func() error { return d.SynchronizeEvent(ev) }},
		{"cuStreamSynchronize", func() error { return d.SynchronizeStream(s) }},
		{"cuCtxSynchronize", d.SynchronizeDevice},
		{"cuEventDestroy_v2", func() error { return d.DestroyEvent(ev) }},
		{"cuStreamQuery", func() error { return d.DestroyStream(s) }},
	}
	for _, step := range steps {
		before, fakeBefore := d.Live(), f.live()
		f.fail(t, step.fn, 1, ResultUnknown)
		err := step.do()
		require.Equal(t, ResultUnknown, resultOf(err), "%s: %v", step.fn, err)
		var ae *acl.Error
		require.ErrorAs(t, err, &ae)
		require.Equal(t, step.fn, ae.Op)
		require.Equal(t, before, d.Live(), "%s failed but changed the books", step.fn)
		require.Equal(t, fakeBefore, f.live(), "%s failed but changed CUDA's state", step.fn)
		if step.fn == "cuMemSetAccess" {
			_, _, m := d.book.Mapping(base)
			require.False(t, m.Access, "no access recorded after a failed grant")
		}
		if step.fn == "cuStreamQuery" {
			// The stream is still there: destroying it fails in CUDA too.
			f.fail(t, "cuStreamDestroy_v2", 1, ResultUnknown)
			err := d.DestroyStream(s)
			require.Equal(t, ResultUnknown, resultOf(err))
			require.Equal(t, before, d.Live())
			require.Equal(t, fakeBefore, f.live())
		}
		require.NoError(t, step.do(), "%s retried", step.fn)
	}
	got := make([]byte, 2)
	require.NoError(t, d.MemcpyDtoH(got, base+g-1))
	require.Equal(t, []byte{7, 7}, got, "the retried memset ran, across the seam")
	unmapRun(t, d, base, hs)
	require.NoError(t, d.ReleaseMemAddress(base))
	require.True(t, d.Live().Zero(), "%+v", d.Live())
	require.Equal(t, int64(1), f.live().Streams, "only the driver's own stream is left")
	require.Zero(t, f.live().Events)
}

// Open fails cleanly when the driver's own stream cannot be created.
func TestOpenStreamFails(t *testing.T) {
	f := newFake(t)
	f.fail(t, "cuStreamCreate", 1, ResultOutOfMemory)
	_, err := Open(Config{Library: f.path})
	require.ErrorIs(t, err, acl.ErrOutOfMemory)
	require.ErrorContains(t, err, "cuStreamCreate")
	f.requireClean(t)
}

// Destroyed, NULL and busy streams and events, and unknown events, are
// refused before CUDA sees them, and a stream with work pending cannot be
// destroyed. A stream the driver never made is the caller's: CUDA gets it.
func TestStreamAndEventRefusals(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	l := launcherOf(d).(*launcher)
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	hs := mapRun(t, d, base, 1)
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	s, err := d.CreateStream()
	require.NoError(t, err)
	ev, err := d.CreateEvent()
	require.NoError(t, err)

	acltest.RequireCode(t, d.DestroyStream(0), acl.ErrCodeInvalidParam, "the default stream")
	acltest.RequireCode(t, d.RecordEvent(0, s), acl.ErrCodeInvalidParam, "NULL event")
	_, err = d.QueryEvent(0)
	acltest.RequireCode(t, err, acl.ErrCodeInvalidParam)
	acltest.RequireCode(t, d.SynchronizeEvent(0), acl.ErrCodeInvalidParam)
	acltest.RequireCode(t, d.DestroyEvent(0), acl.ErrCodeInvalidParam)
	// 0x1234 is no stream at all; passed on as a foreign one, CUDA (here
	// the double) refuses it.
	syncs := f.calls(t, "cuStreamSynchronize")
	require.Equal(t, ResultInvalidHandle, resultOf(d.SynchronizeStream(0x1234)), "never made: CUDA's answer")
	require.Equal(t, syncs+1, f.calls(t, "cuStreamSynchronize"))
	require.Equal(t, ResultInvalidHandle, resultOf(d.MemsetAsync(base, 0, 1, 0x1234)))
	require.Equal(t, ResultInvalidHandle, resultOf(d.RecordEvent(ev, 0x1234)))
	err = d.DestroyStream(0x1234)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "not the driver's")
	require.ErrorContains(t, err, "not created by this driver: its owner destroys it")
	memsets := f.calls(t, "cuMemsetD8Async")
	acltest.RequireCode(t, d.MemsetAsync(base+g-4, 0, 8, s), acl.ErrCodeRTParamInvalid, "past the mapping")
	require.Equal(t, memsets, f.calls(t, "cuMemsetD8Async"), "refused before CUDA")

	// Work pending: refused after cuStreamQuery, and nothing changes.
	id, err := l.launch(s, base, g)
	require.NoError(t, err)
	destroys := f.calls(t, "cuStreamDestroy_v2")
	acltest.RequireCode(t, d.DestroyStream(s), acl.ErrCodeRTParamInvalid, "work pending")
	require.Equal(t, destroys, f.calls(t, "cuStreamDestroy_v2"))
	require.Equal(t, 1, d.Live().Streams)

	// A call waiting on the stream and the event makes them busy.
	require.NoError(t, d.RecordEvent(ev, s))
	waits := make(chan error, 2)
	go func() { waits <- d.SynchronizeStream(s) }()
	go func() { waits <- d.SynchronizeEvent(ev) }()
	require.Eventually(t, func() bool {
		d.omu.Lock()
		defer d.omu.Unlock()
		return d.streams[s].busy == 1 && d.events[ev].busy == 1
	}, 5*time.Second, time.Millisecond)
	acltest.RequireCode(t, d.DestroyEvent(ev), acl.ErrCodeRTParamInvalid, "busy event")
	err = d.DestroyStream(s)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "busy stream")
	require.ErrorContains(t, err, "in use", "refused for the call in flight, before cuStreamQuery")
	complete, err := d.QueryEvent(ev)
	require.NoError(t, err)
	require.False(t, complete)
	require.Equal(t, int32(0), l.f.finish(id))
	require.NoError(t, <-waits)
	require.NoError(t, <-waits)
	complete, err = d.QueryEvent(ev)
	require.NoError(t, err)
	require.True(t, complete)

	require.NoError(t, d.DestroyEvent(ev))
	require.NoError(t, d.DestroyStream(s))
	records := f.calls(t, "cuEventRecord")
	ev2, err := d.CreateEvent()
	require.NoError(t, err)
	acltest.RequireCode(t, d.RecordEvent(ev2, s), acl.ErrCodeRTParamInvalid, "destroyed stream")
	acltest.RequireCode(t, d.RecordEvent(ev, 0), acl.ErrCodeRTParamInvalid, "destroyed event")
	require.Equal(t, records, f.calls(t, "cuEventRecord"), "refused before CUDA")
	err = d.DestroyStream(s)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "twice")
	require.ErrorContains(t, err, "was destroyed")
	acltest.RequireCode(t, d.DestroyEvent(ev), acl.ErrCodeRTParamInvalid, "twice")
	require.NoError(t, d.DestroyEvent(ev2))
	unmapRun(t, d, base, hs)
	require.NoError(t, d.ReleaseMemAddress(base))
}

// One cuMemSetAccess covers a run of adjacent mappings; gaps and ends inside
// a mapping are refused before CUDA is called.
func TestAccessSpan(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	base, err := d.ReserveMemAddress(16*g, 0, 0, 0)
	require.NoError(t, err)
	hs := mapRun(t, d, base, 8)
	rw := acl.ReadWrite(0)
	calls := func() int64 { return f.calls(t, "cuMemSetAccess") }

	n := calls()
	require.NoError(t, d.MemSetAccess(base, g, rw), "one mapping")
	require.NoError(t, d.MemSetAccess(base, 8*g, rw), "a run of 8, one already granted")
	require.Equal(t, n+2, calls(), "one call for the run")
	require.NoError(t, d.MemSetAccess(base+g, 4*g, rw), "granted already")
	require.Equal(t, n+2, calls(), "no call")
	msg := bytes.Repeat([]byte("span"), int(g)) // 4 chunks' worth
	require.NoError(t, d.MemcpyHtoD(base+g/2, msg))

	// A gap: chunk 9 of the reservation is not mapped.
	h9, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base+9*g, g, 0, h9, 0))
	acltest.RequireCode(t, d.MemSetAccess(base+7*g, 3*g, rw), acl.ErrCodeRTParamInvalid, "gap")
	acltest.RequireCode(t, d.MemSetAccess(base+8*g, 2*g, rw), acl.ErrCodeRTParamInvalid, "starts unmapped")
	acltest.RequireCode(t, d.MemSetAccess(base+g/2, g, rw), acl.ErrCodeRTParamInvalid, "starts inside a mapping")
	// Ends inside a mapping: chunks 10–11 are one mapping of 2 granules.
	h10, err := d.MallocPhysical(2*g, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base+10*g, 2*g, 0, h10, 0))
	acltest.RequireCode(t, d.MemSetAccess(base+9*g, 2*g, rw), acl.ErrCodeRTParamInvalid, "ends inside a mapping")
	require.Equal(t, n+2, calls(), "refused before CUDA")
	require.NoError(t, d.MemSetAccess(base+9*g, 3*g, rw), "mappings of different sizes")
	require.Equal(t, n+3, calls())

	unmapRun(t, d, base, hs)
	require.NoError(t, d.UnmapMem(base+9*g))
	require.NoError(t, d.UnmapMem(base+10*g))
	require.NoError(t, d.FreePhysical(h9))
	require.NoError(t, d.FreePhysical(h10))
	require.NoError(t, d.ReleaseMemAddress(base))
}

// An unmap under queued work succeeds; the work faults: a memset queued
// behind a kernel writes nothing into what is mapped there later, and the
// stream's next synchronisation, and only that one, reports the illegal
// address.
func TestUnmapUnderQueuedMemset(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	l := launcherOf(d).(*launcher)
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	s, err := d.CreateStream()
	require.NoError(t, err)
	hs := mapRun(t, d, base, 1)
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	id, err := l.launch(s, base, g)
	require.NoError(t, err)
	require.NoError(t, d.MemsetAsync(base, 0xAA, g, s))
	unmapRun(t, d, base, hs)
	require.Equal(t, 2, l.Faults(), "the kernel and the memset")

	hs = mapRun(t, d, base, 1)
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	require.NoError(t, d.Memset(base, 0x11, g))
	require.Equal(t, 3, l.Faults(), "the new owner's memset races the stale work (on a GPU that work would write into the new memory)")
	require.Equal(t, int32(0), f.finish(id))
	err = d.SynchronizeStream(s)
	require.Equal(t, ResultIllegalAddress, resultOf(err), "%v", err)
	acltest.RequireCode(t, err, acl.ErrCodeRTDrvInternal)
	require.NoError(t, d.SynchronizeStream(s), "reported once")
	got := make([]byte, 16)
	require.NoError(t, d.MemcpyDtoH(got, base+g-16))
	require.Equal(t, bytes.Repeat([]byte{0x11}, 16), got, "the faulted memset wrote nothing")
	unmapRun(t, d, base, hs)
	require.NoError(t, d.DestroyStream(s))
	require.NoError(t, d.ReleaseMemAddress(base))
}

// Work on a caller's stream is not ordered with the legacy default stream,
// but the synchronous host copies are ordered after the legacy stream's own
// work, as on a GPU.
func TestLegacyStream(t *testing.T) {
	d, _ := openFake(t, 0, Config{})
	l := launcherOf(d).(*launcher)
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	hs := mapRun(t, d, base, 2)
	require.NoError(t, d.MemSetAccess(base, 2*g, acl.ReadWrite(0)))
	s, err := d.CreateStream()
	require.NoError(t, err)
	id, err := l.launch(0, base+g, g)
	require.NoError(t, err)
	unblock := func() { l.f.finish(id) }
	require.NoError(t, returnsSoon(t, unblock, func() error {
		return errors.Join(d.MemsetAsync(base, 5, 8, s), d.SynchronizeStream(s))
	}), "a non-blocking stream does not wait for the legacy stream")
	copied := make(chan error, 1)
	go func() { copied <- d.MemcpyHtoD(base, []byte{6}) }()
	select {
	case err := <-copied:
		unblock()
		t.Fatalf("a host copy ran (%v) before the legacy stream's work finished", err)
	case <-time.After(20 * time.Millisecond):
	}
	unblock()
	require.NoError(t, <-copied)
	require.NoError(t, d.SynchronizeStream(0))
	got := make([]byte, 2)
	require.NoError(t, d.MemcpyDtoH(got, base))
	require.Equal(t, []byte{6, 5}, got)
	require.Zero(t, l.Faults())
	unmapRun(t, d, base, hs)
	require.NoError(t, d.DestroyStream(s))
	require.NoError(t, d.ReleaseMemAddress(base))
}

// Close destroys leaked streams and events, and reports them.
func TestCloseReleasesLeakedStreams(t *testing.T) {
	f := newFake(t)
	d, err := Open(Config{Library: f.path})
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	mapRun(t, d, base, 1)
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	s, err := d.CreateStream()
	require.NoError(t, err)
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	require.NoError(t, d.MemsetAsync(base, 1, g, s))
	require.NoError(t, d.RecordEvent(ev, s))
	syncs := f.calls(t, "cuCtxSynchronize")
	err = d.Close()
	require.ErrorContains(t, err, "still live")
	require.ErrorContains(t, err, "Streams:1 Events:1")
	require.Equal(t, syncs+1, f.calls(t, "cuCtxSynchronize"), "work drained before the teardown")
	f.requireClean(t)
	_, err = d.CreateStream()
	acltest.RequireCode(t, err, acl.ErrCodeRTContextNull)
	acltest.RequireCode(t, d.SynchronizeDevice(), acl.ErrCodeRTContextNull)
}

// Many goroutines create, use and destroy streams and events at once.
func TestConcurrentStreams(t *testing.T) {
	d, _ := openFake(t, 0, Config{})
	const workers = 16
	base, err := d.ReserveMemAddress(workers*g, 0, 0, 0)
	require.NoError(t, err)
	hs := mapRun(t, d, base, workers)
	require.NoError(t, d.MemSetAccess(base, workers*g, acl.ReadWrite(0)))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			at := base + acl.DevicePtr(w)*g
			s, err := d.CreateStream()
			if err != nil {
				errs <- err
				return
			}
			ev, err := d.CreateEvent()
			if err != nil {
				errs <- err
				return
			}
			for r := range 20 {
				v := byte(w*20 + r)
				err = errors.Join(d.MemsetAsync(at, v, g, s), d.RecordEvent(ev, s), d.SynchronizeEvent(ev))
				if err == nil {
					var done bool
					done, err = d.QueryEvent(ev)
					if err == nil && !done {
						err = fmt.Errorf("event not complete after SynchronizeEvent")
					}
				}
				got := []byte{0}
				if err == nil {
					err = d.MemcpyDtoH(got, at+g-1)
				}
				if err == nil && got[0] != v {
					err = fmt.Errorf("worker %d read %d, want %d", w, got[0], v)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- errors.Join(d.SynchronizeStream(s), d.DestroyEvent(ev), d.DestroyStream(s))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, d.SynchronizeDevice())
	unmapRun(t, d, base, hs)
	require.NoError(t, d.ReleaseMemAddress(base))
}

// A stream created outside the driver, as the caller's own CUDA code creates
// its streams, is passed to CUDA as it is: events recorded on it, memsets
// queued on it and its synchronisation work, and order with work launched on
// it, as on any stream. The driver neither counts it nor destroys it, and
// Close leaves it to its owner.
func TestForeignStreams(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	l := launcherOf(d).(*launcher)
	fs := f.foreign(t, 0, cuStreamNonBlocking)
	require.Equal(t, int32(cuStreamNonBlocking), f.flags(uintptr(fs)))
	require.True(t, d.Live().Zero(), "not in the driver's counts: %+v", d.Live())
	require.Equal(t, int64(2), f.live().Streams, "the driver's own and the foreign one")
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	hs := mapRun(t, d, base, 2)
	require.NoError(t, d.MemSetAccess(base, 2*g, acl.ReadWrite(0)))
	ev, err := d.CreateEvent()
	require.NoError(t, err)

	// Record, query, synchronise, memset on an idle foreign stream.
	records := f.calls(t, "cuEventRecord")
	require.NoError(t, d.MemsetAsync(base, 0x5A, g, fs))
	require.NoError(t, d.RecordEvent(ev, fs))
	require.Equal(t, records+1, f.calls(t, "cuEventRecord"))
	require.NoError(t, d.SynchronizeEvent(ev))
	complete, err := d.QueryEvent(ev)
	require.NoError(t, err)
	require.True(t, complete)
	require.NoError(t, d.SynchronizeStream(fs))
	got := make([]byte, 2)
	require.NoError(t, d.MemcpyDtoH(got, base+g-2))
	require.Equal(t, []byte{0x5A, 0x5A}, got)

	// Work in flight on it: the event recorded after a kernel completes only
	// once the kernel has, and a memset queued behind it runs after it.
	id, err := l.launch(fs, base, g)
	require.NoError(t, err)
	require.NoError(t, d.MemsetAsync(base+g, 7, 8, fs))
	require.NoError(t, d.RecordEvent(ev, fs))
	complete, err = d.QueryEvent(ev)
	require.NoError(t, err)
	require.False(t, complete, "behind the kernel")
	waits := make(chan error, 2)
	go func() { waits <- d.SynchronizeEvent(ev) }()
	go func() { waits <- d.SynchronizeStream(fs) }()
	select {
	case err := <-waits:
		t.Fatalf("a wait returned (%v) while the kernel on the foreign stream was in flight", err)
	case <-time.After(20 * time.Millisecond):
	}
	require.Equal(t, int32(0), f.finish(id))
	require.NoError(t, <-waits)
	require.NoError(t, <-waits)
	complete, err = d.QueryEvent(ev)
	require.NoError(t, err)
	require.True(t, complete)
	require.NoError(t, d.MemcpyDtoH(got, base+g))
	require.Equal(t, []byte{7, 7}, got, "the memset ran after the kernel")

	// The Launcher of the conformance suite takes it too.
	done := make(chan struct{})
	require.NoError(t, l.Launch(fs, base, g, done))
	require.NoError(t, d.RecordEvent(ev, fs))
	time.AfterFunc(10*time.Millisecond, func() { close(done) })
	require.NoError(t, d.SynchronizeEvent(ev))
	require.Zero(t, l.Faults())

	// Destroying it is its owner's business: refused before CUDA.
	queries, destroys := f.calls(t, "cuStreamQuery"), f.calls(t, "cuStreamDestroy_v2")
	err = d.DestroyStream(fs)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid)
	require.ErrorContains(t, err, "not created by this driver: its owner destroys it")
	require.Equal(t, queries, f.calls(t, "cuStreamQuery"))
	require.Equal(t, destroys, f.calls(t, "cuStreamDestroy_v2"))

	require.NoError(t, d.DestroyEvent(ev))
	unmapRun(t, d, base, hs)
	require.NoError(t, d.ReleaseMemAddress(base))
	require.True(t, d.Live().Zero(), "%+v", d.Live())
	require.Equal(t, int64(2), f.live().Streams, "the foreign stream lives on")
}

// A blocking foreign stream (flags 0, what cudaStreamCreate makes) is
// ordered with the legacy default stream, as CUDA orders it: the synchronous
// host copies wait for its work, while Memset, on the driver's own
// non-blocking stream, does not.
func TestBlockingForeignStream(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	l := launcherOf(d).(*launcher)
	fs := f.foreign(t, 0, 0)
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	hs := mapRun(t, d, base, 2)
	require.NoError(t, d.MemSetAccess(base, 2*g, acl.ReadWrite(0)))
	id, err := l.launch(fs, base+g, g)
	require.NoError(t, err)
	unblock := func() { f.finish(id) }
	require.NoError(t, returnsSoon(t, unblock, func() error { return d.Memset(base, 3, 8) }),
		"the driver's own stream does not wait for a blocking stream")
	copied := make(chan error, 1)
	go func() { copied <- d.MemcpyHtoD(base, []byte{4}) }()
	select {
	case err := <-copied:
		unblock()
		t.Fatalf("a host copy ran (%v) before the blocking stream's work finished", err)
	case <-time.After(20 * time.Millisecond):
	}
	unblock()
	require.NoError(t, <-copied)
	require.NoError(t, d.SynchronizeStream(fs))
	unmapRun(t, d, base, hs)
	require.NoError(t, d.ReleaseMemAddress(base))
}

// Close leaves foreign streams alone: they are neither leaks nor its to
// destroy, even with work queued on them.
func TestCloseLeavesForeignStreams(t *testing.T) {
	f := newFake(t)
	t.Cleanup(func() { f.requireClean(t) }) // after the foreign stream's cleanup destroys it
	d, err := Open(Config{Library: f.path})
	require.NoError(t, err)
	fs := f.foreign(t, 0, cuStreamNonBlocking)
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	hs := mapRun(t, d, base, 1)
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	require.NoError(t, d.MemsetAsync(base, 1, g, fs))
	require.NoError(t, d.SynchronizeStream(fs))
	unmapRun(t, d, base, hs)
	require.NoError(t, d.ReleaseMemAddress(base))
	syncs := f.calls(t, "cuCtxSynchronize")
	require.NoError(t, d.Close(), "a foreign stream is no leak")
	require.Equal(t, syncs, f.calls(t, "cuCtxSynchronize"), "nothing to drain")
	l := f.live()
	require.Equal(t, int64(1), l.Streams, "the foreign stream is still live")
	require.Equal(t, int64(1), l.ContextRefs, "its owner's reference to the primary context")
}

// A stream the driver destroyed stays refused until CUDA hands its value out
// again: to the driver, it is then simply the new stream; to someone else,
// the driver cannot tell, and refuses it (the documented limit).
func TestDestroyedStreamValueReused(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	f.set(t, "reuse_streams", 1)
	l := launcherOf(d).(*launcher)
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	hs := mapRun(t, d, base, 1)
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	ev, err := d.CreateEvent()
	require.NoError(t, err)

	s, err := d.CreateStream()
	require.NoError(t, err)
	require.NoError(t, d.DestroyStream(s))
	calls := func() [4]int64 {
		return [4]int64{f.calls(t, "cuStreamSynchronize"), f.calls(t, "cuEventRecord"),
			f.calls(t, "cuMemsetD8Async"), f.calls(t, "cuStreamDestroy_v2")}
	}
	before := calls()
	for what, err := range map[string]error{
		"sync":    d.SynchronizeStream(s),
		"record":  d.RecordEvent(ev, s),
		"memset":  d.MemsetAsync(base, 0, 8, s),
		"destroy": d.DestroyStream(s),
	} {
		acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, what)
		require.ErrorContains(t, err, "was destroyed", what)
	}
	_, err = l.launch(s, base, g)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "launch")
	require.Equal(t, before, calls(), "refused before CUDA")

	again, err := d.CreateStream()
	require.NoError(t, err)
	require.Equal(t, s, again, "the double handed the value out again")
	require.NoError(t, d.RecordEvent(ev, again), "the new stream")
	require.NoError(t, d.SynchronizeStream(again))
	require.Equal(t, 1, d.Live().Streams)
	require.NoError(t, d.DestroyStream(again))

	// Handed to the caller's own code instead, the value is still refused.
	fs := f.foreign(t, 0, cuStreamNonBlocking)
	require.Equal(t, s, fs, "the double handed the value to a foreign stream")
	acltest.RequireCode(t, d.SynchronizeStream(fs), acl.ErrCodeRTParamInvalid, "the limit")

	require.NoError(t, d.DestroyEvent(ev))
	unmapRun(t, d, base, hs)
	require.NoError(t, d.ReleaseMemAddress(base))
}
