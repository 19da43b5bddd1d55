package cuda

import (
	"github.com/vmarena/vmarena/acl"
)

// Streams and events.
//
// An acl.Stream of this driver is the CUstream itself: the pointer value
// cuStreamCreate returned, so that a caller can hand a stream it created here
// to its own kernel launches, and pass the driver a stream its own CUDA code
// created. acl.Stream(0) is the legacy default stream (a NULL CUstream).
//
// The books (streams) hold the streams CreateStream made and DestroyStream
// has not destroyed: they are counted, destroyed at Close if leaked, and only
// they can be destroyed. Any other non-zero stream is foreign: the caller
// owns it and vouches for it, and the calls that only use a stream
// (RecordEvent, MemsetAsync, SynchronizeStream) pass it to CUDA as it is, as
// a C program would. DestroyStream refuses a foreign stream (107000): its
// owner destroys it. A stream this driver destroyed is remembered (gone) and
// refused with 107000 rather than passed to CUDA as a dangling pointer, until
// CUDA hands the same value out again through CreateStream; see
// handles.Graveyard for the limits.
//
// Events are only ever created by the driver: an acl.Event is the driver's
// own id, with the CUevent behind it in its books, so a stale or unknown one
// is refused with 107000 before CUDA sees it.
//
// A call that waits (SynchronizeStream, SynchronizeEvent) or queues work
// (RecordEvent, MemsetAsync) marks the stream and event of the books it uses
// busy while CUDA runs it outside omu, and DestroyStream and DestroyEvent
// refuse a busy object, so that no CUDA call ever gets a handle the driver
// destroyed under it.

// stream is a CUstream created by CreateStream. The CUstream is its key in
// the books.
type stream struct {
	busy int // calls in flight that use it
}

// event is a CUevent created by CreateEvent.
type event struct {
	cu   uintptr // CUevent
	busy int     // calls in flight that use it
}

// holdStream checks s for a call of op: the default stream and a foreign
// stream are passed as they are (st is nil); a stream of the books is marked
// busy until releaseStream(st); a destroyed one is refused. The CUstream is
// uintptr(s) in every case.
func (d *Driver) holdStream(op string, s acl.Stream) (st *stream, err error) {
	if s == 0 {
		return nil, nil
	}
	d.omu.Lock()
	defer d.omu.Unlock()
	if st, ok := d.streams[s]; ok {
		st.busy++
		return st, nil
	}
	if d.gone.Holds(s) {
		return nil, fail(op, acl.ErrCodeRTParamInvalid, "stream %#x was destroyed", uintptr(s))
	}
	return nil, nil // foreign: its owner vouches for it
}

func (d *Driver) releaseStream(st *stream) {
	if st == nil {
		return
	}
	d.omu.Lock()
	st.busy--
	d.omu.Unlock()
}

// holdEvent returns ev, marked busy until releaseEvent.
func (d *Driver) holdEvent(op string, ev acl.Event) (*event, error) {
	if ev == 0 {
		return nil, fail(op, acl.ErrCodeInvalidParam, "event is NULL")
	}
	d.omu.Lock()
	defer d.omu.Unlock()
	e, ok := d.events[ev]
	if !ok {
		return nil, fail(op, acl.ErrCodeRTParamInvalid, "event %#x is not a live event", uintptr(ev))
	}
	e.busy++
	return e, nil
}

func (d *Driver) releaseEvent(e *event) {
	d.omu.Lock()
	e.busy--
	d.omu.Unlock()
}

// call runs fn on a bound thread and returns the error for fn's CUresult,
// named after the CUDA function cufn.
func (d *Driver) call(cufn string, fn func() Result) error {
	b, err := d.bind()
	if err != nil {
		return err
	}
	r := fn()
	d.unbind(b)
	return d.lib.newError(cufn, r)
}

// CreateStream is cuStreamCreate with CU_STREAM_NON_BLOCKING: a stream that
// is not ordered with the legacy default stream, so that work other code
// queues there neither holds back nor waits for the caller's. The stream is
// the CUstream: the caller may queue its own kernels on it.
func (d *Driver) CreateStream() (acl.Stream, error) {
	const op = "aclrtCreateStream"
	if err := d.begin(op); err != nil {
		return 0, err
	}
	defer d.end()
	var cu uintptr
	if err := d.call("cuStreamCreate", func() Result { return d.lib.cuStreamCreate(&cu, cuStreamNonBlocking) }); err != nil {
		return 0, err
	}
	if cu == 0 {
		return 0, fail("cuStreamCreate", acl.ErrCodeRTInternal, "CUDA returned a NULL stream")
	}
	s := acl.Stream(cu)
	d.omu.Lock()
	defer d.omu.Unlock()
	d.gone.Revive(s)
	d.streams[s] = &stream{}
	return s, nil
}

// DestroyStream is cuStreamDestroy_v2, for a stream this driver created.
// CUDA would destroy a stream with work pending once the work is done; the
// contract refuses it (107000), as it refuses a stream another call is
// using, after asking cuStreamQuery. A foreign stream is refused (107000)
// without a call: its owner destroys it.
func (d *Driver) DestroyStream(s acl.Stream) error {
	const op = "aclrtDestroyStream"
	if s == 0 {
		return fail(op, acl.ErrCodeInvalidParam, "the default stream cannot be destroyed")
	}
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	d.omu.Lock()
	defer d.omu.Unlock()
	st, ok := d.streams[s]
	switch {
	case !ok && d.gone.Holds(s):
		return fail(op, acl.ErrCodeRTParamInvalid, "stream %#x was destroyed", uintptr(s))
	case !ok:
		return fail(op, acl.ErrCodeRTParamInvalid, "stream %#x was not created by this driver: its owner destroys it", uintptr(s))
	case st.busy > 0:
		return fail(op, acl.ErrCodeRTParamInvalid, "stream %#x is in use by %d calls in flight", uintptr(s), st.busy)
	}
	b, err := d.bind()
	if err != nil {
		return err
	}
	defer d.unbind(b)
	switch r := d.lib.cuStreamQuery(uintptr(s)); r {
	case ResultSuccess:
	case ResultNotReady:
		return fail(op, acl.ErrCodeRTParamInvalid, "stream %#x has work pending: synchronise it first", uintptr(s))
	default:
		return d.lib.newError("cuStreamQuery", r)
	}
	if r := d.lib.cuStreamDestroy(uintptr(s)); r != ResultSuccess {
		return d.lib.newError("cuStreamDestroy_v2", r)
	}
	delete(d.streams, s)
	d.gone.Bury(s)
	return nil
}

// SynchronizeStream is cuStreamSynchronize: it waits for the work queued on
// s, and returns the error of work that failed there. s may be foreign.
func (d *Driver) SynchronizeStream(s acl.Stream) error {
	const op = "aclrtSynchronizeStream"
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	st, err := d.holdStream(op, s)
	if err != nil {
		return err
	}
	defer d.releaseStream(st)
	return d.call("cuStreamSynchronize", func() Result { return d.lib.cuStreamSynchronize(uintptr(s)) })
}

// SynchronizeDevice is cuCtxSynchronize: it waits for every stream of the
// device's primary context (the caller's and other code's in the process).
func (d *Driver) SynchronizeDevice() error {
	const op = "aclrtSynchronizeDevice"
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	return d.call("cuCtxSynchronize", d.lib.cuCtxSynchronize)
}

// CreateEvent is cuEventCreate with CU_EVENT_DISABLE_TIMING: the event only
// orders work, so the GPU records no timestamp.
func (d *Driver) CreateEvent() (acl.Event, error) {
	const op = "aclrtCreateEvent"
	if err := d.begin(op); err != nil {
		return 0, err
	}
	defer d.end()
	var cu uintptr
	if err := d.call("cuEventCreate", func() Result { return d.lib.cuEventCreate(&cu, cuEventDisableTiming) }); err != nil {
		return 0, err
	}
	d.omu.Lock()
	defer d.omu.Unlock()
	d.nextObj += 0x10
	ev := acl.Event(d.nextObj)
	d.events[ev] = &event{cu: cu}
	return ev, nil
}

// RecordEvent is cuEventRecord(ev, s). s may be foreign; CUDA requires it to
// belong to the device's primary context, as the event does.
func (d *Driver) RecordEvent(ev acl.Event, s acl.Stream) error {
	const op = "aclrtRecordEvent"
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	e, err := d.holdEvent(op, ev)
	if err != nil {
		return err
	}
	defer d.releaseEvent(e)
	st, err := d.holdStream(op, s)
	if err != nil {
		return err
	}
	defer d.releaseStream(st)
	return d.call("cuEventRecord", func() Result { return d.lib.cuEventRecord(e.cu, uintptr(s)) })
}

// QueryEvent is cuEventQuery: CUDA_SUCCESS is complete, CUDA_ERROR_NOT_READY
// is not, anything else is an error. An event never recorded is complete.
func (d *Driver) QueryEvent(ev acl.Event) (bool, error) {
	const op = "aclrtQueryEventStatus"
	if err := d.begin(op); err != nil {
		return false, err
	}
	defer d.end()
	e, err := d.holdEvent(op, ev)
	if err != nil {
		return false, err
	}
	defer d.releaseEvent(e)
	b, err := d.bind()
	if err != nil {
		return false, err
	}
	r := d.lib.cuEventQuery(e.cu)
	d.unbind(b)
	switch r {
	case ResultSuccess:
		return true, nil
	case ResultNotReady:
		return false, nil
	}
	return false, d.lib.newError("cuEventQuery", r)
}

// SynchronizeEvent is cuEventSynchronize: it waits until ev completes.
func (d *Driver) SynchronizeEvent(ev acl.Event) error {
	const op = "aclrtSynchronizeEvent"
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	e, err := d.holdEvent(op, ev)
	if err != nil {
		return err
	}
	defer d.releaseEvent(e)
	return d.call("cuEventSynchronize", func() Result { return d.lib.cuEventSynchronize(e.cu) })
}

// DestroyEvent is cuEventDestroy_v2. An event another call is using is
// refused (107000).
func (d *Driver) DestroyEvent(ev acl.Event) error {
	const op = "aclrtDestroyEvent"
	if ev == 0 {
		return fail(op, acl.ErrCodeInvalidParam, "event is NULL")
	}
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	d.omu.Lock()
	defer d.omu.Unlock()
	e, ok := d.events[ev]
	switch {
	case !ok:
		return fail(op, acl.ErrCodeRTParamInvalid, "event %#x is not a live event", uintptr(ev))
	case e.busy > 0:
		return fail(op, acl.ErrCodeRTParamInvalid, "event %#x is in use by %d calls in flight", uintptr(ev), e.busy)
	}
	if err := d.call("cuEventDestroy_v2", func() Result { return d.lib.cuEventDestroy(e.cu) }); err != nil {
		return err
	}
	delete(d.events, ev)
	return nil
}

// MemsetAsync is cuMemsetD8Async on s (which may be foreign), after checking
// that [ptr, ptr+n) is mapped with access. It returns once the memset is
// queued.
func (d *Driver) MemsetAsync(ptr acl.DevicePtr, value byte, n uintptr, s acl.Stream) error {
	const op = "aclrtMemsetAsync"
	if n == 0 {
		return nil
	}
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	d.mu.RLock()
	defer d.mu.RUnlock()
	if _, err := d.book.Writable(op, ptr, n); err != nil {
		return err
	}
	st, err := d.holdStream(op, s)
	if err != nil {
		return err
	}
	defer d.releaseStream(st)
	return d.call("cuMemsetD8Async", func() Result { return d.lib.cuMemsetD8Async(uint64(ptr), value, n, uintptr(s)) })
}
