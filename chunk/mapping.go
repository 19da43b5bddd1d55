package chunk

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/vmarena/vmarena/acl"
)

// Map maps c at ptr for its tenant, with no stream: MapRange(ptr, [c], nil).
func (p Lender) Map(ptr acl.DevicePtr, c Chunk) error {
	_, err := p.MapRange(ptr, []Chunk{c}, nil)
	return err
}

// LeftState says what a chunk that a failed MapRange left mapped can be
// trusted with: none of them can be trusted with a tenant's bytes. Its
// caller keeps it out of use (a stray, or a sleeping arena's slot), and,
// before unmapping it, orders the unmap after the work its state says may
// still run.
type LeftState uint8

const (
	// LeftNoAccess: mapped, and access not granted (or not known to be):
	// the device faults on it. No work is queued on it.
	LeftNoAccess LeftState = iota + 1
	// LeftUnscrubbed: mapped with access, and not cleared for its tenant:
	// it may hold another tenant's bytes. No work is queued on it.
	LeftUnscrubbed
	// LeftQueued: mapped with access, with clears queued on the tenant's
	// stream that may still run (the wait for them failed): unmapping it
	// before that stream has been waited for would make the device fault.
	// Its bytes may be another tenant's too.
	LeftQueued
)

var leftStates = [...]string{"", "no access", "unscrubbed", "clears queued"}

// String describes the state.
func (s LeftState) String() string {
	if int(s) < len(leftStates) && s != 0 {
		return leftStates[s]
	}
	return fmt.Sprintf("chunk.LeftState(%d)", uint8(s))
}

// A Leftover is a chunk a failed MapRange left mapped, and its state.
type Leftover struct {
	Mapped
	State LeftState
}

// LeftMappedError is the error of a MapRange that failed and could not undo
// all its mappings: the chunks in Left are still mapped where they were put,
// in the state each says, and must be unmapped (after the work a
// LeftQueued chunk's state names) before they are Put back. Their leases
// still name the bytes they held before: a later MapRange scrubs them. It
// matches ErrMapped.
type LeftMappedError struct {
	Left []Leftover
	Err  error // why the MapRange failed, and why the undo did
}

// Error describes the failure.
func (e *LeftMappedError) Error() string {
	return fmt.Sprintf("chunk: %v: %d chunks left mapped: %v", ErrMapped, len(e.Left), e.Err)
}

// Unwrap returns the cause.
func (e *LeftMappedError) Unwrap() error { return e.Err }

// Is matches ErrMapped.
func (e *LeftMappedError) Is(target error) bool { return target == ErrMapped }

// MapRange maps the chunks cs side by side from ptr (a multiple of the chunk
// size inside a reservation: each chunk at ptr plus the Sizes of those
// before it), grants the device read-write access to them, and clears those
// that may hold another tenant's bytes (see Scrub).
//
// Access is granted with one MemSetAccess over the whole range where the
// driver allows it (acl.Caps.AccessSpan), else one per chunk; a driver
// without MemSetAccess (ACL before 8.5 answers 207000) maps accessible
// chunks, and the pool stops asking.
//
// Scrubs are queued on stream, the first of streams (the stream on which the
// tenant uses its memory), with MemsetAsync: they run before any work the
// tenant queues there afterwards, and nobody waits for them. scrubbed says
// how many were queued, so that the caller can fence its synchronous copies
// behind them. With no stream the scrubs are synchronous Memsets, which wait
// for the clear alone, not for the device.
//
// A failed MapRange unmaps what it mapped, top down, once the clears it
// queued have run; should some of those unmaps fail too, or the wait for the
// clears (which then leaves every chunk mapped: unmapping memory that queued
// work may still write would make the device fault), the error is a
// *LeftMappedError (matching ErrMapped) that lists the chunks still mapped
// and their states.
func (p Lender) MapRange(ptr acl.DevicePtr, cs []Chunk, streams []acl.Stream) (scrubbed int, err error) {
	if len(cs) == 0 {
		return 0, nil
	}
	var buf [16]lease // no heap allocation for a run of up to 16 chunks
	ls, err := p.pool.leasesOf("map", ptr, cs, buf[:0])
	if err != nil {
		return 0, err
	}
	at := ptr
	for i, c := range cs {
		if err := p.pool.drv.MapMem(at, c.Size, 0, c.Handle, 0); err != nil {
			return 0, p.pool.unmapRange(ptr, cs[:i], LeftNoAccess, fmt.Errorf("chunk: map at %v: %w", at, err))
		}
		at = at.Add(c.Size)
	}
	if err := p.pool.grantAccess(ptr, cs); err != nil {
		return 0, p.pool.unmapRange(ptr, cs, LeftNoAccess, err)
	}
	var stream acl.Stream
	async := len(streams) > 0
	if async {
		stream = streams[0]
	}
	var fresh, moved, queued int
	next := ptr
	for i, c := range cs {
		at := next
		next = next.Add(c.Size)
		need, isFresh := p.pool.needsScrub(ls[i].holder, ls[i].tenant)
		if !need {
			continue
		}
		r := region(RegionScrub)
		var err error
		if async {
			err = p.pool.drv.MemsetAsync(at, 0, c.Size, stream)
			if errors.Is(err, acl.ErrNotSupported) {
				async = false
			} else if err == nil {
				queued++
			}
		}
		if !async {
			err = p.pool.drv.Memset(at, 0, c.Size)
		}
		r.End()
		if err != nil {
			err = fmt.Errorf("chunk: scrub at %v: %w", at, err)
			if queued > 0 {
				// The clears already queued must run before the unmaps;
				// if the wait for them fails, they may still run, and
				// nothing is unmapped.
				if werr := p.pool.drv.SynchronizeStream(stream); werr != nil {
					return 0, p.pool.leftAll(ptr, cs, LeftQueued, fmt.Errorf("%w (and the wait for the clears queued: %w)", err, werr))
				}
			}
			return 0, p.pool.unmapRange(ptr, cs, LeftUnscrubbed, err)
		}
		if isFresh {
			fresh++
		} else {
			moved++
		}
	}
	p.pool.mu.Lock()
	p.pool.stats.Scrubs += int64(fresh + moved)
	p.pool.stats.ScrubsFresh += int64(fresh)
	p.pool.stats.ScrubsAsync += int64(queued)
	for i, c := range cs {
		l := ls[i]
		l.holder = l.tenant // from now on the tenant may write into it
		p.pool.setLease(c.Handle, l)
	}
	p.pool.mu.Unlock()
	p.pool.logScrub(ptr, fresh, moved, queued)
	return queued, nil
}

// grantAccess grants read-write access to the chunks cs mapped side by side
// from ptr.
func (p *Pool) grantAccess(ptr acl.DevicePtr, cs []Chunk) error { return p.grant(ptr, cs, p.access) }

// grant grants the access desc describes to the chunks cs mapped side by
// side from ptr: with one call over all their bytes where the driver allows
// it (span), else one call per chunk.
func (p *Pool) grant(ptr acl.DevicePtr, cs []Chunk, desc []acl.MemAccessDesc) error {
	if p.implicit.Load() {
		return nil
	}
	at := ptr
	for i := 0; i < len(cs); {
		j, size := i+1, cs[i].Size
		if p.span {
			for ; j < len(cs); j++ {
				size += cs[j].Size
			}
		}
		err := p.drv.MemSetAccess(at, size, desc)
		switch {
		case errors.Is(err, acl.ErrNotSupported):
			p.implicit.Store(true)
			return nil
		case err != nil:
			return fmt.Errorf("chunk: set access at %v: %w", at, err)
		}
		at, i = at.Add(size), j
	}
	return nil
}

// needsScrub reports whether a chunk holding holder's bytes must be cleared
// before tenant t may read it, and whether it is fresh from the driver.
func (p *Pool) needsScrub(holder, t Tenant) (need, isFresh bool) {
	if p.scrub == ScrubNever || holder == zeroed || holder == t {
		return false, false
	}
	if holder != fresh {
		return true, false // another tenant's bytes
	}
	// Fresh memory holds what some process freed: any process's where the
	// device does not clear memory between processes, only this process's
	// where it does, and then only t's if t is the device's only tenant.
	if p.fresh == acl.FreshProcess && p.dev.only(t) {
		return false, true
	}
	return true, true
}

// unmapRange undoes a failed MapRange: it unmaps the chunks cs mapped from
// ptr, top down, and returns err, or a *LeftMappedError listing the chunks
// it could not unmap, in state (nothing is queued on them).
func (p *Pool) unmapRange(ptr acl.DevicePtr, cs []Chunk, state LeftState, err error) error {
	var left []Leftover
	var uerrs []error
	end := spanEnd(ptr, cs)
	for i := len(cs) - 1; i >= 0; i-- {
		end -= acl.DevicePtr(cs[i].Size)
		if uerr := p.drv.UnmapMem(end); uerr != nil {
			left = append(left, Leftover{Mapped{end, cs[i]}, state})
			uerrs = append(uerrs, uerr)
		}
	}
	if len(left) == 0 {
		return err
	}
	return &LeftMappedError{Left: left, Err: fmt.Errorf("%w (and unmap: %w)", err, errors.Join(uerrs...))}
}

// leftAll is the error of a MapRange that leaves every chunk of cs mapped
// from ptr, in state.
func (p *Pool) leftAll(ptr acl.DevicePtr, cs []Chunk, state LeftState, err error) error {
	left := make([]Leftover, 0, len(cs))
	end := spanEnd(ptr, cs)
	for i := len(cs) - 1; i >= 0; i-- {
		end -= acl.DevicePtr(cs[i].Size)
		left = append(left, Leftover{Mapped{end, cs[i]}, state})
	}
	return &LeftMappedError{Left: left, Err: err}
}

// spanEnd returns the end of the chunks cs mapped side by side from ptr.
func spanEnd(ptr acl.DevicePtr, cs []Chunk) acl.DevicePtr {
	for _, c := range cs {
		ptr = ptr.Add(c.Size)
	}
	return ptr
}

// leaseOf returns the lease of c, which must be out of this pool, and of
// the size the pool lent it out as.
func (p *Pool) leaseOf(op string, ptr acl.DevicePtr, c Chunk) (lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.leaseLocked(op, ptr, c)
}

// leaseLocked is leaseOf with mu held.
func (p *Pool) leaseLocked(op string, ptr acl.DevicePtr, c Chunk) (lease, error) {
	l, ok := p.out[c.Handle]
	if !ok {
		return lease{}, notOut(op, ptr, c)
	}
	if c.Size != l.size {
		return lease{}, wrongSize(op, ptr, c, l)
	}
	return l, nil
}

// notOut is the error of op on c at ptr when c is not out of the pool.
func notOut(op string, ptr acl.DevicePtr, c Chunk) error {
	return fmt.Errorf("chunk: %s at %v: %w: chunk %#x is not out of this pool", op, ptr, acl.ErrInvalidParam, uintptr(c.Handle))
}

// leasesOf appends to ls the leases of cs, mapped (or to be) side by side
// from ptr, all of which must be out of this pool: leaseOf for a run, under
// one hold of the pool's lock.
func (p *Pool) leasesOf(op string, ptr acl.DevicePtr, cs []Chunk, ls []lease) ([]lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		l, err := p.leaseLocked(op, ptr, c)
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ptr = ptr.Add(c.Size)
	}
	return ls, nil
}

// setLease records l for h, if h is still out (a caller that put the chunk
// back while mapping it gets no say). Call with mu held.
func (p *Pool) setLease(h acl.PhysicalHandle, l lease) {
	if _, ok := p.out[h]; ok {
		p.out[h] = l
	}
}

// Unmap removes the mapping of a chunk at ptr. The chunk can then be Put
// back or mapped again. The caller has made sure that no device work still
// touches it (see SyncDevice and ReleaseAfter).
func (p Lender) Unmap(ptr acl.DevicePtr) error {
	if err := p.pool.drv.UnmapMem(ptr); err != nil {
		return fmt.Errorf("chunk: unmap at %v: %w", ptr, err)
	}
	return nil
}

// SyncDevice waits for every stream of the device (SynchronizeDevice): the
// fallback that orders an unmap after the device work that may touch the
// range when no stream says which work that is. It is counted in
// Stats.DeviceSyncs.
func (p Lender) SyncDevice() error {
	p.pool.mu.Lock()
	p.pool.stats.DeviceSyncs++
	p.pool.mu.Unlock()
	var start time.Time // read the clock only for the event that reports it
	if p.pool.logOn(slog.LevelDebug) {
		start = time.Now()
	}
	err := p.pool.drv.SynchronizeDevice()
	p.pool.logSync(start, err)
	if err != nil {
		return fmt.Errorf("chunk: wait for the device before unmapping: %w", err)
	}
	return nil
}

// Release unmaps c, mapped at ptr, to give it back with Put. In
// ScrubOnRelease mode it clears the chunk first. The caller has ordered the
// unmap after the device work that touches the chunk (SyncDevice). A failed
// Release leaves c mapped (and, if the unmap failed, maybe cleared).
func (p Lender) Release(ptr acl.DevicePtr, c Chunk) error {
	defer region(RegionRelease).End()
	l, err := p.pool.leaseOf("release", ptr, c)
	if err != nil {
		return err
	}
	scrub := p.pool.scrub == ScrubOnRelease && l.holder != zeroed && l.shared == nil // a shared chunk is freed, and its bytes are another process's too
	if scrub {
		if err := p.pool.drv.Memset(ptr, 0, l.size); err != nil {
			return fmt.Errorf("chunk: scrub at %v: %w", ptr, err)
		}
	}
	if err := p.Unmap(ptr); err != nil {
		return err
	}
	if scrub {
		// Only now: while mapped, the tenant could still write into it.
		p.pool.mu.Lock()
		p.pool.stats.Scrubs++
		l.holder = zeroed
		p.pool.setLease(c.Handle, l)
		p.pool.mu.Unlock()
	}
	return nil
}
