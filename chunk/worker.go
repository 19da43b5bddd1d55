package chunk

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/sched"
)

// The pool's worker: the one background goroutine of vmarena.
//
// It does three things off the callers' paths, each when there is reason to:
//
//   - unmaps and caches the chunks waiting for the device whose events have
//     completed (ReleaseAfter), polling while any wait;
//   - refills the headroom of members that asked for it (Member.WantRefill,
//     from an arena's Alloc), with memory that is free now (TryAcquire): it
//     never takes memory from anyone and never maps past the budget;
//   - keeps Config.Ahead fresh chunks in the cache, within the budget.
//
// It starts on first need (a member that wants refills, Config.Ahead, a
// ReleaseAfter) and stops with Close. Work moved here is not free: it takes
// CPU time and driver time, only not the caller's.
//
// Waking a parked goroutine costs its waker a futex system call, and the
// kernel may have to wake an idle CPU for it: microseconds on bare metal,
// tens of them in a virtual machine. That would land on the caller's path
// (an Alloc asking for a refill), so a worker that has been asked for
// something lately does not park: it polls, from every idlePollMin up to
// every idlePollMax, and a poke that finds it polling only raises a flag.
// After idleFor without being asked it parks, and the next poke wakes it.
// Polling costs the worker a timer wake-up per look, which is worth it only
// while the asks come often: once the last two asks (the first of each
// burst, idlePollMin or more apart) were more than idlePollMax apart, the
// worker parks after each round instead (a decode step of several
// milliseconds pays one wake-up of the worker per step, where polling cost
// it four or more; the caller's poke then costs it a system call, a few
// microseconds against its step), and polls again once they come closer. A
// worker under a CPU cap (workercap.go) keeps polling: its polls are where
// it waits for credit.
// While chunks wait for the device it polls their events (pendingPollMin to
// pendingPollMax).
const (
	pendingPollMin = 20 * time.Microsecond
	pendingPollMax = 2 * time.Millisecond
	idlePollMin    = 250 * time.Microsecond
	idlePollMax    = 2 * time.Millisecond
	idleFor        = 50 * time.Millisecond
)

type worker struct {
	kick    chan struct{}      // a poke to a parked worker; never blocks the sender
	settle  chan chan struct{} // Settle: answered after one full round of work
	quit    chan struct{}
	done    chan struct{}
	asked   atomic.Bool // set by every poke, cleared at the start of each round
	polling atomic.Bool // the worker will look again soon without a kick
}

// yieldToCallers lets the callers' goroutines run between two driver calls
// of a burst the worker makes (the unmaps of a batch whose events have
// completed, the fresh chunks it keeps ahead). A device may serialise its
// virtual-memory calls with kernel launches behind one lock (the device
// model's pessimistic reading does), and a goroutine woken to take that lock
// is queued on the processor of the goroutine that released it: a worker
// that went straight on to its next call would run first and take the lock
// again. Yielding hands the processor to the waiter. On the device model
// (pessimistic reading, kv at 1 ms steps, six runs each side by side) the
// launches' waits for the lock fell from 7.5–13.5 ms a run to 3.0–5.1 ms;
// it costs the worker a trip through the scheduler per call, against calls
// of tens of microseconds.
func yieldToCallers() { runtime.Gosched() }

// poke asks the worker for a round of work. It never blocks, allocates
// nothing, and makes no system call while the worker is polling.
func (w *worker) poke() {
	w.asked.Store(true)
	if w.polling.Load() {
		return // it looks at asked within idlePollMax
	}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// stop stops the worker and waits for it. It is safe on a nil worker.
func (w *worker) stop() {
	if w == nil {
		return
	}
	close(w.quit)
	<-w.done
}

// workerLocked returns the pool's worker, starting it. Call with mu held on
// an open pool.
func (p *Pool) workerLocked() *worker {
	if p.w == nil {
		p.w = &worker{kick: make(chan struct{}, 1), settle: make(chan chan struct{}), quit: make(chan struct{}),
			done: make(chan struct{})}
		go p.run(p.w)
		p.started.Store(p.w)
	}
	return p.w
}

// wake pokes the worker, starting it.
func (p *Pool) wake() {
	p.mu.Lock()
	p.wakeLocked()
	p.mu.Unlock()
}

// wakeLocked is wake with mu held.
func (p *Pool) wakeLocked() {
	if p.closed {
		return
	}
	p.workerLocked().poke()
}

func (p *Pool) run(w *worker) {
	defer close(w.done)
	clk := p.clk
	timer := clk.timer()
	b := newBucket(p.workerCPU, clk.now())
	var (
		pendingDelay time.Duration // the next look at the events, while chunks wait for the device
		idleDelay    time.Duration // the next look at asked, while polling
		lastAsked    time.Time     // when a round last found asked set
		sparse       bool          // the last two asks were more than idlePollMax apart: park between asks
		answer       chan struct{} // a Settle waiting for the next round to end
	)
	defer func() {
		if answer != nil {
			close(answer) // the pool is closing: Settle need wait no longer
		}
	}()
	for {
		delay := pendingDelay
		if idleDelay > 0 && (delay == 0 || idleDelay < delay) {
			delay = idleDelay
		}
		var held time.Duration // how long the cap held this round back
		if delay > 0 {
			// A poll. Under the cap it stretches to when credit returns.
			var now time.Time
			var wait time.Duration
			if b.rate > 0 {
				now = clk.now()
				wait = b.wait(now)
			}
			timer.reset(max(delay, wait))
			select {
			case <-w.kick:
			case answer = <-w.settle:
			case <-timer.fired():
				if wait > delay {
					held = clk.now().Sub(now.Add(delay))
				}
			case <-w.quit:
				timer.stop()
				return
			}
			timer.stop()
		} else {
			// Park. From here on a poke kicks: look once more for one
			// that came while polling was still set.
			w.polling.Store(false)
			if !w.asked.Load() {
				sched.At(sched.WorkerParks, p)
				select {
				case <-w.kick:
				case answer = <-w.settle:
				case <-w.quit:
					return
				}
			}
		}
		// Overspent: wait for credit. Pokes only raise asked meanwhile, and a
		// kick stays in its channel; both are served by the round after. A
		// Settle is taken and answered after that round.
		if b.rate > 0 && b.wait(clk.now()) > 0 {
			since := clk.now()
			for wait := b.wait(since); wait > 0; wait = b.wait(clk.now()) {
				w.polling.Store(true)
				settle := w.settle
				if answer != nil {
					settle = nil // one at a time: the next waits for the next round
				}
				timer.reset(wait)
				select {
				case answer = <-settle:
				case <-timer.fired():
				case <-w.quit:
					timer.stop()
					return
				}
				timer.stop()
			}
			held += clk.now().Sub(since)
		}
		asked := w.asked.Swap(false)
		start := clk.now()
		r := region(RegionWorker)
		progressed, waiting := p.settleReady()
		p.refill()
		p.fillAhead()
		r.End()
		end := clk.now()
		b.spend(start, end)
		p.mu.Lock()
		p.stats.WorkerNS += int64(end.Sub(start))
		p.stats.WorkerSpins++
		p.stats.WorkerThrottledNS += int64(held)
		p.mu.Unlock()
		if answer != nil {
			close(answer)
			answer = nil
		}
		switch {
		case !waiting:
			pendingDelay = 0
		case progressed > 0 || pendingDelay == 0:
			pendingDelay = pendingPollMin
		default:
			pendingDelay = min(2*pendingDelay, pendingPollMax)
		}
		switch {
		case asked:
			if gap := start.Sub(lastAsked); !lastAsked.IsZero() && gap >= idlePollMin {
				sparse = gap > idlePollMax // a gap within a burst of asks says nothing
			}
			lastAsked, idleDelay = start, idlePollMin
			if sparse && b.rate == 0 { // a capped worker's polls are where it waits for credit
				idleDelay = 0
			}
		case idleDelay > 0 && start.Sub(lastAsked) < idleFor:
			idleDelay = min(2*idleDelay, idlePollMax)
		default:
			idleDelay = 0
		}
		w.polling.Store(pendingDelay > 0 || idleDelay > 0)
	}
}

// refill refills the headroom of the members that asked.
func (p *Pool) refill() {
	p.mu.Lock()
	var ms []*Member
	for _, m := range p.members {
		if m.want.Load() {
			ms = append(ms, m)
		}
	}
	p.mu.Unlock()
	for _, m := range ms {
		m.want.Store(false) // before the refill: a later ask is not lost
		m.c.Refill()
	}
}

// fillAhead allocates fresh chunks into the cache until it holds
// Config.Ahead, within the budget. A failure (out of memory, or the driver)
// waits for the next wake.
func (p *Pool) fillAhead() { _, _ = p.fill(p.ahead, -1) }

// Warm allocates up to n fresh chunks of the chunk size (large ones, on a
// pool of two sizes) into the cache now, within the budget and the cache's
// bound (a count of the chunks of both sizes), and returns how many it
// added: a server that knows its memory budget warms its pool once at
// start, off any request's path, so that growths find physical memory
// ready and only map it (as vAttention pre-allocates its page pool). The chunks stay free to take: any tenant of
// the pool may use them, and Trim gives them back.
func (p *Pool) Warm(n int) (int, error) {
	if !p.made() {
		return 0, errNotMade
	}
	if n < 0 {
		return 0, fmt.Errorf("chunk: warm %d chunks: %w", n, acl.ErrInvalidParam)
	}
	added, err := p.fill(p.maxCached, n)
	if err != nil {
		return added, fmt.Errorf("chunk: warm: %w", err)
	}
	return added, nil
}

// fill allocates fresh chunks into the cache while it holds less than
// target chunks' bytes (cachedBelowLocked), within the budget, at most limit
// of them (-1: no limit).
func (p *Pool) fill(target, limit int) (int, error) {
	added := 0
	for limit < 0 || added < limit {
		if added > 0 && limit < 0 {
			yieldToCallers() // the worker's fill: see yieldToCallers
		}
		p.mu.Lock()
		if b := p.budget.Load(); p.closed || !p.cachedBelowLocked(target) || (b != 0 && b-min(p.held, b) < p.size) ||
			(limit < 0 && p.dormantLocked()) {
			p.mu.Unlock()
			return added, nil
		}
		p.held += p.size
		p.filling++ // Member.Sleep and Close wait for it
		p.mu.Unlock()
		h, err := p.drv.MallocPhysical(p.size, &p.prop, 0)
		p.mu.Lock()
		p.filling--
		if err != nil {
			p.held -= p.size
			p.mu.Unlock()
			if errors.Is(err, acl.ErrOutOfMemory) {
				return added, nil // the device is full: what fits is in
			}
			return added, err
		}
		p.stats.Allocs++
		p.stats.Ahead++
		p.cacheLocked(entry{h, p.freshHolder(), p.size})
		p.mu.Unlock()
		added++
	}
	return added, nil
}

// Settle waits until the pool's worker has done what was asked of it so far:
// the refills members asked for, the chunks to keep ahead, and the releases
// whose events have completed (it does not wait for the device). Tests and
// benchmarks use it to observe a quiet pool; it is never needed for
// correctness. It returns at once when there is no worker. A worker capped by
// Config.WorkerCPU that has used more than its share waits for credit before
// that round, and Settle with it; Close answers it at once.
func (p Lender) Settle() {
	p.pool.mu.Lock()
	w := p.pool.w
	p.pool.mu.Unlock()
	if w == nil {
		return
	}
	answer := make(chan struct{})
	select {
	case w.settle <- answer:
		<-answer
	case <-w.done:
	}
}
