package chunk

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/sched"
)

// Sharing chunks with other processes.
//
// A chunk out of the pool can be exported (Export) for another process to
// map, and a chunk another process exported can be imported (Import) and
// lent like one of the pool's own. Either way the chunk is shared: its
// memory may be mapped by two processes at once, so it never goes back to the
// reuse cache, where it could be handed to another tenant of this process
// while the other process still reads or writes it. Put frees it instead,
// which drops only this process's reference: the device keeps the memory
// alive for the other process, and the other process's death frees nothing
// of this one's. A shared chunk is never scrubbed either: its bytes are the
// other process's as much as its tenant's, and the pool does not reuse it.
//
// Budget: an exported chunk counts against the budget of the pool that made
// it until it is put back; an imported chunk counts against the budget of
// the pool that imported it, from Import until it is put back. Importing the
// same memory twice into one pool counts it, and holds it, once.

// shared is what the pool knows about a shared chunk.
type shared struct {
	imported bool
	holders  int                 // imported: how many Imports handed it out and have not put it back
	export   acl.ShareableHandle // exported: its shareable form
	readOnly bool                // exported with acl.ExportReadOnly
	pids     []int32             // exported as a token: the processes allowed to import it
}

// doomedRef is a shared chunk to free, or a second import reference of
// memory the pool holds (extra: freeing it frees no budget), whose free
// failed: never cached, tried again by Trim and Close.
type doomedRef struct {
	h     acl.PhysicalHandle
	size  uintptr // its bytes, which leave the books when it is freed
	extra bool
}

// freeShared frees a shared chunk, or keeps it doomed if the driver refuses.
func (p *Pool) freeShared(r doomedRef) error {
	err := p.drv.FreePhysical(r.h)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.doomed = append(p.doomed, r)
		return fmt.Errorf("chunk: free shared chunk: %w", err)
	}
	p.stats.Frees++
	if !r.extra {
		p.held -= r.size
		p.returns++
	}
	return nil
}

// freeDoomed tries again to free the doomed chunks.
func (p *Pool) freeDoomed() error {
	p.mu.Lock()
	ds := p.doomed
	p.doomed = nil
	p.mu.Unlock()
	var errs []error
	for _, r := range ds {
		errs = append(errs, p.freeShared(r))
	}
	return errors.Join(errs...)
}

// isShared reports whether c is out of the pool and shared.
func (p *Pool) isShared(c Chunk) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out[c.Handle].shared != nil
}

// putSharedLocked puts back a shared chunk: it is freed, unless another
// Import of the same memory still holds it. Called by Put with mu held;
// unlocks it.
func (p *Pool) putSharedLocked(c Chunk, l lease) error {
	if l.shared.holders > 1 {
		l.shared.holders--
		p.mu.Unlock()
		return nil
	}
	p.unlendLocked(c.Handle, l)
	p.freeingLocked(l.size) // on its way back: a growth short of memory waits for it (roomNow)
	p.mu.Unlock()
	sched.At(sched.SharedFree, p)
	_ = p.freeShared(doomedRef{h: c.Handle, size: l.size}) // a failure keeps it doomed, for Trim and Close
	p.mu.Lock()
	p.freedLocked(l.size)
	p.mu.Unlock()
	return nil
}

// Export returns the shareable form of c, a chunk out of this pool, for the
// process pid (as that process's acl.Driver.DeviceGetBareTgid names it) to
// import. The first Export of a chunk exports it (ExportDefault); later ones
// return the same shareable handle. Where the driver shares tokens, pid is
// added to the chunk's allow-list; where it shares descriptors, the
// descriptor is the capability and pid is not used (send it only to pid).
// An exported chunk is freed, not cached, when it is put back. The pool must
// be Config.Shareable where the driver shares descriptors. A chunk exported
// read-only (ExportReadOnly) cannot be exported read-write, nor the other
// way round.
func (p Lender) Export(c Chunk, pid int32) (acl.ShareableHandle, error) {
	return p.pool.export(c, pid, false)
}

// ExportReadOnly is Export of a shareable form the importer can only read,
// where the driver can enforce it (acl.ExportReadOnly: the host driver
// seals the memory against writes through the importer's mappings; ACL
// and CUDA cannot, and the importer's own API enforces it). This process's
// mapping of c stays writable.
func (p Lender) ExportReadOnly(c Chunk, pid int32) (acl.ShareableHandle, error) {
	return p.pool.export(c, pid, true)
}

func (p *Pool) export(c Chunk, pid int32, readOnly bool) (acl.ShareableHandle, error) {
	p.shareMu.Lock()
	defer p.shareMu.Unlock()
	l, err := p.leaseOf("export", 0, c)
	if err != nil {
		return acl.ShareableHandle{}, err
	}
	sharing := p.drv.Caps().Sharing
	if l.shared == nil {
		flags := acl.ExportDefault
		if readOnly {
			flags |= acl.ExportReadOnly
		}
		s, err := p.drv.MemExportToShareableHandle(c.Handle, sharing.HandleType(), flags)
		if err != nil {
			return acl.ShareableHandle{}, fmt.Errorf("chunk: export chunk %#x: %w", uintptr(c.Handle), err)
		}
		p.mu.Lock()
		l = p.out[c.Handle]
		l.shared = &shared{export: s, readOnly: readOnly}
		p.out[c.Handle] = l
		p.stats.Exported++
		p.mu.Unlock()
	}
	if l.shared.imported {
		return acl.ShareableHandle{}, fmt.Errorf("chunk: export chunk %#x: %w: it was imported; only its exporter can share it",
			uintptr(c.Handle), acl.ErrInvalidParam)
	}
	if l.shared.readOnly != readOnly {
		was := map[bool]string{false: "read-write", true: "read-only"}
		return acl.ShareableHandle{}, fmt.Errorf("chunk: export chunk %#x %s: %w: it was exported %s (once per chunk)",
			uintptr(c.Handle), was[readOnly], acl.ErrInvalidParam, was[l.shared.readOnly])
	}
	if sharing == acl.SharingToken && pid != 0 && !slices.Contains(l.shared.pids, pid) {
		pids := append(slices.Clone(l.shared.pids), pid)
		if err := p.drv.MemSetPidToShareableHandle(l.shared.export, pids); err != nil {
			return acl.ShareableHandle{}, fmt.Errorf("chunk: allow process %d to import chunk %#x: %w", pid, uintptr(c.Handle), err)
		}
		p.mu.Lock()
		l.shared.pids = pids
		p.mu.Unlock()
	}
	return l.shared.export, nil
}

// Import imports the memory another process exported as s, a chunk of size
// bytes, and lends it to tenant t like a chunk of the pool's own (map it
// with MapImported, give it back with Put). The size is the Chunk's Size
// and what the import books: a positive multiple of the pool's TailSize (a
// multiple of the driver's granularity) no larger than the driver's largest
// reservation, one of the pool's own sizes or not, since an imported chunk
// is never cached (acl.ErrInvalidParam otherwise, before any driver call). It
// counts against the budget (ErrBudget before any driver call). The chunk
// holds t's bytes, so it is never scrubbed; it is freed, not cached, when
// put back. Importing memory the pool holds already returns the same chunk,
// which must then be put back as many times; importing it again as another
// size fails with acl.ErrInvalidHandle.
func (p Lender) Import(t Tenant, s acl.ShareableHandle, size uintptr) (Chunk, error) {
	if !p.pool.made() {
		return Chunk{}, errNotMade
	}
	if size == 0 || size%p.pool.tail != 0 || size > p.pool.drv.Caps().ReserveLimit() {
		return Chunk{}, fmt.Errorf("chunk: import %v: %w: a chunk of %d bytes: want a positive multiple of the pool's tail size %d, at most the driver's largest reservation",
			s, acl.ErrInvalidParam, size, p.pool.tail)
	}
	if t == 0 {
		t = NewTenant()
	}
	p.pool.dev.note(t)
	p.pool.mu.Lock()
	if p.pool.closed {
		p.pool.mu.Unlock()
		return Chunk{}, errClosed
	}
	if b := p.pool.budget.Load(); b != 0 && p.pool.held+size > b {
		held := p.pool.held
		p.pool.stats.Failures++
		p.pool.mu.Unlock()
		return Chunk{}, fmt.Errorf("chunk: %w: %w: %d of %d bytes held, importing %d more", ErrBudget, acl.ErrOutOfMemory,
			held, b, size)
	}
	p.pool.held += size
	p.pool.mu.Unlock()

	h, err := p.pool.drv.MemImportFromShareableHandle(s, p.pool.drv.Device())

	p.pool.mu.Lock()
	if err != nil {
		p.pool.held -= size
		if errors.Is(err, acl.ErrOutOfMemory) { // Failures are shortages (vmarena_pool_ooms_total)
			p.pool.stats.Failures++
		}
		p.pool.mu.Unlock()
		return Chunk{}, fmt.Errorf("chunk: import %v: %w", s, err)
	}
	l, ok := p.pool.out[h]
	if !ok {
		p.pool.lendLocked(h, lease{tenant: t, holder: t, size: size, shared: &shared{imported: true, holders: 1}})
		p.pool.stats.Imported++
		p.pool.mu.Unlock()
		return Chunk{h, size}, nil
	}
	// The driver handed back memory the pool holds already, with one more
	// reference (ACL's rule). Drop that reference: the pool's first one
	// keeps the memory, and counts it once.
	p.pool.held -= size
	p.pool.mu.Unlock()
	var ferr error
	if err := p.pool.freeShared(doomedRef{h: h, size: size, extra: true}); err != nil {
		ferr = fmt.Errorf("chunk: import %v: drop the second reference: %w", s, err)
	}
	if l.shared == nil || !l.shared.imported {
		return Chunk{}, errors.Join(ferr, fmt.Errorf("chunk: import %v: %w: the driver returned chunk %#x, which the pool lent out as its own",
			s, acl.ErrInvalidHandle, uintptr(h)))
	}
	if l.size != size {
		return Chunk{}, errors.Join(ferr, fmt.Errorf("chunk: import %v: %w: chunk %#x was imported as %d bytes, not %d",
			s, acl.ErrInvalidHandle, uintptr(h), l.size, size))
	}
	p.pool.mu.Lock()
	l.shared.holders++
	p.pool.stats.Imported++
	p.pool.mu.Unlock()
	return Chunk{h, l.size}, nil
}

// MapImported maps imported chunks cs side by side from ptr and grants the
// device access to them: read-only when readOnly is set and the driver can
// map read-only (acl.Caps.ReadOnly; the caller enforces it otherwise), else
// read-write. Nothing is scrubbed: the chunks hold what the other process
// shared. A failed MapImported unmaps what it mapped, top down; a chunk it
// cannot unmap is listed in a *LeftMappedError. The chunks are given back as
// any others: Release or ReleaseAfter, then Put.
func (p Lender) MapImported(ptr acl.DevicePtr, cs []Chunk, readOnly bool) error {
	at := ptr
	for _, c := range cs {
		if _, err := p.pool.leaseOf("map", at, c); err != nil {
			return err
		}
		at = at.Add(c.Size)
	}
	at = ptr
	for i, c := range cs {
		if err := p.pool.drv.MapMem(at, c.Size, 0, c.Handle, 0); err != nil {
			return p.pool.unmapRange(ptr, cs[:i], LeftNoAccess, fmt.Errorf("chunk: map at %v: %w", at, err))
		}
		at = at.Add(c.Size)
	}
	desc := p.pool.access
	if readOnly && p.pool.drv.Caps().ReadOnly {
		desc = acl.ReadWrite(p.pool.drv.Device())
		desc[0].Flags = acl.MemAccessRead
	}
	if err := p.pool.grant(ptr, cs, desc); err != nil {
		return p.pool.unmapRange(ptr, cs, LeftNoAccess, err)
	}
	return nil
}
