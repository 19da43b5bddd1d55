package chunk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/sched"
)

// Stream-ordered release.
//
// On a device, work queued on streams may still read memory its tenant has
// dropped, and unmapping memory that queued work reads makes the device
// fault. The fallback is to wait for the whole device (SyncDevice) before an
// unmap, which stalls every stream, including work that never touches the
// memory. ReleaseAfter instead records an event on each stream that may
// touch the chunks and returns at once; the chunks wait in the pool,
// "released, waiting for the device", still mapped where they were, until
// their events complete. Then they are unmapped and go to the cache, off the
// caller's path: by the pool's worker, by an Acquire that needs them, or by
// Close. Meanwhile
//
//   - a chunk waiting for the device is handed to nobody: it is still out of
//     the pool, and the budget counts it as held;
//   - its tenant may take it back where it lies (Reclaim), mapped, with no
//     driver call, when it grows into that address again;
//   - a failed event call falls back to SyncDevice, counted in
//     Stats.SyncFallbacks; a failed unmap leaves the chunk waiting, counted in
//     Stats.ReleaseErrors, to be tried again.

// Mapped is a chunk mapped at an address.
type Mapped struct {
	At acl.DevicePtr
	C  Chunk
}

// item is one chunk waiting for the device.
type item struct {
	Mapped
	b     *batch
	state chunkState    // chunkWaiting, chunkClaimed or chunkUnmapping while in the books (protocol.go)
	done  chan struct{} // made when it starts unmapping (the one state anyone waits out), closed when that ends; nil before
}

// batch is the chunks of one ReleaseAfter, or of one member's gift to a
// relief, and the events they wait for.
type batch struct {
	evs      []acl.Event
	items    []*item
	left     int     // items still in the books
	units    int     // their units (of the pool's tail size): what a relief that claims the batch gets
	complete bool    // the events were seen complete (or the device waited for): only unmaps remain
	scrubbed bool    // cleared before the events were recorded (ScrubOnRelease)
	sync     bool    // no events: ordered by a device-wide wait (a member without streams gave them)
	claimed  bool    // a relief waits for it and takes its chunks (chunkClaimed): the worker leaves it alone
	owner    *Member // the member that let the chunks go, told before they are unmapped (Unmapper); nil: nobody
}

// pending is the pool's chunks waiting for the device.
type pending struct {
	byAddr map[acl.DevicePtr]*item
	queue  []*batch // oldest first
	chunks int
	bytes  uintptr     // of the chunks, each at its size
	free   []acl.Event // events to record again
}

// maxFreeEvents bounds the events a pool keeps for reuse.
const maxFreeEvents = 64

func (q *pending) init() { q.byAddr = make(map[acl.DevicePtr]*item) }

// ReleaseAfter hands the chunks ms, mapped and out of this pool, back to the
// pool to be unmapped once the work queued now on streams has run, and
// returns without waiting. In ScrubOnRelease mode with one stream their
// clears are queued on it first; with more, they are cleared on reuse. The chunks must be in the caller's address order,
// lowest first; they are unmapped from the top down.
//
// On success the caller no longer owns the chunks (it may take one back
// with Reclaim while it waits). If an event cannot be created or recorded, it
// returns an error matching ErrNoOrder and nothing changed.
func (p Lender) ReleaseAfter(ms []Mapped, streams []acl.Stream) error {
	return p.releaseAfter(nil, ms, streams)
}

// ReleaseAfter is Lender.ReleaseAfter for the member's own chunks: when its
// client is an Unmapper, it is told before they are unmapped.
func (m *Member) ReleaseAfter(ms []Mapped, streams []acl.Stream) error {
	return m.p.lend().releaseAfter(m, ms, streams)
}

// ReleaseAfterDevice is ReleaseAfter for chunks no event can order: the
// member's own chunks ms (mapped, lowest address first) wait in the pool
// for a wait on the whole device, which whoever needs them next makes,
// holding nothing: a relief that claims them, the member's own growth
// taking them back where they lie (ReclaimSpan: it needs no wait), or
// Close. The worker never makes that wait. It never waits itself, so its
// caller may hold its own lock. Its client, when an Unmapper, is told
// before they are unmapped.
func (m *Member) ReleaseAfterDevice(ms []Mapped) error {
	if len(ms) == 0 {
		return nil
	}
	if err := m.p.allOut("release", ms); err != nil {
		return err
	}
	m.p.enqueueEvents(m, ms, nil, false, false)
	return nil
}

// allOut checks that every chunk of ms is out of this pool, and of the size
// it was lent out as, under one hold of its lock: leaseOf for a release's
// chunks.
func (p *Pool) allOut(op string, ms []Mapped) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range ms {
		if _, err := p.leaseLocked(op, m.At, m.C); err != nil {
			return err
		}
	}
	return nil
}

func (p Lender) releaseAfter(owner *Member, ms []Mapped, streams []acl.Stream) error {
	if len(ms) == 0 {
		return nil
	}
	if len(streams) == 0 {
		return fmt.Errorf("chunk: release after: %w: no stream", acl.ErrInvalidParam)
	}
	if err := p.pool.allOut("release", ms); err != nil {
		return err
	}
	scrubbed := 0
	// The clear is queued on the first stream, ordered after its work only:
	// with more streams, work queued on another before the release could
	// write the chunk after the clear, and the cache would hold a tenant's
	// bytes marked cleared. No driver call orders one clear after several
	// streams, so then the chunk is left to be cleared on reuse, as chunks
	// that come back any other way are.
	if p.pool.scrub == ScrubOnRelease && len(streams) == 1 {
		for _, m := range ms {
			if p.pool.isShared(m.C) {
				continue // freed, and its bytes are another process's too
			}
			if err := p.pool.drv.MemsetAsync(m.At, 0, m.C.Size, streams[0]); err != nil {
				return p.pool.fallback(nil, fmt.Errorf("scrub at %v: %w", m.At, err))
			}
			scrubbed++
		}
	}
	evs := make([]acl.Event, 0, len(streams))
	for _, s := range streams {
		ev, err := p.pool.event()
		if err != nil {
			return p.pool.fallback(evs, err)
		}
		evs = append(evs, ev)
		if err := p.pool.drv.RecordEvent(ev, s); err != nil {
			return p.pool.fallback(evs, fmt.Errorf("record on stream %#x: %w", uintptr(s), err))
		}
	}
	p.pool.mu.Lock()
	p.pool.stats.Scrubs += int64(scrubbed)
	p.pool.stats.ScrubsAsync += int64(scrubbed)
	p.pool.mu.Unlock()
	p.pool.enqueueEvents(owner, ms, evs, false, scrubbed > 0)
	return nil
}

// fallback gives back the events of a ReleaseAfter that could not be
// ordered, counts the fallback and returns the error for the caller.
func (p *Pool) fallback(evs []acl.Event, err error) error {
	p.mu.Lock()
	p.stats.SyncFallbacks++
	p.mu.Unlock()
	p.recycle(evs)
	return fmt.Errorf("chunk: %w: %w", ErrNoOrder, err)
}

// enqueue hands chunks a member (owner) gave a relief (mapped, lowest
// address first) to wait for the device: on events recorded now on streams,
// or, without streams or when an event call fails, a device-wide wait. With
// claimed set the relief waits for them itself and takes them; the worker
// leaves them.
func (p *Pool) enqueue(owner *Member, ms []Mapped, streams []acl.Stream, claimed bool) *batch {
	var evs []acl.Event
	for _, s := range streams {
		ev, err := p.event()
		if err == nil {
			evs = append(evs, ev)
			err = p.drv.RecordEvent(ev, s)
		}
		if err != nil {
			p.mu.Lock()
			if len(streams) > 0 {
				p.stats.SyncFallbacks++
			}
			p.mu.Unlock()
			p.recycle(evs)
			evs = nil
			break
		}
	}
	return p.enqueueEvents(owner, ms, evs, claimed, false)
}

// enqueueEvents registers a batch of owner's chunks that wait for evs (none:
// for a device-wide wait), cleared before the events if scrubbed, and
// returns it.
func (p *Pool) enqueueEvents(owner *Member, ms []Mapped, evs []acl.Event, claimed, scrubbed bool) *batch {
	b := &batch{evs: evs, left: len(ms), sync: len(evs) == 0, claimed: claimed, scrubbed: scrubbed, owner: owner}
	var bytes uintptr
	p.mu.Lock()
	state := chunkWaiting
	if claimed {
		state = chunkClaimed
	}
	// One allocation for the batch's items; their done channels are made
	// only for the items someone may wait for (unmapItems).
	its := make([]item, len(ms))
	b.items = make([]*item, len(ms))
	for i := range ms { // top down
		it := &its[i]
		*it = item{Mapped: ms[len(ms)-1-i], b: b, state: state}
		if l, ok := p.out[it.C.Handle]; ok {
			// The pool's record of the size is the one its books keep (a
			// member's Give, which cannot be refused, is not checked).
			it.C.Size = l.size
		}
		b.items[i] = it
		p.pending.byAddr[it.At] = it
		bytes += it.C.Size
	}
	b.units = int(bytes / p.tail)
	p.pending.bytes += bytes
	p.pending.queue = append(p.pending.queue, b)
	p.pending.chunks += len(ms)
	p.releasedLocked() // wait.go: a waiter's retry may take them
	if !claimed {
		p.wakeLocked()
	}
	p.mu.Unlock()
	sched.At(sched.ReleaseQueued, p)
	return b
}

// event returns an event to record: a recycled one, or a new one.
func (p *Pool) event() (acl.Event, error) {
	p.mu.Lock()
	var surplus []acl.Event
	if n := len(p.pending.free); n > maxFreeEvents {
		surplus = slices.Clone(p.pending.free[maxFreeEvents:])
		p.pending.free = p.pending.free[:maxFreeEvents]
	}
	if n := len(p.pending.free); n > 0 {
		ev := p.pending.free[n-1]
		p.pending.free = p.pending.free[:n-1]
		p.mu.Unlock()
		p.destroyEvents(surplus)
		return ev, nil
	}
	p.mu.Unlock()
	p.destroyEvents(surplus)
	ev, err := p.drv.CreateEvent()
	if err != nil {
		return 0, fmt.Errorf("create event: %w", err)
	}
	return ev, nil
}

// recycle keeps events for the next ReleaseAfter, destroying those beyond
// maxFreeEvents (or all of them once the pool is closed).
func (p *Pool) recycle(evs []acl.Event) {
	p.mu.Lock()
	var extra []acl.Event
	for _, ev := range evs {
		if p.closed || len(p.pending.free) >= maxFreeEvents {
			extra = append(extra, ev)
			continue
		}
		p.pending.free = append(p.pending.free, ev)
	}
	p.mu.Unlock()
	p.destroyEvents(extra)
}

// destroyEvents destroys events the pool no longer keeps. One the driver
// fails to destroy goes back to the pool's free events, for Close to try
// again.
func (p *Pool) destroyEvents(evs []acl.Event) error {
	var errs []error
	for _, ev := range evs {
		if err := p.drv.DestroyEvent(ev); err != nil {
			errs = append(errs, fmt.Errorf("chunk: destroy event: %w", err))
			p.mu.Lock()
			p.pending.free = append(p.pending.free, ev)
			p.mu.Unlock()
		}
	}
	return errors.Join(errs...)
}

// dropEvents destroys every event the pool keeps for reuse (at Close).
func (p *Pool) dropEvents() error {
	p.mu.Lock()
	evs := p.pending.free
	p.pending.free = nil
	p.mu.Unlock()
	return p.destroyEvents(evs)
}

// ReclaimSpan takes back, for their tenant, every chunk waiting for the
// device that starts in [from, end), whatever its size, still mapped where
// it lies, and appends them to dst in address order; a chunk that starts
// in the span may end past end (a large chunk the span cuts). It makes no
// driver call and never waits: when one of them is busy (claimed by a
// relief, or being unmapped) it takes none, returns dst as it was, and
// returns that one to wait for before trying again. With a dst of room
// enough it allocates nothing. A member's chunks lie at multiples of the
// tail size from its base (Pool.TailSize), and from is one of those places
// (its top, where it grows).
func (p Lender) ReclaimSpan(from, end acl.DevicePtr, dst []Mapped) ([]Mapped, Busy) {
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	q := &p.pool.pending
	if len(q.byAddr) == 0 || end <= from {
		return dst, Busy{}
	}
	base := len(dst)
	u := p.pool.tail
	if steps := uintptr(end-from) / u; steps <= uintptr(len(q.byAddr)) {
		// A short span: look at each place a chunk may start, and past
		// each chunk found to its end.
		for x := from; x < end; {
			it := q.byAddr[x]
			if it == nil {
				if x.Add(u) < x {
					break // the address space ends
				}
				x = x.Add(u)
				continue
			}
			if it.state.busy() {
				return dst[:base], Busy{p.pool, x}
			}
			dst = append(dst, it.Mapped)
			if x.Add(it.C.Size) < x {
				break
			}
			x = x.Add(it.C.Size)
		}
	} else {
		// Fewer chunks wait than the span has places: look at each.
		for at, it := range q.byAddr {
			if at < from || at >= end {
				continue
			}
			if it.state.busy() {
				return dst[:base], Busy{p.pool, at}
			}
			dst = append(dst, it.Mapped)
		}
		slices.SortFunc(dst[base:], func(a, b Mapped) int { return cmp.Compare(a.At, b.At) })
	}
	for _, m := range dst[base:] {
		p.pool.settleLocked(q.byAddr[m.At], chunkMapped, true)
	}
	return dst, Busy{}
}

// ReclaimRange takes back every chunk waiting for the device in
// [base, base+size) that is not busy, as ReclaimSpan does, in no particular
// order; busy is one that is (zero when none is): wait for it, and call
// again for the rest.
func (p Lender) ReclaimRange(base acl.DevicePtr, size uintptr) (out []Mapped, busy Busy) {
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	for at, it := range p.pool.pending.byAddr {
		if at < base || uintptr(at-base) >= size {
			continue
		}
		if it.state.busy() {
			busy = Busy{p.pool, at}
			continue
		}
		p.pool.settleLocked(it, chunkMapped, true)
		out = append(out, it.Mapped)
	}
	return out, busy
}

// settleLocked takes it out of the books, in its final state to, and
// retires its batch when it was the last. It closes it.done unless the
// caller will, once it has put the chunk back. Call with mu held.
func (p *Pool) settleLocked(it *item, to chunkState, closeDone bool) {
	it.state = to
	delete(p.pending.byAddr, it.At)
	p.pending.chunks--
	p.pending.bytes -= it.C.Size
	if closeDone && it.done != nil {
		close(it.done)
	}
	it.b.left--
	it.b.units -= int(it.C.Size / p.tail)
	if it.b.left == 0 {
		if i := slices.Index(p.pending.queue, it.b); i >= 0 {
			p.pending.queue = slices.Delete(p.pending.queue, i, i+1)
		}
		// Keep the events for the next ReleaseAfter; event() and Close
		// destroy the surplus, outside the lock.
		p.pending.free = append(p.pending.free, it.b.evs...)
		it.b.evs = nil
	}
}

// claimLocked claims b for a relief: the worker leaves it alone, and its
// member, growing into it, waits for the relief. Call with mu held.
func (p *Pool) claimLocked(b *batch) {
	b.claimed = true
	for _, it := range b.items {
		if it.state == chunkWaiting {
			it.state = chunkClaimed
		}
	}
}

// settleReady unmaps the chunks whose events have completed, without
// waiting, and puts them in the cache; batches a relief has claimed are the
// relief's. It returns how many it settled and whether chunks still wait.
func (p *Pool) settleReady() (settled int, waiting bool) {
	for _, b := range p.batches() {
		p.mu.Lock()
		mine := !b.claimed
		p.mu.Unlock()
		if !mine || !p.complete(b, false) {
			continue
		}
		if n := p.unmapBatch(b, false); n > 0 {
			settled += n
		}
	}
	p.mu.Lock()
	waiting = p.pending.chunks > 0
	p.mu.Unlock()
	return settled, waiting
}

// await waits for the device to finish with the batches a relief claimed,
// holding nothing: for their own events, polled so that ctx and stop can
// cut it short; for the batches without events, one device-wide wait for
// them all (on a goroutine of its own, for the same reason). It returns the
// batches whose chunks may now be unmapped, and gives back to the worker
// (unclaims) those it stopped waiting for: when ctx is done (it returns
// ctx.Err()), stop is closed, or the device could not tell.
func (p *Pool) await(ctx context.Context, stop <-chan struct{}, claims []*batch) ([]*batch, error) {
	ready := claims[:0:0]
	synced := false
	for i, b := range claims {
		var ok bool
		var err error
		switch {
		case b.sync && !synced:
			ok, err = p.syncDevice(ctx, stop)
			if ctx.Err() == nil {
				err = nil // the device could not tell: the batch goes back to the worker
			}
			synced = ok
			fallthrough
		case b.sync:
			if synced {
				ok = true
				p.mu.Lock()
				b.complete = true
				p.mu.Unlock()
			}
		default:
			err = poll(ctx, stop, func() bool { return p.complete(b, false) })
			ok = err == nil && !stopped(stop)
		}
		if !ok {
			p.unclaim(claims[i:])
			sched.At(sched.ReliefWaited, p)
			return ready, err
		}
		ready = append(ready, b)
	}
	sched.At(sched.ReliefWaited, p)
	return ready, nil
}

// syncDevice waits for the whole device (SyncDevice), holding nothing, until
// ctx is done or stop is closed: the driver's wait then goes on, on a
// goroutine of its own, and ends with the device's work. It reports whether
// the device was waited for, and the driver's error or ctx.Err().
func (p *Pool) syncDevice(ctx context.Context, stop <-chan struct{}) (bool, error) {
	if ctx.Done() == nil && stop == nil {
		err := p.lend().SyncDevice()
		return err == nil, err
	}
	done := make(chan error, 1)
	go func() { done <- p.lend().SyncDevice() }()
	select {
	case err := <-done:
		return err == nil, err
	case <-ctx.Done():
		return false, ctx.Err()
	case <-stop:
		return false, nil
	}
}

// syncCtx is SyncDevice that returns an error wrapping ctx.Err() when ctx
// is done first.
func (p *Pool) syncCtx(ctx context.Context) error {
	if _, err := p.syncDevice(ctx, nil); err != nil {
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return fmt.Errorf("chunk: wait for the device: %w", err)
		}
		return err
	}
	return nil
}

// unclaim hands batches a relief gave up on to the worker.
func (p *Pool) unclaim(bs []*batch) {
	p.mu.Lock()
	left := false
	for _, b := range bs {
		b.claimed = false
		for _, it := range b.items {
			if it.state == chunkClaimed {
				it.state = chunkWaiting
			}
		}
		left = left || b.left > 0
	}
	if left {
		p.wakeLocked()
	}
	p.mu.Unlock()
}

// settleAll waits for every chunk waiting for the device and unmaps it (or
// waits for the goroutine unmapping it), or, when ctx is done first, stops
// and says how many still wait. With a ctx
// that can be done it polls the batches' events instead of blocking on them.
func (p *Pool) settleAll(ctx context.Context) error {
	var errs []error
	polled := ctx.Done() != nil
	for _, b := range p.batches() {
		if ctx.Err() != nil {
			break
		}
		var ok bool
		if polled && !b.sync {
			ok = poll(ctx, nil, func() bool { return p.complete(b, false) }) == nil
			if !ok && ctx.Err() != nil {
				break
			}
		} else {
			ok = p.complete(b, true)
		}
		if !ok {
			errs = append(errs, fmt.Errorf("chunk: the device could not say when %d pending chunks are free", len(b.items)))
			continue
		}
		if n := p.unmapBatch(b, true); n < 0 {
			errs = append(errs, fmt.Errorf("chunk: %d pending chunks could not be unmapped", -n))
		}
	}
	if err := ctx.Err(); err != nil {
		n := 0
		for _, b := range p.batches() {
			n += len(b.items)
		}
		if n > 0 {
			errs = append(errs, fmt.Errorf("chunk: close: %d chunks still wait for the device (close again to finish): %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// batches returns the batches waiting now, oldest first.
func (p *Pool) batches() []*batch {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.pending.queue)
}

// complete reports whether b's events have completed, waiting for them if
// wait is set. An event call that fails falls back to SyncDevice.
func (p *Pool) complete(b *batch, wait bool) bool {
	p.mu.Lock()
	if b.complete {
		p.mu.Unlock()
		return true
	}
	evs, sync := b.evs, b.sync
	p.mu.Unlock()
	if sync {
		// No event says when the device is done with these chunks: only a
		// device-wide wait does, and only when asked to wait.
		if !wait || p.lend().SyncDevice() != nil {
			return false
		}
		p.mu.Lock()
		b.complete = true
		p.mu.Unlock()
		return true
	}
	ok := true
	for _, ev := range evs {
		var err error
		var done bool
		if wait {
			err = p.drv.SynchronizeEvent(ev)
			done = err == nil
		} else {
			done, err = p.drv.QueryEvent(ev)
		}
		if err != nil {
			// The event cannot tell: wait for the whole device instead.
			p.mu.Lock()
			p.stats.SyncFallbacks++
			p.mu.Unlock()
			if p.lend().SyncDevice() != nil {
				return false // try again later
			}
			done = true
		}
		if !done {
			ok = false
			break
		}
	}
	if ok {
		p.mu.Lock()
		b.complete = true
		p.mu.Unlock()
	}
	return ok
}

// unmapBatch unmaps and puts back the chunks of b, whose events completed,
// that still wait. With wait set it also waits for the chunks of b that
// another goroutine is unmapping, so that they are back (or waiting again)
// when it returns. It returns how many it settled, or minus how many it
// failed to unmap.
func (p *Pool) unmapBatch(b *batch, wait bool) int {
	return p.unmapItems(b, wait, 0, nil)
}

// handBatch unmaps the chunks of b a relief claimed, whose device work has
// ended, and hands them to tenant t instead of putting them back: they stay
// out of the pool, leased to t. A shared chunk is put back (freed) instead.
func (p *Pool) handBatch(b *batch, t Tenant) []Chunk {
	var out []Chunk
	p.unmapItems(b, true, t, &out)
	p.unclaim([]*batch{b}) // a chunk whose unmap failed waits again, for the worker
	return out
}

// unmapItems is unmapBatch, handing the chunks to t when out is set (a
// relief's claimed batch; otherwise the batch is the worker's, or Close's).
// It takes the items it will unmap (busy from then on), tells their owner
// first (Unmapper: an error leaves them all waiting, for the next try), and
// then unmaps them one by one.
func (p *Pool) unmapItems(b *batch, wait bool, t Tenant, out *[]Chunk) int {
	defer region(RegionRelease).End()
	n, failed := 0, 0
	defer func() { p.logRelease(n, failed) }()
	mine := chunkWaiting
	if out != nil {
		mine = chunkClaimed
	}
	var todo []*item
	for _, it := range b.items {
		p.mu.Lock()
		for wait && it.state == chunkUnmapping {
			done := it.done
			p.mu.Unlock()
			sched.At(sched.UnmapAwaited, p)
			<-done
			p.mu.Lock()
		}
		if it.state != mine {
			p.mu.Unlock()
			continue
		}
		it.state = chunkUnmapping
		it.done = make(chan struct{})
		p.mu.Unlock()
		todo = append(todo, it)
	}
	if len(todo) == 0 {
		return 0
	}
	u, _ := b.unmapper()
	if u != nil {
		if err := u.Unmapping(mappedOf(todo)); err != nil {
			// Nothing is unmapped: the owner keeps them (registered, say)
			// until a later try.
			p.mu.Lock()
			for _, it := range todo {
				p.failUnmapLocked(it)
			}
			p.mu.Unlock()
			failed = len(todo)
			return -failed
		}
	}
	for i, it := range todo {
		if i > 0 && !wait {
			yieldToCallers() // the worker's: see yieldToCallers
		}
		sched.At(sched.ReleaseUnmap, p)
		err := p.drv.UnmapMem(it.At)
		if err != nil {
			if u != nil {
				// Told it would go; it stays. Told again while it is
				// still busy, before anyone else may unmap it.
				u.StillMapped([]Mapped{it.Mapped})
			}
			p.mu.Lock()
			p.failUnmapLocked(it)
			p.mu.Unlock()
			failed++
			continue
		}
		p.mu.Lock()
		l, ok := p.out[it.C.Handle]
		if ok && b.scrubbed {
			l.holder = zeroed
		}
		p.stats.Ordered++
		if hand := out != nil && ok && l.shared == nil; hand {
			p.settleLocked(it, chunkHanded, false)
			l.tenant = t
			p.out[it.C.Handle] = l
			p.mu.Unlock()
			*out = append(*out, it.C)
		} else {
			p.settleLocked(it, chunkUnmapped, false)
			if ok {
				p.out[it.C.Handle] = l
			}
			// Out of the books and into the cache, or counted on its way to
			// the driver, under this one hold of the lock: a relief looking
			// in between would find the chunk nowhere and give up (roomNow).
			// Out of the pool until now, so it cannot be refused.
			_ = p.putLocked(it.C, true)
		}
		close(it.done) // whoever waits for the unmap finds the chunk back
		n++
	}
	if failed > 0 {
		return -failed
	}
	return n
}

// failUnmapLocked puts it, which was to be unmapped, back to waiting (the
// worker's, to try again), and wakes whoever waits for its unmap. Call with
// mu held.
func (p *Pool) failUnmapLocked(it *item) {
	it.state = chunkWaiting
	p.stats.ReleaseErrors++
	close(it.done) // made when it started unmapping
	it.done = nil
}

// mappedOf returns the chunks of items.
func mappedOf(its []*item) []Mapped {
	ms := make([]Mapped, len(its))
	for i, it := range its {
		ms[i] = it.Mapped
	}
	return ms
}

// unmapper returns the batch's owner's client as an Unmapper, if it is one.
func (b *batch) unmapper() (Unmapper, bool) {
	if b.owner == nil {
		return nil, false
	}
	u, ok := b.owner.c.(Unmapper)
	return u, ok
}

// PendingIn returns the chunks waiting for the device in [base, base+size)
// that are not being unmapped: mapped there, the pool's until they are
// unmapped or taken back. A client that keeps books of its mappings (an
// Unmapper) reads them when it starts keeping them.
func (p Lender) PendingIn(base acl.DevicePtr, size uintptr) []Mapped {
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	var out []Mapped
	for at, it := range p.pool.pending.byAddr {
		if at >= base && uintptr(at-base) < size && it.state != chunkUnmapping {
			out = append(out, it.Mapped)
		}
	}
	slices.SortFunc(out, func(a, b Mapped) int { return cmp.Compare(a.At, b.At) })
	return out
}

// WaitStreams waits until the work queued now on streams has run, or ctx is
// done: it records an event on each stream and polls them, so that a
// deadline is honoured while the device is busy. Without streams, or when
// an event call fails, it waits for the whole device instead (SyncDevice,
// on a goroutine of its own when ctx can be done, so that the deadline
// holds even then).
func (p Lender) WaitStreams(ctx context.Context, streams []acl.Stream) error {
	if len(streams) == 0 {
		return p.pool.syncCtx(ctx)
	}
	evs := make([]acl.Event, 0, len(streams))
	defer func() { p.pool.recycle(evs) }()
	for _, s := range streams {
		ev, err := p.pool.event()
		if err == nil {
			evs = append(evs, ev)
			err = p.pool.drv.RecordEvent(ev, s)
		}
		if err != nil {
			p.pool.mu.Lock()
			p.pool.stats.SyncFallbacks++
			p.pool.mu.Unlock()
			return p.pool.syncCtx(ctx)
		}
	}
	delay := pendingPollMin
	for _, ev := range evs {
		for {
			done, err := p.pool.drv.QueryEvent(ev)
			if err != nil {
				p.pool.mu.Lock()
				p.pool.stats.SyncFallbacks++
				p.pool.mu.Unlock()
				return p.pool.syncCtx(ctx)
			}
			if done {
				break
			}
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("chunk: wait for the device: %w", ctx.Err())
			case <-t.C:
			}
			delay = min(2*delay, pendingPollMax)
		}
	}
	return nil
}
