package model

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vmarena/vmarena/acl"
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

// workKind is what a queued piece of work does.
type workKind int

const (
	workMemset workKind = iota // MemsetAsync
	workKernel                 // Launch, LaunchFor
)

// work is one piece of device work queued on a stream.
type work struct {
	kind    workKind
	seq     uint64  // its position in its stream, from 1
	lo, hi  uintptr // the device range it touches, [lo, hi); empty for none
	value   byte
	spans   []span // where a memset writes, in data mode
	ready   int64  // when it may start: its launch call has returned
	dur     int64  // device time once started
	done    <-chan struct{}
	closed  bool  // done has been seen closed
	closeAt int64 // when
	end     int64 // completion time, once known
	known   bool  // end is known
	faulted bool  // its range was unmapped before it finished
}

// stream is a queue of device work.
type stream struct {
	id       acl.Stream
	queue    []*work // not yet retired, in order
	queued   uint64  // seq of the last work queued
	finished uint64  // seq of the last work retired
	tail     int64   // end of the last work retired
	err      error   // the first fault since the last synchronisation
}

// event is a position in a stream's queue.
type event struct {
	s   *stream // nil until recorded
	seq uint64
}

// streams is the model's device-work state. Its mutex is taken after the
// driver's mu and before its data lock.
type streams struct {
	mu      sync.Mutex
	cond    *sync.Cond // broadcast when a done channel closes, and at Close
	all     map[acl.Stream]*stream
	events  map[acl.Event]*event
	next    uintptr // the last stream or event id handed out
	faults  int
	closing bool
	wg      sync.WaitGroup // watchers
}

func (ss *streams) init() {
	ss.cond = sync.NewCond(&ss.mu)
	ss.all = map[acl.Stream]*stream{0: {id: 0}}
	ss.events = make(map[acl.Event]*event)
	ss.next = 0x5000
}

// schedule works out the end of each queued piece of work, as far as it is
// known: up to the first Launch whose done channel has not closed.
func (s *stream) schedule() {
	prev := s.tail
	for _, w := range s.queue {
		if !w.known {
			if w.done != nil && !w.closed {
				return
			}
			e := max(w.ready, prev) + w.dur
			if w.done != nil {
				e = max(e, w.closeAt)
			}
			w.end, w.known = e, true
		}
		prev = w.end
	}
}

// advanceLocked retires the work on s that has finished by t, applying
// memsets in data mode. Call with ss.mu held.
func (d *Driver) advanceLocked(s *stream, t int64) {
	s.schedule()
	n := 0
	for n < len(s.queue) && s.queue[n].known && s.queue[n].end <= t {
		w := s.queue[n]
		if w.faulted {
			if s.err == nil {
				s.err = fail("device work", acl.ErrCodeRTDrvInternal,
					"work on stream %#x touched [%#x, %#x) after it was unmapped (illegal address)", uintptr(s.id), w.lo, w.hi)
			}
		} else if w.kind == workMemset && w.spans != nil {
			d.data.Lock()
			applyFill(w.spans, w.value)
			d.data.Unlock()
		}
		s.finished, s.tail = w.seq, w.end
		s.queue[n] = nil
		n++
	}
	if n > 0 {
		s.queue = s.queue[n:]
		if len(s.queue) == 0 {
			s.queue = nil
		}
	}
}

// advanceAllLocked retires finished work on every stream.
func (d *Driver) advanceAllLocked(t int64) {
	for _, s := range d.ss.all {
		d.advanceLocked(s, t)
	}
}

// endOf returns when the work up to seq on s ends, if that is known yet.
func (s *stream) endOf(seq uint64) (int64, bool) {
	s.schedule()
	for _, w := range s.queue {
		if w.seq == seq {
			return w.end, w.known
		}
		if !w.known {
			return 0, false
		}
	}
	return s.tail, true
}

// faultUnmapLocked marks the unfinished work that touches [lo, hi), which
// is being unmapped, as faulted. Call with d.mu held.
func (d *Driver) faultUnmapLocked(lo, hi uintptr) {
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	d.advanceAllLocked(now())
	for _, s := range ss.all {
		for _, w := range s.queue {
			if w.lo < hi && lo < w.hi && !w.faulted {
				w.faulted = true
				ss.faults++
			}
		}
	}
}

// faultRace records a fault if unfinished work will still write [alo, ahi)
// or [blo, bhi), which a synchronous call is about to touch. Call with d.mu
// held (shared).
func (d *Driver) faultRace(alo, ahi, blo, bhi uintptr) {
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	d.advanceAllLocked(now())
	for _, s := range ss.all {
		for _, w := range s.queue {
			if (w.lo < ahi && alo < w.hi) || (w.lo < bhi && blo < w.hi) {
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
	if !ok {
		return nil, fail(op, acl.ErrCodeRTParamInvalid, "stream %#x is not a live stream", uintptr(s))
	}
	return st, nil
}

// enqueue queues w on s, after checking that its range, if any, is mapped
// with access. ready is when the work may start.
func (d *Driver) enqueue(op string, s acl.Stream, w *work) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	if w.hi > w.lo {
		r, err := d.book.Accessible(op, acl.DevicePtr(w.lo), w.hi-w.lo)
		if err != nil {
			return err
		}
		if w.kind == workMemset {
			w.spans = d.spans(r, w.lo, w.hi-w.lo)
		}
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
	if w.done != nil {
		ss.wg.Add(1)
		go d.watch(w)
	}
	return nil
}

// watch notes when w's done channel closes.
func (d *Driver) watch(w *work) {
	defer d.ss.wg.Done()
	select {
	case <-w.done:
	case <-d.quit:
		return
	}
	t := now()
	d.ss.mu.Lock()
	w.closed, w.closeAt = true, t
	d.ss.cond.Broadcast()
	d.ss.mu.Unlock()
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
	err := d.enqueue(op, s, &work{kind: workMemset, lo: uintptr(ptr), hi: uintptr(ptr) + n, value: value,
		ready: t0 + host, dur: d.cost.device(n)})
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
	w := &work{kind: workKernel, ready: t0 + host, dur: dur, done: done}
	if n > 0 {
		w.lo, w.hi = uintptr(ptr), uintptr(ptr)+n
	}
	err := d.enqueue("Launch", s, w)
	d.end(cLaunch, t0, host, 0)
	return err
}

// CreateStream makes a new stream.
func (d *Driver) CreateStream() (acl.Stream, error) {
	const op = "aclrtCreateStream"
	t0 := d.begin(cCreateStream)
	s, err := d.createStream(op)
	d.end(cCreateStream, t0, d.cost.base[cCreateStream], 0)
	return s, err
}

func (d *Driver) createStream(op string) (acl.Stream, error) {
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
	ss.all[id] = &stream{id: id}
	d.live.Streams++
	return id, nil
}

// DestroyStream forgets s, which must have no work pending.
func (d *Driver) DestroyStream(s acl.Stream) error {
	const op = "aclrtDestroyStream"
	t0 := d.begin(cDestroyStream)
	err := d.destroyStream(op, s)
	d.end(cDestroyStream, t0, d.cost.base[cDestroyStream], 0)
	return err
}

func (d *Driver) destroyStream(op string, s acl.Stream) error {
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
	d.advanceLocked(st, now())
	if len(st.queue) > 0 {
		return fail(op, acl.ErrCodeRTParamInvalid, "stream %#x has %d pieces of work pending: synchronise it first", uintptr(s), len(st.queue))
	}
	delete(ss.all, s)
	d.live.Streams--
	return nil
}

// waitFor waits until the work up to seq on s has finished, or the driver
// closes.
func (d *Driver) waitFor(op string, s *stream, seq uint64) error {
	ss := &d.ss
	ss.mu.Lock()
	for {
		d.advanceLocked(s, now())
		if s.finished >= seq {
			ss.mu.Unlock()
			return nil
		}
		if ss.closing {
			ss.mu.Unlock()
			return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
		}
		end, known := s.endOf(seq)
		if !known {
			ss.cond.Wait()
			continue
		}
		ss.mu.Unlock()
		waitUntil(end)
		ss.mu.Lock()
	}
}

// takeErr returns and clears the fault s has to report.
func (s *stream) takeErr() error {
	err := s.err
	s.err = nil
	return err
}

// SynchronizeStream waits until the work queued on s has run, and returns
// the fault of work on s since the last synchronisation, if any. It returns
// the profile's sync_stream base after the later of its call and the
// work's completion.
func (d *Driver) SynchronizeStream(s acl.Stream) error {
	const op = "aclrtSynchronizeStream"
	ss := &d.ss
	ss.mu.Lock()
	st, err := d.streamLocked(op, s)
	var seq uint64
	if err == nil {
		seq = st.queued
	}
	ss.mu.Unlock()
	if err == nil {
		err = d.waitFor(op, st, seq)
	}
	if err == nil {
		ss.mu.Lock()
		err = st.takeErr()
		ss.mu.Unlock()
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
	ss.mu.Lock()
	var marks []mark
	for _, st := range ss.all {
		if st.queued > st.finished {
			marks = append(marks, mark{st, st.queued})
		}
	}
	ss.mu.Unlock()
	var errs []error
	for _, m := range marks {
		if err := d.waitFor(op, m.s, m.seq); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if len(errs) == 0 {
		ss.mu.Lock()
		for _, st := range ss.all {
			errs = append(errs, st.takeErr())
		}
		ss.mu.Unlock()
	}
	d.charge(cSyncDevice)
	return errors.Join(errs...)
}

// CreateEvent makes an event, never recorded.
func (d *Driver) CreateEvent() (acl.Event, error) {
	const op = "aclrtCreateEvent"
	t0 := d.begin(cCreateEvent)
	ev, err := d.createEvent(op)
	d.end(cCreateEvent, t0, d.cost.base[cCreateEvent], 0)
	return ev, err
}

func (d *Driver) createEvent(op string) (acl.Event, error) {
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
	t0 := d.begin(cRecordEvent)
	err := d.recordEvent(op, ev, s)
	d.end(cRecordEvent, t0, d.cost.base[cRecordEvent], 0)
	return err
}

func (d *Driver) recordEvent(op string, ev acl.Event, s acl.Stream) error {
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

// QueryEvent reports whether the work before ev's mark has finished. It
// never waits. An event never recorded is not complete, as on ACL.
func (d *Driver) QueryEvent(ev acl.Event) (bool, error) {
	const op = "aclrtQueryEventStatus"
	t0 := d.begin(cQueryEvent)
	done, err := d.queryEvent(op, ev)
	d.end(cQueryEvent, t0, d.cost.base[cQueryEvent], 0)
	return done, err
}

func (d *Driver) queryEvent(op string, ev acl.Event) (bool, error) {
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	e, err := d.eventLocked(op, ev)
	if err != nil {
		return false, err
	}
	if e.s == nil {
		return false, nil
	}
	d.advanceLocked(e.s, now())
	return e.s.finished >= e.seq, nil
}

// SynchronizeEvent waits until ev completes. An event never recorded
// returns at once.
func (d *Driver) SynchronizeEvent(ev acl.Event) error {
	const op = "aclrtSynchronizeEvent"
	ss := &d.ss
	ss.mu.Lock()
	e, err := d.eventLocked(op, ev)
	var st *stream
	var seq uint64
	if err == nil {
		st, seq = e.s, e.seq
	}
	ss.mu.Unlock()
	if err == nil && st != nil {
		err = d.waitFor(op, st, seq)
	}
	d.charge(cSyncEvent)
	return err
}

// DestroyEvent forgets ev.
func (d *Driver) DestroyEvent(ev acl.Event) error {
	const op = "aclrtDestroyEvent"
	t0 := d.begin(cDestroyEvent)
	err := d.destroyEvent(op, ev)
	d.end(cDestroyEvent, t0, d.cost.base[cDestroyEvent], 0)
	return err
}

func (d *Driver) destroyEvent(op string, ev acl.Event) error {
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

// stopStreams wakes every waiter and stops the watchers; work still queued
// is dropped.
func (d *Driver) stopStreams() {
	ss := &d.ss
	ss.mu.Lock()
	ss.closing = true
	ss.cond.Broadcast()
	ss.mu.Unlock()
	close(d.quit)
	ss.wg.Wait()
}

// pendingWork describes the work not yet finished, for leak reports.
func (d *Driver) pendingWork() string {
	ss := &d.ss
	ss.mu.Lock()
	defer ss.mu.Unlock()
	d.advanceAllLocked(now())
	n := 0
	for _, s := range ss.all {
		n += len(s.queue)
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d pieces of device work still queued", n)
}
