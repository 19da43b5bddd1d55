package arena

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
)

// client is the arena's side of its membership of the pool (chunk.Client):
// what the pool asks of it under pressure, and what the pool's worker asks
// of it to refill the headroom. Both use TryLock: an arena that is busy (in
// a Grow, a Close, or asking the pool itself) is skipped, never waited for,
// so arenas reclaiming from each other cannot deadlock. The one wait is a
// reclaim's for a refill under way: a refill takes only free memory and
// waits for no other arena, so it ends, and the memory the reclaim is after
// (the headroom) is what it maps.
type client struct{ a *Arena }

// Reclaimable reports the chunks wholly above Len and what Grow promised,
// and whether Len is 0, from the atomic words alone.
func (c client) Reclaimable() (int, bool) {
	a := c.a
	l := a.state.Load() & lenMask
	mapped := a.cap.Load()
	return int((mapped - min(a.keepBytes(l), mapped)) / a.chunkSize), l == 0
}

// keepBytes is what a reclaim leaves mapped when Len is l: l and what Grow
// promised, rounded up to whole chunks.
func (a *Arena) keepBytes(l uint64) uint64 { return a.roundUp(max(l, a.floor.Load())) }

// Reclaim gives back up to n chunks from the top of the arena, above Len
// and what Grow promised, as Shrink does. No byte below Len is touched. A
// busy arena gives nothing and says so.
func (c client) Reclaim(n int) (int, bool) {
	a := c.a
	if !a.mu.TryLock() {
		if !a.refilling.Load() {
			return 0, true
		}
		a.mu.Lock() // the worker's refill, which ends (see client)
	}
	defer a.mu.Unlock()
	if a.closed.Load() || a.sl.asleep.Load() {
		return 0, false
	}
	defer region(RegionReclaim).End()
	c0 := a.cap.Load()
	s := a.freeze()
	defer a.thaw(s, s&lenMask)
	keep := max(int(a.keepBytes(s&lenMask)/a.chunkSize), len(a.chunks)-n)
	k := len(a.chunks) - keep
	if k <= 0 || a.unstray(false) != nil {
		return 0, false
	}
	if err := a.dropTop(keep, false); err != nil {
		return 0, false
	}
	a.reclaimed += uint64(k)
	a.obs.gaveBack(a, EventReclaim, c0)
	return k, false
}

// Refill maps the headroom back up to Config.Headroom above Len, with memory
// that is free now: it takes nothing from other arenas.
func (c client) Refill() {
	a := c.a
	if !a.mu.TryLock() {
		return // busy: the next Alloc below the low-water mark asks again
	}
	defer a.mu.Unlock()
	a.refilling.Store(true)
	defer a.refilling.Store(false)
	if a.closed.Load() || a.sl.asleep.Load() {
		return
	}
	target := min(a.state.Load()&lenMask+a.headroom, a.reserved)
	if target <= a.cap.Load() {
		return
	}
	if a.growLocked(target, true) == nil {
		a.refills++
	}
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
