package arena

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/bits"
	"runtime/trace"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
	"github.com/vmarena/vmarena/internal/units"
)

// Config configures an Arena. The zero value works: an arena on the
// process's default driver (DefaultDriver: the device $VMARENA_DEVICE names,
// the host driver when it is unset and no device answers), reserving as much
// address space as the device has memory, with a private pool of 2 MiB
// chunks, as its own tenant, with no headroom and no streams.
type Config struct {
	// Driver is the device to allocate on. nil means the pool's driver, or,
	// when Pool is nil too, DefaultDriver: the device $VMARENA_DEVICE names
	// (host, ascend[:N], cuda[:N], model:NAME; unset or auto: a device that
	// answers, else the host driver). A value other than host or auto needs
	// the device selector linked in, import _
	// "github.com/vmarena/vmarena/acl/device"; without it, or when the named
	// device cannot be opened, New fails rather than fall back to the host.
	Driver acl.Driver
	// Pool supplies the physical chunks and may be shared by many arenas
	// (and so is their budget). nil means a private pool built from Chunk,
	// closed with the arena.
	Pool *chunk.Pool
	// Chunk configures the private pool when Pool is nil. It must be left
	// zero when Pool is set: that pool's chunks were configured by chunk.New.
	Chunk chunk.Config
	// Reserve is the address space to reserve, in bytes, rounded up to the
	// chunk size: the most the arena can ever map. It may not pass the
	// driver's largest reservation (acl.Caps.MaxReserve: 128 GiB, ACL's
	// limit per reservation, on every driver here by default). 0 means the
	// device's total memory, at most that limit, halved until the driver
	// grants it.
	Reserve int
	// Tenant is who may read the arena's bytes. Chunks move between the
	// arenas of one tenant (say, all the sequences of one model) without
	// being cleared, and are cleared when they move between tenants. 0 makes
	// the arena its own tenant, the safe default.
	Tenant chunk.Tenant
	// Streams are the device streams whose work may touch the arena's
	// memory. With them, memory the arena gives back is unmapped only after
	// the work queued on these streams at that moment has run (an event is
	// recorded on each), without waiting for the rest of the device; and
	// chunks that must be cleared for the arena are cleared by memsets
	// queued on the first stream, ahead of the work the caller queues there
	// next, without waiting for them. Without streams the arena waits for the
	// whole device before it unmaps (SynchronizeDevice), and clears chunks
	// with synchronous memsets. The caller owns the streams and must keep
	// them alive until the arena is closed.
	Streams []acl.Stream
	// Headroom is mapped memory the pool's background worker keeps ready
	// above Len, so that Alloc finds memory mapped instead of mapping it on
	// the caller's path: after a refill at least Headroom bytes are mapped
	// above Len, in whole chunks. A headroom smaller than a chunk maps the
	// next chunk before Len reaches it and no more: a KV cache in 16 MiB
	// chunks with a Headroom of a few tokens' bytes has each chunk mapped as
	// the last tokens of the one before are cut, with no Prefetch per token,
	// and holds half a chunk above Len on average. In whole chunks it may not
	// pass Reserve or the pool's budget. 0 means none.
	Headroom int
	// MaxHeadroom bounds the headroom the arena learns. The worker keeps
	// Headroom at first; each growth that has to map on the caller's path
	// because the headroom ran out doubles it, up to MaxHeadroom, and 64
	// refills in a row without one shrink it by a quarter, down to Headroom
	// again. 0 means 8 × Headroom, within the reservation and the pool's
	// budget; MaxHeadroom equal to Headroom keeps the headroom fixed.
	MaxHeadroom int
	// LowWater is the headroom below which Alloc asks the worker to refill
	// it (a request that never blocks). 0 means half of the learnt headroom
	// in whole chunks, at least one chunk, or the whole headroom while it is
	// smaller than a chunk.
	LowWater int
	// TrapStale is a debug mode that makes the memory Truncate and Reset drop
	// unusable at once, so that a stale pointer into it fails loudly instead
	// of reading or corrupting what the memory holds next. Truncate and Reset
	// unmap every chunk above the new Len, as Shrink does (Cap becomes Len
	// rounded up to the chunk size), and fill the dropped bytes of the chunk
	// they keep in part with PoisonByte. A pointer into an unmapped chunk
	// faults (on the host driver a Go program reading it through
	// host.Driver.Bytes gets a fault, see runtime/debug.SetPanicOnFault); one
	// into the kept chunk reads poison. It costs an unmap per chunk dropped, a
	// map per chunk when the arena grows again, and a memset, and it waits
	// for the device before unmapping, streams or not.
	TrapStale bool
	// Tag groups arenas for SleepTag and WakeTag (TagWeights, TagKV,
	// TagScratch, or the caller's own). The empty Tag is a tag like any
	// other.
	Tag Tag
	// Logger receives the arena's events (EventGrow and the others in
	// observe.go) as structured records, and is the private pool's logger
	// too unless Chunk.Logger is set. nil, the default, logs nothing and
	// costs nothing.
	Logger *slog.Logger
}

// PoisonByte fills the bytes Truncate and Reset drop in TrapStale mode.
const PoisonByte = 0xA5

// MaxReserve is the largest Config.Reserve every driver accepts: 128 GiB,
// ACL's limit per reservation (acl.MaxReserve). A driver reports its own
// limit in acl.Caps.MaxReserve, and New checks Reserve against that one;
// whatever the driver, an arena reserves at most 1 TiB.
const MaxReserve = acl.MaxReserve

// maxReserve is the most any arena reserves, whatever its driver grants:
// the state word's Len holds it.
const maxReserve = 1 << 40

// AlignLimit is the largest alignment any arena accepts (1 GiB). An arena's
// own limit, Arena.BaseAlign, is the alignment of its base up to this.
const AlignLimit = 1 << maxAlignShift

const maxAlignShift = 30

// The allocator's state word: the bytes in use (Len) in the low 41 bits (room
// for maxReserve itself), an epoch above them that every Truncate, Shrink and
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
	// The words Alloc's fast path reads come first, so that it touches one
	// cache line of the arena, not three (an engine cuts tensors from many
	// arenas in turn, between copies that evict them).
	state    atomic.Uint64 // epoch | len, see lenBits
	cap      atomic.Uint64 // bytes mapped
	lowWater atomic.Uint64 // low 41 bits: refill when less than this is mapped above Len, 0 without headroom (headroom.go); above: the epoch's era (stale.go)
	maxAlign uint64        // the largest alignment base guarantees

	floor atomic.Uint64 // bytes Grow promised to keep mapped: a pool under pressure takes only what lies above it and Len
	// growing is the target of the growth under way while it relieves
	// pressure; a younger relief leaves it mapped once growth has a ticket.
	growing atomic.Uint64
	growth  chunk.Growth // the growth on a caller's path (growMu), in the protocol's loop
	life    life         // open, closing, closed, sleeping, asleep, waking, imported (lifecycle.go)

	base      acl.DevicePtr
	reserved  uint64
	chunkSize uint64 // the pool's chunks
	unit      uint64 // the smallest chunk the arena maps, and the unit the pool's protocol counts in: the chunk size, while a pool has one size
	drv       acl.Driver
	pool      *chunk.Pool
	lend      chunk.Lender // the pool's protocol with its arenas
	ownPool   bool
	tenant    chunk.Tenant // who the pool lends chunks to, for scrubbing
	streams   []acl.Stream // Config.Streams
	hr        headroom     // what the worker keeps mapped above Len (headroom.go)
	member    *chunk.Member
	trap      bool // Config.TrapStale
	fence     fence
	scratch   struct {
		slots, fresh, spare []chunk.Chunk
		offs                []uint64 // where slots[i] lies: base+offs[i]
		back                []bool
		backs, fm           []chunk.Mapped
		plan                []slotPlan
	} // place's, reused under mu
	grower, refiller growStep    // the Placers of a growth on a caller's path and of a refill (growLocked)
	imp              *importMode // set for an Imported's arena: how it maps another process's memory (share.go)
	obs              observer    // events, trace regions, counters (observe.go)
	sl               sleeper     // sleep and wake (sleep.go)
	ev               backing     // the callbacks told of backing changes, and their books (backing.go)
	// drops are the drops of Len since the arena was made, for the
	// buffers' staleness check (stale.go). Written under mu.
	drops dropLog

	// growMu serialises the growths that may wait for memory (Grow, Alloc's
	// slow path), which release mu while they wait. Taken before mu (with the
	// caller's context: lockMu); nothing else takes it.
	growMu sync.Mutex
	mu     sync.Mutex // serialises the slow path and everything that calls the driver; never held while waiting for memory or for a stream
	// users is held for reading by every copy through a Buffer, and for
	// writing by Close once it has waited for the device: a copy that races
	// Close completes first, or sees the arena closed.
	users     sync.RWMutex
	geo       layout  // the chunks mapped below Cap, in address order, and where each lies (layout.go)
	strays    []stray // chunks left mapped at or above Cap by a failed undo
	peak      uint64  // the most bytes in use up to the last freeze
	maps      uint64
	unmaps    uint64
	grows     uint64
	reclaimed uint64
	refills   uint64
}

// A stray is a chunk the arena mapped, failed to use, and then failed to
// unmap: it lies at or above Cap, outside the arena's bytes. The next Grow,
// Shrink, Truncate in TrapStale mode, or Close unmaps it first.
type stray struct {
	at acl.DevicePtr
	c  chunk.Chunk
}

// New reserves the arena's address space. It maps nothing itself: the first
// Grow or Alloc does, or, with Config.Headroom, the pool's worker.
func New(cfg Config) (*Arena, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	pool, own := cfg.Pool, false
	drv := cfg.Driver
	switch {
	case pool != nil && pool.Driver() == nil:
		return nil, fmt.Errorf("arena: %w: Config.Pool was not made by chunk.New", ErrInvalid)
	case pool != nil && drv != nil && pool.Driver() != drv:
		return nil, fmt.Errorf("arena: %w: Config.Driver (%s) is not Config.Pool's driver (%s): leave Driver nil with a Pool",
			ErrInvalid, drv.Name(), pool.Driver().Name())
	case pool != nil:
		drv = pool.Driver()
	case drv == nil:
		d, err := DefaultDriver()
		if err != nil {
			return nil, err
		}
		drv = d
	}
	if pool == nil {
		if cfg.Chunk.Logger == nil {
			cfg.Chunk.Logger = cfg.Logger
		}
		p, err := chunk.New(drv, cfg.Chunk)
		if err != nil {
			return nil, fmt.Errorf("arena: Config.Chunk: %w", err)
		}
		pool, own = p, true
	}
	tenant := cfg.Tenant
	if tenant == 0 {
		tenant = chunk.NewTenant()
	}
	a := &Arena{drv: drv, pool: pool, lend: pool.Lender(), ownPool: own, chunkSize: uint64(pool.ChunkSize()),
		unit: uint64(pool.TailSize()), tenant: tenant, streams: slices.Clone(cfg.Streams), trap: cfg.TrapStale}
	a.obs.log = cfg.Logger
	a.obs.timed.Store(cfg.Logger != nil) // its events carry the durations
	if cfg.Headroom > 0 {
		a.hr.min = uint64(cfg.Headroom)
		a.hr.max = uint64(cfg.MaxHeadroom)
		if cfg.MaxHeadroom == 0 {
			a.hr.max = defaultMaxHeadroom * a.hr.min
			if b := uint64(pool.Budget()); b > 0 {
				a.hr.max = max(a.hr.min, min(a.hr.max, b/a.unit*a.unit))
			}
		}
		a.hr.fixedLow = uint64(cfg.LowWater)
		a.setHeadroom(a.hr.min)
	}
	fail := func(err error) (*Arena, error) {
		if own {
			err = errors.Join(err, pool.Close())
		}
		return nil, err
	}
	if err := a.checkPool(cfg); err != nil {
		return fail(err)
	}
	if err := a.reserve(uint64(cfg.Reserve)); err != nil {
		return fail(err)
	}
	a.geo.sizes(a.chunkSize, a.unit, a.reserved)
	if a.roundUnit(a.hr.min) > a.reserved {
		return fail(errors.Join(fmt.Errorf("arena: %w: Config.Headroom %s exceeds the reservation, %s (the device's memory, as Config.Reserve is 0)",
			ErrInvalid, units.Ubytes(a.hr.min), units.Ubytes(a.reserved)), a.releaseReservation()))
	}
	a.hr.max = min(a.hr.max, a.reserved)
	m, err := pool.Lender().Join(client{a}, a.hr.min > 0)
	if err != nil {
		return fail(errors.Join(joinErr(err), a.releaseReservation()))
	}
	a.member = m
	a.maxAlign = 1 << min(bits.TrailingZeros64(uint64(a.base)), maxAlignShift)
	if a.hr.min > 0 {
		m.WantRefill() // the worker maps the first headroom
	}
	a.sl.tag = cfg.Tag
	a.enlist()
	return a, nil
}

// check checks the fields of cfg that need no driver, naming the field and
// the rule it breaks.
func (cfg *Config) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("arena: %w: "+format, append([]any{ErrInvalid}, args...)...)
	}
	switch {
	case cfg.Reserve < 0:
		return bad("Config.Reserve %d: want 0 (the device's memory) or more", cfg.Reserve)
	case cfg.Headroom < 0:
		return bad("Config.Headroom %d: want 0 (none) or more", cfg.Headroom)
	case cfg.LowWater < 0:
		return bad("Config.LowWater %d: want 0 (half the headroom) or more", cfg.LowWater)
	case cfg.MaxHeadroom < 0:
		return bad("Config.MaxHeadroom %d: want 0 (%d × Headroom) or more", cfg.MaxHeadroom, defaultMaxHeadroom)
	case cfg.MaxHeadroom > 0 && cfg.Headroom == 0:
		return bad("Config.MaxHeadroom %s without Config.Headroom: an arena without headroom learns none", units.Bytes(int64(cfg.MaxHeadroom)))
	case cfg.MaxHeadroom > 0 && cfg.MaxHeadroom < cfg.Headroom:
		return bad("Config.MaxHeadroom %s is below Config.Headroom %s: the learnt headroom lies between them (set both equal to fix it)",
			units.Bytes(int64(cfg.MaxHeadroom)), units.Bytes(int64(cfg.Headroom)))
	case cfg.LowWater > cfg.Headroom:
		return bad("Config.LowWater %s exceeds Config.Headroom %s: the worker refills when the headroom falls below LowWater",
			units.Bytes(int64(cfg.LowWater)), units.Bytes(int64(cfg.Headroom)))
	case cfg.Pool != nil && cfg.Chunk != (chunk.Config{}):
		return bad("Config.Chunk is set, but Config.Pool is given: the pool's chunk.Config applies; leave Chunk zero")
	}
	for i, s := range cfg.Streams {
		if s == 0 {
			return bad("Config.Streams[%d] is 0: not a stream (leave Streams empty to use none)", i)
		}
	}
	return nil
}

// checkPool checks what cfg asks of the arena's pool: a chunk no larger than
// the reservation can be, and headroom within the pool's budget.
func (a *Arena) checkPool(cfg Config) error {
	cs, limit := a.chunkSize, reserveLimit(a.drv)
	if cs > limit {
		return fmt.Errorf("arena: %w: the chunk size, %s, exceeds %s's largest reservation, %s",
			ErrInvalid, units.Ubytes(cs), a.drv.Name(), units.Ubytes(limit))
	}
	if cfg.Reserve > 0 && a.roundUnit(uint64(cfg.Reserve)) > limit {
		return fmt.Errorf("arena: %w: Config.Reserve %s (in chunks of %s) exceeds %s's largest reservation, %s (acl.Caps.MaxReserve)",
			ErrInvalid, units.Bytes(int64(cfg.Reserve)), units.IEC(int64(a.unit)), a.drv.Name(), units.Ubytes(limit))
	}
	if cfg.Reserve > 0 && a.roundUnit(a.hr.min) > a.roundUnit(uint64(cfg.Reserve)) {
		return fmt.Errorf("arena: %w: Config.Headroom %s exceeds Config.Reserve %s (in chunks of %s): headroom is mapped inside the reservation",
			ErrInvalid, units.Bytes(int64(cfg.Headroom)), units.Bytes(int64(cfg.Reserve)), units.IEC(int64(a.unit)))
	}
	if b := uint64(a.pool.Budget()); b > 0 && a.roundUnit(a.hr.min) > b {
		return fmt.Errorf("arena: %w: Config.Headroom %s (in chunks of %s) exceeds the pool's budget, %s",
			ErrInvalid, units.Bytes(int64(cfg.Headroom)), units.IEC(int64(a.unit)), units.Ubytes(b))
	}
	if cfg.MaxHeadroom > 0 && cfg.Reserve > 0 && a.roundUnit(a.hr.max) > a.roundUnit(uint64(cfg.Reserve)) {
		return fmt.Errorf("arena: %w: Config.MaxHeadroom %s exceeds Config.Reserve %s (in chunks of %s): headroom is mapped inside the reservation",
			ErrInvalid, units.Bytes(int64(cfg.MaxHeadroom)), units.Bytes(int64(cfg.Reserve)), units.IEC(int64(a.unit)))
	}
	if b := uint64(a.pool.Budget()); cfg.MaxHeadroom > 0 && b > 0 && a.roundUnit(a.hr.max) > b {
		return fmt.Errorf("arena: %w: Config.MaxHeadroom %s (in chunks of %s) exceeds the pool's budget, %s",
			ErrInvalid, units.Bytes(int64(cfg.MaxHeadroom)), units.IEC(int64(a.unit)), units.Ubytes(b))
	}
	return nil
}

// releaseReservation gives the reservation back, for a New that fails late.
func (a *Arena) releaseReservation() error {
	if err := a.drv.ReleaseMemAddress(a.base); err != nil {
		return fmt.Errorf("arena: release reservation: %w", err)
	}
	return nil
}

// roundUnit rounds n bytes up to whole units: what a request of n bytes
// maps at the least.
func (a *Arena) roundUnit(n uint64) uint64 { return (n + a.unit - 1) / a.unit * a.unit }

// at returns the device address of chunk i (of a.geo; off(n()) is Cap's).
func (a *Arena) at(i int) acl.DevicePtr { return a.base.Add(uintptr(a.geo.off(i))) }

// setCap publishes Cap after a.geo changed. Call with mu held.
func (a *Arena) setCap() { a.cap.Store(a.geo.top()) }

// chunkEnd returns, without the arena's lock, the offset past the chunk
// that holds byte x-1 (0 for x 0): what a Len of x keeps mapped (a byte
// above Cap counts as in a unit chunk).
func (a *Arena) chunkEnd(x uint64) uint64 { return a.geo.end(x) }

// errNotMade is returned by the methods of an Arena that New did not make.
var errNotMade = fmt.Errorf("arena: %w: the Arena was not made by New", ErrInvalid)

// lock takes mu for an operation that changes an open arena's size, or
// returns why it cannot.
func (a *Arena) lock() error {
	if a == nil {
		return errClosed
	}
	if a.drv == nil {
		return errNotMade
	}
	if a.ev.owner.Load() != 0 && a.inCallback() {
		return errCallback
	}
	a.mu.Lock()
	if err := a.lifeNow().err(); err != nil {
		a.mu.Unlock()
		return err
	}
	return nil
}

// lockGrow takes growMu and mu for a growth that may wait for memory, or
// returns why it cannot (an error wrapping ctx.Err() when ctx is done
// first); unlockGrow releases both.
func (a *Arena) lockGrow(ctx context.Context) error {
	if a == nil || a.drv == nil {
		return a.lock()
	}
	if a.ev.owner.Load() != 0 && a.inCallback() {
		return errCallback
	}
	if err := lockCtx(ctx, &a.growMu); err != nil {
		return fmt.Errorf("arena: wait for the arena's growth under way: %w", err)
	}
	a.hr.waiting.Add(1) // a refill under way yields mu at its next step
	defer a.hr.waiting.Add(-1)
	sched.At(sched.GrowWaiting, a)
	if err := lockCtx(ctx, &a.mu); err != nil {
		a.growMu.Unlock()
		return fmt.Errorf("arena: wait for the arena's lock: %w", err)
	}
	if err := a.lifeNow().err(); err != nil {
		a.unlockGrow()
		return err
	}
	return nil
}

func (a *Arena) unlockGrow() {
	a.mu.Unlock()
	a.growMu.Unlock()
}

// reserveLimit returns the largest reservation of the arena's driver, at
// most maxReserve.
func reserveLimit(drv acl.Driver) uint64 { return min(uint64(drv.Caps().ReserveLimit()), maxReserve) }

// reserve reserves size bytes, or, when size is 0, the device's memory (at
// most the driver's largest reservation) halved until the driver agrees.
func (a *Arena) reserve(size uint64) error {
	const op = "arena: reserve"
	limit := reserveLimit(a.drv)
	if size != 0 {
		size = a.roundUnit(size)
		p, err := a.drv.ReserveMemAddress(uintptr(size), 0, 0, 0)
		if err != nil {
			return fmt.Errorf("%s %s: %w", op, units.Ubytes(size), err)
		}
		a.base, a.reserved = p, size
		return nil
	}
	_, total, err := a.drv.GetMemInfo(acl.HBMMem)
	if err != nil {
		return fmt.Errorf("%s: device memory: %w", op, err)
	}
	size = min(a.roundUnit(uint64(total)), limit/a.unit*a.unit)
	if size < a.chunkSize {
		return fmt.Errorf("%s: %w: chunk size %s exceeds the largest reservation, %s", op, ErrInvalid,
			units.Ubytes(a.chunkSize), units.Ubytes(min(a.roundUnit(uint64(total)), limit)))
	}
	var errs []error
	for size >= a.chunkSize {
		p, err := a.drv.ReserveMemAddress(uintptr(size), 0, 0, 0)
		if err == nil {
			a.base, a.reserved = p, size
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", units.Ubytes(size), err))
		size = size / 2 / a.unit * a.unit
	}
	return fmt.Errorf("%s: %w", op, errors.Join(errs...))
}

// The accessors below are safe on a nil *Arena, which has no memory: they
// return zero (nil for Driver and Pool).

// Base returns the device address of the first byte of the arena. It never
// changes.
func (a *Arena) Base() acl.DevicePtr {
	if a == nil {
		return 0
	}
	return a.base
}

// Len returns the bytes in use: the end of the last allocation.
func (a *Arena) Len() int {
	if a == nil {
		return 0
	}
	return int(a.state.Load() & lenMask)
}

// Cap returns the bytes mapped, a multiple of TailSize.
func (a *Arena) Cap() int {
	if a == nil {
		return 0
	}
	return int(a.cap.Load())
}

// Reserved returns the bytes of address space the arena reserved: the most
// Cap can reach.
func (a *Arena) Reserved() int {
	if a == nil {
		return 0
	}
	return int(a.reserved)
}

// ChunkSize returns the size of the pool's chunks: of its large ones on a
// pool of two sizes (chunk.Config.TailSize), which the arena maps only on
// whole blocks of this size aligned to it, so every multiple of ChunkSize
// is a chunk boundary.
func (a *Arena) ChunkSize() int {
	if a == nil {
		return 0
	}
	return int(a.chunkSize)
}

// TailSize returns the smallest chunk the arena maps: Cap is a multiple of
// it. It is ChunkSize on a pool of one size.
func (a *Arena) TailSize() int {
	if a == nil {
		return 0
	}
	return int(a.unit)
}

// BaseAlign returns the alignment of Base, at most AlignLimit (1 GiB): the
// largest alignment Alloc accepts. It is at least the driver's granularity
// (2 MiB on ACL, CUDA and the host driver), since reservations are aligned
// to it, and it never changes.
func (a *Arena) BaseAlign() int {
	if a == nil {
		return 0
	}
	return int(a.maxAlign)
}

// Driver returns the device driver the arena allocates on.
func (a *Arena) Driver() acl.Driver {
	if a == nil {
		return nil
	}
	return a.drv
}

// Pool returns the chunk pool the arena draws from.
func (a *Arena) Pool() *chunk.Pool {
	if a == nil {
		return nil
	}
	return a.pool
}

// Alloc returns a buffer of size bytes whose offset is a multiple of align (a
// power of two, at most Arena.BaseAlign: the alignment of Base up to 1 GiB, so
// that the buffer's device address is aligned too). It maps more memory when the mapped space is used up, so it
// can fail with ErrOutOfMemory or ErrExhausted; within Cap it makes no driver
// call, takes no lock and allocates nothing on the Go heap. With
// Config.Headroom, an Alloc that leaves less than the low-water mark mapped
// above Len asks the pool's worker to refill it, without waiting.
func (a *Arena) Alloc(size, align int) (Buffer, error) {
	if a == nil {
		return Buffer{}, errClosed
	}
	if size < 0 || align <= 0 || align&(align-1) != 0 || uint64(align) > a.maxAlign {
		return Buffer{}, a.badAlloc(size, align)
	}
	s := a.state.Load()
	if s&frozen == 0 {
		start := (s&lenMask + uint64(align) - 1) &^ (uint64(align) - 1)
		end := start + uint64(size) // cannot wrap: start < 2^41, size < 2^63
		w := a.lowWater.Load()      // before the compare-and-swap: the era of s's epoch (stale.go)
		c := a.cap.Load()
		if end <= c && a.state.CompareAndSwap(s, s&^lenMask|end) {
			if end+w&lenMask > c { // never true without headroom: the mark is 0
				a.member.WantRefill()
			}
			return Buffer{a: a, off: uintptr(start), n: uintptr(size), gen: epochOf(s, w)}, nil
		}
	}
	return a.allocSlow(uint64(size), uint64(align))
}

// AllocN cuts len(dst) buffers of size bytes each into dst, one after
// another, each at an offset that is a multiple of align: the buffers
// len(dst) calls of Alloc(size, align) would cut with no other Alloc between
// them, in one step and for the cost of one Alloc (an inference engine
// appending a token's K and V for every layer makes one call, not two a
// layer). Buffer i starts at dst[0].Offset() + i × size rounded up to
// align. Either every buffer is cut or none: a failed AllocN leaves the
// arena and dst as they were and returns what Alloc would for the span they
// cover together; an empty dst cuts nothing.
func (a *Arena) AllocN(dst []Buffer, size, align int) error {
	if a == nil {
		return errClosed
	}
	if size < 0 || align <= 0 || align&(align-1) != 0 || uint64(align) > a.maxAlign {
		return a.badAlloc(size, align)
	}
	if len(dst) == 0 {
		return nil
	}
	stride := (uint64(size) + uint64(align) - 1) &^ (uint64(align) - 1)
	n := uint64(len(dst))
	// The span, (n-1)·stride + size, in 128 bits: past the reservation (or a
	// word) it cannot fit.
	hi, lo := bits.Mul64(n-1, stride)
	span, carry := bits.Add64(lo, uint64(size), 0)
	if hi != 0 || carry != 0 || span > a.reserved {
		return a.exhausted(fmt.Sprintf("alloc %d buffers of %s", n, units.Bytes(int64(size))))
	}
	b, err := a.Alloc(int(span), align)
	if err != nil {
		return err
	}
	for i := range dst {
		dst[i] = Buffer{a: a, off: b.off + uintptr(i)*uintptr(stride), n: uintptr(size), gen: b.gen}
	}
	return nil
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
	return fmt.Errorf("arena: alloc: %w: alignment %s exceeds the arena's BaseAlign, %s", ErrInvalid,
		units.Bytes(int64(align)), units.Ubytes(a.maxAlign))
}

func (a *Arena) allocSlow(size, align uint64) (Buffer, error) {
	return a.allocSlowContext(context.Background(), size, align)
}

func (a *Arena) allocSlowContext(ctx context.Context, size, align uint64) (Buffer, error) {
	if err := a.lockGrow(ctx); err != nil {
		return Buffer{}, err
	}
	defer a.unlockGrow()
	a.member.Touch()
	for {
		s := a.state.Load() // never frozen: freezing happens under mu
		start := (s&lenMask + align - 1) &^ (align - 1)
		if size > a.reserved || start > a.reserved-size {
			return Buffer{}, a.exhausted(fmt.Sprintf("alloc %s at %d", units.Ubytes(size), start))
		}
		end := start + size
		if end > a.cap.Load() {
			if err := a.growLocked(ctx, end, false); err != nil {
				return Buffer{}, fmt.Errorf("arena: alloc %s: %w", units.Ubytes(size), err)
			}
			a.missed()
		}
		// Lock-free Allocs may have moved Len meanwhile; if so, go round.
		if a.state.CompareAndSwap(s, s&^lenMask|end) {
			a.wantHeadroom(end)
			return Buffer{a: a, off: uintptr(start), n: uintptr(size), gen: epochOf(s, a.lowWater.Load())}, nil
		}
	}
}

// Grow makes sure that at least n more bytes can be allocated (with
// alignment 1) without mapping, like bytes.Buffer.Grow: afterwards
// Cap-Len ≥ n, and a pool under pressure does not take that memory back
// until a Truncate, Reset or Shrink drops it. It maps whole chunks: the
// arena's own chunks still waiting to be unmapped are taken back where they
// lie, the rest come from the pool, which may reclaim memory other arenas
// hold mapped and unused. A failed Grow
// leaves the arena as it was and returns an error matching ErrOutOfMemory
// (device or budget exhausted), ErrExhausted (beyond the reservation),
// ErrInvalid (negative n) or ErrClosed.
func (a *Arena) Grow(n int) error { return a.grow(context.Background(), n) }

// grow is Grow whose waits for the device under pressure end when ctx is
// done.
func (a *Arena) grow(ctx context.Context, n int) error {
	if n < 0 {
		return fmt.Errorf("arena: grow: %w: negative size %d", ErrInvalid, n)
	}
	if a.mapped(uint64(n)) {
		return nil
	}
	if err := a.lockGrow(ctx); err != nil {
		return err
	}
	defer a.unlockGrow()
	a.member.Touch()
	l := a.state.Load() & lenMask
	if uint64(n) > a.reserved-l {
		return a.exhausted(fmt.Sprintf("grow by %s at %d", units.Bytes(int64(n)), l))
	}
	miss := l+uint64(n) > a.cap.Load()
	if err := a.growLocked(ctx, l+uint64(n), false); err != nil {
		return fmt.Errorf("arena: grow by %s: %w", units.Bytes(int64(n)), err)
	}
	if miss {
		a.missed() // a growth that mapped on the caller's path, not one that failed
	}
	a.floor.Store(max(a.floor.Load(), l+uint64(n)))
	a.wantHeadroom(l + uint64(n))
	return nil
}

// mapped is Grow's fast path: when n more bytes are mapped already (the
// headroom, or memory kept after a drop), it records the promise and returns
// true without taking the lock, so that a decode step's Grow never waits
// behind the worker's refill. A freeze (Truncate, Shrink, a reclaim) or a
// Cap that drops meanwhile sends Grow down the locked path.
func (a *Arena) mapped(n uint64) bool {
	if a == nil || a.drv == nil || a.lifeNow() != lifeOpen {
		return false
	}
	s := a.state.Load()
	want := s&lenMask + n
	if s&frozen != 0 || want > a.cap.Load() || want > a.reserved {
		return false
	}
	sched.At(sched.GrowFastPath, a)
	raised, prev := false, uint64(0)
	for f := a.floor.Load(); f < want; f = a.floor.Load() {
		if a.floor.CompareAndSwap(f, want) {
			raised, prev = true, f
			break
		}
	}
	// A reclaim that froze the arena before the promise was raised may have
	// taken memory below it: look again, and if so, undo the promise (unless
	// someone changed it since), so that nothing stays pinned by a growth
	// that does not happen here.
	if a.state.Load()&frozen != 0 || want > a.cap.Load() {
		if raised && a.floor.CompareAndSwap(want, prev) {
			a.member.Dropped()
		}
		return false
	}
	a.member.Touch()
	a.wantHeadroom(want)
	return true
}

// growLocked maps chunks until Cap ≥ target (≤ reserved), through the
// protocol's one loop (chunk.Lender.Grow): place does what can be done
// under mu, from what is at hand, and the loop waits, holding nothing (mu
// released, growMu kept), for a chunk in the way or for a relief of the
// pressure, then places again. A speculative growth (a refill) takes only
// free memory (TryAcquire) and never waits: it fails with chunk.ErrBusy or
// a shortage instead. On failure Cap is as it was (a chunk that cannot be
// unmapped is left a stray). Call with mu held (and growMu, unless
// speculative); it returns with mu held.
func (a *Arena) growLocked(ctx context.Context, target uint64, speculative bool) (err error) {
	c := a.cap.Load()
	if target <= c {
		return nil
	}
	g := a.obs.begin(ctx, speculative)
	defer func() { a.obs.end(a, g, c, target, speculative, err) }()
	sched.At(sched.GrowLocked, a)
	if speculative {
		a.refiller = growStep{a: a, target: target, speculative: true}
		return a.lend.Grow(ctx, &a.hr.growth, a.tenant, &a.refiller, chunk.Speculative)
	}
	a.grower = growStep{a: a, target: target}
	err = a.lend.Grow(ctx, &a.growth, a.tenant, &a.grower, chunk.MayRelieve)
	if a.growth.End() {
		a.growing.Store(0)
		if err != nil {
			sched.At(sched.GrowFailed, a)
			a.member.Failed() // what it protected is reclaimable again
		}
	}
	return err
}

// growStep is the arena's side of one growth (a chunk.Placer): place to
// target, under mu.
type growStep struct {
	a           *Arena
	target      uint64
	speculative bool
}

func (s *growStep) Place(have []chunk.Chunk) (chunk.Step, error) {
	return s.a.place(s.target, have, s.speculative)
}

// Unlock releases mu for a wait, having published the growth's target:
// younger reliefs leave it mapped once the growth has a ticket.
func (s *growStep) Unlock() <-chan struct{} {
	a := s.a
	a.growing.Store(s.target)
	stop := a.lifeChanged() // a Close or a Sleep ends the wait
	a.mu.Unlock()
	sched.At(sched.GrowUnlocked, a)
	return stop
}

func (s *growStep) Lock() {
	s.a.mu.Lock()
	sched.At(sched.GrowRelocked, s.a)
}

// putChunks gives chunks the arena holds unmapped back to the pool.
func (a *Arena) putChunks(cs []chunk.Chunk) error {
	var errs []error
	for _, ch := range cs {
		errs = append(errs, a.lend.Put(ch))
	}
	return errors.Join(errs...)
}

// place maps chunks until Cap ≥ target from what is at hand: the arena's own
// chunks waiting in the pool at those addresses (taken back in place), have,
// and memory free in the pool now. It never waits. When it cannot complete
// the growth it changes nothing and keeps no chunk (have and the chunks
// taken back go back), and says why: the fresh chunks the pool had no room
// for, with the shortage, or a chunk in its way that a relief claimed (or
// that is being unmapped). Call with mu held.
func (a *Arena) place(target uint64, have []chunk.Chunk, speculative bool) (chunk.Step, error) {
	if err := a.lifeNow().err(); err != nil {
		// A Close or a Sleep began while the growth waited.
		return chunk.Step{}, errors.Join(err, a.putChunks(have))
	}
	c := a.cap.Load()
	if target <= c {
		return chunk.Step{}, a.putChunks(have)
	}
	// Strays lie where growth maps: they must go first.
	if err := a.unstray(false); err != nil {
		return chunk.Step{}, errors.Join(err, a.putChunks(have))
	}
	e := a.roundUnit(target)
	// More than the budget can ever hold fails here, before any driver call
	// (the arena's own chunks count in the budget, and the pool cannot take
	// them from an arena that is growing).
	if b := uint64(a.pool.Budget()); b != 0 && e > b {
		return chunk.Step{}, errors.Join(fmt.Errorf("%w: %w: %s mapped and %s more would exceed the pool's budget, %s", chunk.ErrBudget,
			ErrOutOfMemory, units.Ubytes(c), units.Ubytes(e-c), units.Ubytes(b)),
			a.putChunks(have))
	}
	// The arena's scratch, reused under mu: a growth from the cache makes
	// no heap allocation.
	sc := &a.scratch
	// Chunks wait in the arena's range after its stream-ordered releases, and
	// after a relief took them (until it unmaps them: then they are in the
	// way, and the growth waits for them holding nothing). Every one that
	// starts below e is taken back whole, where it lies: the growth may end
	// past e.
	backs, busy := a.lend.ReclaimSpan(a.base.Add(uintptr(c)), a.base.Add(uintptr(e)), sc.backs[:0])
	sc.backs = backs
	if !busy.IsZero() {
		return chunk.Step{Busy: busy}, a.putChunks(have)
	}
	// Lay the growth: the chunks taken back where they lie, the gaps
	// between them tiled (layout.tile), and count what the gaps need.
	plan, x := sc.plan[:0], c
	for _, m := range backs {
		off := uint64(m.At - a.base)
		plan = a.layGap(plan, x, off)
		plan = append(plan, slotPlan{off: off, size: uint64(m.C.Size), c: m.C, back: true})
		x = off + uint64(m.C.Size)
	}
	plan = a.layGap(plan, x, max(x, e))
	sc.plan = plan
	want, large := 0, 0 // units of the fresh slots, and how many of them are large
	for _, s := range plan {
		if !s.back {
			want += int(s.size / a.unit)
			if a.isLarge(s.size) {
				large++
			}
		}
	}
	// What a relief handed goes first; what is left over goes back.
	fresh, spare, want, large := a.useHanded(have, sc.fresh[:0], sc.spare[:0], want, large)
	sc.spare = spare
	if len(spare) > 0 {
		if err := a.putChunks(spare); err != nil {
			return chunk.Step{}, errors.Join(err, a.putChunks(fresh), a.dropBacks(backs))
		}
	}
	if want > 0 {
		take := a.lend.TakeFree
		if speculative {
			take = a.lend.TryAcquire
		}
		var err error
		fresh, err = take(fresh, a.tenant, chunk.Ask{Units: want, Large: min(large, want/a.per())})
		if err != nil {
			if errors.Is(err, chunk.ErrClosed) {
				err = poolClosed{err}
			}
			undo := errors.Join(a.putChunks(fresh), a.dropBacks(backs))
			if errors.Is(err, ErrOutOfMemory) && undo == nil {
				return chunk.Step{Missing: want, Short: err}, nil
			}
			return chunk.Step{}, errors.Join(err, undo)
		}
	}
	sc.fresh = fresh
	sched.At(sched.GrowTaken, a)
	// Place the chunks: large ones on the large slots from the bottom up, a
	// large slot left without one laid as tail chunks.
	slices.SortStableFunc(fresh, func(x, y chunk.Chunk) int { return cmp.Compare(y.Size, x.Size) })
	nl := 0
	for nl < len(fresh) && a.isLarge(uint64(fresh[nl].Size)) {
		nl++
	}
	slots, offs, back := sc.slots[:0], sc.offs[:0], sc.back[:0]
	li, ti := 0, nl
	for _, s := range plan {
		switch {
		case s.back:
			slots, offs, back = append(slots, s.c), append(offs, s.off), append(back, true)
		case a.isLarge(s.size) && li < nl:
			slots, offs, back = append(slots, fresh[li]), append(offs, s.off), append(back, false)
			li++
		default:
			for o := s.off; o < s.off+s.size && ti < len(fresh); o += a.unit {
				slots, offs, back = append(slots, fresh[ti]), append(offs, o), append(back, false)
				ti++
			}
		}
	}
	sc.slots, sc.offs, sc.back = slots, offs, back
	need, laid := len(slots), uint64(0)
	for _, ch := range slots {
		laid += uint64(ch.Size)
	}
	if last := plan[len(plan)-1]; li != nl || ti != len(fresh) || laid != last.off+last.size-c {
		// The pool lent what was not asked: nothing is placed.
		return chunk.Step{}, errors.Join(fmt.Errorf("arena: grow: %w: the pool lent chunks that do not tile the growth", ErrInvalid),
			a.putChunks(fresh), a.dropBacks(backs))
	}
	// Map the fresh chunks, a run of adjacent slots at a time, so that one
	// access call can cover a run where the driver allows it.
	scrubbed := 0
	for i := 0; i < need; {
		if back[i] {
			i++
			continue
		}
		j := i
		for j < need && !back[j] {
			j++
		}
		sc, err := a.lend.MapRange(a.base.Add(uintptr(offs[i])), slots[i:j], a.streams)
		if err != nil {
			return chunk.Step{}, a.undoGrow(offs, slots, back, i, scrubbed > 0, err)
		}
		scrubbed += sc
		i = j
	}
	if scrubbed > 0 {
		if err := a.fence.record(a.drv, a.streams[0]); err != nil {
			return chunk.Step{}, a.undoGrow(offs, slots, back, need, true, err)
		}
	}
	// Mapped with access, the clears ordered, nothing published yet: the
	// callbacks register the fresh chunks now, or the growth is undone.
	cause := BackingGrow
	if speculative {
		cause = BackingRefill
	}
	fm := a.scratch.fm[:0]
	for i := range slots {
		if !back[i] {
			fm = append(fm, chunk.Mapped{At: a.base.Add(uintptr(offs[i])), C: slots[i]})
		}
	}
	a.scratch.fm = fm
	if err := a.announce(cause, fm); err != nil {
		return chunk.Step{}, a.undoGrow(offs, slots, back, need, scrubbed > 0, err)
	}
	a.maps += uint64(need)
	for _, ch := range slots {
		a.geo.push(ch, uint64(ch.Size))
	}
	a.grows++
	a.setCap()
	return chunk.Step{}, nil
}

// slotPlan is one chunk of a growth as place lays it: at off, of size
// bytes; c is set for a chunk taken back in place (back).
type slotPlan struct {
	off, size uint64
	c         chunk.Chunk
	back      bool
}

// layGap appends to plan the fresh slots that fill [from, to), as
// layout.tile lays them.
func (a *Arena) layGap(plan []slotPlan, from, to uint64) []slotPlan {
	for x := from; x < to; {
		s := a.geo.next(x, to)
		plan = append(plan, slotPlan{off: x, size: s})
		x += s
	}
	return plan
}

// useHanded sorts chunks a relief handed for slots that want units, large of
// them in large slots: large chunks go to the large slots, tail chunks to
// any (standing in for large ones where they must); it appends those it
// uses to use and the rest to rest, and returns what is still wanted.
func (a *Arena) useHanded(have, use, rest []chunk.Chunk, want, large int) ([]chunk.Chunk, []chunk.Chunk, int, int) {
	k := a.per()
	for _, ch := range have {
		switch big := a.isLarge(uint64(ch.Size)); {
		case big && large > 0 && want >= k:
			use = append(use, ch)
			want, large = want-k, large-1
		case !big && want > 0:
			use = append(use, ch)
			want--
		default:
			rest = append(rest, ch)
		}
	}
	return use, rest, want, large
}

// per returns the units in a large chunk (1 on a pool of one size).
func (a *Arena) per() int { return int(a.chunkSize / a.unit) }

// isLarge reports whether a chunk of size bytes is one of the pool's large
// chunks, on a pool of two sizes.
func (a *Arena) isLarge(size uint64) bool { return a.chunkSize != a.unit && size == a.chunkSize }

// dropBacks gives back the chunks a growth took back in place (still
// mapped), to waiting for the device again.
func (a *Arena) dropBacks(ms []chunk.Mapped) error {
	if len(ms) == 0 {
		return nil
	}
	return a.dropMapped(BackingUndo, ms)
}

// undoGrow rolls back a growLocked whose mapping of the run at slot failed
// went wrong: the fresh chunks mapped before that run, and any of that run
// its own undo left mapped, are unmapped, top down, after the scrubs queued
// for them have run (queued, or a chunk the failed run left with its clears
// queued: chunk.LeftQueued); a chunk that cannot be unmapped, or must not be
// (the wait for its clears failed: they may still run), becomes a stray,
// which the next Grow, Shrink, Sleep or Close unmaps once the device is
// done; and every other chunk the growth placed goes back: fresh ones to
// the pool, ones taken back in place to waiting for the device again. Call
// with mu held.
func (a *Arena) undoGrow(offs []uint64, slots []chunk.Chunk, back []bool, failed int, queued bool, err error) error {
	at := func(i int) acl.DevicePtr { return a.base.Add(uintptr(offs[i])) }
	slotOf := func(p acl.DevicePtr) int {
		i, _ := slices.BinarySearch(offs, uint64(p-a.base))
		return i
	}
	mapped := make([]bool, len(slots)) // fresh chunks still mapped
	clears := make([]bool, len(slots)) // of those, the ones clears queued on the stream may still write
	for i := 0; i < failed; i++ {
		mapped[i] = !back[i]
		clears[i] = mapped[i] && queued
	}
	var left *chunk.LeftMappedError
	if errors.As(err, &left) {
		for _, m := range left.Left {
			i := slotOf(m.At)
			mapped[i] = true
			if m.State == chunk.LeftQueued {
				queued, clears[i] = true, true
			}
		}
	}
	synced := true
	if queued {
		if werr := a.drv.SynchronizeStream(a.streams[0]); werr != nil {
			err = errors.Join(err, fmt.Errorf("wait for the clears queued: %w", werr))
			synced = false
		}
	}
	// A callback that registered a chunk and could not give it back keeps
	// it mapped.
	var ms []chunk.Mapped
	for i := range slots {
		if mapped[i] {
			ms = append(ms, chunk.Mapped{At: at(i), C: slots[i]})
		}
	}
	free, lerr := a.letGoHeld(BackingUndo, ms)
	err = errors.Join(err, lerr)
	for k := len(ms) - 1; k >= 0; k-- {
		i := slotOf(ms[k].At)
		keep := !free[k] || clears[i] && !synced
		if !keep {
			if uerr := a.lend.Unmap(at(i)); uerr != nil {
				err = errors.Join(err, uerr)
				keep = true
			}
		}
		if keep {
			a.maps++ // a stray counts as mapped
			a.strays = append(a.strays, stray{at(i), slots[i]})
			slots[i] = chunk.Chunk{}
		}
	}
	return errors.Join(err, a.giveBack(offs, slots, back))
}

// giveBack returns to the pool what a failed growth placed at offs: fresh
// chunks (unmapped) with Put, chunks taken back in place (still mapped) to
// waiting for the device. Zero slots are skipped.
func (a *Arena) giveBack(offs []uint64, slots []chunk.Chunk, back []bool) error {
	var errs []error
	var mapped []chunk.Mapped
	for i, ch := range slots {
		switch {
		case ch == chunk.Chunk{}:
		case back[i]:
			mapped = append(mapped, chunk.Mapped{At: a.base.Add(uintptr(offs[i])), C: ch})
		default:
			errs = append(errs, a.lend.Put(ch))
		}
	}
	if len(mapped) > 0 {
		errs = append(errs, a.dropMapped(BackingUndo, mapped))
	}
	return errors.Join(errs...)
}

// dropMapped gives back to the pool chunks mapped above Cap, outside the
// arena's counts, that the device may still touch, without waiting: to be
// unmapped once events recorded on the arena's streams complete, or, with
// no streams (or no event), after a wait for the whole device that whoever
// needs them next makes holding nothing (the arena's own next growth takes
// them back where they lie). The pool tells the callbacks, for cause,
// before it unmaps them. Those it cannot give back become strays. Call with
// mu held.
func (a *Arena) dropMapped(cause BackingCause, ms []chunk.Mapped) error {
	if len(ms) == 0 {
		return nil
	}
	a.leave(cause, ms)
	if len(a.streams) > 0 {
		err := a.member.ReleaseAfter(ms, a.streams)
		if !errors.Is(err, chunk.ErrNoOrder) {
			return a.strayOnError(ms, err)
		}
	}
	return a.strayOnError(ms, a.member.ReleaseAfterDevice(ms))
}

// strayOnError keeps ms, which the pool refused to take back (err), as
// strays, and returns err.
func (a *Arena) strayOnError(ms []chunk.Mapped, err error) error {
	if err != nil {
		for _, m := range ms {
			a.maps++ // a stray counts as mapped
			a.strays = append(a.strays, stray{m.At, m.C})
		}
	}
	return err
}

// unstray unmaps the strays and gives them back to the pool, after waiting
// for the device unless the caller has ordered the unmaps already (a stray
// may have been in use). Those it cannot unmap stay strays, and it returns
// the error.
func (a *Arena) unstray(ordered bool) error {
	if len(a.strays) == 0 {
		return nil
	}
	if !ordered {
		if err := a.lend.SyncDevice(); err != nil {
			return err
		}
	}
	return a.unmapStrays(a.lend.Put)
}

// unmapStrays unmaps the strays, whose device work the caller has ordered,
// and hands each one unmapped to giveBack (the pool's Put, or a free to the
// driver). One that cannot be unmapped, or that a callback keeps, stays a
// stray. Call with mu held.
func (a *Arena) unmapStrays(giveBack func(chunk.Chunk) error) error {
	if len(a.strays) == 0 {
		return nil
	}
	ms := make([]chunk.Mapped, len(a.strays))
	for i, s := range a.strays {
		ms[i] = chunk.Mapped{At: s.at, C: s.c}
	}
	was := a.heldOf(ms)
	free, lerr := a.letGoHeld(BackingUndo, ms)
	errs := []error{lerr}
	kept := a.strays[:0]
	for i, s := range a.strays {
		if !free[i] {
			kept = append(kept, s)
			continue
		}
		if err := a.lend.Unmap(s.at); err != nil {
			errs = append(errs, err)
			if was[i] { // one no callback held may lack access: not told Mapped
				errs = append(errs, a.stillMapped(ms[i:i+1]))
			}
			kept = append(kept, s)
			continue
		}
		a.unmaps++
		errs = append(errs, giveBack(s.c))
	}
	clear(a.strays[len(kept):])
	a.strays = kept
	return errors.Join(errs...)
}

// dropTop gives back the chunks keep.. at the top of the arena, for cause:
// with streams, to the pool to be unmapped once the work queued on them now
// has run (the arena does not wait; the pool tells the callbacks before it
// unmaps them); without, or if that cannot be ordered, after the device
// has been waited for (here, unless waited says the caller has since they
// were dropped), unmapping them here, top down (a failed unmap, or a
// callback that refuses, maps back what was unmapped, and the arena is as
// it was). Cap drops to keep chunks on success. Call with mu held and the
// state frozen.
func (a *Arena) dropTop(keep int, waited bool, cause BackingCause) error {
	n := a.geo.n()
	if keep >= n {
		return nil
	}
	if len(a.streams) > 0 {
		ms := make([]chunk.Mapped, 0, n-keep)
		for i := keep; i < n; i++ {
			ms = append(ms, chunk.Mapped{At: a.at(i), C: a.geo.cs[i]})
		}
		a.leave(cause, ms)
		err := a.member.ReleaseAfter(ms, a.streams)
		if err == nil {
			a.unmaps += uint64(n - keep)
			a.geo.cut(keep)
			a.setCap()
			return nil
		}
		if !errors.Is(err, chunk.ErrNoOrder) {
			return err
		}
		waited = false // the events' failure: the work on the streams was not waited for
	}
	if !waited {
		if err := a.lend.SyncDevice(); err != nil {
			return err
		}
	}
	if err := a.detach(keep, cause); err != nil {
		return err
	}
	return a.release(keep)
}

// detach unmaps chunks keep.. top down, for cause, in preparation for giving
// them back: they stay in a.geo, and Cap stays, until release (or
// reattach, to undo). The callbacks let go of them first: one that refuses
// keeps them all mapped. If an unmap fails, it maps back what it unmapped
// (the callbacks take them again) and returns the error. Call with mu held,
// the state frozen and the device's work ordered.
func (a *Arena) detach(keep int, cause BackingCause) error {
	n := a.geo.n()
	if keep >= n {
		return nil
	}
	ms := make([]chunk.Mapped, 0, n-keep)
	for i := keep; i < n; i++ {
		ms = append(ms, chunk.Mapped{At: a.at(i), C: a.geo.cs[i]})
	}
	if _, err := a.letGo(cause, ms); err != nil {
		return errors.Join(err, a.announce(BackingUndo, ms))
	}
	for i := n - 1; i >= keep; i-- {
		if err := a.lend.Release(a.at(i), a.geo.cs[i]); err != nil {
			return errors.Join(err, a.reattach(i+1, n), a.announce(BackingUndo, ms[:i+1-keep]))
		}
		a.unmaps++
	}
	return nil
}

// reattach maps back chunks from..n-1, which detach unmapped; their physical
// memory was kept, so no byte is lost, and the callbacks take them again
// (cause BackingUndo). Should a map fail, the arena ends below that chunk:
// Cap drops there, the chunks above go back to the pool (the caller's thaw
// brings Len down to Cap), and it returns the error.
func (a *Arena) reattach(from, n int) (rerr error) {
	for j := from; j < n; j++ {
		err := a.lend.Map(a.at(j), a.geo.cs[j])
		if err == nil {
			a.maps++
			if err := a.announce(BackingUndo, []chunk.Mapped{{At: a.at(j), C: a.geo.cs[j]}}); err != nil {
				// Mapped back, and not registered: the error says so.
				rerr = errors.Join(rerr, fmt.Errorf("a chunk mapped back was refused by a callback: %w", err))
			}
			continue
		}
		k := j
		if errors.Is(err, chunk.ErrMapped) {
			a.maps++
			a.strays = append(a.strays, stray{a.at(j), a.geo.cs[j]})
			k++
		}
		for ; k < n; k++ {
			err = errors.Join(err, a.lend.Put(a.geo.cs[k]))
		}
		a.geo.cut(j)
		a.setCap()
		return errors.Join(rerr, err)
	}
	return rerr
}

// release gives the chunks detach unmapped (keep..) back to the pool and
// lowers Cap to match.
func (a *Arena) release(keep int) error {
	var errs []error
	for i := keep; i < a.geo.n(); i++ {
		errs = append(errs, a.lend.Put(a.geo.cs[i]))
	}
	a.geo.cut(keep)
	a.setCap()
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
// compare-and-swap) and lets Allocs run again. Len lowered makes the buffers
// above it stale (stale.go). Call with mu held.
func (a *Arena) thaw(s, n uint64) {
	e, l := a.nextEpoch(s), min(n, a.cap.Load())
	if l < s&lenMask {
		a.dropped(e, l)
		sched.At(sched.DropRecorded, a)
	}
	f := uint64(0)
	if a.lifeNow() != lifeOpen {
		f = frozen // every state but open keeps the word frozen (lifecycle.go)
	}
	a.state.Store(e | l | f)
}

// Truncate drops every allocation at or above offset n (0 ≤ n ≤ Len), like
// reslicing s[:n]: Len becomes n, and Cap stays: the memory stays mapped,
// to be used again at no cost, until Shrink or a pool under pressure takes
// it back (in TrapStale mode, Cap drops to n rounded up to the chunk size at
// once). Buffers that end above n are stale afterwards: copies through them
// fail with ErrStale, even once new allocations cover their range.
func (a *Arena) Truncate(n int) error {
	if err := a.lock(); err != nil {
		return err
	}
	defer a.mu.Unlock()
	a.member.Touch()
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
	a.floor.Store(uint64(n)) // what Grow promised is dropped with the bytes
	a.thaw(s, uint64(n))
	a.member.Dropped() // a growth waiting for memory may now reclaim it
	return nil
}

// trapDropped makes the bytes [n, l) that Truncate drops unusable: it unmaps
// the chunks above n (after waiting for the device) and poisons the rest.
// Call with mu held and the state frozen.
func (a *Arena) trapDropped(n, l uint64) error {
	if err := a.lend.SyncDevice(); err != nil {
		return err
	}
	if err := a.unstray(true); err != nil {
		return err
	}
	keep := a.geo.keep(n)
	if err := a.detach(keep, BackingTrapStale); err != nil {
		return err
	}
	if end := min(l, a.geo.off(keep)); end > n {
		if err := a.fence.wait(a.drv); err != nil {
			return errors.Join(err, a.reattach(keep, a.geo.n()))
		}
		if err := a.drv.Memset(a.base.Add(uintptr(n)), PoisonByte, uintptr(end-n)); err != nil {
			return errors.Join(fmt.Errorf("poison: %w", err), a.reattach(keep, a.geo.n()))
		}
	}
	return a.release(keep)
}

// Reset drops every allocation: Truncate(0). The memory stays mapped for
// reuse (except in TrapStale mode); Shrink gives it back, and so does a pool
// under pressure.
func (a *Arena) Reset() error { return a.Truncate(0) }

// Shrink gives back the chunks wholly above Len (like slices.Clip, at chunk
// granularity): afterwards Cap is Len rounded up to the chunk size. With
// Config.Streams it returns at once: the chunks are unmapped by the pool once
// the work queued on those streams has run, without a device-wide wait.
// Without streams it waits for the whole device, holding no lock (the
// arena's other calls go on meanwhile; a Truncate, Reset or Shrink among
// them makes it wait again), then unmaps; if an unmap fails, the chunks
// already unmapped are mapped back (their physical memory was kept, so no
// data is lost) and the arena is as it was.
func (a *Arena) Shrink() error { return a.shrinkTo(0) }

// ShrinkTo is Shrink keeping n bytes: it gives back the chunks wholly above
// max(Len, n), so that Cap is that rounded up to the chunk size, or less if
// Cap was less. What it keeps above Len is kept mapped for the arena's next
// use (a slot's next request, whose size the caller knows), not promised:
// a pool under pressure may still take it back, as it may take any memory
// mapped above Len. The rest goes back as Shrink's does. It fails with
// ErrInvalid for a negative n, and as Shrink does otherwise.
func (a *Arena) ShrinkTo(n int) error {
	if n < 0 {
		return fmt.Errorf("arena: shrink to %d: %w: negative size", n, ErrInvalid)
	}
	return a.shrinkTo(uint64(n))
}

// shrinkWaits bounds the waits for the device that a Shrink without streams
// makes before it takes the arena's lock: a wait is made again when a
// Truncate, Reset or Shrink ran meanwhile (the work queued before it on the
// memory it dropped may not have been waited for), and past the bound the
// last wait is made under the lock.
const shrinkWaits = 4

// shrinkTo is Shrink keeping keep bytes. Without streams its unmaps wait
// for the whole device, and it makes that wait first, holding nothing: the
// memory above Len when the wait began is then free of device work, which
// holds for what it gives back as long as no Truncate, Reset or Shrink ran
// meanwhile (the state word's epoch tells); when one did, it waits again.
func (a *Arena) shrinkTo(keep uint64) error {
	defer region(RegionShrink).End()
	wait := false // the locked part found memory to unmap: wait for the device first
	for i := 0; ; i++ {
		last := i == shrinkWaits || a == nil || len(a.streams) > 0
		waited, epoch := false, uint64(0)
		if !last && (wait || a.shrinks(keep)) {
			epoch = a.state.Load() & epochMask
			sched.At(sched.ShrinkWait, a)
			if err := a.lend.SyncDevice(); err != nil {
				return fmt.Errorf("arena: shrink: %w", err)
			}
			sched.At(sched.ShrinkWaited, a)
			waited = true
		}
		retry, err := a.shrinkLocked(keep, waited, epoch, last)
		if !retry {
			return err
		}
		wait = true
	}
}

// shrinks reports, without the arena's lock, whether a Shrink keeping keep
// bytes looks likely to unmap anything: a hint, checked again under the lock.
func (a *Arena) shrinks(keep uint64) bool {
	if a == nil || a.drv == nil {
		return false
	}
	top := min(max(a.state.Load()&lenMask, keep), a.reserved)
	return a.cap.Load() > a.chunkEnd(top)
}

// shrinkLocked is shrinkTo under the arena's lock. waited says the device
// was waited for since the state word's epoch was epoch; when it was not
// (waited false, or the epoch moved on) and there is something to unmap
// without streams, it changes nothing and asks for a wait (retry), unless
// last: then it waits for the device itself, under the lock.
func (a *Arena) shrinkLocked(keep uint64, waited bool, epoch uint64, last bool) (retry bool, err error) {
	if err := a.lock(); err != nil {
		return false, err
	}
	defer a.mu.Unlock()
	a.member.Touch()
	s := a.freeze()
	defer a.thaw(s, s&lenMask)
	waited = waited && s&epochMask == epoch
	top := min(max(s&lenMask, keep), a.reserved)
	keepChunks := a.geo.keep(top)
	if !waited && !last && (len(a.strays) > 0 || keepChunks < a.geo.n()) {
		return true, nil
	}
	c, n := a.cap.Load(), a.geo.n()
	if err := a.unstray(waited); err != nil {
		return false, fmt.Errorf("arena: shrink: %w", err)
	}
	if err := a.dropTop(keepChunks, waited, BackingShrink); err != nil {
		return false, fmt.Errorf("arena: shrink: %w", err)
	}
	a.floor.Store(s & lenMask)
	a.obs.gaveBack(a, EventShrink, c, n-a.geo.n())
	return false, nil
}

// Close unmaps every chunk, releases the reservation, and returns the chunks
// to the pool (closing a private pool): CloseContext with a context that is
// never done.
func (a *Arena) Close() error { return a.CloseContext(context.Background()) }

// CloseContext unmaps every chunk, releases the reservation, and returns the
// chunks to the pool (closing a private pool). It first waits for the work
// queued on Config.Streams to finish with the memory (or, without streams,
// for the device), including the chunks Shrink handed back that still wait
// and those a relief took and has not unmapped yet: until ctx is done, after
// which it returns an error wrapping ctx.Err() and changes nothing. It holds
// no lock while it waits: meanwhile the arena is closing, and refuses
// growth with ErrClosed (the waits of GrowContext and AllocContext on it end
// with ErrClosed), Sleep and Wake wait for the Close to end, and copies
// already under way complete before anything is unmapped. Buffers must not
// be used afterwards: copies through them fail with ErrClosed. A failed
// Close leaves the arena as it was (open, asleep or imported), with its Len,
// Cap and bytes, so it can be retried; chunks it took back from those still
// waiting stay with the arena (Stats.Strays) until the retry unmaps them.
// The one exception is the last step: once the reservation is released the
// arena is closed, and a sleeping arena's host copy (its contents, freed
// last) or a private pool that then fails to be freed is left for the next
// Close, which tries again. Close is safe to call more than once, and on a
// nil *Arena; later calls return nil, unless such a free failed, which they
// try again.
func (a *Arena) CloseContext(ctx context.Context) error {
	if a == nil {
		return nil
	}
	if a.drv == nil {
		return errNotMade
	}
	defer trace.StartRegion(ctx, RegionClose).End()
	prev, err := a.awaitTransition(ctx) // a Sleep, a Wake or another Close under way ends first
	if err != nil {
		return fmt.Errorf("arena: close: %w", err)
	}
	if prev == lifeClosed {
		// What a failed Close left: the host copy of a sleeping arena, the
		// private pool.
		defer a.mu.Unlock()
		if err := a.freeHost(); err != nil {
			return fmt.Errorf("arena: close: %w", err)
		}
		if a.ownPool {
			if err := a.pool.Close(); err != nil {
				return fmt.Errorf("arena: close: %w", err)
			}
		}
		return nil
	}
	sched.At(sched.CloseLocked, a)
	// An awake arena's host buffer is only kept for its next Offload: free
	// it first, while a failure still changes nothing. A sleeping arena's
	// holds its contents until the arena is gone.
	if prev != lifeAsleep {
		if err := a.freeHost(); err != nil {
			a.mu.Unlock()
			return fmt.Errorf("arena: close: %w", err)
		}
	}
	s := a.freeze()
	a.setLife(lifeClosing) // growths and reliefs for the arena stop; nothing else changes it
	a.mu.Unlock()
	a.member.Interrupt() // its waiters' retries fail with ErrClosed

	// The chunks still waiting in the pool for the device lie in the
	// reservation: take them back, to unmap with the rest once the device is
	// done (or to hand back to waiting if it is not done in time), and wait,
	// holding nothing, for a relief to unmap those it took.
	sched.At(sched.CloseWaiting, a)
	back, werr := a.reclaimAll(ctx)
	if werr == nil {
		werr = a.lend.WaitStreams(ctx, a.streams)
	}
	a.users.Lock() // copies under way end first; later ones see the arena closed
	defer a.users.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	fail := func(err error) error {
		a.setLife(prev)
		if prev == lifeAsleep {
			a.state.Store(s) // frozen, as a sleeping arena is
		} else {
			a.thaw(s, s&lenMask)
		}
		return fmt.Errorf("arena: close: %w", err)
	}
	if werr != nil {
		return fail(errors.Join(werr, a.dropMapped(BackingClose, back)))
	}
	for _, m := range back {
		a.maps++ // counted as strays: mapped above Cap
		a.strays = append(a.strays, stray{m.At, m.C})
	}
	// The scrubs the fence orders have run: its event can go (a later
	// record, should this Close fail, makes a new one).
	if err := a.fence.destroy(a.drv); err != nil {
		return fail(err)
	}
	if err := a.unstray(true); err != nil {
		return fail(err)
	}
	if prev == lifeAsleep {
		if err := a.closeAsleep(); err != nil { // sleep.go
			return fail(err)
		}
	}
	if err := a.detach(0, BackingClose); err != nil {
		return fail(err)
	}
	if err := a.releasing(); err != nil {
		return fail(errors.Join(err, a.reattach(0, a.geo.n())))
	}
	if err := a.drv.ReleaseMemAddress(a.base); err != nil {
		// The range stays: the callbacks take it again before the chunks
		// come back into it.
		return fail(errors.Join(err, a.unreleased(), a.reattach(0, a.geo.n())))
	}
	a.setLife(lifeClosed)
	// Frozen for good: every Alloc takes the slow path and sees closed.
	a.state.Store(frozen)
	a.member.Leave()
	a.delist() // sleep.go
	err = errors.Join(a.release(0), a.freeHost())
	if a.ownPool {
		err = errors.Join(err, a.pool.Close())
	}
	if err != nil {
		return fmt.Errorf("arena: close: %w", err)
	}
	return nil
}

// reclaimAll takes back the chunks of the arena's range still waiting in
// the pool for the device, for a Close or a Sleep that holds no lock (the
// arena is closing or sleeping: nothing else adds to them). A chunk a relief
// claimed is the relief's until it unmaps it: reclaimAll waits for that,
// holding nothing, until ctx is done; it then gives back what it took
// (to waiting again) and returns the error.
func (a *Arena) reclaimAll(ctx context.Context) ([]chunk.Mapped, error) {
	var back []chunk.Mapped
	for {
		got, busy := a.lend.ReclaimRange(a.base, uintptr(a.reserved))
		back = append(back, got...)
		if busy.IsZero() {
			return back, nil
		}
		if err := busy.Wait(ctx, nil); err != nil {
			return back, fmt.Errorf("wait for a relief's unmaps in the arena's range: %w", err)
		}
	}
}

// Stats describes an arena at one moment.
type Stats struct {
	Base        acl.DevicePtr // the arena's first byte
	Reserved    int           // address space reserved, bytes
	Mapped      int           // bytes mapped (Cap)
	Used        int           // bytes in use (Len)
	Reclaimable int           // bytes mapped above Len and what Grow promised: what a pool under pressure may take back
	Peak        int           // the most bytes ever in use at once
	ChunkSize   int           // bytes per chunk (the pool's large chunks, on a pool of two sizes)
	TailSize    int           // bytes per tail chunk: the smallest the arena maps (ChunkSize on a pool of one size)
	Chunks      int           // chunks mapped below Cap (not counted in a view from a backing callback)
	Headroom    int           // the headroom the worker keeps above Len now: learnt, between Config.Headroom and MaxHeadroom
	Misses      int64         // growths that mapped on the caller's path although the arena keeps headroom
	Maps        int64         // chunks placed in the arena's range: mapped, or taken back in place while they waited to be unmapped
	Unmaps      int64         // chunks taken out of it: unmapped, or handed to the pool to unmap once the device is done
	Grows       int64         // growths that placed at least one chunk
	Reclaimed   int64         // chunks the pool took back under pressure
	Refills     int64         // growths the pool's worker made to refill the headroom
	Strays      int           // chunks a failed undo left mapped above Cap (a sleeping arena's too); the next Grow, Shrink, Sleep, Wake or Close unmaps them
	Held        int           // chunks a sleeping arena holds unmapped, which a Sleep could not free (the driver refused): the next Sleep, Wake or Close gives them back
	Closed      bool
}

// Stats returns the arena's counters. A nil *Arena has none, and is closed;
// an Arena not made by New has none.
func (a *Arena) Stats() Stats {
	if a == nil {
		return Stats{Closed: true}
	}
	if a.drv == nil {
		return Stats{} // not made by New: nothing reserved, nothing mapped
	}
	if a.ev.owner.Load() != 0 && a.inCallback() {
		// A callback's own goroutine, which would wait for itself: what
		// the atomic words say.
		return Stats{Base: a.base, Reserved: int(a.reserved), Mapped: int(a.cap.Load()),
			Used: int(a.state.Load() & lenMask), ChunkSize: int(a.chunkSize),
			TailSize: int(a.unit), Closed: a.lifeNow() == lifeClosed}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.statsNow()
}

// statsNow is Stats. Call with mu held.
func (a *Arena) statsNow() Stats {
	used := a.state.Load() & lenMask
	mapped := a.cap.Load()
	strays, held := len(a.strays), 0
	if a.sl.st != nil {
		strays += a.sl.st.mapped() // a sleeping arena's slots a failure left mapped (sleep.go)
		held = a.sl.st.count(slotHeld)
	}
	return Stats{
		Base:        a.base,
		Reserved:    int(a.reserved),
		Mapped:      int(mapped),
		Used:        int(used),
		Reclaimable: int(mapped - min(a.keepBytes(used, math.MaxUint64), mapped)),
		Peak:        int(max(a.peak, used)),
		ChunkSize:   int(a.chunkSize),
		TailSize:    int(a.unit),
		Chunks:      a.geo.n(),
		Headroom:    int(a.hr.size.Load()),
		Misses:      int64(a.hr.misses),
		Maps:        int64(a.maps),
		Unmaps:      int64(a.unmaps),
		Grows:       int64(a.grows),
		Reclaimed:   int64(a.reclaimed),
		Refills:     int64(a.refills),
		Strays:      strays,
		Held:        held,
		Closed:      a.lifeNow() == lifeClosed,
	}
}
