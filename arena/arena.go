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
	// TrapStale is a debug mode that makes the memory Truncate and Reset drop
	// unusable at once, so that a stale pointer into it fails loudly instead
	// of reading or corrupting what the memory holds next. Truncate and Reset
	// unmap every chunk above the new Len, as Shrink does (Cap becomes Len
	// rounded up to the chunk size), and fill the dropped bytes of the chunk
	// they keep in part with PoisonByte. A pointer into an unmapped chunk
	// faults (on the host driver a Go program reading it through
	// host.Driver.Bytes gets a fault, see runtime/debug.SetPanicOnFault); one
	// into the kept chunk reads poison. It costs an unmap per chunk dropped, a
	// map per chunk when the arena grows again, and a memset.
	TrapStale bool
}

// PoisonByte fills the bytes Truncate and Reset drop in TrapStale mode.
const PoisonByte = 0xA5

// MaxReserve is the largest reservation an arena supports (1 TiB).
const MaxReserve = 1 << 40

// The allocator's state word: the bytes in use (Len) in the low 41 bits (room
// for MaxReserve itself), an epoch above them that every Truncate, Shrink and
// Reset advances, and a frozen bit that stops lock-free Allocs while one of
// those runs.
const (
	lenBits   = 41
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
	owner     chunk.Owner // who the pool lends chunks to, for scrubbing
	trap      bool        // Config.TrapStale

	mu     sync.Mutex    // serialises the slow path and everything that calls the driver
	closed atomic.Bool   // set under mu; read without it by Buffer checks
	chunks []chunk.Chunk // mapped chunks, in address order: chunk i at base + i×chunkSize
	strays []stray       // chunks left mapped at or above Cap by a failed undo
	peak   uint64        // the most bytes in use up to the last freeze
	maps   uint64
	unmaps uint64
	grows  uint64
}

// A stray is a chunk the arena mapped, failed to use, and then failed to
// unmap: it lies at or above Cap, outside the arena's bytes. The next Grow,
// Shrink, Truncate in TrapStale mode, or Close unmaps it first.
type stray struct {
	at acl.DevicePtr
	c  chunk.Chunk
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
	a := &Arena{drv: drv, pool: pool, ownPool: own, chunkSize: uint64(pool.ChunkSize()),
		owner: chunk.NewOwner(), trap: cfg.TrapStale}
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

// at returns the device address of chunk i.
func (a *Arena) at(i int) acl.DevicePtr { return a.base.Add(uintptr(uint64(i) * a.chunkSize)) }

// errNotMade is returned by the methods of an Arena that New did not make.
var errNotMade = fmt.Errorf("arena: %w: the Arena was not made by New", ErrInvalid)

// lock takes mu for an operation on an open arena, or returns why it cannot.
func (a *Arena) lock() error {
	if a == nil {
		return ErrClosed
	}
	if a.drv == nil {
		return errNotMade
	}
	a.mu.Lock()
	if a.closed.Load() {
		a.mu.Unlock()
		return ErrClosed
	}
	return nil
}

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
	if size < a.chunkSize {
		return fmt.Errorf("%s: %w: chunk size %d exceeds the largest reservation %d", op, ErrInvalid, a.chunkSize,
			min(a.roundUp(uint64(total)), acl.MaxReserve))
	}
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
	case a.drv == nil:
		return errNotMade
	case size < 0:
		return fmt.Errorf("arena: alloc: %w: negative size %d", ErrInvalid, size)
	case align <= 0 || align&(align-1) != 0:
		return fmt.Errorf("arena: alloc: %w: alignment %d is not a power of two", ErrInvalid, align)
	}
	return fmt.Errorf("arena: alloc: %w: alignment %d exceeds the base's %d", ErrInvalid, align, a.maxAlign)
}

func (a *Arena) allocSlow(size, align uint64) (Buffer, error) {
	if err := a.lock(); err != nil {
		return Buffer{}, err
	}
	defer a.mu.Unlock()
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
	if n < 0 {
		return fmt.Errorf("arena: grow: %w: negative size %d", ErrInvalid, n)
	}
	if err := a.lock(); err != nil {
		return err
	}
	defer a.mu.Unlock()
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
// unmaps what it mapped and returns the chunks to the pool, leaving Cap as it
// was; a chunk it cannot unmap is left a stray.
func (a *Arena) growLocked(target uint64) error {
	c := a.cap.Load()
	if target <= c {
		return nil
	}
	// Strays lie where growth maps: they must go first.
	if err := a.unstray(); err != nil {
		return err
	}
	need := int((a.roundUp(target) - c) / a.chunkSize)
	var err error
	got := a.chunks
	for range need {
		var ch chunk.Chunk
		ch, err = a.pool.GetFor(a.owner)
		if err != nil {
			break
		}
		if err = a.pool.Map(a.at(len(got)), ch); err != nil {
			if errors.Is(err, chunk.ErrMapped) {
				a.maps++
				got = append(got, ch) // still mapped: the rollback unmaps it
			} else {
				err = errors.Join(err, a.pool.Put(ch))
			}
			break
		}
		a.maps++
		got = append(got, ch)
	}
	if err == nil {
		a.chunks = got
		a.grows++
		a.cap.Store(uint64(len(got)) * a.chunkSize)
		return nil
	}
	// Roll back, top down.
	for i := len(got) - 1; i >= len(a.chunks); i-- {
		if uerr := a.pool.Unmap(a.at(i)); uerr != nil {
			err = errors.Join(err, uerr)
			a.strays = append(a.strays, stray{a.at(i), got[i]})
			continue
		}
		a.unmaps++
		err = errors.Join(err, a.pool.Put(got[i]))
	}
	clear(got[len(a.chunks):])
	return err
}

// unstray unmaps the strays and gives them back to the pool. Those it cannot
// unmap stay strays, and it returns the error.
func (a *Arena) unstray() error {
	var errs []error
	kept := a.strays[:0]
	for _, s := range a.strays {
		if err := a.pool.Unmap(s.at); err != nil {
			errs = append(errs, err)
			kept = append(kept, s)
			continue
		}
		a.unmaps++
		errs = append(errs, a.pool.Put(s.c))
	}
	clear(a.strays[len(kept):])
	a.strays = kept
	return errors.Join(errs...)
}

// detach unmaps chunks keep.. top down, in preparation for giving them back:
// they stay in a.chunks, and Cap stays, until release (or reattach, to undo).
// If an unmap fails, it maps back what it unmapped and returns the error.
// Call with mu held and the state frozen.
func (a *Arena) detach(keep int) error {
	n := len(a.chunks)
	for i := n - 1; i >= keep; i-- {
		if err := a.pool.Release(a.at(i), a.chunks[i]); err != nil {
			return errors.Join(err, a.reattach(i+1, n))
		}
		a.unmaps++
	}
	return nil
}

// reattach maps back chunks from..n-1, which detach unmapped; their physical
// memory was kept, so no byte is lost. Should a map fail, the arena ends
// below that chunk: Cap drops there, the chunks above go back to the pool
// (the caller's thaw brings Len down to Cap), and it returns the error.
func (a *Arena) reattach(from, n int) error {
	for j := from; j < n; j++ {
		err := a.pool.Map(a.at(j), a.chunks[j])
		if err == nil {
			a.maps++
			continue
		}
		k := j
		if errors.Is(err, chunk.ErrMapped) {
			a.maps++
			a.strays = append(a.strays, stray{a.at(j), a.chunks[j]})
			k++
		}
		for ; k < n; k++ {
			err = errors.Join(err, a.pool.Put(a.chunks[k]))
		}
		clear(a.chunks[j:n])
		a.chunks = a.chunks[:j]
		a.cap.Store(uint64(j) * a.chunkSize)
		return err
	}
	return nil
}

// release gives the chunks detach unmapped (keep..) back to the pool and
// lowers Cap to match.
func (a *Arena) release(keep int) error {
	var errs []error
	for i := keep; i < len(a.chunks); i++ {
		errs = append(errs, a.pool.Put(a.chunks[i]))
	}
	clear(a.chunks[keep:])
	a.chunks = a.chunks[:keep]
	a.cap.Store(uint64(keep) * a.chunkSize)
	return errors.Join(errs...)
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

// thaw sets Len to n (or Cap, if a failure left Cap below n), advances the
// epoch (so an Alloc that read the state before the freeze fails its
// compare-and-swap) and lets Allocs run again. Call with mu held.
func (a *Arena) thaw(s, n uint64) {
	a.state.Store((s+epochOne)&epochMask | min(n, a.cap.Load()))
}

// Truncate drops every allocation at or above offset n (0 ≤ n ≤ Len), like
// reslicing s[:n]: Len becomes n, and Cap stays (in TrapStale mode, Cap drops
// to n rounded up to the chunk size). Buffers above n must not be used
// afterwards; copies through them fail with ErrRange.
func (a *Arena) Truncate(n int) error {
	if err := a.lock(); err != nil {
		return err
	}
	defer a.mu.Unlock()
	s := a.freeze()
	l := s & lenMask
	if n < 0 || uint64(n) > l {
		a.thaw(s, l)
		return fmt.Errorf("arena: truncate to %d: %w: length is %d", n, ErrRange, l)
	}
	if a.trap {
		if err := a.trapDropped(uint64(n), l); err != nil {
			a.thaw(s, l)
			return fmt.Errorf("arena: truncate to %d: %w", n, err)
		}
	}
	a.thaw(s, uint64(n))
	return nil
}

// trapDropped makes the bytes [n, l) that Truncate drops unusable: it unmaps
// the chunks above n and poisons the rest. Call with mu held and the state
// frozen.
func (a *Arena) trapDropped(n, l uint64) error {
	if err := a.unstray(); err != nil {
		return err
	}
	keep := int(a.roundUp(n) / a.chunkSize)
	if err := a.detach(keep); err != nil {
		return err
	}
	if end := min(l, uint64(keep)*a.chunkSize); end > n {
		if err := a.drv.Memset(a.base.Add(uintptr(n)), PoisonByte, uintptr(end-n)); err != nil {
			return errors.Join(fmt.Errorf("poison: %w", err), a.reattach(keep, len(a.chunks)))
		}
	}
	return a.release(keep)
}

// Reset drops every allocation: Truncate(0). The memory stays mapped for
// reuse (except in TrapStale mode); Shrink gives it back.
func (a *Arena) Reset() error { return a.Truncate(0) }

// Shrink unmaps the chunks wholly above Len and returns them to the pool
// (like slices.Clip, at chunk granularity): afterwards Cap is Len rounded up
// to the chunk size. If an unmap fails, the chunks already unmapped are mapped
// back (their physical memory was kept, so no data is lost) and the arena is
// as it was.
func (a *Arena) Shrink() error {
	if err := a.lock(); err != nil {
		return err
	}
	defer a.mu.Unlock()
	s := a.freeze()
	defer a.thaw(s, s&lenMask)
	if err := a.unstray(); err != nil {
		return fmt.Errorf("arena: shrink: %w", err)
	}
	keep := int(a.roundUp(s&lenMask) / a.chunkSize)
	if err := a.detach(keep); err != nil {
		return fmt.Errorf("arena: shrink: %w", err)
	}
	if err := a.release(keep); err != nil {
		return fmt.Errorf("arena: shrink: %w", err)
	}
	return nil
}

// Close unmaps every chunk, releases the reservation, and returns the chunks
// to the pool (closing a private pool). Buffers must not be used afterwards:
// copies through them fail with ErrClosed. A failed Close leaves the arena
// open and as it was, so it can be retried. Close is safe to call more than
// once, and on a nil *Arena; later calls return nil, unless the private pool
// failed to free memory, which they try again.
func (a *Arena) Close() error {
	if a == nil {
		return nil
	}
	if a.drv == nil {
		return errNotMade
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed.Load() {
		if a.ownPool {
			if err := a.pool.Close(); err != nil {
				return fmt.Errorf("arena: close: %w", err)
			}
		}
		return nil
	}
	s := a.freeze()
	fail := func(err error) error {
		a.thaw(s, s&lenMask)
		return fmt.Errorf("arena: close: %w", err)
	}
	if err := a.unstray(); err != nil {
		return fail(err)
	}
	if err := a.detach(0); err != nil {
		return fail(err)
	}
	if err := a.drv.ReleaseMemAddress(a.base); err != nil {
		return fail(errors.Join(err, a.reattach(0, len(a.chunks))))
	}
	a.closed.Store(true)
	// Frozen for good: every Alloc takes the slow path and sees closed.
	a.state.Store(frozen)
	err := a.release(0)
	if a.ownPool {
		err = errors.Join(err, a.pool.Close())
	}
	if err != nil {
		return fmt.Errorf("arena: close: %w", err)
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
	Strays    int           // chunks a failed undo left mapped above Cap; the next Grow, Shrink or Close unmaps them
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
		Strays:    len(a.strays),
		Closed:    a.closed.Load(),
	}
}
