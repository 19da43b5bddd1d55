// Package queue keeps the books of device work for the drivers that simulate
// a device, the host driver (acl/host) and the device model (acl/model): the
// streams and events, the work queued on each stream, the faults that work
// records, and the rules of the stream and event calls, with ACL's codes.
//
// How the work runs is each driver's own. The host driver runs every stream
// on a goroutine of its own, which executes the work and then retires it;
// the model computes when each piece of work ends, and retires it once that
// moment has passed. Queues calls the driver back at the two places where
// that matters: Start, when a stream is made, and Advance, before it looks at
// a stream's queue.
//
// # Faults
//
// A fault is what a device reports as an illegal address, or a test sees as
// a data race:
//
//   - FaultUnmap: a mapping is removed while work that touches it has not
//     finished. The unmap succeeds; the work is marked, and its stream
//     reports the fault at the first synchronisation after the work is
//     retired.
//   - FaultRace: a synchronous copy or memset touches a range that work not
//     yet finished will write.
//
// Faults counts both.
//
// # Locking
//
// Queues has one mutex. A driver takes its own lock before it, never after.
// The methods whose names end in Locked are called with the mutex held (Lock,
// Unlock); the others take it themselves, and those that take the driver's
// state as arguments (closed, live) are called with the driver's lock held.
// Start and Advance run with the mutex held.
package queue

import (
	"errors"
	"iter"
	"maps"
	"sync"

	"github.com/vmarena/vmarena/acl"
)

// Kind is what a piece of work does.
type Kind int

const (
	Memset Kind = iota // MemsetAsync: writes Value over [Lo, Hi)
	Kernel             // a stand-in kernel (acl.Launcher): touches [Lo, Hi) until Done is closed
)

// Work is one piece of device work queued on a stream; X is what else the
// driver keeps per piece.
type Work[WX any] struct {
	Kind    Kind
	Seq     uint64          // its position in its stream, from 1
	Lo, Hi  uintptr         // the device range it touches, [Lo, Hi); empty for none
	Value   byte            // a memset's value
	Done    <-chan struct{} // a kernel's: it stays in flight until Done is closed (nil: its turn is all it needs)
	Faulted bool            // its range was unmapped before it finished
	X       WX
}

// Stream is a queue of device work, run in order; X is what else the driver
// keeps per stream.
type Stream[WX, SX any] struct {
	ID        acl.Stream
	Queue     []*Work[WX] // not yet retired, in order
	Queued    uint64      // Seq of the last work queued
	Finished  uint64      // Seq of the last work retired
	Destroyed bool        // DestroyStream forgot it
	err       error       // the first fault since the last synchronisation
	X         SX
}

// Idle reports whether all the work queued on s has been retired.
func (s *Stream[WX, SX]) Idle() bool { return s.Finished == s.Queued }

// Retire takes the first piece of work, which has finished, off s's queue,
// and keeps its fault, if it has one, for the next synchronisation.
func (s *Stream[WX, SX]) Retire() *Work[WX] {
	w := s.Queue[0]
	s.Queue[0] = nil
	s.Queue = s.Queue[1:]
	if len(s.Queue) == 0 {
		s.Queue = nil
	}
	s.Finished = w.Seq
	if w.Faulted && s.err == nil {
		s.err = acl.Errorf("device work", acl.ErrCodeRTDrvInternal,
			"work on stream %#x touched [%#x, %#x) after it was unmapped (illegal address)", uintptr(s.ID), w.Lo, w.Hi)
	}
	return w
}

// TakeErr returns and clears the fault s has to report.
func (s *Stream[WX, SX]) TakeErr() error {
	err := s.err
	s.err = nil
	return err
}

// Event is a mark in a stream's queue: it completes once the stream has
// retired the work up to Seq.
type Event[WX, SX any] struct {
	Stream *Stream[WX, SX] // nil until recorded
	Seq    uint64
}

// Complete reports whether e has been recorded and the work before its mark
// retired.
func (e *Event[WX, SX]) Complete() bool { return e.Stream != nil && e.Stream.Finished >= e.Seq }

// Range is the device range [Lo, Hi).
type Range struct{ Lo, Hi uintptr }

// Queues is a driver's streams and events. Call Init before use.
type Queues[WX, SX any] struct {
	// Start, if set, is called with each new stream, the default stream
	// included, before any call can use it: the host driver starts the
	// stream's goroutine there (GoLocked).
	Start func(*Stream[WX, SX])
	// Advance, if set, is called with a stream before Queues looks at its
	// queue: the model retires there the work that has finished by now.
	Advance func(*Stream[WX, SX])

	mu       sync.Mutex
	cond     *sync.Cond // broadcast when work is queued or retired, a stream destroyed, and at Stop
	streams  map[acl.Stream]*Stream[WX, SX]
	events   map[acl.Event]*Event[WX, SX]
	next     uintptr // the last stream or event id handed out
	faults   int
	stopping bool
	quit     chan struct{} // closed by Stop
	wg       sync.WaitGroup
}

// Init makes the books, with the default stream (0), and calls Start for it.
func (q *Queues[WX, SX]) Init() {
	q.cond = sync.NewCond(&q.mu)
	q.streams = make(map[acl.Stream]*Stream[WX, SX])
	q.events = make(map[acl.Event]*Event[WX, SX])
	q.next = 0x5000
	q.quit = make(chan struct{})
	q.addLocked(0)
}

// Lock takes the mutex.
func (q *Queues[WX, SX]) Lock() { q.mu.Lock() }

// Unlock releases the mutex.
func (q *Queues[WX, SX]) Unlock() { q.mu.Unlock() }

// Wait waits, with the mutex held, until the next Broadcast.
func (q *Queues[WX, SX]) Wait() { q.cond.Wait() }

// Broadcast wakes every Wait.
func (q *Queues[WX, SX]) Broadcast() { q.cond.Broadcast() }

// StoppingLocked reports whether Stop has been called: a wait must give up.
func (q *Queues[WX, SX]) StoppingLocked() bool { return q.stopping }

// Quit is closed by Stop: a goroutine of GoLocked stops waiting for anything
// else.
func (q *Queues[WX, SX]) Quit() <-chan struct{} { return q.quit }

// GoLocked runs f on a goroutine that Stop waits for. The driver calls it
// only while it is not closed, so that it comes before Stop.
func (q *Queues[WX, SX]) GoLocked(f func()) {
	q.wg.Add(1)
	go func() {
		defer q.wg.Done()
		f()
	}()
}

// StreamsLocked returns the live streams, in no order.
func (q *Queues[WX, SX]) StreamsLocked() iter.Seq[*Stream[WX, SX]] { return maps.Values(q.streams) }

func errClosed(op string) error { return acl.Errorf(op, acl.ErrCodeRTContextNull, "driver closed") }

func (q *Queues[WX, SX]) advance(s *Stream[WX, SX]) {
	if q.Advance != nil {
		q.Advance(s)
	}
}

// addLocked makes the stream id.
func (q *Queues[WX, SX]) addLocked(id acl.Stream) *Stream[WX, SX] {
	s := &Stream[WX, SX]{ID: id}
	q.streams[id] = s
	if q.Start != nil {
		q.Start(s)
	}
	return s
}

// newID hands out the next stream or event id.
func (q *Queues[WX, SX]) newID() uintptr {
	q.next += 0x10
	return q.next
}

// StreamLocked returns the live stream s.
func (q *Queues[WX, SX]) StreamLocked(op string, s acl.Stream) (*Stream[WX, SX], error) {
	st, ok := q.streams[s]
	if !ok {
		return nil, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "stream %#x is not a live stream", uintptr(s))
	}
	return st, nil
}

// EventLocked returns the live event ev: NULL is 100000, anything else not
// live 107000.
func (q *Queues[WX, SX]) EventLocked(op string, ev acl.Event) (*Event[WX, SX], error) {
	if ev == 0 {
		return nil, acl.Errorf(op, acl.ErrCodeInvalidParam, "event is NULL")
	}
	e, ok := q.events[ev]
	if !ok {
		return nil, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "event %#x is not a live event", uintptr(ev))
	}
	return e, nil
}

// EnqueueLocked queues w at the end of s and wakes every Wait.
func (q *Queues[WX, SX]) EnqueueLocked(op string, s acl.Stream, w *Work[WX]) error {
	st, err := q.StreamLocked(op, s)
	if err != nil {
		return err
	}
	st.Queued++
	w.Seq = st.Queued
	st.Queue = append(st.Queue, w)
	q.cond.Broadcast()
	return nil
}

// CreateStream makes a new stream, unless the driver is closed, and counts
// it in live. Call with the driver's lock held.
func (q *Queues[WX, SX]) CreateStream(op string, closed bool, live *acl.LiveCounts) (acl.Stream, error) {
	if closed {
		return 0, errClosed(op)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.addLocked(acl.Stream(q.newID()))
	live.Streams++
	return s.ID, nil
}

// DestroyStream forgets s, which must be a live stream other than the
// default one, with no work pending, and counts it out of live. Call with
// the driver's lock held.
func (q *Queues[WX, SX]) DestroyStream(op string, s acl.Stream, closed bool, live *acl.LiveCounts) error {
	switch {
	case s == 0:
		return acl.Errorf(op, acl.ErrCodeInvalidParam, "the default stream cannot be destroyed")
	case closed:
		return errClosed(op)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	st, err := q.StreamLocked(op, s)
	if err != nil {
		return err
	}
	q.advance(st)
	if len(st.Queue) > 0 {
		return acl.Errorf(op, acl.ErrCodeRTParamInvalid, "stream %#x has %d pieces of work pending: synchronise it first", uintptr(s), len(st.Queue))
	}
	st.Destroyed = true
	delete(q.streams, s)
	q.cond.Broadcast() // the stream's goroutine, where it has one, stops
	live.Streams--
	return nil
}

// CreateEvent makes an event, never recorded, unless the driver is closed,
// and counts it in live. Call with the driver's lock held.
func (q *Queues[WX, SX]) CreateEvent(op string, closed bool, live *acl.LiveCounts) (acl.Event, error) {
	if closed {
		return 0, errClosed(op)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	ev := acl.Event(q.newID())
	q.events[ev] = &Event[WX, SX]{}
	live.Events++
	return ev, nil
}

// DestroyEvent forgets the live event ev, closed or not, and counts it out
// of live. Call with the driver's lock held.
func (q *Queues[WX, SX]) DestroyEvent(op string, ev acl.Event, live *acl.LiveCounts) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, err := q.EventLocked(op, ev); err != nil {
		return err
	}
	delete(q.events, ev)
	live.Events--
	return nil
}

// Record marks the present end of s's queue with ev.
func (q *Queues[WX, SX]) Record(op string, ev acl.Event, s acl.Stream) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	e, err := q.EventLocked(op, ev)
	if err != nil {
		return err
	}
	st, err := q.StreamLocked(op, s)
	if err != nil {
		return err
	}
	e.Stream, e.Seq = st, st.Queued
	return nil
}

// Query reports whether ev is complete. An event never recorded is not, as
// on ACL.
func (q *Queues[WX, SX]) Query(op string, ev acl.Event) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e, err := q.EventLocked(op, ev)
	if err != nil {
		return false, err
	}
	if e.Stream != nil {
		q.advance(e.Stream)
	}
	return e.Complete(), nil
}

// TakeErrsLocked returns and clears the faults every stream has to report.
func (q *Queues[WX, SX]) TakeErrsLocked() error {
	var errs []error
	for _, s := range q.streams {
		errs = append(errs, s.TakeErr())
	}
	return errors.Join(errs...)
}

// FaultUnmap marks the work not yet finished that touches [lo, hi), which
// is being unmapped, as faulted, and counts a fault for each piece.
func (q *Queues[WX, SX]) FaultUnmap(lo, hi uintptr) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, s := range q.streams {
		q.advance(s)
		for _, w := range s.Queue {
			if w.Lo < hi && lo < w.Hi && !w.Faulted {
				w.Faulted = true
				q.faults++
			}
		}
	}
}

// FaultRace counts one fault if work not yet finished touches any of rs,
// which a synchronous call is about to touch.
func (q *Queues[WX, SX]) FaultRace(rs ...Range) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, s := range q.streams {
		q.advance(s)
	}
	for _, s := range q.streams {
		for _, w := range s.Queue {
			for _, r := range rs {
				if w.Lo < r.Hi && r.Lo < w.Hi {
					q.faults++
					return
				}
			}
		}
	}
}

// Faults returns how many faults have been counted.
func (q *Queues[WX, SX]) Faults() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.faults
}

// Stop wakes every Wait, closes Quit and waits for the goroutines of
// GoLocked; it returns how many pieces of work were still queued, which are
// dropped. Call it once, when the driver closes, without the driver's lock
// where such a goroutine takes it.
func (q *Queues[WX, SX]) Stop() (pending int) {
	q.mu.Lock()
	for _, s := range q.streams {
		q.advance(s)
		pending += len(s.Queue)
	}
	q.stopping = true
	q.cond.Broadcast()
	q.mu.Unlock()
	close(q.quit)
	q.wg.Wait()
	return pending
}
