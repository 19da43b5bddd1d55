package arena

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/chunk"
)

// Config configures an Arena. The zero value works: an arena on the process's
// default host driver, reserving as much address space as the device has
// memory, with a private pool of 2 MiB chunks.
type Config struct {
	// Driver is the device to allocate on. nil means the pool's driver, or
	// the process-wide host driver (host.Default) when Pool is nil too.
	Driver acl.Driver
	// Pool supplies the physical chunks and may be shared by many arenas
	// (and so is their budget). nil means a private pool built from Chunk,
	// closed with the arena.
	Pool *chunk.Pool
	// Chunk configures the private pool when Pool is nil.
	Chunk chunk.Config
	// Reserve is the address space to reserve, in bytes, rounded up to the
	// chunk size: the most the arena can ever map. 0 means the device's total
	// memory (at most 128 GiB, ACL's limit per reservation), halved until the
	// driver grants it.
	Reserve int64
}

// MaxReserve is the largest reservation an arena supports (1 TiB): offsets
// fit in 40 bits of the allocator's state word.
const MaxReserve = 1 << lenBits

// The allocator's state word: the bytes in use (Len) in the low 40 bits, an
// epoch above them that every Truncate, Shrink and Reset advances, and a
// frozen bit that stops lock-free Allocs while one of those runs.
const (
	lenBits   = 40
	lenMask   = 1<<lenBits - 1
	frozen    = 1 << 63
	epochOne  = 1 << lenBits
	epochMask = (frozen - 1) &^ lenMask
)

// Arena is a growable region of device memory with a stable base address.
type Arena struct {
	state atomic.Uint64 // epoch | len, see lenBits
	cap   atomic.Uint64 // bytes mapped

	base      acl.DevicePtr
	reserved  uint64
	chunkSize uint64
	maxAlign  uint64 // the largest alignment base guarantees
	drv       acl.Driver
	pool      *chunk.Pool
	ownPool   bool

	mu     sync.Mutex    // serialises the slow path and everything that calls the driver
	closed atomic.Bool   // set under mu; read without it by Buffer checks
	chunks []chunk.Chunk // mapped chunks, in address order
	peak   uint64        // the most bytes in use up to the last freeze
	maps   uint64
	unmaps uint64
	grows  uint64
}

// New reserves the arena's address space. It maps nothing: the first Grow or
// Alloc does.
func New(cfg Config) (*Arena, error) {
	if cfg.Reserve < 0 || cfg.Reserve > MaxReserve {
		return nil, fmt.Errorf("arena: %w: reserve %d bytes (want 0 to %d)", ErrInvalid, cfg.Reserve, int64(MaxReserve))
	}
	pool, own := cfg.Pool, false
	drv := cfg.Driver
	switch {
	case pool != nil && drv != nil && pool.Driver() != drv:
		return nil, fmt.Errorf("arena: %w: Config.Driver differs from the pool's driver", ErrInvalid)
	case pool != nil:
		drv = pool.Driver()
	case drv == nil:
		d, err := host.Default()
		if err != nil {
			return nil, fmt.Errorf("arena: default host driver: %w", err)
		}
		drv = d
	}
	if pool == nil {
		p, err := chunk.New(drv, cfg.Chunk)
		if err != nil {
			return nil, fmt.Errorf("arena: %w", err)
		}
		pool, own = p, true
	}
	a := &Arena{drv: drv, pool: pool, ownPool: own, chunkSize: uint64(pool.ChunkSize())}
	if err := a.reserve(uint64(cfg.Reserve)); err != nil {
		if own {
			err = errors.Join(err, pool.Close())
		}
		return nil, err
	}
	a.maxAlign = 1 << min(bits.TrailingZeros64(uint64(a.base)), 30)
	return a, nil
}

func (a *Arena) roundUp(n uint64) uint64 { return (n + a.chunkSize - 1) / a.chunkSize * a.chunkSize }

// reserve reserves size bytes, or, when size is 0, the device's memory
// halved until the driver agrees.
func (a *Arena) reserve(size uint64) error {
	const op = "arena: reserve"
	if size != 0 {
		size = a.roundUp(size)
		if size > MaxReserve {
			return fmt.Errorf("%s %d bytes: %w: more than %d", op, size, ErrInvalid, int64(MaxReserve))
		}
		p, err := a.drv.ReserveMemAddress(uintptr(size), 0, 0, 0)
		if err != nil {
			return fmt.Errorf("%s %d bytes: %w", op, size, err)
		}
		a.base, a.reserved = p, size
		return nil
	}
	_, total, err := a.drv.GetMemInfo(acl.HBMMem)
	if err != nil {
		return fmt.Errorf("%s: device memory: %w", op, err)
	}
	size = min(a.roundUp(uint64(total)), acl.MaxReserve/a.chunkSize*a.chunkSize)
	var errs []error
	for size >= a.chunkSize {
		p, err := a.drv.ReserveMemAddress(uintptr(size), 0, 0, 0)
		if err == nil {
			a.base, a.reserved = p, size
			return nil
		}
		errs = append(errs, fmt.Errorf("%d bytes: %w", size, err))
		size = size / 2 / a.chunkSize * a.chunkSize
	}
	return fmt.Errorf("%s: %w", op, errors.Join(errs...))
}

// Base returns the device address of the first byte of the arena. It never
// changes.
func (a *Arena) Base() acl.DevicePtr { return a.base }

// Len returns the bytes in use: the end of the last allocation.
func (a *Arena) Len() int { return int(a.state.Load() & lenMask) }

// Cap returns the bytes mapped, a multiple of the chunk size.
func (a *Arena) Cap() int { return int(a.cap.Load()) }

// Reserved returns the bytes of address space the arena reserved: the most
// Cap can reach.
func (a *Arena) Reserved() int { return int(a.reserved) }

// ChunkSize returns the bytes mapped at a time.
func (a *Arena) ChunkSize() int { return int(a.chunkSize) }

// Driver returns the device driver the arena allocates on.
func (a *Arena) Driver() acl.Driver { return a.drv }

// Pool returns the chunk pool the arena draws from.
func (a *Arena) Pool() *chunk.Pool { return a.pool }

// Alloc returns a buffer of size bytes whose offset is a multiple of align (a
// power of two, at most the alignment of Base, which is at least the chunk
// granularity). It maps more memory when the mapped space is used up, so it
// can fail with ErrOutOfMemory or ErrExhausted; within Cap it makes no driver
// call, takes no lock and allocates nothing on the Go heap.
func (a *Arena) Alloc(size, align int) (Buffer, error) {
	if a == nil {
		return Buffer{}, ErrClosed
	}
	if size < 0 || align <= 0 || align&(align-1) != 0 || uint64(align) > a.maxAlign {
		return Buffer{}, a.badAlloc(size, align)
	}
	s := a.state.Load()
	if s&frozen == 0 {
		start := (s&lenMask + uint64(align) - 1) &^ (uint64(align) - 1)
		end := start + uint64(size) // cannot wrap: start < 2^41, size < 2^63
		if end <= a.cap.Load() && a.state.CompareAndSwap(s, s&^lenMask|end) {
			return Buffer{a: a, off: uintptr(start), n: uintptr(size)}, nil
		}
	}
	return a.allocSlow(uint64(size), uint64(align))
}

func (a *Arena) badAlloc(size, align int) error {
	switch {
	case size < 0:
		return fmt.Errorf("arena: alloc: %w: negative size %d", ErrInvalid, size)
	case align <= 0 || align&(align-1) != 0:
		return fmt.Errorf("arena: alloc: %w: alignment %d is not a power of two", ErrInvalid, align)
	}
	return fmt.Errorf("arena: alloc: %w: alignment %d exceeds the base's %d", ErrInvalid, align, a.maxAlign)
}

func (a *Arena) allocSlow(size, align uint64) (Buffer, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return Buffer{}, ErrClosed
	}
	for {
		s := a.state.Load() // never frozen: freezing happens under mu
		start := (s&lenMask + align - 1) &^ (align - 1)
		if size > a.reserved || start > a.reserved-size {
			return Buffer{}, fmt.Errorf("arena: alloc %d bytes at %d: %w: %d bytes reserved", size, start, ErrExhausted, a.reserved)
		}
		end := start + size
		if end > a.cap.Load() {
			if err := a.growLocked(end); err != nil {
				return Buffer{}, fmt.Errorf("arena: alloc %d bytes: %w", size, err)
			}
		}
		// Lock-free Allocs may have moved Len meanwhile; if so, go round.
		if a.state.CompareAndSwap(s, s&^lenMask|end) {
			return Buffer{a: a, off: uintptr(start), n: uintptr(size)}, nil
		}
	}
}

// Grow makes sure that at least n more bytes can be allocated (with
// alignment 1) without mapping, like bytes.Buffer.Grow: afterwards
// Cap-Len ≥ n. It maps whole chunks from the pool. A failed Grow leaves the
// arena as it was and returns an error matching ErrOutOfMemory (device or
// budget exhausted), ErrExhausted (beyond the reservation), ErrInvalid
// (negative n) or ErrClosed.
func (a *Arena) Grow(n int) error {
	if a == nil {
		return ErrClosed
	}
	if n < 0 {
		return fmt.Errorf("arena: grow: %w: negative size %d", ErrInvalid, n)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return ErrClosed
	}
	l := a.state.Load() & lenMask
	if uint64(n) > a.reserved-l {
		return fmt.Errorf("arena: grow by %d bytes at %d: %w: %d bytes reserved", n, l, ErrExhausted, a.reserved)
	}
	if err := a.growLocked(l + uint64(n)); err != nil {
		return fmt.Errorf("arena: grow by %d bytes: %w", n, err)
	}
	return nil
}

// growLocked maps chunks until Cap ≥ target (≤ reserved). On failure it
// unmaps what it mapped and returns the chunks to the pool.
func (a *Arena) growLocked(target uint64) error {
	c := a.cap.Load()
	if target <= c {
		return nil
	}
	newCap := a.roundUp(target)
	need := int((newCap - c) / a.chunkSize)
	var err error
	got := a.chunks
	for i := range need {
		var ch chunk.Chunk
		ch, err = a.pool.Get()
		if err != nil {
			break
		}
		at := a.base.Add(uintptr(c + uint64(i)*a.chunkSize))
		if err = a.pool.Map(at, ch); err != nil {
			err = errors.Join(err, a.pool.Put(ch))
			break
		}
		a.maps++
		got = append(got, ch)
	}
	if err == nil {
		a.chunks = got
		a.grows++
		a.cap.Store(newCap)
		return nil
	}
	// Roll back, top down. Should an unmap fail, keep the chunks below it
	// (they are mapped and contiguous) rather than leak them.
	for i := len(got) - 1; i >= len(a.chunks); i-- {
		at := a.base.Add(uintptr(c + uint64(i-len(a.chunks))*a.chunkSize))
		if uerr := a.pool.Unmap(at); uerr != nil {
			err = errors.Join(err, uerr)
			a.cap.Store(c + uint64(i-len(a.chunks)+1)*a.chunkSize)
			a.chunks = got[:i+1]
			return err
		}
		a.unmaps++
		err = errors.Join(err, a.pool.Put(got[i]))
	}
	clear(got[len(a.chunks):])
	return err
}

// freeze stops lock-free Allocs and returns the state word. Call with mu held.
func (a *Arena) freeze() uint64 {
	for {
		s := a.state.Load()
		if a.state.CompareAndSwap(s, s|frozen) {
			a.peak = max(a.peak, s&lenMask)
			return s
		}
	}
}

// thaw sets Len to n, advances the epoch (so an Alloc that read the state
// before the freeze fails its compare-and-swap) and lets Allocs run again.
func (a *Arena) thaw(s, n uint64) {
	a.state.Store((s+epochOne)&epochMask | n)
}

// Truncate drops every allocation at or above offset n (0 ≤ n ≤ Len), like
// reslicing s[:n]: Len becomes n, and Cap stays. Buffers above n must not be
// used afterwards; copies through them fail with ErrRange.
func (a *Arena) Truncate(n int) error {
	if a == nil {
		return ErrClosed
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return ErrClosed
	}
	s := a.freeze()
	if n < 0 || uint64(n) > s&lenMask {
		a.thaw(s, s&lenMask)
		return fmt.Errorf("arena: truncate to %d: %w: length is %d", n, ErrRange, s&lenMask)
	}
	a.thaw(s, uint64(n))
	return nil
}

// Reset drops every allocation: Truncate(0). The memory stays mapped for
// reuse; Shrink gives it back.
func (a *Arena) Reset() error { return a.Truncate(0) }

// Shrink unmaps the chunks wholly above Len and returns them to the pool
// (like slices.Clip, at chunk granularity): afterwards Cap is Len rounded up
// to the chunk size. If an unmap fails, the chunks already unmapped are mapped
// back (their physical memory was kept, so no data is lost) and the arena is
// as it was.
func (a *Arena) Shrink() error {
	if a == nil {
		return ErrClosed
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return ErrClosed
	}
	s := a.freeze()
	defer a.thaw(s, s&lenMask)
	keep := int(a.roundUp(s&lenMask) / a.chunkSize)
	if err := a.unmapAbove(keep); err != nil {
		return fmt.Errorf("arena: shrink: %w", err)
	}
	return nil
}

// unmapAbove unmaps chunks keep.. top down, then returns them to the pool.
// It undoes the unmaps on failure. Call with mu held and the state frozen.
func (a *Arena) unmapAbove(keep int) error {
	n := len(a.chunks)
	if keep >= n {
		return nil
	}
	at := func(i int) acl.DevicePtr { return a.base.Add(uintptr(uint64(i) * a.chunkSize)) }
	for i := n - 1; i >= keep; i-- {
		err := a.pool.Unmap(at(i))
		if err == nil {
			a.unmaps++
			continue
		}
		for j := i + 1; j < n; j++ {
			if rerr := a.pool.Map(at(j), a.chunks[j]); rerr != nil {
				// Chunks j.. stay unmapped: give them back and keep the
				// arena consistent below them.
				for k := j; k < n; k++ {
					rerr = errors.Join(rerr, a.pool.Put(a.chunks[k]))
				}
				a.chunks = a.chunks[:j]
				a.cap.Store(uint64(j) * a.chunkSize)
				return errors.Join(err, rerr)
			}
			a.maps++
		}
		return err
	}
	var errs []error
	for i := keep; i < n; i++ {
		errs = append(errs, a.pool.Put(a.chunks[i]))
		a.chunks[i] = chunk.Chunk{}
	}
	a.chunks = a.chunks[:keep]
	a.cap.Store(uint64(keep) * a.chunkSize)
	return errors.Join(errs...)
}

// Close unmaps every chunk, returns them to the pool (closing a private
// pool), and releases the reservation. Buffers must not be used afterwards.
// Close is safe to call more than once, and on a nil *Arena; later calls
// return nil.
func (a *Arena) Close() error {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		return nil
	}
	s := a.freeze()
	err := a.unmapAbove(0)
	if err != nil {
		a.thaw(s, s&lenMask)
		return fmt.Errorf("arena: close: %w", err)
	}
	if rerr := a.drv.ReleaseMemAddress(a.base); rerr != nil {
		a.thaw(s, s&lenMask)
		return fmt.Errorf("arena: close: %w", rerr)
	}
	a.closed.Store(true)
	a.cap.Store(0)
	// Frozen for good: every Alloc takes the slow path and sees closed.
	a.state.Store(frozen)
	if a.ownPool {
		if perr := a.pool.Close(); perr != nil {
			return fmt.Errorf("arena: close: %w", perr)
		}
	}
	return nil
}

// Stats describes an arena at one moment.
type Stats struct {
	Base      acl.DevicePtr // the arena's first byte
	Reserved  int           // address space reserved, bytes
	Mapped    int           // bytes mapped (Cap)
	Used      int           // bytes in use (Len)
	Peak      int           // the most bytes ever in use at once
	ChunkSize int           // bytes per chunk
	Maps      int64         // chunks mapped (driver MapMem calls)
	Unmaps    int64         // chunks unmapped (driver UnmapMem calls)
	Grows     int64         // growths that mapped at least one chunk
	Closed    bool
}

// Stats returns the arena's counters.
func (a *Arena) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	used := a.state.Load() & lenMask
	return Stats{
		Base:      a.base,
		Reserved:  int(a.reserved),
		Mapped:    int(a.cap.Load()),
		Used:      int(used),
		Peak:      int(max(a.peak, used)),
		ChunkSize: int(a.chunkSize),
		Maps:      int64(a.maps),
		Unmaps:    int64(a.unmaps),
		Grows:     int64(a.grows),
		Closed:    a.closed.Load(),
	}
}
