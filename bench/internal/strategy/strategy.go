// Package strategy holds the ways of giving tensors device memory that the
// benchmark suite compares, all behind one interface and all on the same
// acl.Driver:
//
//	arena      vmarena: one reservation per region, chunks mapped as it grows,
//	           from a chunk pool (shared by all regions) with a reuse cache;
//	           memory a region drops stays mapped until another region's
//	           growth needs it, a background worker keeps headroom mapped,
//	           unmaps wait for the workload's stream, one tenant
//	arena-eager the arena as a plain allocator: no headroom, no stream, a
//	           tenant per region, and dropped memory given back at once
//	realloc    a buffer that grows by allocating a larger region (×Growth),
//	           copying the old contents over on the device and freeing the old
//	prealloc   one mapping per region, sized for its maximum up front
//	pertensor  a physical allocation and mapping for every Grow (every tensor)
//	paged      a PagedAttention-style block pool: the budget allocated once,
//	           fixed-size blocks, a block table per region (kv only)
//	caching    a PyTorch-style caching allocator: every Grow a tensor from
//	           size-class pools of segments, blocks split and merged
//	caching-expandable  the same in expandable-segments mode: each pool one
//	           reservation that grows by mapping pages at its end
//
// A Region is a growable byte range, addressed by logical offsets: Grow makes
// room, Alloc cuts a tensor from it (never calling the driver), Truncate drops
// tensors at the top, Idle says the region will grow again soon (a finished
// sequence whose slot takes the next request), and Trim gives memory back as
// far as the strategy can. The workloads call exactly the same sequence on
// every strategy.
package strategy

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
)

// Names lists the strategies, in the order the suite reports them.
var Names = []string{"arena", "arena-eager", "realloc", "prealloc", "pertensor", "paged", "caching", "caching-expandable"}

// Default lists the strategies the suite runs unless told otherwise.
var Default = []string{"arena", "realloc", "prealloc", "pertensor", "paged", "caching", "caching-expandable"}

// KVOnly reports whether the strategy serves only workloads whose tensors
// fit a block (the paged pool: KV caches).
func KVOnly(name string) bool { return name == "paged" }

// ErrFull is returned by Grow and Alloc when a region cannot hold the request
// (a preallocated region past its maximum, or an Alloc without a Grow).
var ErrFull = errors.New("strategy: region full")

// Strategy makes regions.
type Strategy interface {
	// Name is one of Names.
	Name() string
	// Open returns an empty region that will never hold more than max bytes.
	Open(max int64) (Region, error)
	// Prepare does what the strategy does once at start, before any region
	// opens (the arena warms its pool); the workload times it as setup.
	Prepare() error
	// Close releases what the strategy keeps beyond its regions (the arena's
	// pool and its cache). Regions must be closed first.
	Close() error
}

// Region is a growable range of device memory in logical offsets.
type Region interface {
	// Grow makes room for n more bytes: the next Allocs of n bytes in total
	// (with sizes and alignments that are multiples of Align) succeed
	// without a driver call.
	Grow(n int64) error
	// Alloc cuts n bytes aligned to align and returns their logical offset.
	Alloc(n, align int64) (int64, error)
	// AllocN cuts count tensors of n bytes each, as count Allocs of (n,
	// align) one after another would, in one call, and returns the first's
	// offset; on failure it cuts none. Each strategy does it its cheapest
	// way (the arena with one Arena.AllocN, the others with one bump where
	// the tensors share a block or segment).
	AllocN(count int, n, align int64) (int64, error)
	// Ptr returns the device address of the logical range [off, off+n) now.
	// It may change with the next Grow or Trim (realloc moves data).
	Ptr(off, n int64) (acl.DevicePtr, error)
	// Len returns the logical bytes in use.
	Len() int64
	// Truncate drops every tensor at or above logical offset n.
	Truncate(n int64) error
	// Idle tells the region that the memory above Len is unused for now and
	// that it will grow again soon: it gives back what it cannot keep
	// cheaply (realloc halves or frees its buffer; the arena keeps its
	// chunks mapped, for a pool under pressure to reclaim).
	Idle() error
	// Trim gives memory above Len back, as far as the strategy can.
	Trim() error
	// Close releases everything the region holds.
	Close() error
}

// Prefetcher is a Region that can prepare memory it is told it will need:
// a workload that knows the size of the next request (a prompt at
// admission) calls Prefetch(n) a step before the Grow of n bytes.
type Prefetcher interface {
	Prefetch(n int64) error
}

// A Mapper is a region whose Alloc maps the memory it cuts (the arena): it
// needs no Grow in a paged pool's blocks, and a workload may grow it by
// exactly what it appends, token by token.
type Mapper interface {
	MapsOnAlloc()
}

// An AheadKeeper is a region that keeps memory mapped above its length by
// itself (the arena with Config.Headroom): KeepsAhead is how many bytes, so
// that a workload need not tell it ahead what it will append.
type AheadKeeper interface {
	KeepsAhead() int64
}

// A Keeper is a region that can be told, while it is empty, how much its
// next use needs: it keeps that and gives the rest back to be used
// elsewhere, where keeping it costs memory (the arena, its pool not warmed:
// Arena.ShrinkTo).
type Keeper interface {
	Keep(n int64) error
}

// Align is the largest alignment the workloads ask for.
const Align = 256

// Config configures a strategy.
type Config struct {
	Driver acl.Driver
	// Chunk is the arena's chunk size; 0 means the pool's choice
	// (chunk.SizeFor: from Budget, the granularity without one).
	Chunk int64
	// Tail is the arena pool's tail chunk size (chunk.Config.TailSize):
	// 0 is the pool's choice (chunk.DefaultTailSize), Chunk one size.
	Tail int64
	// MaxCached bounds the arena pool's reuse cache, in chunks (0: the
	// pool's default; negative: no cache).
	MaxCached int
	// Budget caps the arena pool's physical bytes (0: none). The other
	// strategies are capped by the counting driver instead.
	Budget int64
	// Growth is realloc's growth factor; 0 means 2.
	Growth float64
	// Scrub is the arena pool's scrub policy (the zero value is the pool's
	// default, ScrubOnReuse).
	Scrub chunk.Scrub
	// Stream is the stream the workload's device work runs on: the arena
	// strategy orders its unmaps and scrubs on it. 0: none (the device-wide
	// fallback).
	Stream acl.Stream
	// Headroom is the mapped headroom the arena strategy keeps per region.
	Headroom int64
	// MaxHeadroom bounds the headroom each region learns; 0: the arena's
	// default.
	MaxHeadroom int64
	// Ahead is the fresh chunks the arena strategy's pool keeps allocated.
	Ahead int
	// WorkerCPU caps the arena strategy's pool worker at this share of one
	// CPU (chunk.Config.WorkerCPU); 0: no cap.
	WorkerCPU float64
	// Warm is the fresh chunks the arena strategy's pool allocates at start
	// (Prepare); -1 means as many as the budget allows.
	Warm int
	// Register registers every region of the arena strategies with a
	// modelled collective library (RegisterChunk, RegisterRun; RegisterNone:
	// none), through arena.RegisterWith; RegisterCost is the host time each
	// of its calls is charged (an estimate), on the goroutine that changes
	// the arena's backing.
	Register     string
	RegisterCost time.Duration
	// Block is the paged pool's block in bytes (a KV block: its tokens'
	// cache); 0 means the driver's granularity.
	Block int64
}

// New returns the strategy called name.
func New(name string, cfg Config) (Strategy, error) {
	if cfg.Driver == nil {
		return nil, fmt.Errorf("strategy %s: nil driver", name)
	}
	switch name {
	case "arena":
		return newArena(cfg, false)
	case "arena-eager":
		return newArena(cfg, true)
	case "paged":
		return newPaged(cfg)
	case "realloc", "prealloc", "pertensor", "caching", "caching-expandable":
		d, err := newDev(cfg.Driver)
		if err != nil {
			return nil, fmt.Errorf("strategy %s: %w", name, err)
		}
		switch name {
		case "realloc":
			g := cfg.Growth
			if g == 0 {
				g = 2
			}
			if g <= 1 {
				return nil, fmt.Errorf("strategy realloc: growth factor %g must be above 1", g)
			}
			return &reallocStrategy{dev: d, growth: g}, nil
		case "prealloc":
			return &preallocStrategy{dev: d}, nil
		case "caching", "caching-expandable":
			return newCaching(d, name == "caching-expandable"), nil
		default:
			return &perTensorStrategy{dev: d}, nil
		}
	}
	return nil, fmt.Errorf("unknown strategy %q (want one of %v)", name, Names)
}

// dev makes single-allocation segments with the raw driver calls:
// reserve + malloc + map + access, and back.
type dev struct {
	drv      acl.Driver
	prop     acl.PhysicalMemProp
	access   []acl.MemAccessDesc
	gran     int64
	implicit bool // the driver has no MemSetAccess
}

func newDev(drv acl.Driver) (*dev, error) {
	prop := acl.DeviceProp(drv.Device(), 0)
	g, err := drv.MemGetAllocationGranularity(&prop, acl.GranularityMinimum)
	if err != nil {
		return nil, fmt.Errorf("granularity: %w", err)
	}
	return &dev{drv: drv, prop: prop, access: acl.ReadWrite(drv.Device()), gran: int64(g)}, nil
}

func (d *dev) roundUp(n int64) int64 { return (n + d.gran - 1) / d.gran * d.gran }

// segment is one reservation fully backed by one physical allocation.
type segment struct {
	base acl.DevicePtr
	h    acl.PhysicalHandle
	size int64
}

// alloc makes a segment of at least size bytes. On failure it leaves nothing
// behind.
func (d *dev) alloc(size int64) (segment, error) {
	size = d.roundUp(max(size, 1))
	// The memory first: when the device (or the budget) has none, the
	// allocation fails in one call, as cudaMalloc does.
	h, err := d.drv.MallocPhysical(uintptr(size), &d.prop, 0)
	if err != nil {
		return segment{}, err
	}
	base, err := d.drv.ReserveMemAddress(uintptr(size), 0, 0, 0)
	if err != nil {
		return segment{}, errors.Join(err, d.drv.FreePhysical(h))
	}
	if err := d.drv.MapMem(base, uintptr(size), 0, h, 0); err != nil {
		return segment{}, errors.Join(err, d.drv.FreePhysical(h), d.drv.ReleaseMemAddress(base))
	}
	if !d.implicit {
		err := d.drv.MemSetAccess(base, uintptr(size), d.access)
		switch {
		case errors.Is(err, acl.ErrNotSupported):
			d.implicit = true
		case err != nil:
			return segment{}, errors.Join(err, d.drv.UnmapMem(base), d.drv.FreePhysical(h), d.drv.ReleaseMemAddress(base))
		}
	}
	return segment{base: base, h: h, size: size}, nil
}

// free gives a segment back: wait for the device (as engines without
// stream ordering do before an unmap), unmap, free, release.
func (d *dev) free(s segment) error {
	if s.size == 0 {
		return nil
	}
	if err := d.drv.SynchronizeDevice(); err != nil {
		return err
	}
	if err := d.drv.UnmapMem(s.base); err != nil {
		return err
	}
	return errors.Join(d.drv.FreePhysical(s.h), d.drv.ReleaseMemAddress(s.base))
}

func alignUp(n, a int64) int64 { return (n + a - 1) &^ (a - 1) }

// span checks AllocN's arguments and returns the bytes from the first
// tensor's start to the last's end: count-1 strides of n rounded up to
// align, and n.
func span(count int, n, align int64) (int64, error) {
	if err := checkAlloc(n, align); err != nil {
		return 0, err
	}
	stride := alignUp(n, align)
	if count < 1 || stride > 0 && int64(count-1) > (math.MaxInt64-n)/stride {
		return 0, fmt.Errorf("strategy: alloc %d tensors of %d bytes: bad count", count, n)
	}
	return int64(count-1)*stride + n, nil
}

func checkAlloc(n, align int64) error {
	if n < 0 || align <= 0 || align&(align-1) != 0 || align > Align {
		return fmt.Errorf("strategy: alloc %d bytes aligned %d: bad size or alignment", n, align)
	}
	return nil
}
