package chunk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/sched"
	"github.com/vmarena/vmarena/internal/units"
)

// errBudgetShort is take's shortage of budget; a growth that fails words
// the error afresh (Pool.failed).
var errBudgetShort = fmt.Errorf("chunk: %w: %w", ErrBudget, acl.ErrOutOfMemory)

// Scrub says when a pool clears a chunk's bytes, so that no tenant reads
// bytes another tenant wrote.
type Scrub int

const (
	// ScrubOnReuse, the default, clears a chunk when it is mapped for a tenant
	// other than the one whose bytes it may hold: a chunk another tenant gave
	// back, or fresh physical memory that may hold bytes this or another
	// process freed (see acl.Caps.Fresh). A tenant that takes its own chunk
	// back skips the clear, so the common shrink-and-regrow cycle costs
	// nothing.
	ScrubOnReuse Scrub = iota
	// ScrubOnRelease clears a chunk when its tenant gives it back (before the
	// unmap), so the cache holds zeroed chunks. Chunks that come back some
	// other way (among them those released after the work of more than one
	// stream, which no one clear can follow), and fresh ones, are cleared on
	// reuse as above. It costs a
	// clear per released chunk, whether or not anyone reuses it.
	ScrubOnRelease
	// ScrubNever never clears: a chunk's next tenant may read what its
	// previous tenant wrote. For pools that serve a single tenant.
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

// Tenant identifies who may read the bytes of the chunks it holds: the unit
// of isolation. Chunks move between the arenas of one tenant without being
// cleared, and are cleared when they move between tenants. Make one with
// NewTenant; every arena is its own tenant unless its Config names one. The
// zero Tenant is anonymous: every Get by it counts as a different tenant.
type Tenant uint64

var lastTenant atomic.Uint64

// NewTenant returns a Tenant distinct from every other in the process.
func NewTenant() Tenant { return Tenant(lastTenant.Add(1)) }

// Holders of a chunk's bytes besides tenants.
const (
	zeroed Tenant = 0              // the bytes are zero
	fresh  Tenant = ^Tenant(0) - 1 // fresh from the driver: see Pool.needsScrub
)

// DefaultMaxCached is the reuse cache bound when Config.MaxCached is 0.
const DefaultMaxCached = 256

// Config configures a Pool. The zero value gives granularity-sized chunks of
// HBM, a 256-chunk reuse cache and no budget.
type Config struct {
	// Size is the chunk size in bytes, a multiple of the driver's
	// granularity. 0 lets the pool choose: with no Budget, the granularity
	// (2 MiB on ACL); with one, the size SizeFor gives the Budget (the power
	// of two nearest Budget/BudgetChunks, from the granularity to
	// MaxAutoSize), so that a large budget is mapped in few driver calls and
	// a small one wastes little (an arena holds at most one partial chunk
	// beyond its length, and many arenas share one budget). The size is
	// fixed at New: SetBudget does not change it.
	Size int
	// TailSize is the size of the pool's tail chunks in bytes: the pool
	// lends chunks of two sizes, large ones of Size and tail ones of
	// TailSize, so that an arena maps the whole large chunks of a growth
	// and the rest in tail chunks, and keeps less than a tail chunk mapped
	// beyond its length instead of less than a large one. The protocol with
	// the arenas counts in units of TailSize (Ask).
	//
	// 0, the default, lets the pool choose (DefaultTailSize): a quarter of
	// the chunk size where that is a multiple of the driver's granularity,
	// else the chunk size itself. Equal to the chunk size, the pool has one
	// size. Otherwise it is a multiple of the granularity, smaller than the
	// chunk size, that divides it.
	//
	// Each tail chunk costs an allocation, a map and an access call, so an
	// arena that grows a token at a time makes a call per TailSize bytes of
	// tokens: a tail much smaller than Size trades calls for the memory it
	// saves (docs/benchmarks.md measures a quarter of Size, a half, and a
	// sixteenth, and one size).
	TailSize int
	// MaxCached bounds the reuse cache, in chunks of the pool's size: on a
	// pool of two sizes (one list per size) it bounds the cache's bytes at
	// MaxCached large chunks, a tail counting as the part of one it is, so
	// that a cache of tails holds as much memory as one of large chunks.
	// 0 means DefaultMaxCached; a negative value disables the cache.
	MaxCached int
	// Budget caps the physical bytes the pool holds: chunks in use, cached,
	// allocated ahead, or waiting for the device before they are unmapped.
	// 0 means no cap beyond the device's memory.
	Budget int64
	// MemAttr is the kind of memory to allocate. 0 means acl.HBMMemHuge.
	MemAttr acl.MemAttr
	// Scrub says when chunks are cleared so that no tenant reads another's
	// bytes. The zero value is ScrubOnReuse.
	Scrub Scrub
	// FreshZeroed promises that the driver's MallocPhysical returns zeroed
	// memory, so fresh chunks need no scrub. Drivers that promise it
	// themselves (acl.Caps.Fresh, as the host driver does) need no help.
	FreshZeroed bool
	// Ahead keeps this many fresh chunks (large ones, on a pool of two
	// sizes) allocated in the cache by the pool's background worker, within
	// the budget, so that a growth that finds the cache empty does not wait
	// for MallocPhysical; cached chunks of both sizes count, by their bytes
	// (a tail as the part of a large chunk it is). 0 means none.
	Ahead int
	// WorkerCPU caps the pool's background worker at this share of one CPU,
	// averaged over a few milliseconds: 0.25 lets it work a quarter of the
	// time. 0, the default, sets no cap; otherwise it is from 0.01 to 1. The
	// worker's time is its rounds' wall time (its CPU and its driver calls);
	// when it has used more than its share it waits before its next round.
	// A capped worker answers later: more growths find no headroom mapped
	// and map on their caller's path, released chunks stay mapped longer
	// before they are unmapped, and Lender.Settle may wait for the worker's
	// credit. Stats.WorkerThrottledNS counts the waits.
	WorkerCPU float64
	// Logger receives the pool's events (see EventScrub and the others) as
	// structured records. nil, the default, logs nothing and costs nothing.
	Logger *slog.Logger
	// Shareable allocates chunks that can be exported to another process
	// (Export; arena's Buffer.Share). ACL exports any allocation; a driver that
	// shares file descriptors (acl.SharingFD) exports only those made with
	// PhysicalMemProp.HandleType = MemHandleTypePOSIX, which on the host
	// driver cost a descriptor and a kernel memory area each. New fails with
	// acl.ErrNotSupported when the driver cannot share.
	Shareable bool
}

// Chunk is one physical allocation of one of the pool's sizes: its chunk
// size (a large chunk) or its tail size (Config.TailSize).
type Chunk struct {
	Handle acl.PhysicalHandle
	// Size is the bytes of its physical allocation. The pool sets it when
	// it hands the chunk out; a chunk whose Size differs from the pool's
	// record of it is refused (acl.ErrInvalidParam), as one that is not out
	// of the pool is.
	Size uintptr
}

// Stats describes a pool at one moment.
type Stats struct {
	ChunkSize int   // bytes per large chunk: every chunk, on a pool of one size
	TailSize  int   // bytes per tail chunk, the unit of the pool's protocol (Pool.TailSize); ChunkSize on a pool of one size
	InUse     int   // chunks handed out and not yet Put back (mapped, or waiting to be unmapped)
	Cached    int   // chunks in the reuse cache
	Pending   int   // chunks of InUse waiting for the device before they are unmapped
	Freeing   int   // chunks on their way back to the driver: out of the books of InUse and Cached, still counted by HeldBytes and the budget until FreePhysical returns
	HeldBytes int64 // physical bytes held: InUseBytes + CachedBytes + FreeingBytes, and the chunks being allocated (or shared ones whose free failed, which Trim and Close retry)
	Budget    int64 // Config.Budget; 0 when none

	// The bytes of the chunks counted above, each chunk counted at its
	// Size: the counts say how many driver objects (handles) there are, the
	// bytes how much memory they hold.
	InUseBytes   int64 // bytes of the chunks of InUse
	CachedBytes  int64 // bytes of the chunks of Cached
	PendingBytes int64 // bytes of the chunks of Pending (a part of InUseBytes)
	FreeingBytes int64 // bytes of the chunks of Freeing

	Hits      int64 // chunks handed out from the cache
	Misses    int64 // chunks that called MallocPhysical
	Allocs    int64 // successful MallocPhysical calls
	Ahead     int64 // of Allocs, those made ahead of need (Config.Ahead, Warm)
	Frees     int64 // FreePhysical calls that freed (a refused one frees nothing)
	Evictions int64 // Puts that freed a chunk because the cache was full
	Failures  int64 // Gets (and imports) that failed for want of memory (budget or device)

	Conversions int64 // cached chunks freed to make room for chunks of the other size, for a take short of room that could not use them

	Scrubs      int64 // chunks cleared so that no tenant read another's bytes
	ScrubsFresh int64 // of Scrubs, fresh chunks from MallocPhysical
	ScrubsAsync int64 // of Scrubs, memsets queued on the tenant's stream instead of waited for

	Reclaimed     int64 // chunks taken back from members that held them mapped and unused
	PeerTrimmed   int64 // cached chunks other pools on the device freed for this one
	DeviceSyncs   int64 // SynchronizeDevice calls: unmaps ordered by waiting for the whole device
	Ordered       int64 // chunks unmapped after their events completed, without a device-wide wait
	SyncFallbacks int64 // stream-ordered releases that fell back to SynchronizeDevice (an event call failed)
	ReleaseErrors int64 // failed unmaps of pending chunks (they stay pending and are retried)

	WorkerNS    int64 // time the background worker spent working (refills, chunks ahead, releases): off the callers' paths, not free
	WorkerSpins int64 // rounds of work the worker did

	WorkerThrottledNS int64 // time the worker held rounds back to stay within Config.WorkerCPU

	Waiters int // growths waiting for memory in the pool's queue (GrowContext)

	Exported int64 // chunks exported to other processes (Export); freed, not cached, when put back
	Imported int64 // chunks imported from other processes (Import); freed when put back

	Members   int   // clients that joined the pool (Lender.Join) and have not left: its arenas
	UsedBytes int64 // bytes of the members' mapped memory in use, as those that are Meters report it (an arena: Len, while it is awake)
}

// Pool hands out chunks from one driver, of one size, or of two
// (Config.TailSize).
type Pool struct {
	drv       acl.Driver
	size      uintptr // the chunks' size (Config.Size)
	tail      uintptr // the tail chunks' size (Config.TailSize), the unit the protocol counts in: size, on a pool of one size
	prop      acl.PhysicalMemProp
	access    []acl.MemAccessDesc
	implicit  atomic.Bool // the driver has no MemSetAccess: mappings are accessible as made
	span      bool        // one MemSetAccess may cover adjacent mappings
	maxCached int
	budget    atomic.Uintptr // Config.Budget, or what SetBudget set
	scrub     Scrub
	fresh     acl.Freshness // what a fresh chunk may hold
	ahead     int
	workerCPU float64 // Config.WorkerCPU (workercap.go)
	clk       clock   // the worker's time: the wall clock, or a test's
	dev       *device
	log       *slog.Logger // Config.Logger (observe.go)

	mu      sync.Mutex
	closed  bool
	shareMu sync.Mutex                   // serialises Export, so that a chunk is exported once
	doomed  []doomedRef                  // shared chunks whose free failed: Trim and Close try again (share.go)
	cache   [2][]entry                   // largeList and tailList, each LIFO: the chunk unmapped last is reused first
	out     map[acl.PhysicalHandle]lease // chunks handed out and not yet Put back
	held    uintptr                      // bytes in use, cached, freeing, or being allocated
	stats   Stats
	members []*Member // in the order they joined
	pending pending   // chunks waiting for the device before they are unmapped (release.go)
	wq      waitq     // growths waiting for memory (wait.go)
	tick    atomic.Uint64
	w       *worker                // started on first need (worker.go)
	started atomic.Pointer[worker] // w once started, read without mu (Member.AskRefill)

	// reliefMu makes reliefs choose their chunks one at a time
	// (pressure.go), and guards tickets. Nothing that holds it waits for
	// memory or for the device; a member's Give runs under it.
	reliefMu sync.Mutex
	tickets  uint64 // the last relief's Ticket
	// relieving counts the growths relieving pressure now. TryAcquire
	// stands aside meanwhile (and while the device's waiters wait): a
	// refill would take the memory they free.
	relieving atomic.Int32
	// growing counts the growths under way (Lender.Grow), speculative ones
	// included: while one is, memory may move (wait.go, ErrDeadlock).
	growing atomic.Int32
	// freeing counts the chunks on their way back to the driver: still
	// held, no longer cached (see free); freeingBytes is their bytes.
	freeing      int
	freeingBytes uintptr
	// inUseBytes and cachedBytes are the bytes of the chunks stats.InUse
	// and stats.Cached count, each at its own size.
	inUseBytes, cachedBytes uintptr
	// returns counts the chunks that came back to the cache or the driver
	// (those an acquire puts back where they came from, as putBack does,
	// are not counted: nothing came back that was not there before): a
	// growth reads it before its take and its relief after, for room it
	// did not make itself (a chunk the worker freed is room on the device,
	// not in the cache).
	returns uint64
	// filling counts the chunks the worker is allocating ahead
	// (Config.Ahead, Warm): held, not yet cached (Member.Sleep waits).
	filling int
}

// entry is a cached chunk, whose bytes it holds, and its size.
type entry struct {
	h      acl.PhysicalHandle
	holder Tenant
	size   uintptr
}

// lease is a chunk out of the pool: who has it, whose bytes it holds, and
// its size (the pool's record, which a Chunk handed back must match).
type lease struct {
	tenant Tenant
	holder Tenant
	size   uintptr
	shared *shared // exported or imported: freed when put back (share.go)
}

// New returns a pool of chunks from drv. It checks every field of cfg
// first and fails with an error matching acl.ErrInvalidParam that names the
// field and the rule: a Size that is not a multiple of the driver's
// granularity or passes its largest reservation, a TailSize that does not
// divide it, a Budget below one chunk,
// an Ahead beyond the reuse cache, the budget or the device's memory, a
// WorkerCPU outside its range.
func New(drv acl.Driver, cfg Config) (*Pool, error) {
	if drv == nil || isNilPointer(drv) {
		return nil, fmt.Errorf("chunk: %w: nil driver", acl.ErrInvalidParam)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("chunk: %w: "+format, append([]any{acl.ErrInvalidParam}, args...)...)
	}
	switch {
	case cfg.Size < 0:
		return nil, bad("Config.Size %d: want 0 (the driver's granularity) or a multiple of the granularity", cfg.Size)
	case cfg.TailSize < 0:
		return nil, bad("Config.TailSize %d: want 0 (the pool's choice, DefaultTailSize) or a multiple of the granularity that divides Config.Size", cfg.TailSize)
	case cfg.Budget < 0:
		return nil, bad("Config.Budget %d: want 0 (no cap) or more", cfg.Budget)
	case cfg.Ahead < 0:
		return nil, bad("Config.Ahead %d: want 0 (none) or more", cfg.Ahead)
	case cfg.Scrub < ScrubOnReuse || cfg.Scrub > ScrubNever:
		return nil, bad("Config.Scrub %v: want ScrubOnReuse, ScrubOnRelease or ScrubNever", cfg.Scrub)
	}
	if err := checkWorkerCPU(cfg.WorkerCPU); err != nil {
		return nil, err
	}
	prop := acl.DeviceProp(drv.Device(), cfg.MemAttr)
	caps := drv.Caps()
	if cfg.Shareable {
		if caps.Sharing == acl.SharingNone {
			return nil, fmt.Errorf("chunk: shareable chunks: %w: %s does not share memory between processes", acl.ErrNotSupported, drv.Name())
		}
		prop.HandleType = caps.Sharing.HandleType()
	}
	g, err := drv.MemGetAllocationGranularity(&prop, acl.GranularityMinimum)
	if err != nil {
		return nil, fmt.Errorf("chunk: granularity of Config.MemAttr %v (Shareable %v): %w", cfg.MemAttr, cfg.Shareable, err)
	}
	size := uintptr(cfg.Size)
	if size == 0 {
		size = autoSize(cfg.Budget, g, caps.ReserveLimit())
	}
	if size%g != 0 {
		return nil, bad("Config.Size %s is not a multiple of the driver's granularity, %s", units.Bytes(int64(size)), units.Bytes(int64(g)))
	}
	if limit := caps.ReserveLimit(); size > limit {
		return nil, bad("Config.Size %s exceeds %s's largest reservation, %s: no arena could map a chunk",
			units.Bytes(int64(size)), drv.Name(), units.Ubytes(uint64(limit)))
	}
	tail := uintptr(DefaultTailSize(int(size), int(g)))
	if cfg.TailSize > 0 {
		tail = uintptr(cfg.TailSize)
		switch {
		case tail%g != 0:
			return nil, bad("Config.TailSize %s is not a multiple of the driver's granularity, %s", units.Bytes(int64(tail)), units.Bytes(int64(g)))
		case cfg.Size == 0 && size%tail != 0:
			return nil, bad("Config.TailSize %s does not divide the chunk size the pool chose for Config.Size 0, %s (see SizeFor)",
				units.Bytes(int64(tail)), units.IEC(int64(size)))
		case tail > size:
			return nil, bad("Config.TailSize %s is larger than Config.Size, %s", units.Bytes(int64(tail)), units.IEC(int64(size)))
		case size%tail != 0:
			return nil, bad("Config.TailSize %s does not divide Config.Size, %s", units.Bytes(int64(tail)), units.IEC(int64(size)))
		}
	}
	if cfg.Budget > 0 && uintptr(cfg.Budget) < size {
		return nil, bad("Config.Budget %s is less than one chunk, %s: the pool could hand out nothing",
			units.Bytes(cfg.Budget), units.IEC(int64(size)))
	}
	maxCached := cfg.MaxCached
	switch {
	case maxCached == 0:
		maxCached = DefaultMaxCached
	case maxCached < 0:
		maxCached = 0
	}
	if cfg.Ahead > 0 {
		if err := checkAhead(drv, cfg, size, maxCached); err != nil {
			return nil, err
		}
	}
	p := &Pool{
		drv:       traced{Driver: drv}, // trace.go; hist once it joins its device
		log:       cfg.Logger,
		size:      size,
		tail:      tail,
		prop:      prop,
		access:    acl.ReadWrite(drv.Device()),
		span:      caps.AccessSpan,
		maxCached: maxCached,
		scrub:     cfg.Scrub,
		fresh:     caps.Fresh,
		ahead:     cfg.Ahead,
		workerCPU: cfg.WorkerCPU,
		clk:       realClock{},
		out:       make(map[acl.PhysicalHandle]lease),
	}
	if cfg.FreshZeroed {
		p.fresh = acl.FreshZeroed
	}
	p.budget.Store(uintptr(cfg.Budget))
	p.pending.init()
	p.stats.ChunkSize = int(size)
	p.stats.TailSize = int(tail)
	p.stats.Budget = cfg.Budget
	p.dev = join(p)
	p.drv = traced{Driver: drv, hist: p.dev.hist}
	if p.ahead > 0 {
		p.wake()
	}
	return p, nil
}

// isNilPointer reports whether d is a nil pointer in an interface, whose
// methods would dereference it.
func isNilPointer(d acl.Driver) bool {
	v := reflect.ValueOf(d)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// Driver returns the pool's driver (nil for a Pool not made by New).
func (p *Pool) Driver() acl.Driver {
	if !p.made() {
		return nil
	}
	return p.drv.(traced).Driver
}

// made reports whether New made p: a zero Pool refuses everything
// (errNotMade) rather than dereference what it lacks.
func (p *Pool) made() bool { return p != nil && p.drv != nil }

// ChunkSize returns the size of the large chunks, in bytes (of every chunk,
// on a pool of one size): Config.Size, or the size the pool chose for
// Config.Size 0 (see SizeFor). It never changes.
func (p *Pool) ChunkSize() int { return int(p.size) }

// TailSize returns the size of the tail chunks, in bytes: Config.TailSize,
// or ChunkSize on a pool of one size. It is the unit the pool's protocol
// with its arenas counts in (Ask, Fits, Step.Missing, Client). It never
// changes.
func (p *Pool) TailSize() int { return int(p.tail) }

// Budget returns the most physical bytes the pool holds (Config.Budget, or
// what SetBudget set last); 0 when there is no cap.
func (p *Pool) Budget() int64 { return int64(p.budget.Load()) }

// SetBudget changes the most physical bytes the pool holds; 0 removes the
// cap. The chunk sizes stay what New chose (from Config.Budget, when
// Config.Size was 0): chunks already handed out, cached and mapped are all
// of the pool's sizes. Raising it wakes the first growth waiting for
// memory. Lowering it below what the pool holds takes nothing back at once:
// growths fail, or reclaim, until the pool is under it again, and Trim
// frees the cache. It
// fails with acl.ErrInvalidParam for a negative budget, and with ErrClosed
// after Close.
func (p *Pool) SetBudget(n int64) error {
	if !p.made() {
		return errNotMade
	}
	if n < 0 {
		return fmt.Errorf("chunk: set budget %d: %w: negative", n, acl.ErrInvalidParam)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errClosed
	}
	old := p.budget.Load()
	p.budget.Store(uintptr(n))
	p.stats.Budget = n
	if n == 0 || uintptr(n) > old && old != 0 {
		p.releasedLocked() // wait.go: room for the first waiter
	}
	return nil
}

// Get returns a chunk for an anonymous tenant: GetFor(0).
func (p Lender) Get() (Chunk, error) { return p.GetFor(0) }

// GetFor returns one chunk for tenant t: Acquire(t, 1).
func (p Lender) GetFor(t Tenant) (Chunk, error) {
	cs, err := p.Acquire(t, 1)
	if err != nil {
		return Chunk{}, err
	}
	return cs[0], nil
}

// Acquire returns n chunks for tenant t, all or none, each of the chunk size
// (large ones, on a pool of two sizes: tail chunks never stand in for them):
// from the cache first (preferring chunks that hold t's bytes or zeros, so
// that they need no scrub), then from the driver, and, on a pool of two
// sizes short of room, by converting cached tail chunks (see TakeFree).
// When the budget or the device has no room, it relieves the pressure as
// any growth does (Lender.Grow), for no growth of a member: it takes chunks
// that the pool's members hold mapped but unused (idle ones first, least
// recently used first, and never what a growth a relief chose before is
// growing into, see Growth) and chunks waiting for the device, waits for
// the device to finish with those (and only those), and, when the device is
// out of memory, asks the other pools on the device to free their caches.
// It holds no chunk while it waits. It fails with an error matching
// acl.ErrOutOfMemory (and ErrBudget, when the budget refused) when that is
// not enough, and with ErrClosed after Close. n chunks that exceed the
// budget by themselves fail at once, before any driver call.
func (p Lender) Acquire(t Tenant, n int) ([]Chunk, error) {
	if !p.pool.made() {
		return nil, errNotMade
	}
	o, err := p.pool.exact(n)
	if err != nil {
		return nil, err
	}
	if err := p.pool.checkAsk(o); err != nil {
		return nil, err
	}
	if t == 0 {
		t = NewTenant()
	}
	tk := &taker{p: p.pool, t: t, o: o}
	var g Growth
	if err := p.Grow(context.Background(), &g, t, tk, MayRelieve); err != nil {
		return nil, err
	}
	return tk.got, nil
}

// taker is Acquire's Placer: a growth of an exact order that maps nothing
// and holds no lock.
type taker struct {
	p   *Pool
	t   Tenant
	o   order
	got []Chunk
}

func (tk *taker) Place(have []Chunk) (Step, error) {
	// The order is of large chunks: tail chunks a relief handed over, and
	// large ones beyond the order, go back.
	keep, extra := have[:0:0], have[:0:0]
	for _, c := range have {
		if c.Size == tk.p.size && len(keep) < tk.o.large {
			keep = append(keep, c)
		} else {
			extra = append(extra, c)
		}
	}
	if len(extra) > 0 {
		if err := tk.p.putAll(extra); err != nil {
			return Step{}, errors.Join(err, tk.p.putAll(keep))
		}
	}
	have = keep
	got, err := tk.p.acquire(have, tk.t, tk.p.exactOf(tk.o.large-len(have)), takeFree)
	if err == nil {
		tk.got = got
		return Step{}, nil
	}
	err = errors.Join(err, tk.p.putAll(have))
	if errors.Is(err, acl.ErrOutOfMemory) {
		return Step{Missing: tk.o.units, Short: err}, nil
	}
	return Step{}, err
}

func (tk *taker) Unlock() <-chan struct{} { return nil }
func (tk *taker) Lock()                   {}

// An Ask is what a take asks the pool for, counted in units of the pool's
// tail size (Pool.TailSize; on a pool of one size a unit is a chunk): Units
// units in all, of which at most Large may come as large chunks (of
// Pool.ChunkSize, ChunkSize/TailSize units each), the rest in tail chunks.
// Tail chunks may stand in for large ones: a take may serve the whole ask
// in tail chunks. On a pool of one size, Large is ignored.
type Ask struct {
	Units int
	Large int
}

// order is an Ask as take serves it: units of the tail size, at most large
// of them in large chunks; exact asks for large chunks only, which tail
// chunks do not stand in for (Acquire's n chunks).
type order struct {
	units, large int
	exact        bool
}

// per returns how many units a large chunk holds.
func (p *Pool) per() int { return int(p.size / p.tail) }

// orderOf returns the order of a: on a pool of one size every unit is a
// chunk, and Large does not matter.
func (p *Pool) orderOf(a Ask) (order, error) {
	if a.Units < 0 || p.per() > 1 && a.Large < 0 {
		return order{}, fmt.Errorf("chunk: acquire %d units, %d large: %w", a.Units, a.Large, acl.ErrInvalidParam)
	}
	k := p.per()
	if k == 1 {
		return order{units: a.Units, large: a.Units}, nil
	}
	return order{units: a.Units, large: min(a.Large, a.Units/k)}, nil
}

// exact returns the order of n large chunks, for Acquire.
func (p *Pool) exact(n int) (order, error) {
	if n < 0 || n > math.MaxInt/p.per() {
		return order{}, fmt.Errorf("chunk: acquire %d chunks: %w", n, acl.ErrInvalidParam)
	}
	return p.exactOf(n), nil
}

// exactOf is exact for an n known to be in range.
func (p *Pool) exactOf(n int) order { return order{units: n * p.per(), large: n, exact: true} }

// TakeFree appends to dst chunks for tenant t that make exactly a's units,
// with at most a.Large large ones, all or none (see Ask), taking only
// memory that is free now (the cache, the budget's room, the device's): it
// never waits and takes nothing from anyone, so a caller may hold a
// member's lock. It appends the large chunks first, then the tail ones. It
// takes large chunks from the cache, then fresh ones within the budget's
// room; then tail chunks from the cache, then fresh ones; and when the
// budget or the device is still short, it converts cached chunks the ask
// cannot use (large ones beyond what it takes), freeing them to allocate
// the tail chunks it lacks in their room (Stats.Conversions); a take of
// tail chunks converts the large chunks idle in the cache beyond those the
// worker keeps ahead before it allocates fresh ones. With a dst of
// room enough it allocates nothing. A shortage is not counted in
// Stats.Failures (nor logged): its caller is expected to relieve the
// pressure next (Lender.Grow), which is. On failure it returns dst as it
// was.
func (p Lender) TakeFree(dst []Chunk, t Tenant, a Ask) ([]Chunk, error) {
	return p.ask(dst, t, a, takeFree)
}

// ask is TakeFree and TryAcquire: a's order, acquired in mode.
func (p Lender) ask(dst []Chunk, t Tenant, a Ask, mode acquireMode) ([]Chunk, error) {
	if !p.pool.made() {
		return dst, errNotMade
	}
	o, err := p.pool.orderOf(a)
	if err != nil {
		return dst, err
	}
	return p.pool.acquire(dst, t, o, mode)
}

// TryAcquire is TakeFree for speculative growth (the background worker's
// refills of headroom, and prefetches): while a growth relieves pressure,
// or any growth on the device waits for memory, it takes nothing, and fails
// with an error matching acl.ErrOutOfMemory, since the memory being freed,
// or given back, is for that growth. Its shortages count as failures.
func (p Lender) TryAcquire(dst []Chunk, t Tenant, a Ask) ([]Chunk, error) {
	return p.ask(dst, t, a, standAside)
}

// The ways an acquire may take its chunks.
type acquireMode int

const (
	takeFree   acquireMode = iota // take only what is free now
	standAside                    // takeFree, and nothing while a growth relieves or waits
)

// checkAsk refuses, before any driver call, an order larger than the whole
// budget.
func (p *Pool) checkAsk(o order) error {
	if !p.made() {
		return errNotMade
	}
	if b := p.budget.Load(); b != 0 && uint64(o.units) > uint64(b/p.tail) {
		p.mu.Lock()
		p.stats.Failures++
		p.mu.Unlock()
		err := fmt.Errorf("chunk: %w: %w: %s asked, more than the whole budget, %s", ErrBudget,
			acl.ErrOutOfMemory, units.Ubytes(uint64(o.units)*uint64(p.tail)), units.Bytes(int64(b)))
		p.logOOM(o.units, p.Stats(), err)
		return err
	}
	return nil
}

// acquire appends the chunks of o for t to dst as mode says, taking only
// what is free now (nil dst: it makes a slice of its own). On failure it
// returns dst as it was.
func (p *Pool) acquire(dst []Chunk, t Tenant, o order, mode acquireMode) ([]Chunk, error) {
	if mode == standAside && o.units > 0 {
		switch {
		case p.relieving.Load() > 0:
			return dst, fmt.Errorf("chunk: acquire %d units: %w: another growth is relieving pressure", o.units, acl.ErrOutOfMemory)
		case p.dev.waiters.Load() > 0:
			return dst, fmt.Errorf("chunk: acquire %d units: %w: a growth waits for memory", o.units, acl.ErrOutOfMemory)
		}
	}
	if err := p.checkAsk(o); err != nil {
		return dst, err
	}
	if t == 0 {
		t = NewTenant()
	}
	p.dev.note(t)
	if dst == nil {
		n := o.units // tail chunks may stand in for every large one
		if o.exact {
			n = o.large
		}
		dst = make([]Chunk, 0, n)
	}
	base := len(dst)
	got := dst
	short, err := p.take(t, o, &got)
	if err != nil {
		return dst[:base], errors.Join(err, p.putBack(got[base:]))
	}
	if short != nil {
		perr := p.putBack(got[base:])
		if mode == takeFree { // its caller relieves next, and that counts
			return dst[:base], errors.Join(short, perr)
		}
		return dst[:base], errors.Join(p.failed(o.units, short, nil), perr)
	}
	return got, nil
}

// budgetView says how much of the budget a view of the pool shows held.
func budgetView(st Stats) string {
	return fmt.Sprintf("%s of %s", units.IEC(st.HeldBytes), units.Bytes(st.Budget))
}

// roomNow is how many units a take could have at once without relief: the
// cache's, and what the budget leaves (none known without a budget), once
// the chunks on their way back to the driver are freed: it waits for those
// frees (the pool's own, and a sleeping arena's), holding nothing, until
// ctx is done or stop is closed. Chunks can come back while a growth relieves
// pressure (the worker puts back those whose device work ended, and frees
// what the cache cannot keep), so a relief that freed nothing itself is
// worth a retry when there is room.
func (p *Pool) roomNow(ctx context.Context, stop <-chan struct{}) (int, error) {
	told := false
	err := poll(ctx, stop, func() bool {
		p.mu.Lock()
		n := p.freeing
		p.mu.Unlock()
		if n > 0 && !told {
			told = true
			sched.At(sched.FreesAwaited, p)
		}
		return n == 0
	})
	if err != nil {
		return 0, fmt.Errorf("chunk: wait for chunks on their way back to the driver: %w", err)
	}
	return p.roomNowNoWait(), nil
}

// returnsNow reads the count of chunks that came back to the cache or the
// driver, for returnsSince.
func (p *Pool) returnsNow() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.returns
}

// returnsSince reports whether chunks came back to the cache or the driver
// since returnsNow returned n.
func (p *Pool) returnsSince(n uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.returns != n
}

// The reuse cache's lists, one LIFO per size.
const (
	largeList = iota // chunks of the chunk size (all of them, on a pool of one size)
	tailList         // chunks of the tail size
)

// listOf returns the cache's list for chunks of size bytes.
func (p *Pool) listOf(size uintptr) int {
	if size == p.size {
		return largeList
	}
	return tailList
}

// fitsLocked reports whether the order o could be taken now, as far as the
// pool's books know: from the cache, and within what the budget leaves once
// the cached chunks o cannot use are converted (freed to make room: large
// ones beyond o.large; tail ones, for an exact order). With no budget only
// the device can say, by refusing an allocation. Call with mu held.
func (p *Pool) fitsLocked(o order) bool {
	b := p.budget.Load()
	if b == 0 {
		return true
	}
	nl := len(p.cache[largeList])
	usable := min(nl, o.large) // large cached chunks o takes as they are
	convert := uintptr(nl-usable) * p.size
	if o.exact {
		convert += p.cachedBytes - uintptr(nl)*p.size // the tail chunks
	}
	room := uintptr(0) // bytes for fresh chunks, once those are freed
	if p.held < b+convert {
		room = b + convert - p.held
	}
	if o.exact {
		return uint64(o.large-usable) <= uint64(room/p.size)
	}
	have := usable*p.per() + len(p.cache[tailList]) // units: tail chunks stand in for large ones
	return o.units <= have || uint64(o.units-have) <= uint64(room/p.tail)
}

// Fits reports whether a TakeFree of units units could succeed now, as far
// as the pool's books know: the cache (chunks of both sizes: a cached chunk
// a take cannot use is converted, freed to make room) and the budget's room
// (with no budget, only the device can refuse). It takes nothing, and the
// answer can be stale by the time the caller acts on it: a client checks it
// before work that a shortage would undo (a Wake that maps step by step),
// and still handles the shortage.
func (p Lender) Fits(units int) bool {
	if !p.pool.made() {
		return false
	}
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	return !p.pool.closed && p.pool.fitsLocked(order{units: units, large: units / p.pool.per()})
}

// roomNowNoWait is roomNow without the wait for frees under way.
func (p *Pool) roomNowNoWait() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := int(p.cachedBytes / p.tail)
	if b := p.budget.Load(); b != 0 && p.held < b {
		n += int((b - p.held) / p.tail)
	}
	return n
}

// take appends to got chunks for t that make the order o, in this order:
//
//  1. large chunks from the cache, up to o.large;
//  2. fresh large chunks within the budget's room, up to what o.large
//     leaves;
//  3. tail chunks from the cache for all the units left (tail chunks stand
//     in for large ones; not for an exact order);
//  4. fresh tail chunks within the room;
//  5. conversion, when it is still short for want of budget or of device
//     memory: cached chunks o cannot use are freed to make room for the
//     chunks it lacks (see convert).
//
// On a pool of one size only the first two apply. It returns why it fell
// short (a budget or out-of-memory error), or an error that ends the
// Acquire (ErrClosed, a driver failure other than out of memory).
func (p *Pool) take(t Tenant, o order, got *[]Chunk) (short, fatal error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errClosed
	}
	if !p.fitsLocked(o) {
		// An acquire takes all or nothing: what the cache and the budget
		// hold cannot make the order, so nothing is taken or allocated
		// (each chunk allocated here would be freed again, the cache being
		// full, or kept from the relief that follows).
		p.mu.Unlock()
		return errBudgetShort, nil
	}
	k := p.per()
	units, large := 0, 0
	for large < o.large && len(p.cache[largeList]) > 0 {
		*got = append(*got, p.hitLocked(t, largeList))
		large++
		units += k
	}
	n := p.reserveLocked(p.size, o.large-large)
	if p.cachedBelowLocked(p.ahead) && !p.dormantLocked() {
		p.wakeLocked() // the cache ran below what the worker keeps ahead
	}
	p.mu.Unlock()
	if units == o.units {
		return nil, nil
	}
	made, err := p.allocate(t, p.size, n, got)
	large += made
	units += made * k
	if err != nil && !errors.Is(err, acl.ErrOutOfMemory) {
		return nil, err
	}
	oom := err
	if units < o.units && k > 1 && !o.exact {
		p.mu.Lock()
		for units < o.units && len(p.cache[tailList]) > 0 {
			*got = append(*got, p.hitLocked(t, tailList))
			units++
		}
		idle := len(p.cache[largeList]) > p.ahead
		p.mu.Unlock()
		if idle {
			// Large chunks idle in the cache beyond what the worker keeps
			// ahead become tail chunks before the pool holds more: a pool
			// whose growths have turned to tails (sequences decoding after
			// their prompts) would otherwise keep them as well as the tails.
			added, err := p.convert(t, o, units, large, got, true)
			units += added
			if err != nil && !errors.Is(err, acl.ErrOutOfMemory) {
				return nil, err
			}
		}
		p.mu.Lock()
		n := p.reserveLocked(p.tail, o.units-units)
		p.mu.Unlock()
		made, err := p.allocate(t, p.tail, n, got)
		units += made
		if err != nil && !errors.Is(err, acl.ErrOutOfMemory) {
			return nil, err
		}
		if err != nil {
			oom = err
		}
	}
	if units < o.units && k > 1 {
		added, err := p.convert(t, o, units, large, got, false)
		units += added
		if err != nil && !errors.Is(err, acl.ErrOutOfMemory) {
			return nil, err
		}
		if err != nil {
			oom = err
		}
	}
	switch {
	case units == o.units:
		return nil, nil
	case oom != nil:
		return oom, nil
	}
	return errBudgetShort, nil // acquire says what was held when it gives up
}

// hitLocked lends t a chunk from the cache's list: the last one put back
// that holds t's bytes or zeros (it needs no scrub), else the last one put
// back. Call with mu held.
func (p *Pool) hitLocked(t Tenant, list int) Chunk {
	l := p.cache[list]
	i := len(l) - 1
	for j := i; j >= 0; j-- {
		if h := l[j].holder; h == t || h == zeroed {
			i = j
			break
		}
	}
	e := p.uncacheLocked(list, i)
	p.lendLocked(e.h, lease{tenant: t, holder: e.holder, size: e.size})
	p.stats.Hits++
	return Chunk{e.h, e.size}
}

// reserveLocked books in held up to want fresh chunks of size bytes within
// the budget's room, counts them as misses, and returns how many. Call with
// mu held.
func (p *Pool) reserveLocked(size uintptr, want int) int {
	if want <= 0 {
		return 0
	}
	n := want
	if b := p.budget.Load(); b != 0 {
		free := uintptr(0)
		if p.held < b {
			free = (b - p.held) / size
		}
		n = min(want, int(free))
	}
	p.held += uintptr(n) * size
	p.stats.Misses += int64(n)
	return n
}

// allocate allocates n chunks of size bytes for t, which the caller booked
// in held, and appends them to got. It returns how many it made, and the
// driver's error that stopped it; what it did not make leaves held.
func (p *Pool) allocate(t Tenant, size uintptr, n int, got *[]Chunk) (made int, err error) {
	for ; made < n; made++ {
		var h acl.PhysicalHandle
		h, err = p.drv.MallocPhysical(size, &p.prop, 0)
		if err != nil {
			break
		}
		p.mu.Lock()
		p.stats.Allocs++
		p.lendLocked(h, lease{tenant: t, holder: p.freshHolder(), size: size})
		p.mu.Unlock()
		*got = append(*got, Chunk{h, size})
	}
	if made < n {
		p.mu.Lock()
		p.held -= uintptr(n-made) * size
		p.mu.Unlock()
	}
	if err != nil {
		return made, fmt.Errorf("chunk: allocate %s: %w", units.Bytes(int64(size)), err)
	}
	return made, nil
}

// convert serves what a take still lacks of the order o (it took units of
// it, large of them in large chunks) by conversion: it takes out of the
// cache the chunks o cannot use (large ones, all beyond what o took; tail
// ones, for an exact order), as few as make room for what o lacks with the
// budget's room, and frees them, keeping their bytes booked in held for
// this take while they are freed, so that no other growth can take the
// room; then it allocates the chunks o lacks into that room, and releases
// what is left. When the cache and the room cannot make what o lacks, it
// converts nothing. With idle set it converts, whatever room the budget
// leaves, only the large chunks cached beyond what the worker keeps ahead,
// for as much of what o lacks as they make. It returns the units it added
// to got, and the driver's error that stopped it.
func (p *Pool) convert(t Tenant, o order, units, large int, got *[]Chunk, idle bool) (added int, err error) {
	size, per, want, from := p.tail, 1, o.units-units, largeList
	if o.exact {
		size, per, want, from = p.size, p.per(), o.large-large, tailList
	}
	p.mu.Lock()
	keep := 0 // cached chunks conversion leaves
	if idle {
		keep = p.ahead
		if spare := len(p.cache[from]) - keep; spare > 0 {
			want = min(want, spare*int(p.size/size))
		}
	}
	need := uintptr(want) * size
	if p.closed || len(p.cache[from]) <= keep {
		p.mu.Unlock()
		return 0, nil
	}
	room := uintptr(0) // what the budget leaves; with no budget, only the conversion's room is known
	if b := p.budget.Load(); !idle && b != 0 && p.held < b {
		room = b - p.held
	}
	var buf [8]entry
	victims := buf[:0]
	var freeing uintptr
	for room+freeing < need && len(p.cache[from]) > keep {
		e := p.uncacheLocked(from, 0) // the least recently cached first
		p.freeingLocked(e.size)
		victims = append(victims, e)
		freeing += e.size
	}
	if room+freeing < need {
		// Not enough: convert nothing, and the cache is as it was.
		for _, e := range victims {
			p.freedLocked(e.size)
			p.stats.Cached++
			p.cachedBytes += e.size
		}
		p.cache[from] = slices.Insert(p.cache[from], 0, victims...)
		p.mu.Unlock()
		return 0, nil
	}
	extra := need - min(need, freeing) // of the budget's room
	p.held += extra
	p.mu.Unlock()

	held := extra // the bytes this take holds for its chunks: extra, and the victims freed
	for _, e := range victims {
		ferr := p.drv.FreePhysical(e.h)
		p.mu.Lock()
		p.freedLocked(e.size)
		if ferr != nil {
			p.cacheLocked(e) // the driver kept it, and so do we: held as cached
		} else {
			p.stats.Frees++
			p.stats.Conversions++
			held += e.size
		}
		p.mu.Unlock()
	}
	n := min(want, int(held/size))
	p.mu.Lock()
	p.stats.Misses += int64(n)
	p.mu.Unlock()
	made, err := p.allocate(t, size, n, got) // n·size of held is theirs, made or not
	p.mu.Lock()
	left := held - uintptr(n)*size
	p.held -= left
	if left > 0 {
		p.returns++
	}
	p.mu.Unlock()
	if left > 0 {
		p.freed() // wait.go
	}
	return made * per, err
}

// freshHolder is the holder of a chunk fresh from the driver: zeroed where
// the driver zeroes fresh memory, and where the device clears memory between
// processes (acl.FreshProcess) while no pool of this process has freed any
// of the device's memory yet, since only this process's frees could then
// have put bytes in it; else fresh (needsScrub decides). Call it after
// MallocPhysical returned: a free that could have given this memory back
// marked the history before its FreePhysical began (traced), so the mark is
// seen here.
func (p *Pool) freshHolder() Tenant {
	if p.fresh == acl.FreshZeroed || p.fresh == acl.FreshProcess && !p.dev.hist.freed.Load() {
		return zeroed
	}
	return fresh
}

// unitsOf returns the units (of the tail size) that cs hold.
func (p *Pool) unitsOf(cs []Chunk) int {
	var b uintptr
	for _, c := range cs {
		b += c.Size
	}
	return int(b / p.tail)
}

// putAll gives back chunks an Acquire took but cannot hand out.
func (p *Pool) putAll(cs []Chunk) error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, p.lend().Put(c))
	}
	return errors.Join(errs...)
}

// Put gives back a chunk that Get returned and that is no longer mapped. It
// goes to the cache, or back to the driver when the cache is full or the
// pool is closed. Put fails with acl.ErrInvalidParam, and changes nothing,
// for a chunk that is not out of this pool (put back twice, or never got),
// or whose Size is not the size the pool lent it out with. Should the driver
// fail to free the chunk, the pool keeps it in the cache, where Trim and
// Close try again and report the error.
func (p Lender) Put(c Chunk) error { return p.put(c, true) }

// PutBack gives back chunks the caller took with TakeFree or TryAcquire in
// a try that then fell short, as Put does (they must be unmapped), but
// without telling the pool's waiters: nothing came back that was not free
// before the try, so no waiter can be served by it. Telling them would wake
// a waiting growth with its own failed try (a Wake that maps a step at a
// time and undoes its maps when a later step finds the device short), which
// would then try again at once, and again, until its deadline. Chunks a
// relief handed over (Placer.Place's have) go back with Put: they are
// memory that came back.
func (p Lender) PutBack(cs []Chunk) error { return p.pool.putBack(cs) }

// putBack returns what an acquire took before it fell short to where it
// came from, without telling the waiters (PutBack).
func (p *Pool) putBack(cs []Chunk) error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, p.lend().put(c, false))
	}
	return errors.Join(errs...)
}

// put is Put; notify says whether the waiters are told.
func (p Lender) put(c Chunk, notify bool) error {
	p.pool.mu.Lock()
	return p.pool.putLocked(c, notify)
}

// putLocked is put with mu held, which it releases: the chunk goes into the
// cache, or is counted in freeing, under the caller's hold of the lock.
func (p *Pool) putLocked(c Chunk, notify bool) error {
	l, ok := p.out[c.Handle]
	if !ok {
		p.mu.Unlock()
		return fmt.Errorf("chunk: %w: put of chunk %#x, which is not out of this pool", acl.ErrInvalidParam, uintptr(c.Handle))
	}
	if c.Size != l.size {
		p.mu.Unlock()
		return wrongSize("put", 0, c, l)
	}
	if l.shared != nil {
		return p.putSharedLocked(c, l) // freed, never cached
	}
	p.unlendLocked(c.Handle, l)
	e := entry{c.Handle, l.holder, l.size}
	if !p.closed && p.cacheRoomLocked(e.size) {
		p.cacheLocked(e)
		if notify {
			p.returns++
			p.releasedLocked() // wait.go
		}
		others := notify && p.dev.waiters.Load() > p.wq.n.Load()
		p.mu.Unlock()
		if others {
			// A growth of another pool waiting for the device's memory can
			// have this pool free its cache (its relief trims its peers).
			p.dev.wakeHeads(p)
		}
		return nil
	}
	if !p.closed {
		p.stats.Evictions++
	}
	p.freeingLocked(e.size)
	p.mu.Unlock()
	_ = p.freeNotify(e, notify) // a failure keeps the chunk cached, for Trim and Close to retry
	return nil
}

// The books of the chunks in use, cached and freeing, in chunks and in
// bytes. Call them with mu held.

// lendLocked books the chunk h out of the pool, leased as l.
func (p *Pool) lendLocked(h acl.PhysicalHandle, l lease) {
	p.out[h] = l
	p.stats.InUse++
	p.inUseBytes += l.size
}

// unlendLocked takes the chunk h, leased as l, off the books of those out.
func (p *Pool) unlendLocked(h acl.PhysicalHandle, l lease) {
	delete(p.out, h)
	p.stats.InUse--
	p.inUseBytes -= l.size
}

// cacheLocked puts e on top of the cache's list for its size.
func (p *Pool) cacheLocked(e entry) {
	l := p.listOf(e.size)
	p.cache[l] = append(p.cache[l], e)
	p.stats.Cached++
	p.cachedBytes += e.size
}

// The cache is measured in chunks of the pool's size, by its bytes: a tail
// counts as the part of a large chunk it is (Config.MaxCached, Ahead).

// cachedBelowLocked reports whether the cache holds less than n chunks'
// bytes.
func (p *Pool) cachedBelowLocked(n int) bool { return p.cachedBytes < uintptr(n)*p.size }

// cacheRoomLocked reports whether a chunk of size bytes fits in the cache
// under Config.MaxCached.
func (p *Pool) cacheRoomLocked(size uintptr) bool {
	return p.cachedBytes+size <= uintptr(p.maxCached)*p.size
}

// uncacheLocked takes the ith entry of the cache's list out of it.
func (p *Pool) uncacheLocked(list, i int) entry {
	e := p.cache[list][i]
	p.cache[list] = append(p.cache[list][:i], p.cache[list][i+1:]...)
	p.stats.Cached--
	p.cachedBytes -= e.size
	return e
}

// freeingLocked counts a chunk of size bytes on its way back to the
// driver; freedLocked counts its free done (or refused).
func (p *Pool) freeingLocked(size uintptr) {
	p.freeing++
	p.freeingBytes += size
}

func (p *Pool) freedLocked(size uintptr) {
	p.freeing--
	p.freeingBytes -= size
}

// wrongSize is the error of op on c at ptr (0: no address) when c's Size is
// not the size of the chunk the pool lent out as l.
func wrongSize(op string, ptr acl.DevicePtr, c Chunk, l lease) error {
	at := ""
	if ptr != 0 {
		at = fmt.Sprintf(" at %v", ptr)
	}
	return fmt.Errorf("chunk: %s%s: %w: chunk %#x says its size is %s, but the pool lent it out as %s",
		op, at, acl.ErrInvalidParam, uintptr(c.Handle), units.Ubytes(uint64(c.Size)), units.Ubytes(uint64(l.size)))
}

// free gives e back to the driver. If the driver refuses, the chunk goes
// back to the cache (past its bound if need be) so that it is not lost. The
// caller counted e in freeing, with mu held, when it took e out of the cache
// or the chunks out.
func (p *Pool) free(e entry) error { return p.freeNotify(e, true) }

// freeNotify is free; notify says whether the waiters are told.
func (p *Pool) freeNotify(e entry, notify bool) error {
	err := p.drv.FreePhysical(e.h)
	p.mu.Lock()
	p.freedLocked(e.size)
	if err != nil {
		// The driver kept the memory; so do we, and the budget stays true.
		p.cacheLocked(e)
		p.mu.Unlock()
		return fmt.Errorf("chunk: free: %w", err)
	}
	p.stats.Frees++
	p.held -= e.size
	if notify {
		p.returns++
	}
	p.mu.Unlock()
	if notify {
		p.freed() // wait.go
	}
	return nil
}

// Trim frees every cached chunk. A chunk the driver fails to free stays
// cached, and the error says so.
func (p *Pool) Trim() error {
	if !p.made() {
		return errNotMade
	}
	_, _, err := p.trim()
	return err
}

// trim frees the cache and returns how many chunks it freed, and their
// bytes.
func (p *Pool) trim() (n int, bytes uintptr, err error) {
	p.mu.Lock()
	cache := append(p.cache[largeList], p.cache[tailList]...)
	p.cache = [2][]entry{}
	p.stats.Cached = 0
	for _, e := range cache {
		p.freeingLocked(e.size)
	}
	p.cachedBytes = 0
	p.mu.Unlock()
	errs := []error{p.freeDoomed()}
	for _, e := range cache {
		err := p.free(e)
		if err == nil {
			n++
			bytes += e.size
		}
		errs = append(errs, err)
	}
	return n, bytes, errors.Join(errs...)
}

// Stats returns the pool's counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.HeldBytes = int64(p.held)
	s.InUseBytes = int64(p.inUseBytes)
	s.CachedBytes = int64(p.cachedBytes)
	s.Pending = p.pending.chunks
	s.PendingBytes = int64(p.pending.bytes)
	s.Freeing = p.freeing
	s.FreeingBytes = int64(p.freeingBytes)
	s.Waiters = len(p.wq.q)
	s.Members = len(p.members)
	for _, m := range p.members {
		if u, ok := m.c.(Meter); ok {
			s.UsedBytes += u.Used()
		}
	}
	return s
}

// Close stops the pool's worker, waits for the chunks still waiting for the
// device and unmaps them, and frees the cached chunks. Chunks still out are
// freed as they are Put back; the first Close reports them as an error, since
// their tenants leaked them or have not closed yet. Close is safe to call
// more than once; a later call frees what an earlier one could not.
func (p *Pool) Close() error { return p.CloseContext(context.Background()) }

// CloseContext is Close whose wait for the device ends when ctx is done: it
// then returns an error wrapping ctx's, the pool closed (no growth, no
// worker) with the chunks whose device work has not ended still mapped and
// its cache freed; a later Close or CloseContext finishes. The wait polls the
// chunks' events, so it is cut short while a kernel runs; chunks that have
// no event (a driver without events, or an event that failed) need a
// device-wide wait, which no context can cut short.
func (p *Pool) CloseContext(ctx context.Context) error {
	if p == nil {
		return nil
	}
	if p.drv == nil {
		return errNotMade
	}
	p.mu.Lock()
	first := !p.closed
	p.closed = true
	w := p.w
	p.wakeAllLocked() // wait.go: their retries fail
	p.mu.Unlock()
	if first {
		w.stop()
		leave(p)
	}
	err := p.settleAll(ctx)
	// A Warm (or the worker's last round) allocating ahead puts its chunk in
	// the cache when the driver returns: wait for it, so that the trim
	// below frees it too and a closed pool holds nothing.
	err = errors.Join(err, poll(ctx, nil, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.filling == 0
	}))
	p.mu.Lock()
	inUse := p.stats.InUse
	p.mu.Unlock()
	_, _, terr := p.trim()
	err = errors.Join(err, terr, p.dropEvents())
	if first && inUse > 0 {
		err = errors.Join(err, fmt.Errorf("chunk: pool closed with %d chunks still in use", inUse))
	}
	return err
}

// A Lender is a pool's side of its protocol with the arenas it lends chunks
// to: taking and giving back chunks, mapping and unmapping them, ordering
// their unmaps after device work, membership, relief under pressure, the
// queue of waiting growths, and sharing with other processes. Package arena
// is its user; it is exported for those who write an arena of their own. It
// carries none of the Pool's own methods (Close, SetBudget, Stats, …): a
// user of a pool needs only those, and the protocol does not hand them on.
//
// A Lender is a small value; Pool.Lender returns one.
type Lender struct{ pool *Pool }

// Lender returns the pool's protocol with its arenas.
func (p *Pool) Lender() Lender { return Lender{p} }

// lend is Lender, for the pool's own code.
func (p *Pool) lend() Lender { return Lender{p} }
