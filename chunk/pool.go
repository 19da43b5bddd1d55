package chunk

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
)

// ErrBudget is returned (wrapped, together with acl.ErrOutOfMemory) when a
// Get would take the pool past Config.Budget.
var ErrBudget = errors.New("chunk: pool budget exhausted")

// ErrClosed is returned by a Pool after Close.
var ErrClosed = errors.New("chunk: pool closed")

// ErrMapped is matched by the error of a Map that mapped the chunk, failed
// after that (granting access or scrubbing), and could not unmap it again:
// the chunk is still mapped at the address, without access or unscrubbed,
// and must be unmapped before it is Put back.
var ErrMapped = errors.New("chunk: left mapped by a failed Map")

// Scrub says when a pool clears a chunk's bytes (aclrtMemset to zero), so that
// no owner reads bytes another owner wrote.
type Scrub int

const (
	// ScrubOnReuse, the default, clears a chunk when it is mapped for an owner
	// other than the one whose bytes it may hold: a chunk another arena gave
	// back, or fresh physical memory the driver does not promise is zero
	// (Config.FreshZeroed). An arena that takes its own chunk back skips the
	// clear, so the common shrink-and-regrow cycle costs nothing.
	ScrubOnReuse Scrub = iota
	// ScrubOnRelease clears a chunk when its owner gives it back (Release,
	// before the unmap), so the cache holds zeroed chunks. Chunks that come
	// back some other way, and fresh ones, are cleared on reuse as above. It
	// costs a clear per released chunk, whether or not anyone reuses it.
	ScrubOnRelease
	// ScrubNever never clears: a chunk's next owner may read what its previous
	// owner wrote. For pools whose arenas all serve one tenant.
	ScrubNever
)

// String returns the mode's name.
func (s Scrub) String() string {
	switch s {
	case ScrubOnReuse:
		return "on-reuse"
	case ScrubOnRelease:
		return "on-release"
	case ScrubNever:
		return "never"
	}
	return fmt.Sprintf("chunk.Scrub(%d)", int(s))
}

// Owner identifies a user of a pool, usually an arena, so that the pool can
// tell whose bytes a chunk holds. Make one with NewOwner. The zero Owner is
// anonymous: every Get by it counts as a different owner.
type Owner uint64

var lastOwner atomic.Uint64

// NewOwner returns an Owner distinct from every other in the process.
func NewOwner() Owner { return Owner(lastOwner.Add(1)) }

// Holders of a chunk's bytes besides owners.
const (
	zeroed  Owner = 0         // the bytes are zero
	unknown Owner = ^Owner(0) // fresh memory the driver does not promise is zero
)

// DefaultMaxCached is the reuse cache bound when Config.MaxCached is 0.
const DefaultMaxCached = 256

// Config configures a Pool. The zero value gives granularity-sized chunks of
// HBM, a 256-chunk reuse cache and no budget.
type Config struct {
	// Size is the chunk size in bytes, a multiple of the driver's
	// granularity. 0 means the granularity (2 MiB on ACL).
	Size int
	// MaxCached bounds the reuse cache, in chunks. 0 means DefaultMaxCached;
	// a negative value disables the cache.
	MaxCached int
	// Budget caps the physical bytes the pool holds (in use plus cached).
	// 0 means no cap beyond the device's memory.
	Budget int64
	// MemAttr is the kind of memory to allocate. 0 means acl.HBMMemHuge.
	MemAttr acl.MemAttr
	// Scrub says when chunks are cleared so that no owner reads another's
	// bytes. The zero value is ScrubOnReuse.
	Scrub Scrub
	// FreshZeroed promises that the driver's MallocPhysical returns zeroed
	// memory, so fresh chunks need no scrub. ACL does not promise it (the
	// runtime clears memory it maps for itself), so on a device a fresh chunk
	// may hold data freed by this or another process. A driver that
	// implements acl.Zeroing (the host driver) needs no promise.
	FreshZeroed bool
}

// Chunk is one physical allocation of the pool's chunk size.
type Chunk struct {
	Handle acl.PhysicalHandle
}

// Stats describes a pool at one moment.
type Stats struct {
	ChunkSize int   // bytes per chunk
	InUse     int   // chunks handed out by Get and not yet Put back
	Cached    int   // chunks in the reuse cache
	HeldBytes int64 // physical bytes held: (InUse + Cached) × ChunkSize
	Budget    int64 // Config.Budget; 0 when none
	Hits      int64 // Gets served from the cache
	Misses    int64 // Gets that called MallocPhysical
	Allocs    int64 // successful MallocPhysical calls
	Frees     int64 // FreePhysical calls
	Evictions int64 // Puts that freed a chunk because the cache was full
	Failures  int64 // Gets that failed (budget or driver)
	Scrubs    int64 // chunks cleared so that no owner read another's bytes
}

// Pool hands out chunks of one size from one driver.
type Pool struct {
	drv       acl.Driver
	size      uintptr
	prop      acl.PhysicalMemProp
	access    []acl.MemAccessDesc
	implicit  atomic.Bool // the driver has no MemSetAccess: mappings are accessible as made
	maxCached int
	budget    uintptr
	scrub     Scrub
	fresh     Owner // the holder of a fresh chunk's bytes: zeroed or unknown

	mu     sync.Mutex
	closed bool
	cache  []entry                      // LIFO: the chunk unmapped last is reused first
	out    map[acl.PhysicalHandle]lease // chunks handed out by Get and not yet Put back
	held   uintptr                      // bytes in use, cached, or being allocated
	stats  Stats
}

// entry is a cached chunk and whose bytes it holds.
type entry struct {
	h      acl.PhysicalHandle
	holder Owner
}

// lease is a chunk out of the pool: who has it, and whose bytes it holds.
type lease struct {
	owner  Owner
	holder Owner
}

// New returns a pool of chunks from drv.
func New(drv acl.Driver, cfg Config) (*Pool, error) {
	if drv == nil || isNilPointer(drv) {
		return nil, fmt.Errorf("chunk: %w: nil driver", acl.ErrInvalidParam)
	}
	if cfg.Size < 0 || cfg.Budget < 0 || cfg.Scrub < ScrubOnReuse || cfg.Scrub > ScrubNever {
		return nil, fmt.Errorf("chunk: %w: size %d, budget %d, scrub %v", acl.ErrInvalidParam, cfg.Size, cfg.Budget, cfg.Scrub)
	}
	prop := acl.DeviceProp(drv.Device(), cfg.MemAttr)
	g, err := drv.MemGetAllocationGranularity(&prop, acl.GranularityMinimum)
	if err != nil {
		return nil, fmt.Errorf("chunk: granularity: %w", err)
	}
	size := uintptr(cfg.Size)
	if size == 0 {
		size = g
	}
	if size%g != 0 {
		return nil, fmt.Errorf("chunk: %w: size %d is not a multiple of the granularity %d", acl.ErrInvalidParam, size, g)
	}
	maxCached := cfg.MaxCached
	switch {
	case maxCached == 0:
		maxCached = DefaultMaxCached
	case maxCached < 0:
		maxCached = 0
	}
	p := &Pool{
		drv:       drv,
		size:      size,
		prop:      prop,
		access:    acl.ReadWrite(drv.Device()),
		maxCached: maxCached,
		budget:    uintptr(cfg.Budget),
		scrub:     cfg.Scrub,
		fresh:     unknown,
		out:       make(map[acl.PhysicalHandle]lease),
	}
	if cfg.FreshZeroed || drv.Caps().Fresh == acl.FreshZeroed {
		p.fresh = zeroed
	}
	p.stats.ChunkSize = int(size)
	p.stats.Budget = cfg.Budget
	return p, nil
}

// isNilPointer reports whether d is a nil pointer in an interface, whose
// methods would dereference it.
func isNilPointer(d acl.Driver) bool {
	v := reflect.ValueOf(d)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// Driver returns the pool's driver.
func (p *Pool) Driver() acl.Driver { return p.drv }

// ChunkSize returns the size of every chunk, in bytes.
func (p *Pool) ChunkSize() int { return int(p.size) }

// Get returns a chunk for an anonymous owner: GetFor(0).
func (p *Pool) Get() (Chunk, error) { return p.GetFor(0) }

// GetFor returns a chunk for owner, from the cache when it has one (one that
// holds owner's bytes or zeros, if any does) and from the driver otherwise. It
// fails with an error matching acl.ErrOutOfMemory when the budget or the
// device is exhausted, and with ErrClosed after Close.
func (p *Pool) GetFor(owner Owner) (Chunk, error) {
	if owner == 0 || owner == unknown {
		owner = NewOwner()
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return Chunk{}, ErrClosed
	}
	if n := len(p.cache); n > 0 {
		i := n - 1
		for j := i; j >= 0; j-- {
			if h := p.cache[j].holder; h == owner || h == zeroed {
				i = j
				break
			}
		}
		e := p.cache[i]
		p.cache = append(p.cache[:i], p.cache[i+1:]...)
		p.out[e.h] = lease{owner: owner, holder: e.holder}
		p.stats.Hits++
		p.stats.InUse++
		p.stats.Cached--
		p.mu.Unlock()
		return Chunk{e.h}, nil
	}
	if p.budget != 0 && (p.held > p.budget || p.budget-p.held < p.size) {
		held := p.held
		p.stats.Failures++
		p.mu.Unlock()
		return Chunk{}, fmt.Errorf("%w: %w: %d of %d bytes held, a chunk is %d", ErrBudget, acl.ErrOutOfMemory, held, p.budget, p.size)
	}
	p.held += p.size
	p.stats.Misses++
	p.mu.Unlock()

	h, err := p.drv.MallocPhysical(p.size, &p.prop, 0)

	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.held -= p.size
		p.stats.Failures++
		return Chunk{}, fmt.Errorf("chunk: allocate %d bytes: %w", p.size, err)
	}
	p.stats.Allocs++
	p.stats.InUse++
	p.out[h] = lease{owner: owner, holder: p.fresh}
	return Chunk{h}, nil
}

// Put gives back a chunk that Get returned and that is no longer mapped. It
// goes to the cache, or back to the driver when the cache is full or the pool
// is closed. Put fails with acl.ErrInvalidParam, and changes nothing, for a
// chunk that is not out of this pool (put back twice, or never got). Should
// the driver fail to free the chunk, the pool keeps it in the cache, where
// Trim and Close try again and report the error.
func (p *Pool) Put(c Chunk) error {
	p.mu.Lock()
	l, ok := p.out[c.Handle]
	if !ok {
		p.mu.Unlock()
		return fmt.Errorf("chunk: %w: put of chunk %#x, which is not out of this pool", acl.ErrInvalidParam, uintptr(c.Handle))
	}
	delete(p.out, c.Handle)
	p.stats.InUse--
	e := entry{c.Handle, l.holder}
	if !p.closed && len(p.cache) < p.maxCached {
		p.cache = append(p.cache, e)
		p.stats.Cached++
		p.mu.Unlock()
		return nil
	}
	if !p.closed {
		p.stats.Evictions++
	}
	p.mu.Unlock()
	_ = p.free(e) // a failure keeps the chunk cached, for Trim and Close to retry
	return nil
}

// free gives e back to the driver. If the driver refuses, the chunk goes
// back to the cache (past its bound if need be) so that it is not lost.
func (p *Pool) free(e entry) error {
	err := p.drv.FreePhysical(e.h)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Frees++
	if err != nil {
		// The driver kept the memory; so do we, and the budget stays true.
		p.cache = append(p.cache, e)
		p.stats.Cached++
		return fmt.Errorf("chunk: free: %w", err)
	}
	p.held -= p.size
	return nil
}

// Map maps c at ptr (a multiple of the chunk size inside a reservation),
// grants the device read-write access to it and, when c may hold another
// owner's bytes (see Scrub), clears it. If the driver has no MemSetAccess
// (ACL before 8.5 answers 207000), mappings are accessible as made and the
// pool stops asking.
//
// A failed Map leaves c unmapped, unless the error matches ErrMapped: then the
// step after the map failed and so did the unmap that undoes it.
func (p *Pool) Map(ptr acl.DevicePtr, c Chunk) error {
	l, err := p.leaseOf("map", ptr, c)
	if err != nil {
		return err
	}
	if err := p.drv.MapMem(ptr, p.size, 0, c.Handle, 0); err != nil {
		return fmt.Errorf("chunk: map at %v: %w", ptr, err)
	}
	if !p.implicit.Load() {
		err := p.drv.MemSetAccess(ptr, p.size, p.access)
		switch {
		case errors.Is(err, acl.ErrNotSupported):
			p.implicit.Store(true)
		case err != nil:
			return p.undoMap(ptr, fmt.Errorf("chunk: set access at %v: %w", ptr, err))
		}
	}
	scrub := p.scrub != ScrubNever && l.holder != zeroed && l.holder != l.owner
	if scrub {
		if err := p.drv.Memset(ptr, 0, p.size); err != nil {
			return p.undoMap(ptr, fmt.Errorf("chunk: scrub at %v: %w", ptr, err))
		}
	}
	p.mu.Lock()
	if scrub {
		p.stats.Scrubs++
	}
	l.holder = l.owner // from now on the owner may write into it
	p.setLease(c.Handle, l)
	p.mu.Unlock()
	return nil
}

// leaseOf returns the lease of c, which must be out of this pool.
func (p *Pool) leaseOf(op string, ptr acl.DevicePtr, c Chunk) (lease, error) {
	p.mu.Lock()
	l, ok := p.out[c.Handle]
	p.mu.Unlock()
	if !ok {
		return lease{}, fmt.Errorf("chunk: %s at %v: %w: chunk %#x is not out of this pool", op, ptr, acl.ErrInvalidParam, uintptr(c.Handle))
	}
	return l, nil
}

// setLease records l for h, if h is still out (a caller that put the chunk
// back while mapping it gets no say). Call with mu held.
func (p *Pool) setLease(h acl.PhysicalHandle, l lease) {
	if _, ok := p.out[h]; ok {
		p.out[h] = l
	}
}

// undoMap unmaps the chunk a failed Map mapped at ptr.
func (p *Pool) undoMap(ptr acl.DevicePtr, err error) error {
	if uerr := p.drv.UnmapMem(ptr); uerr != nil {
		return fmt.Errorf("%w: %w (and unmap: %w)", ErrMapped, err, uerr)
	}
	return err
}

// Unmap removes the mapping of a chunk at ptr. The chunk can then be Put
// back or mapped again.
func (p *Pool) Unmap(ptr acl.DevicePtr) error {
	if err := p.drv.UnmapMem(ptr); err != nil {
		return fmt.Errorf("chunk: unmap at %v: %w", ptr, err)
	}
	return nil
}

// Release unmaps c, mapped at ptr, to give it back with Put. In
// ScrubOnRelease mode it clears the chunk first. A failed Release leaves c
// mapped (and, if the unmap failed, maybe cleared).
func (p *Pool) Release(ptr acl.DevicePtr, c Chunk) error {
	l, err := p.leaseOf("release", ptr, c)
	if err != nil {
		return err
	}
	scrub := p.scrub == ScrubOnRelease && l.holder != zeroed
	if scrub {
		if err := p.drv.Memset(ptr, 0, p.size); err != nil {
			return fmt.Errorf("chunk: scrub at %v: %w", ptr, err)
		}
	}
	if err := p.Unmap(ptr); err != nil {
		return err
	}
	if scrub {
		// Only now: while mapped, the owner could still write into it.
		p.mu.Lock()
		p.stats.Scrubs++
		l.holder = zeroed
		p.setLease(c.Handle, l)
		p.mu.Unlock()
	}
	return nil
}

// Trim frees every cached chunk. A chunk the driver fails to free stays
// cached, and the error says so.
func (p *Pool) Trim() error {
	p.mu.Lock()
	cache := p.cache
	p.cache = nil
	p.stats.Cached = 0
	p.mu.Unlock()
	var errs []error
	for _, e := range cache {
		errs = append(errs, p.free(e))
	}
	return errors.Join(errs...)
}

// Stats returns the pool's counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.HeldBytes = int64(p.held)
	return s
}

// Close frees the cached chunks. Chunks still out are freed as they are Put
// back; the first Close reports them as an error, since their owners leaked
// them or have not closed yet. Close is safe to call more than once; a later
// call frees what an earlier one could not.
func (p *Pool) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	first := !p.closed
	p.closed = true
	inUse := p.stats.InUse
	p.mu.Unlock()
	err := p.Trim()
	if first && inUse > 0 {
		err = errors.Join(err, fmt.Errorf("chunk: pool closed with %d chunks still in use", inUse))
	}
	return err
}
