package host

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vmarena/vmarena/acl"
)

// Device work in flight.
//
// The host has no device, but the driver keeps streams the way a device does,
// so that code which orders its unmaps with events can be tested honestly.
// Each stream is a queue of work run in order by a goroutine of its own:
// memsets queued with MemsetAsync, and stand-in kernels queued with Launch,
// which touch a range until the test lets them finish. An event is a
// position in a stream's queue. The driver watches the ranges that queued
// work touches and records a fault, as a device would report an illegal
// address or a test would see a data race, when
//
//   - UnmapMem removes a mapping that queued or running work touches: the
//     unmap succeeds, and the work's stream reports the fault at its next
//     synchronisation;
//   - a synchronous copy or memset touches a range that queued work will
//     still write.
//
// [Driver.Faults] counts them; tests assert it stays 0.

// workKind is what a queued piece of work does.
type workKind int

const (
	workMemset workKind = iota // MemsetAsync
	workKernel                 // Launch: touches its range until done is closed
)

// work is one piece of device work queued on a stream.
type work struct {
	kind    workKind
	seq     uint64  // its position in its stream, from 1
	lo, hi  uintptr // the device range it touches, [lo, hi)
	value   byte
	done    <-chan struct{}
	faulted bool // its range was unmapped while it was queued or running
}

// stream is a queue of device work.
type stream struct {
	id       acl.Stream
	queue    []*work // queued and not finished, in order; queue[0] may be running
	queued   uint64  // seq of the last work queued
	finished uint64  // seq of the last work finished
	err      error   // the first fault since the last synchronisation
	dead     bool    // destroyed
}

// event is a position in a stream's queue.
type event struct {
	s   *stream // nil until recorded
	seq uint64  // complete once s.finished reaches it
}

// streams is the driver's device-work state. Its mutex is taken after the
// driver's mu, never before.
type streams struct {
	mu      sync.Mutex
	cond    *sync.Cond // broadcast whenever work finishes or the driver closes
	all     map[acl.Stream]*stream
	events  map[acl.Event]*event
	next    uintptr // the last stream or event id handed out
	faults  int
	closing bool
	wg      sync.WaitGroup
}

func (ss *streams) init(d *Driver) {
	ss.cond = sync.NewCond(&ss.mu)
	ss.all = make(map[acl.Stream]*stream)
	ss.events = make(map[acl.Event]*event)
	ss.next = 0x5000
	d.startStream(0) // the default stream
}

// startStream makes the stream id and starts its goroutine. Call with
// ss.mu held, or before the driver is shared.
func (d *Driver) startStream(id acl.Stream) *stream {
	s := &stream{id: id}
	d.ss.all[id] = s
	d.ss.wg.Add(1)
	go d.runStream(s)
	return s
}

// runStream runs the work queued on s, in order, until s is destroyed or
// the driver closes.
func (d *Driver) runStream(s *stream) {
	ss := &d.ss
	defer ss.wg.Done()
	for {
		ss.mu.Lock()
		for len(s.queue) == 0 && !s.dead && !ss.closing {
			ss.cond.Wait()
		}
		if len(s.queue) == 0 || ss.closing {
			ss.mu.Unlock()
			return
		}
		w := s.queue[0]
		ss.mu.Unlock()

		d.execute(w)

		ss.mu.Lock()
		s.queue[0] = nil
		s.queue = s.queue[1:]
		s.finished = w.seq
		if w.faulted && s.err == nil {
			s.err = fail("device work", acl.ErrCodeRTDrvInternal,
				"work on stream %#x touched [%#x, %#x) after it was unmapped (illegal address)", uintptr(s.id), w.lo, w.hi)
		}
		ss.cond.Broadcast()
		ss.mu.Unlock()
	}
}

// execute runs w on its stream's goroutine.
func (d *Driver) execute(w *work) {
	switch w.kind {
	case workKernel:
		if w.done != nil {
			select {
			case <-w.done:
			case <-d.quit:
			}
		}
	case workMemset:
		// Hold the driver lock shared so that no unmap runs under the write.
		d.mu.RLock()
		b, err := d.rangeLocked("aclrtMemsetAsync", acl.DevicePtr(w.lo), w.hi-w.lo, true)
		if err == nil && !w.faulted {
			fill(b, w.value)
		}
		d.mu.RUnlock()
	}
}

func fill(b []byte, v byte) {
	if v == 0 {
		clear(b)
		return
	}
	for i := range b {
		b[i] = v
	}
}

// faultUnmapLocked marks the work that touches [lo, hi), which is being
// unmapped, as faulted. Call with d.mu held.
func (d *Driver) faultUnmapLocked(lo, hi uintptr) {
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, s := range ss.all {
		for _, w := range s.queue {
			if w.lo < hi && lo < w.hi && !w.faulted {
				w.faulted = true
				ss.faults++
			}
		}
	}
}

// faultRaceLocked records a fault if queued work will still write [lo, hi),
// which a synchronous call is about to touch. Call with d.mu held (shared).
func (d *Driver) faultRaceLocked(lo, hi uintptr) {
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, s := range ss.all {
		for _, w := range s.queue {
			if w.lo < hi && lo < w.hi {
				ss.faults++
				return
			}
		}
	}
}

// Faults returns how many times device work touched a range after it was
// unmapped, or a synchronous copy or memset touched a range that queued work
// was still writing (see acl.Launcher).
func (d *Driver) Faults() int {
	d.ss.mu.Lock()
	defer d.ss.mu.Unlock()
	return d.ss.faults
}

// streamLocked returns the live stream s. Call with ss.mu held.
func (d *Driver) streamLocked(op string, s acl.Stream) (*stream, error) {
	st, ok := d.ss.all[s]
	if !ok || st.dead {
		return nil, fail(op, acl.ErrCodeRTParamInvalid, "stream %#x is not a live stream", uintptr(s))
	}
	return st, nil
}

// enqueue queues w on s after checking that [lo, hi) is mapped with access.
func (d *Driver) enqueue(op string, s acl.Stream, w *work) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if _, err := d.rangeLocked(op, acl.DevicePtr(w.lo), w.hi-w.lo, w.kind == workMemset); err != nil {
		return err
	}
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st, err := d.streamLocked(op, s)
	if err != nil {
		return err
	}
	st.queued++
	w.seq = st.queued
	st.queue = append(st.queue, w)
	ss.cond.Broadcast()
	return nil
}

// Launch queues stand-in device work on s that reads and writes
// [ptr, ptr+n) and stays in flight until done is closed (a nil done finishes
// as soon as its turn comes). It is how tests put a "kernel" in flight.
func (d *Driver) Launch(s acl.Stream, ptr acl.DevicePtr, n uintptr, done <-chan struct{}) error {
	if n == 0 {
		return fail("Launch", acl.ErrCodeInvalidParam, "empty range")
	}
	return d.enqueue("Launch", s, &work{kind: workKernel, lo: uintptr(ptr), hi: uintptr(ptr) + n, done: done})
}

// MemsetAsync queues a memset of n bytes at ptr on s.
func (d *Driver) MemsetAsync(ptr acl.DevicePtr, value byte, n uintptr, s acl.Stream) error {
	if n == 0 {
		return nil
	}
	return d.enqueue("aclrtMemsetAsync", s, &work{kind: workMemset, lo: uintptr(ptr), hi: uintptr(ptr) + n, value: value})
}

// CreateStream starts a new stream.
func (d *Driver) CreateStream() (acl.Stream, error) {
	const op = "aclrtCreateStream"
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.next += 0x10
	id := acl.Stream(ss.next)
	d.startStream(id)
	d.live.Streams++
	return id, nil
}

// DestroyStream stops s, which must have no work pending.
func (d *Driver) DestroyStream(s acl.Stream) error {
	const op = "aclrtDestroyStream"
	if s == 0 {
		return fail(op, acl.ErrCodeInvalidParam, "the default stream cannot be destroyed")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st, err := d.streamLocked(op, s)
	if err != nil {
		return err
	}
	if len(st.queue) > 0 {
		return fail(op, acl.ErrCodeRTParamInvalid, "stream %#x has %d pieces of work pending: synchronise it first", uintptr(s), len(st.queue))
	}
	st.dead = true
	delete(ss.all, s)
	ss.cond.Broadcast()
	d.live.Streams--
	return nil
}

// wait blocks until done() holds, with ss.mu held, or the driver closes.
func (ss *streams) wait(op string, done func() bool) error {
	for !done() {
		if ss.closing {
			return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
		}
		ss.cond.Wait()
	}
	return nil
}

// takeErr returns and clears the fault s has to report.
func (s *stream) takeErr() error {
	err := s.err
	s.err = nil
	return err
}

// SynchronizeStream waits until the work queued on s has run, and returns
// the fault of work on s since the last synchronisation, if any.
func (d *Driver) SynchronizeStream(s acl.Stream) error {
	const op = "aclrtSynchronizeStream"
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	st, err := d.streamLocked(op, s)
	if err != nil {
		return err
	}
	if err := ss.wait(op, func() bool { return st.finished == st.queued }); err != nil {
		return err
	}
	return st.takeErr()
}

// SynchronizeDevice waits until every stream has drained, and returns their
// faults since the last synchronisation.
func (d *Driver) SynchronizeDevice() error {
	const op = "aclrtSynchronizeDevice"
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if err := ss.wait(op, func() bool {
		for _, st := range ss.all {
			if st.finished != st.queued {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	var errs []error
	for _, st := range ss.all {
		errs = append(errs, st.takeErr())
	}
	return errors.Join(errs...)
}

// CreateEvent makes an event, never recorded.
func (d *Driver) CreateEvent() (acl.Event, error) {
	const op = "aclrtCreateEvent"
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.next += 0x10
	id := acl.Event(ss.next)
	ss.events[id] = &event{}
	d.live.Events++
	return id, nil
}

// eventLocked returns the live event ev. Call with ss.mu held.
func (d *Driver) eventLocked(op string, ev acl.Event) (*event, error) {
	if ev == 0 {
		return nil, fail(op, acl.ErrCodeInvalidParam, "event is NULL")
	}
	e, ok := d.ss.events[ev]
	if !ok {
		return nil, fail(op, acl.ErrCodeRTParamInvalid, "event %#x is not a live event", uintptr(ev))
	}
	return e, nil
}

// RecordEvent marks the present end of s's queue with ev.
func (d *Driver) RecordEvent(ev acl.Event, s acl.Stream) error {
	const op = "aclrtRecordEvent"
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	e, err := d.eventLocked(op, ev)
	if err != nil {
		return err
	}
	st, err := d.streamLocked(op, s)
	if err != nil {
		return err
	}
	e.s, e.seq = st, st.queued
	return nil
}

// QueryEvent reports whether the work before ev's mark has run. An event
// never recorded is not complete, as on ACL.
func (d *Driver) QueryEvent(ev acl.Event) (bool, error) {
	const op = "aclrtQueryEventStatus"
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	e, err := d.eventLocked(op, ev)
	if err != nil {
		return false, err
	}
	return e.s != nil && e.s.finished >= e.seq, nil
}

// SynchronizeEvent waits until ev completes. An event never recorded
// returns at once.
func (d *Driver) SynchronizeEvent(ev acl.Event) error {
	const op = "aclrtSynchronizeEvent"
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	e, err := d.eventLocked(op, ev)
	if err != nil {
		return err
	}
	if e.s == nil {
		return nil
	}
	return ss.wait(op, func() bool { return e.s.finished >= e.seq })
}

// DestroyEvent forgets ev.
func (d *Driver) DestroyEvent(ev acl.Event) error {
	const op = "aclrtDestroyEvent"
	d.mu.Lock()
	defer d.mu.Unlock()
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if _, err := d.eventLocked(op, ev); err != nil {
		return err
	}
	delete(ss.events, ev)
	d.live.Events--
	return nil
}

// stopStreams stops every stream's goroutine; work still queued is dropped.
// Call without d.mu held: a running memset takes it.
func (d *Driver) stopStreams() {
	ss := &d.ss
	ss.mu.Lock()
	ss.closing = true
	ss.cond.Broadcast()
	ss.mu.Unlock()
	close(d.quit)
	ss.wg.Wait()
}

// streamsString describes the streams with work pending, for leak reports.
func (d *Driver) pendingWork() string {
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	n := 0
	for _, s := range ss.all {
		n += len(s.queue)
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d pieces of device work still queued", n)
}
