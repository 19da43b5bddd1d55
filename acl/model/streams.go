package model

import (
	"sync/atomic"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/queue"
)

// Device work in modelled time.
//
// A stream is a queue of device work that runs in order. Each piece of work
// becomes runnable when its launch call returns (the call's base cost after
// it starts) and starts when the work before it has finished; it then runs
// for its device time: a memset, latency + n ÷ local bandwidth; a
// LaunchFor kernel, its duration; a Launch kernel, until its done channel is
// closed. Completion times are computed, not simulated by a goroutine: the
// model retires the work whose end has passed whenever a call looks at the
// queue, so an event completes exactly when the work before its record
// does, and a synchronisation waits (spinning, or sleeping then spinning for
// long waits) until that moment. The only goroutines are the watchers of
// Launch's done channels, which note when the channel closed.
//
// Faults are recorded as the host driver records them:
//
//   - UnmapMem removes a mapping that work not yet finished touches: the
//     unmap succeeds, the fault is counted, and the work's stream reports
//     it at the synchronisation after the work finishes;
//   - a synchronous copy or memset touches a range that work not yet
//     finished will write: the fault is counted.

// The books of streams, events and faults, and the rules of their calls, are
// the host driver's (acl/internal/queue); this file computes when the work
// ends.

type (
	queues = queue.Queues[workX, streamX]
	stream = queue.Stream[workX, streamX]
	work   = queue.Work[workX]
)

// workX is what the model keeps per piece of work beyond the books.
type workX struct {
	spans   []span // where a memset writes; nil with Config.NoData
	ready   int64  // when it may start: its launch call has returned
	dur     int64  // device time once started
	closed  bool   // Done has been seen closed
	closeAt int64  // when
	end     int64  // completion time, once known
	known   bool   // end is known
}

// streamX is what the model keeps per stream beyond the books.
type streamX struct {
	tail int64 // end of the last work retired
}

// schedule works out the end of each queued piece of work on s, as far as
// it is known: up to the first Launch whose done channel has not closed.
func schedule(s *stream) {
	prev := s.X.tail
	for _, w := range s.Queue {
		if !w.X.known {
			if w.Done != nil && !w.X.closed {
				return
			}
			e := max(w.X.ready, prev) + w.X.dur
			if w.Done != nil {
				e = max(e, w.X.closeAt)
			}
			w.X.end, w.X.known = e, true
		}
		prev = w.X.end
	}
}

// advanceLocked retires the work that has finished by now, on every
// stream, in the order it finished, applying memsets (unless
// Config.NoData): memsets on two streams land in the order the device ran
// them, whichever stream a call looks at first. Call with the queues' lock
// held.
func (d *Driver) advanceLocked(_ *stream) {
	t := d.now()
	for {
		var first *stream
		for st := range d.ss.StreamsLocked() {
			schedule(st)
			if len(st.Queue) == 0 || !st.Queue[0].X.known || st.Queue[0].X.end > t {
				continue
			}
			if first == nil || st.Queue[0].X.end < first.Queue[0].X.end {
				first = st
			}
		}
		if first == nil {
			return
		}
		w := first.Queue[0]
		if !w.Faulted && w.Kind == queue.Memset && w.X.spans != nil {
			d.data.Lock()
			applyFill(w.X.spans, w.Value)
			d.data.Unlock()
		}
		first.X.tail = w.X.end
		first.Retire()
	}
}

// endOf returns when the work up to seq on s ends, if that is known yet.
func endOf(s *stream, seq uint64) (int64, bool) {
	schedule(s)
	for _, w := range s.Queue {
		if w.Seq == seq {
			return w.X.end, w.X.known
		}
		if !w.X.known {
			return 0, false
		}
	}
	return s.X.tail, true
}

// Faults returns how many times device work touched a range after it was
// unmapped, or a synchronous copy or memset touched a range that queued work
// was still writing (see acl.Launcher).
func (d *Driver) Faults() int { return d.ss.Faults() }

// enqueue queues w on s, after checking that its range, if any, is mapped
// with access. w.X.ready is when the work may start.
func (d *Driver) enqueue(op string, s acl.Stream, w *work) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	if w.Hi != w.Lo { // a range that wraps is checked too (and refused)
		check := d.book.Accessible
		if w.Kind == queue.Memset {
			check = d.book.Writable
		}
		r, err := check(op, acl.DevicePtr(w.Lo), w.Hi-w.Lo)
		if err != nil {
			return err
		}
		if w.Kind == queue.Memset {
			w.X.spans = d.spans(r, w.Lo, w.Hi-w.Lo)
		}
	}
	ss := &d.ss
	ss.Lock()
	defer ss.Unlock()
	if err := ss.EnqueueLocked(op, s, w); err != nil {
		return err
	}
	if w.Done != nil {
		ss.GoLocked(func() { d.watch(w) })
	}
	return nil
}

// watch notes when w's done channel closes.
func (d *Driver) watch(w *work) {
	select {
	case <-w.Done:
	case <-d.ss.Quit():
		return
	}
	t := d.now()
	d.ss.Lock()
	w.X.closed, w.X.closeAt = true, t
	d.ss.Broadcast()
	d.ss.Unlock()
}

// MemsetAsync queues a memset of n bytes at ptr on s. The call costs the
// profile's memset_async base; the memset then takes the device
// latency + n ÷ local bandwidth once the work before it on s has finished.
func (d *Driver) MemsetAsync(ptr acl.DevicePtr, value byte, n uintptr, s acl.Stream) error {
	if n == 0 {
		return nil
	}
	const op = "aclrtMemsetAsync"
	t0 := d.begin(cMemsetAsync)
	host := d.cost.base[cMemsetAsync]
	err := d.enqueue(op, s, &work{Kind: queue.Memset, Lo: uintptr(ptr), Hi: uintptr(ptr) + n, Value: value,
		X: workX{ready: t0 + host, dur: d.cost.device(n)}})
	d.end(cMemsetAsync, t0, host, 0)
	return err
}

// Launch queues stand-in device work on s that reads and writes
// [ptr, ptr+n) and stays in flight until done is closed (a nil done finishes
// as soon as its turn comes). It costs the profile's launch base, like a
// kernel launch. It is how tests put a "kernel" in flight.
func (d *Driver) Launch(s acl.Stream, ptr acl.DevicePtr, n uintptr, done <-chan struct{}) error {
	if n == 0 {
		return fail("Launch", acl.ErrCodeInvalidParam, "empty range")
	}
	return d.launch(s, ptr, n, 0, done)
}

// LaunchFor queues stand-in device work on s that runs for dur of device
// time once the work before it has finished, touching [ptr, ptr+n), or no
// memory when n is 0: a long-running kernel, for scenarios where other work
// must wait for it or must not. It costs the profile's launch base.
func (d *Driver) LaunchFor(s acl.Stream, ptr acl.DevicePtr, n uintptr, dur time.Duration) error {
	if dur < 0 {
		return fail("LaunchFor", acl.ErrCodeInvalidParam, "negative duration %v", dur)
	}
	return d.launch(s, ptr, n, int64(dur), nil)
}

func (d *Driver) launch(s acl.Stream, ptr acl.DevicePtr, n uintptr, dur int64, done <-chan struct{}) error {
	t0 := d.begin(cLaunch)
	host := d.cost.base[cLaunch]
	w := &work{Kind: queue.Kernel, Done: done, X: workX{ready: t0 + host, dur: dur}}
	if n > 0 {
		w.Lo, w.Hi = uintptr(ptr), uintptr(ptr)+n
	}
	err := d.enqueue("Launch", s, w)
	d.end(cLaunch, t0, host, 0)
	return err
}

// CreateStream makes a new stream.
func (d *Driver) CreateStream() (s acl.Stream, err error) {
	d.timed(cCreateStream, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		s, err = d.ss.CreateStream("aclrtCreateStream", d.closed, &d.live)
	})
	return s, err
}

// DestroyStream forgets s, which must have no work pending.
func (d *Driver) DestroyStream(s acl.Stream) (err error) {
	d.timed(cDestroyStream, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		err = d.ss.DestroyStream("aclrtDestroyStream", s, d.closed, &d.live)
	})
	return err
}

// waitFor waits until the work up to seq on s has finished, or the driver
// closes.
func (d *Driver) waitFor(op string, s *stream, seq uint64) error {
	ss := &d.ss
	ss.Lock()
	for {
		d.advanceLocked(s)
		if s.Finished >= seq {
			ss.Unlock()
			return nil
		}
		if ss.StoppingLocked() {
			ss.Unlock()
			return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
		}
		end, known := endOf(s, seq)
		if !known {
			ss.Wait()
			continue
		}
		ss.Unlock()
		if f := syncWaits.Load(); f != nil {
			(*f)()
		}
		d.waitUntilOr(end, ss.Quit()) // Close ends the wait
		ss.Lock()
	}
}

// syncWaits, which only tests set, is called when a synchronisation has
// found the work it waits for unfinished and is about to wait for its end.
var syncWaits atomic.Pointer[func()]

// SynchronizeStream waits until the work queued on s has run, and returns
// the fault of work on s since the last synchronisation, if any. It returns
// the profile's sync_stream base after the later of its call and the
// work's completion.
func (d *Driver) SynchronizeStream(s acl.Stream) error {
	const op = "aclrtSynchronizeStream"
	ss := &d.ss
	ss.Lock()
	st, err := ss.StreamLocked(op, s)
	var seq uint64
	if err == nil {
		seq = st.Queued
	}
	ss.Unlock()
	if err == nil {
		err = d.waitFor(op, st, seq)
	}
	if err == nil {
		ss.Lock()
		err = st.TakeErr()
		ss.Unlock()
	}
	d.charge(cSyncStream)
	return err
}

// SynchronizeDevice waits until every stream has run the work queued on it
// when it was called, and returns their faults since the last
// synchronisation.
func (d *Driver) SynchronizeDevice() error {
	const op = "aclrtSynchronizeDevice"
	type mark struct {
		s   *stream
		seq uint64
	}
	ss := &d.ss
	ss.Lock()
	var marks []mark
	for st := range ss.StreamsLocked() {
		if !st.Idle() {
			marks = append(marks, mark{st, st.Queued})
		}
	}
	ss.Unlock()
	var err error
	for _, m := range marks {
		if err = d.waitFor(op, m.s, m.seq); err != nil {
			break
		}
	}
	if err == nil {
		ss.Lock()
		err = ss.TakeErrsLocked()
		ss.Unlock()
	}
	d.charge(cSyncDevice)
	return err
}

// CreateEvent makes an event, never recorded.
func (d *Driver) CreateEvent() (ev acl.Event, err error) {
	d.timed(cCreateEvent, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		ev, err = d.ss.CreateEvent("aclrtCreateEvent", d.closed, &d.live)
	})
	return ev, err
}

// RecordEvent marks the present end of s's queue with ev.
func (d *Driver) RecordEvent(ev acl.Event, s acl.Stream) (err error) {
	d.timed(cRecordEvent, func() { err = d.ss.Record("aclrtRecordEvent", ev, s) })
	return err
}

// QueryEvent reports whether the work before ev's mark has finished. It
// never waits. An event never recorded is not complete, as on ACL.
func (d *Driver) QueryEvent(ev acl.Event) (done bool, err error) {
	d.timed(cQueryEvent, func() { done, err = d.ss.Query("aclrtQueryEventStatus", ev) })
	return done, err
}

// SynchronizeEvent waits until ev completes. An event never recorded
// returns at once.
func (d *Driver) SynchronizeEvent(ev acl.Event) error {
	const op = "aclrtSynchronizeEvent"
	ss := &d.ss
	ss.Lock()
	e, err := ss.EventLocked(op, ev)
	var st *stream
	var seq uint64
	if err == nil {
		st, seq = e.Stream, e.Seq
	}
	ss.Unlock()
	if err == nil && st != nil {
		err = d.waitFor(op, st, seq)
	}
	d.charge(cSyncEvent)
	return err
}

// DestroyEvent forgets ev.
func (d *Driver) DestroyEvent(ev acl.Event) (err error) {
	d.timed(cDestroyEvent, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		err = d.ss.DestroyEvent("aclrtDestroyEvent", ev, &d.live)
	})
	return err
}
