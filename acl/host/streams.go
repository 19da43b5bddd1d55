package host

import (
	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/queue"
)

// Device work in flight.
//
// The host has no device, but the driver keeps streams the way a device does,
// so that code which orders its unmaps with events can be tested honestly.
// Each stream is a queue of work run in order by a goroutine of its own:
// memsets queued with MemsetAsync, and stand-in kernels queued with Launch,
// which touch a range until the test lets them finish. An event is a
// position in a stream's queue. The books of streams, events and faults, and
// the rules of their calls, are shared with the device model
// (acl/internal/queue); this file runs the work. The driver records a fault,
// as a device would report an illegal address or a test would see a data
// race, when
//
//   - UnmapMem removes a mapping that queued or running work touches: the
//     unmap succeeds, and the work's stream reports the fault at its next
//     synchronisation;
//   - a synchronous copy or memset touches a range that queued work will
//     still write.
//
// [Driver.Faults] counts them; tests assert it stays 0.

type (
	queues = queue.Queues[struct{}, struct{}]
	stream = queue.Stream[struct{}, struct{}]
	work   = queue.Work[struct{}]
)

// startStream starts the goroutine of the new stream s. The queues call it
// with their lock held.
func (d *Driver) startStream(s *stream) {
	d.ss.GoLocked(func() { d.runStream(s) })
}

// runStream runs the work queued on s, in order, until s is destroyed or
// the driver closes. The work at the head of the queue is running.
func (d *Driver) runStream(s *stream) {
	ss := &d.ss
	for {
		ss.Lock()
		for len(s.Queue) == 0 && !s.Destroyed && !ss.StoppingLocked() {
			ss.Wait()
		}
		if len(s.Queue) == 0 || ss.StoppingLocked() {
			ss.Unlock()
			return
		}
		w := s.Queue[0]
		ss.Unlock()

		d.execute(w)

		ss.Lock()
		s.Retire()
		ss.Broadcast()
		ss.Unlock()
	}
}

// execute runs w on its stream's goroutine.
func (d *Driver) execute(w *work) {
	switch w.Kind {
	case queue.Kernel:
		if w.Done != nil {
			select {
			case <-w.Done:
			case <-d.ss.Quit():
			}
		}
	case queue.Memset:
		// Hold the driver lock shared so that no unmap runs under the write.
		d.mu.RLock()
		b, err := d.rangeLocked("aclrtMemsetAsync", acl.DevicePtr(w.Lo), w.Hi-w.Lo, true)
		if err == nil && !w.Faulted {
			fill(b, w.Value)
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

// faultRace records a fault if queued work will still write [lo, hi),
// which a synchronous call is about to touch.
func (d *Driver) faultRace(lo, hi uintptr) { d.ss.FaultRace(queue.Range{Lo: lo, Hi: hi}) }

// Faults returns how many times device work touched a range after it was
// unmapped, or a synchronous copy or memset touched a range that queued work
// was still writing (see acl.Launcher).
func (d *Driver) Faults() int { return d.ss.Faults() }

// enqueue queues w on s after checking that [lo, hi) is mapped with access.
func (d *Driver) enqueue(op string, s acl.Stream, w *work) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if _, err := d.rangeLocked(op, acl.DevicePtr(w.Lo), w.Hi-w.Lo, w.Kind == queue.Memset); err != nil {
		return err
	}
	d.ss.Lock()
	defer d.ss.Unlock()
	return d.ss.EnqueueLocked(op, s, w)
}

// Launch queues stand-in device work on s that reads and writes
// [ptr, ptr+n) and stays in flight until done is closed (a nil done finishes
// as soon as its turn comes). It is how tests put a "kernel" in flight.
func (d *Driver) Launch(s acl.Stream, ptr acl.DevicePtr, n uintptr, done <-chan struct{}) error {
	if n == 0 {
		return fail("Launch", acl.ErrCodeInvalidParam, "empty range")
	}
	return d.enqueue("Launch", s, &work{Kind: queue.Kernel, Lo: uintptr(ptr), Hi: uintptr(ptr) + n, Done: done})
}

// MemsetAsync queues a memset of n bytes at ptr on s.
func (d *Driver) MemsetAsync(ptr acl.DevicePtr, value byte, n uintptr, s acl.Stream) error {
	if n == 0 {
		return nil
	}
	return d.enqueue("aclrtMemsetAsync", s, &work{Kind: queue.Memset, Lo: uintptr(ptr), Hi: uintptr(ptr) + n, Value: value})
}

// CreateStream starts a new stream.
func (d *Driver) CreateStream() (acl.Stream, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ss.CreateStream("aclrtCreateStream", d.closed, &d.live)
}

// DestroyStream stops s, which must have no work pending.
func (d *Driver) DestroyStream(s acl.Stream) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ss.DestroyStream("aclrtDestroyStream", s, d.closed, &d.live)
}

// waitLocked blocks until done() holds, with the queues' lock held, or the
// driver closes.
func (d *Driver) waitLocked(op string, done func() bool) error {
	for !done() {
		if d.ss.StoppingLocked() {
			return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
		}
		d.ss.Wait()
	}
	return nil
}

// SynchronizeStream waits until the work queued on s has run, and returns
// the fault of work on s since the last synchronisation, if any.
func (d *Driver) SynchronizeStream(s acl.Stream) error {
	const op = "aclrtSynchronizeStream"
	ss := &d.ss
	ss.Lock()
	defer ss.Unlock()
	st, err := ss.StreamLocked(op, s)
	if err != nil {
		return err
	}
	if err := d.waitLocked(op, st.Idle); err != nil {
		return err
	}
	return st.TakeErr()
}

// SynchronizeDevice waits until every stream has drained, and returns their
// faults since the last synchronisation.
func (d *Driver) SynchronizeDevice() error {
	const op = "aclrtSynchronizeDevice"
	ss := &d.ss
	ss.Lock()
	defer ss.Unlock()
	if err := d.waitLocked(op, func() bool {
		for st := range ss.StreamsLocked() {
			if !st.Idle() {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	return ss.TakeErrsLocked()
}

// CreateEvent makes an event, never recorded.
func (d *Driver) CreateEvent() (acl.Event, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ss.CreateEvent("aclrtCreateEvent", d.closed, &d.live)
}

// RecordEvent marks the present end of s's queue with ev.
func (d *Driver) RecordEvent(ev acl.Event, s acl.Stream) error {
	return d.ss.Record("aclrtRecordEvent", ev, s)
}

// QueryEvent reports whether the work before ev's mark has run. An event
// never recorded is not complete, as on ACL.
func (d *Driver) QueryEvent(ev acl.Event) (bool, error) {
	return d.ss.Query("aclrtQueryEventStatus", ev)
}

// SynchronizeEvent waits until ev completes. An event never recorded
// returns at once.
func (d *Driver) SynchronizeEvent(ev acl.Event) error {
	const op = "aclrtSynchronizeEvent"
	ss := &d.ss
	ss.Lock()
	defer ss.Unlock()
	e, err := ss.EventLocked(op, ev)
	if err != nil || e.Stream == nil {
		return err
	}
	return d.waitLocked(op, e.Complete)
}

// DestroyEvent forgets ev.
func (d *Driver) DestroyEvent(ev acl.Event) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ss.DestroyEvent("aclrtDestroyEvent", ev, &d.live)
}
