package cuda

import (
	"github.com/vmarena/vmarena/acl"
)

// Streams and events.
//
// The driver hands out its own ids for streams and events, as it does for
// physical handles, and keeps the CUDA handle behind each in its books. So a
// stale id (destroyed, or never made) is refused with 107000 before CUDA sees
// it, instead of reaching CUDA as a dangling CUstream or CUevent, and the
// live counts are exact. acl.Stream(0) is the legacy default stream (a NULL
// CUstream); it is never in the books and cannot be destroyed.
//
// A call that waits (SynchronizeStream, SynchronizeEvent) or queues work
// (RecordEvent, MemsetAsync) marks the objects it uses busy while CUDA runs it
// outside omu, and DestroyStream and DestroyEvent refuse a busy object, so
// that no CUDA call ever gets a handle destroyed under it.

// stream is a CUstream created by CreateStream.
type stream struct {
	cu   uintptr // CUstream
	busy int     // calls in flight that use it
}

// event is a CUevent created by CreateEvent.
type event struct {
	cu   uintptr // CUevent
	busy int     // calls in flight that use it
}

// holdStream returns the CUstream of s and marks it busy until
// releaseStream(st). For the default stream st is nil and cu is 0.
func (d *Driver) holdStream(op string, s acl.Stream) (st *stream, cu uintptr, err error) {
	if s == 0 {
		return nil, 0, nil
	}
	d.omu.Lock()
	defer d.omu.Unlock()
	st, ok := d.streams[s]
	if !ok {
		return nil, 0, fail(op, acl.ErrCodeRTParamInvalid, "stream %#x is not a live stream", uintptr(s))
	}
	st.busy++
	return st, st.cu, nil
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
// queues there neither holds back nor waits for the caller's.
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
	d.omu.Lock()
	defer d.omu.Unlock()
	d.nextObj += 0x10
	s := acl.Stream(d.nextObj)
	d.streams[s] = &stream{cu: cu}
	return s, nil
}

// DestroyStream is cuStreamDestroy_v2. CUDA would destroy a stream with work
// pending once the work is done; the contract refuses it (107000), as it
// refuses a stream another call is using, after asking cuStreamQuery.
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
	case !ok:
		return fail(op, acl.ErrCodeRTParamInvalid, "stream %#x is not a live stream", uintptr(s))
	case st.busy > 0:
		return fail(op, acl.ErrCodeRTParamInvalid, "stream %#x is in use by %d calls in flight", uintptr(s), st.busy)
	}
	b, err := d.bind()
	if err != nil {
		return err
	}
	defer d.unbind(b)
	switch r := d.lib.cuStreamQuery(st.cu); r {
	case ResultSuccess:
	case ResultNotReady:
		return fail(op, acl.ErrCodeRTParamInvalid, "stream %#x has work pending: synchronise it first", uintptr(s))
	default:
		return d.lib.newError("cuStreamQuery", r)
	}
	if r := d.lib.cuStreamDestroy(st.cu); r != ResultSuccess {
		return d.lib.newError("cuStreamDestroy_v2", r)
	}
	delete(d.streams, s)
	return nil
}

// SynchronizeStream is cuStreamSynchronize: it waits for the work queued on
// s, and returns the error of work that failed there.
func (d *Driver) SynchronizeStream(s acl.Stream) error {
	const op = "aclrtSynchronizeStream"
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	st, cu, err := d.holdStream(op, s)
	if err != nil {
		return err
	}
	defer d.releaseStream(st)
	return d.call("cuStreamSynchronize", func() Result { return d.lib.cuStreamSynchronize(cu) })
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

// RecordEvent is cuEventRecord(ev, s).
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
	st, cu, err := d.holdStream(op, s)
	if err != nil {
		return err
	}
	defer d.releaseStream(st)
	return d.call("cuEventRecord", func() Result { return d.lib.cuEventRecord(e.cu, cu) })
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

// MemsetAsync is cuMemsetD8Async on s, after checking that [ptr, ptr+n) is
// mapped with access. It returns once the memset is queued.
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
	if _, err := d.book.Accessible(op, ptr, n); err != nil {
		return err
	}
	st, cu, err := d.holdStream(op, s)
	if err != nil {
		return err
	}
	defer d.releaseStream(st)
	return d.call("cuMemsetD8Async", func() Result { return d.lib.cuMemsetD8Async(uint64(ptr), value, n, cu) })
}
