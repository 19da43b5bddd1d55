package chunk

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/sched"
)

// Waiting for memory: the pool's queue of growths that would rather wait
// than fail (GrowContext), first come first served, woken by every event
// that can make memory obtainable, and the rule that fails the youngest
// waiter when every holder of the memory waits. The events and the rule are
// told in docs/design.md ("Pressure").

// errDeadlock is Wait's error: ErrDeadlock, matching acl.ErrOutOfMemory.
var errDeadlock = fmt.Errorf("chunk: %w: %w", ErrDeadlock, acl.ErrOutOfMemory)

// waitq is the pool's queue of waiters. The queue is guarded by Pool.mu; n
// mirrors its length so that a release can skip the lock when nobody waits.
type waitq struct {
	q []*Waiter
	n atomic.Int32
}

// A Waiter is a place in a pool's queue of growths waiting for memory. Make
// one with Lender.Enqueue or Member.Enqueue; call Wait until a retry succeeds or the context is
// done, then Done.
type Waiter struct {
	p    *Pool
	m    *Member       // whose growth waits; nil for a waiter made by Lender.Enqueue
	g    *Growth       // the member's growth, GrowQueued while it waits; nil: none
	need int           // units the growth lacked at its last try; 0: unknown
	wake chan struct{} // one slot: a wake-up is never lost and never blocks its sender; sent under Pool.mu

	// Under Pool.mu:
	parked bool // blocked in Wait with no wake-up pending
	doomed bool // chosen to fail with ErrDeadlock
}

// Mark returns a mark of the releases so far (of this pool and of the pools
// on its device). Take it before a try that may fail, and pass it to
// Enqueue: a release between the failure and the Enqueue is then not
// missed.
func (p Lender) Mark() uint64 { return p.pool.dev.gen.Load() }

// Enqueue puts a waiter at the tail of the pool's queue and returns it. If
// the queue was empty and memory came back since mark, the waiter is woken
// at once. It fails with ErrClosed after Close.
func (p Lender) Enqueue(mark uint64) (*Waiter, error) { return p.pool.enqueueWaiter(mark, nil, nil, 0) }

// Enqueue is Lender.Enqueue for a growth g of the member that lacked need
// units (of the pool's tail size, as Step.Missing) at its last try: the member's own failed tries (Failed) do not
// wake it, Interrupt does, and the rule of ErrDeadlock looks at it. g
// (which may be nil) is GrowQueued while it waits.
func (m *Member) Enqueue(mark uint64, g *Growth, need int) (*Waiter, error) {
	return m.p.enqueueWaiter(mark, m, g, need)
}

func (p *Pool) enqueueWaiter(mark uint64, m *Member, g *Growth, need int) (*Waiter, error) {
	w := &Waiter{p: p, m: m, g: g, need: need, wake: make(chan struct{}, 1)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errClosed
	}
	p.wq.q = append(p.wq.q, w)
	p.wq.n.Add(1)
	p.dev.waiters.Add(1)
	if len(p.wq.q) == 1 && p.dev.gen.Load() != mark {
		w.signal()
	}
	p.mu.Unlock()
	sched.At(sched.WaitEnqueued, p)
	return w, nil
}

// Wait blocks until the waiter's turn comes with memory given back since
// its last try (or the pool closes, or its member is interrupted), and
// returns nil: try again then. It returns ctx.Err() when ctx is done first,
// and an error matching ErrDeadlock (and acl.ErrOutOfMemory) when no memory
// can come back: see ErrDeadlock.
func (w *Waiter) Wait(ctx context.Context) error {
	p := w.p
	p.mu.Lock()
	if w.doomed {
		w.doomed = false
		p.mu.Unlock()
		return errDeadlock
	}
	w.parked = true
	if w.g != nil {
		w.g.state.CompareAndSwap(uint32(GrowFailed), uint32(GrowQueued))
	}
	if y := p.stuckLocked(); y != nil {
		if y == w {
			w.parked = false
			p.mu.Unlock()
			sched.At(sched.WaitDeadlock, p)
			return errDeadlock
		}
		y.doomed = true
		y.signal()
	}
	p.mu.Unlock()
	select {
	case <-w.wake:
		p.mu.Lock()
		w.parked = false
		doomed := w.doomed
		w.doomed = false
		p.mu.Unlock()
		if doomed {
			sched.At(sched.WaitDeadlock, p)
			return errDeadlock
		}
		sched.At(sched.WaitWoken, p)
		return nil
	case <-ctx.Done():
		p.mu.Lock()
		w.parked = false
		p.mu.Unlock()
		return ctx.Err()
	}
}

// stuckLocked applies the rule of ErrDeadlock when a waiter parks, and
// returns the waiter that must fail, or nil. A parked head that a retry
// could serve now is woken instead. Call with mu held.
func (p *Pool) stuckLocked() *Waiter {
	b := p.budget.Load()
	if b == 0 || p.closed || len(p.wq.q) == 0 || p.pending.chunks > 0 || p.freeing > 0 || p.growing.Load() > 0 ||
		p.held != p.inUseBytes+p.cachedBytes {
		return nil // no budget (the device is shared), or memory on the move: a growth, a free, an allocation
	}
	waiting := make(map[*Member]bool, len(p.wq.q))
	for _, w := range p.wq.q {
		if !w.parked || len(w.wake) > 0 {
			return nil // it will try again
		}
		if w.m != nil {
			waiting[w.m] = true
		}
	}
	head := p.wq.q[0]
	free := int(p.cachedBytes / p.tail) // units
	if p.held < b {
		free += int((b - p.held) / p.tail)
	}
	held, idle := 0, 0 // units
	for _, m := range p.members {
		h := m.c.Held()
		if h > 0 && !waiting[m] {
			return nil // a holder that does not wait may give memory back
		}
		held += h
		if m != head.m {
			n, _ := m.c.Reclaimable(Ticket(math.MaxUint64))
			idle += n
		}
	}
	if held != int(p.inUseBytes/p.tail) {
		return nil // chunks held by someone the pool cannot see waiting
	}
	if free+idle >= max(head.need, 1) {
		head.signal() // a retry would be served: not stuck
		return nil
	}
	for i := len(p.wq.q) - 1; i >= 0; i-- {
		if w := p.wq.q[i]; w.m != nil && w.m.c.Held() > 0 {
			return w // the youngest waiter that holds memory
		}
	}
	return nil
}

// Done takes the waiter out of the queue; if it was at the head, the next
// waiter's turn comes. It is safe to call more than once.
func (w *Waiter) Done() {
	p := w.p
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.Index(p.wq.q, w)
	if i < 0 {
		return
	}
	p.wq.q = slices.Delete(p.wq.q, i, i+1)
	p.wq.n.Add(-1)
	p.dev.waiters.Add(-1)
	if i == 0 {
		p.wakeHeadLocked()
	}
}

// Waiters returns how many growths wait for memory in the pool's queue.
func (p Lender) Waiters() int { return int(p.pool.wq.n.Load()) }

// Parked returns how many of the waiters are parked: blocked in Wait with no
// wake-up pending. The others are about to try again (or trying). When
// Parked equals Waiters, every wake-up sent so far has been answered, which
// is how a test tells that nobody was served by a release without waiting
// for a while.
func (p Lender) Parked() int {
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	n := 0
	for _, w := range p.pool.wq.q {
		if w.parked && len(w.wake) == 0 {
			n++
		}
	}
	return n
}

// Dropped tells the pool that the member dropped bytes it used, which the
// pool may now reclaim for a waiter. It takes the pool's lock only when a
// growth waits.
func (m *Member) Dropped() { m.p.released() }

// Failed tells the pool that a growth of the member failed and that what it
// protected (its Growth, its promise) is reclaimable again: the first waiter
// may now be served, unless it is the member's own. It takes the pool's lock
// only when a growth waits.
func (m *Member) Failed() {
	p := m.p
	p.dev.gen.Add(1)
	if p.wq.n.Load() > 0 {
		p.mu.Lock()
		if len(p.wq.q) > 0 && p.wq.q[0].m != m {
			p.wq.q[0].signal()
		}
		p.mu.Unlock()
	}
}

// Interrupt wakes the member's waiters: its client is closing, or going to
// sleep, and their retries fail as the client says (an arena's with
// ErrClosed or ErrAsleep), instead of waiting out their deadlines.
func (m *Member) Interrupt() {
	p := m.p
	if p.wq.n.Load() == 0 {
		return
	}
	p.mu.Lock()
	for _, w := range p.wq.q {
		if w.m == m {
			w.signal()
		}
	}
	p.mu.Unlock()
}

func (w *Waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// wakeHeadLocked wakes the waiter at the head of the queue. Call with mu
// held.
func (p *Pool) wakeHeadLocked() {
	if len(p.wq.q) > 0 {
		p.wq.q[0].signal()
	}
}

// releasedLocked notes that memory may have come back to the pool, and
// wakes the head waiter. Call with mu held.
func (p *Pool) releasedLocked() {
	p.dev.gen.Add(1)
	if p.wq.n.Load() > 0 {
		p.wakeHeadLocked()
	}
}

// released is releasedLocked for a caller that does not hold mu.
func (p *Pool) released() {
	p.dev.gen.Add(1)
	if p.wq.n.Load() > 0 {
		p.mu.Lock()
		p.wakeHeadLocked()
		p.mu.Unlock()
	}
}

// freed notes that physical memory went back to the device: room for this
// pool and for the other pools on the device. Call without mu held.
func (p *Pool) freed() {
	p.dev.gen.Add(1)
	p.dev.wakeHeads(nil)
}

// wakeHeads wakes the head waiter of every pool on the device but except.
// Call without any pool's mu held.
func (d *device) wakeHeads(except *Pool) {
	if d.waiters.Load() == 0 {
		return
	}
	for _, q := range d.others(except) {
		if q.wq.n.Load() > 0 {
			q.mu.Lock()
			q.wakeHeadLocked()
			q.mu.Unlock()
		}
	}
}

// wakeAllLocked wakes every waiter, for Close: their retries fail. Call
// with mu held.
func (p *Pool) wakeAllLocked() {
	for _, w := range p.wq.q {
		w.signal()
	}
}
