package chunk

import (
	"context"
	"slices"
	"sync/atomic"

	"github.com/vmarena/vmarena/internal/sched"
)

// Waiting for memory.
//
// A growth that finds the budget (or the device) full after relieving the
// pressure may wait, instead of failing, for other tenants to give memory
// back: for schedulers that prefer to queue a request rather than preempt
// one. The pool keeps the waiters in a queue, first come first served, and
// wakes the one at its head whenever memory may have come back:
//
//   - a chunk put back in the cache (Put; a release whose events completed;
//     a Shrink; a Close), or handed to wait for the device (ReleaseAfter:
//     a retry's relief waits for it);
//   - physical memory freed (a full cache, Trim, Close), in any pool on the
//     same device, since device memory is shared;
//   - a member that dropped bytes it used (Member.Dropped: an arena's
//     Truncate or Reset), which a retry may now reclaim;
//   - a growth that failed (Member.Failed): what it was growing into, and
//     what its arena had promised, are reclaimable again. It does not wake
//     the head when the head is that growth's own waiter, which would only
//     retry what just failed;
//   - the budget raised (SetBudget);
//   - the pool's Close (every waiter wakes, and its retry fails).
//
// Only the head is woken: it tries again, leaves the queue when it succeeds
// (or gives up), and then wakes the next. So a large request at the head is
// not overtaken by smaller ones behind it, and cannot starve: the price is
// that small requests wait behind it (head-of-line blocking), as in a
// first-come-first-served scheduler that stops at the first request that
// does not fit. Growths that do not wait are not held back by the queue:
// they take memory when they find it, as before.
//
// Nothing polls: a waiter sleeps on a one-slot channel until it is woken
// (a wake-up sent while it is trying again stays in the slot, so none is
// lost) or its context is done. Memory freed outside this process, or by a
// pool on another device, wakes nobody: bound the wait with a deadline.

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
	wake chan struct{} // one slot: a wake-up is never lost and never blocks its sender
}

// Mark returns a mark of the releases so far (of this pool and of the pools
// on its device). Take it before a try that may fail, and pass it to
// Enqueue: a release between the failure and the Enqueue is then not
// missed.
func (p Lender) Mark() uint64 { return p.dev.gen.Load() }

// Enqueue puts a waiter at the tail of the pool's queue and returns it. If
// the queue was empty and memory came back since mark, the waiter is woken
// at once. It fails with ErrClosed after Close.
func (p Lender) Enqueue(mark uint64) (*Waiter, error) { return p.enqueueWaiter(mark, nil) }

// Enqueue is Lender.Enqueue for a growth of the member: the member's own
// failed tries (Failed) do not wake it.
func (m *Member) Enqueue(mark uint64) (*Waiter, error) { return m.p.enqueueWaiter(mark, m) }

func (p *Pool) enqueueWaiter(mark uint64, m *Member) (*Waiter, error) {
	w := &Waiter{p: p, m: m, wake: make(chan struct{}, 1)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	p.wq.q = append(p.wq.q, w)
	p.wq.n.Add(1)
	p.dev.waiters.Add(1)
	head := len(p.wq.q) == 1
	p.mu.Unlock()
	if head && p.dev.gen.Load() != mark {
		w.signal()
	}
	sched.At(sched.WaitEnqueued, p)
	return w, nil
}

// Wait blocks until the waiter's turn comes with memory given back since
// its last try (or the pool closes), and returns nil: try again then. It
// returns ctx.Err() when ctx is done first.
func (w *Waiter) Wait(ctx context.Context) error {
	select {
	case <-w.wake:
		sched.At(sched.WaitWoken, w.p)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
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
func (p Lender) Waiters() int { return int(p.wq.n.Load()) }

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
	d := p.dev
	d.gen.Add(1)
	if d.waiters.Load() == 0 {
		return
	}
	d.mu.Lock()
	pools := make([]*Pool, 0, len(d.pools))
	for q := range d.pools {
		pools = append(pools, q)
	}
	d.mu.Unlock()
	for _, q := range pools {
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
