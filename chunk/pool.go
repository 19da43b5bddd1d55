package chunk

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
)

// ErrBudget is returned (wrapped, together with acl.ErrOutOfMemory) when a
// Get would take the pool past Config.Budget.
var ErrBudget = errors.New("chunk: pool budget exhausted")

// ErrClosed is returned by a Pool after Close.
var ErrClosed = errors.New("chunk: pool closed")

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

	mu     sync.Mutex
	closed bool
	cache  []acl.PhysicalHandle // LIFO: the chunk unmapped last is reused first
	held   uintptr              // bytes in use, cached, or being allocated
	stats  Stats
}

// New returns a pool of chunks from drv.
func New(drv acl.Driver, cfg Config) (*Pool, error) {
	if drv == nil {
		return nil, fmt.Errorf("chunk: %w: nil driver", acl.ErrInvalidParam)
	}
	if cfg.Size < 0 || cfg.Budget < 0 {
		return nil, fmt.Errorf("chunk: %w: size %d, budget %d", acl.ErrInvalidParam, cfg.Size, cfg.Budget)
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
	}
	p.stats.ChunkSize = int(size)
	p.stats.Budget = cfg.Budget
	return p, nil
}

// Driver returns the pool's driver.
func (p *Pool) Driver() acl.Driver { return p.drv }

// ChunkSize returns the size of every chunk, in bytes.
func (p *Pool) ChunkSize() int { return int(p.size) }

// Get returns a chunk, from the cache when it has one and from the driver
// otherwise. It fails with an error matching acl.ErrOutOfMemory when the
// budget or the device is exhausted.
func (p *Pool) Get() (Chunk, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return Chunk{}, ErrClosed
	}
	if n := len(p.cache); n > 0 {
		h := p.cache[n-1]
		p.cache = p.cache[:n-1]
		p.stats.Hits++
		p.stats.InUse++
		p.stats.Cached--
		p.mu.Unlock()
		return Chunk{h}, nil
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
	return Chunk{h}, nil
}

// Put gives back a chunk that Get returned and that is no longer mapped. It
// goes to the cache, or back to the driver when the cache is full or the pool
// is closed.
func (p *Pool) Put(c Chunk) error {
	if c.Handle == 0 {
		return fmt.Errorf("chunk: %w: put of a zero chunk", acl.ErrInvalidParam)
	}
	p.mu.Lock()
	p.stats.InUse--
	if !p.closed && len(p.cache) < p.maxCached {
		p.cache = append(p.cache, c.Handle)
		p.stats.Cached++
		p.mu.Unlock()
		return nil
	}
	if !p.closed {
		p.stats.Evictions++
	}
	p.mu.Unlock()
	return p.free(c.Handle)
}

func (p *Pool) free(h acl.PhysicalHandle) error {
	err := p.drv.FreePhysical(h)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Frees++
	if err != nil {
		// The driver kept the memory; so do our books, so the budget stays true.
		return fmt.Errorf("chunk: free: %w", err)
	}
	p.held -= p.size
	return nil
}

// Map maps c at ptr (a multiple of the chunk size inside a reservation) and
// grants the device read-write access to it. If the driver has no
// MemSetAccess (ACL before 8.5 answers 207000), mappings are accessible as
// made and the pool stops asking.
func (p *Pool) Map(ptr acl.DevicePtr, c Chunk) error {
	if err := p.drv.MapMem(ptr, p.size, 0, c.Handle, 0); err != nil {
		return fmt.Errorf("chunk: map at %v: %w", ptr, err)
	}
	if p.implicit.Load() {
		return nil
	}
	err := p.drv.MemSetAccess(ptr, p.size, p.access)
	if errors.Is(err, acl.ErrNotSupported) {
		p.implicit.Store(true)
		return nil
	}
	if err != nil {
		if uerr := p.drv.UnmapMem(ptr); uerr != nil {
			return fmt.Errorf("chunk: set access at %v: %w (and unmap: %w)", ptr, err, uerr)
		}
		return fmt.Errorf("chunk: set access at %v: %w", ptr, err)
	}
	return nil
}

// Unmap removes the mapping of a chunk at ptr. The chunk can then be Put
// back or mapped again.
func (p *Pool) Unmap(ptr acl.DevicePtr) error {
	if err := p.drv.UnmapMem(ptr); err != nil {
		return fmt.Errorf("chunk: unmap at %v: %w", ptr, err)
	}
	return nil
}

// Trim frees every cached chunk.
func (p *Pool) Trim() error {
	p.mu.Lock()
	cache := p.cache
	p.cache = nil
	p.stats.Cached = 0
	p.mu.Unlock()
	var errs []error
	for _, h := range cache {
		errs = append(errs, p.free(h))
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
// back; Close reports them as an error, since their owners leaked them or have
// not closed yet. Close is safe to call more than once.
func (p *Pool) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	inUse := p.stats.InUse
	p.mu.Unlock()
	err := p.Trim()
	if inUse > 0 {
		err = errors.Join(err, fmt.Errorf("chunk: pool closed with %d chunks still in use", inUse))
	}
	return err
}
