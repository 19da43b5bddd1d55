package arena

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// client is the arena's side of its membership of the pool (chunk.Client):
// what the pool asks of it under pressure (Reclaimable, Held, Give), and
// what the pool's worker asks of it to refill the headroom (Refill). None of
// them waits: Give and Refill try the arena's lock and, when it is held,
// say so (the relief comes back to the arena) or ask again (the worker's
// next round). An arena that is not open gives nothing.
type client struct{ a *Arena }

var _ chunk.Meter = client{}

// Reclaimable reports, in units (a.unit: one per chunk while the pool has
// one size), the chunks wholly above what the arena keeps (see keepBytes),
// and whether Len is 0, from the atomic words alone.
func (c client) Reclaimable(by chunk.Ticket) (int, bool) {
	a := c.a
	if a.lifeNow() != lifeOpen {
		return 0, false
	}
	l := a.state.Load() & lenMask
	mapped := a.cap.Load()
	return int((mapped - min(a.keepBytes(l, by), mapped)) / a.unit), l == 0
}

// Held reports the units mapped below Cap, from the atomic word alone.
func (c client) Held() int { return int(c.a.cap.Load() / c.a.unit) }

// Used reports the bytes in use that are mapped: Len, or none while the
// arena sleeps (its bytes are on the host, or dropped), from the atomic
// words alone (chunk.Meter).
func (c client) Used() int64 {
	return int64(min(c.a.state.Load()&lenMask, c.a.cap.Load()))
}

// keepBytes is what the relief with ticket by leaves mapped when Len is l:
// l, what Grow promised and, while a growth of the arena is protected from
// that relief, what it is growing into, up to the end of the chunk that
// holds its last byte.
func (a *Arena) keepBytes(l uint64, by chunk.Ticket) uint64 {
	k := max(l, a.floor.Load())
	if a.growth.ProtectedFrom(by) {
		k = max(k, a.growing.Load())
	}
	return a.chunkEnd(k)
}

// Give detaches chunks from the top of the arena, above what it keeps,
// until they make n units (the last may take it past n), and hands them to
// the pool still mapped, with the streams that order their unmaps, before
// it lets go of its lock. No byte below Len is touched. It never waits for the lock: a held one is busy.
func (c client) Give(n int, by chunk.Ticket, take func([]chunk.Mapped, []acl.Stream)) (int, bool) {
	a := c.a
	if !a.mu.TryLock() {
		return 0, a.lifeNow() == lifeOpen
	}
	defer a.mu.Unlock()
	sched.At(sched.GiveLocked, a)
	if a.lifeNow() != lifeOpen {
		return 0, false
	}
	defer region(RegionReclaim).End()
	c0 := a.cap.Load()
	s := a.freeze()
	defer a.thaw(s, s&lenMask)
	keep, given := a.geo.n(), 0
	for k0 := a.geo.keep(a.keepBytes(s&lenMask, by)); keep > k0 && given < n; {
		keep--
		given += int(a.geo.size(keep) / a.unit)
	}
	if keep >= a.geo.n() {
		return 0, false
	}
	ms := make([]chunk.Mapped, 0, a.geo.n()-keep)
	for i := keep; i < a.geo.n(); i++ {
		ms = append(ms, chunk.Mapped{At: a.at(i), C: a.geo.cs[i]})
	}
	a.geo.cut(keep)
	a.setCap()
	a.unmaps += uint64(len(ms))
	a.reclaimed += uint64(len(ms))
	a.hr.short = true          // the pool is short: a miss until the next refill is not the worker's pace
	a.leave(BackingRelief, ms) // the pool tells the callbacks before it unmaps them
	take(ms, a.streams)
	a.obs.gaveBack(a, EventReclaim, c0, len(ms))
	return given, false
}

// Refill maps the headroom back up to its learnt size above Len, and what
// Prefetch asked for, with memory that is free now: it takes nothing from
// other arenas, and waits for nothing.
func (c client) Refill() {
	a := c.a
	if !a.mu.TryLock() {
		// Busy: ask again, for the worker's next round. (Waiting for the
		// next Alloc below the low-water mark would lose a refill asked
		// for under mu, as Wake does, when no Alloc follows.)
		if l := a.lifeNow(); l != lifeClosed && l != lifeAsleep {
			a.askRefill() // as it was asked: an arena without headroom asks through the pool's mutex
		}
		return
	}
	defer a.mu.Unlock()
	if a.lifeNow() != lifeOpen {
		return
	}
	a.refillLocked() // the learnt headroom, and a prefetch (headroom.go)
}

// fence orders the arena's synchronous copies after the scrubs it queued on
// its first stream: growLocked records an event after queueing them, and a
// host-side copy into the arena waits for the event first. A copy racing a
// queued clear would read or lose bytes (the host driver reports it as a
// fault).
type fence struct {
	mu     sync.Mutex
	ev     acl.Event
	gen    atomic.Uint64 // records so far
	waited atomic.Uint64 // the record the last completed wait covered
}

// record marks the present end of stream s: the scrubs queued so far. Call
// with the arena's mu held. If no event can be recorded it waits for the
// stream instead (not for the device).
func (f *fence) record(drv acl.Driver, s acl.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ev == 0 {
		ev, err := drv.CreateEvent()
		if err != nil {
			return f.waitStream(drv, s, err)
		}
		f.ev = ev
	}
	if err := drv.RecordEvent(f.ev, s); err != nil {
		return f.waitStream(drv, s, err)
	}
	f.gen.Add(1)
	return nil
}

// waitStream is record's fallback: wait for the stream's work now.
func (f *fence) waitStream(drv acl.Driver, s acl.Stream, cause error) error {
	if err := drv.SynchronizeStream(s); err != nil {
		return fmt.Errorf("order the scrubs before copies: %w (and waiting for the stream: %w)", cause, err)
	}
	return nil
}

// wait waits for the scrubs recorded so far, if it has not already.
func (f *fence) wait(drv acl.Driver) error {
	g := f.gen.Load()
	if f.waited.Load() >= g {
		return nil
	}
	f.mu.Lock()
	ev := f.ev
	f.mu.Unlock()
	if ev == 0 {
		return nil // destroyed by a Close that had waited for the scrubs
	}
	if err := drv.SynchronizeEvent(ev); err != nil {
		return fmt.Errorf("wait for scrubs queued on the stream: %w", err)
	}
	for {
		w := f.waited.Load()
		if w >= g || f.waited.CompareAndSwap(w, g) {
			return nil
		}
	}
}

// destroy gives the fence's event back, once the caller has waited for the
// scrubs it orders (an arena's Close has).
func (f *fence) destroy(drv acl.Driver) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ev == 0 {
		return nil
	}
	if err := drv.DestroyEvent(f.ev); err != nil {
		return fmt.Errorf("destroy fence event: %w", err) // kept, to try again
	}
	f.ev = 0
	f.waited.Store(f.gen.Load())
	return nil
}
