package chunk

import "github.com/vmarena/vmarena/acl"

// Methods of Lender that only the package's tests call: the protocol
// package arena follows does not need them.

// Pending reports whether a chunk of this pool waits at ptr for the device.
func (p Lender) Pending(ptr acl.DevicePtr) bool {
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	_, ok := p.pool.pending.byAddr[ptr]
	return ok
}

// Reclaim takes back, for its tenant, the chunk waiting for the device at
// ptr, still mapped there: no driver call, and no wait. ok is false when no
// chunk waits at ptr, or when the one there is busy: claimed by a relief, or
// being unmapped. Then busy says what to wait for (holding nothing) before
// trying again.
func (p Lender) Reclaim(ptr acl.DevicePtr) (c Chunk, ok bool, busy Busy) {
	var buf [1]Mapped
	ms, busy := p.ReclaimSpan(ptr, ptr+1, buf[:0])
	if len(ms) == 0 {
		return Chunk{}, false, busy
	}
	return ms[0].C, true, busy
}
