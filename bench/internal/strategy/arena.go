package strategy

import (
	"errors"
	"fmt"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// arenaStrategy gives every region its own arena; all of them draw chunks
// from one pool, so a chunk one region gives back is reused by the next.
// Eager, it is the arena as a plain allocator; otherwise the regions are one
// tenant (one model's sequences), keep headroom, order their unmaps and
// scrubs on the workload's stream, and leave dropped memory mapped until the
// pool needs it.
type arenaStrategy struct {
	pool   *chunk.Pool
	eager  bool
	tenant chunk.Tenant
	cfg    Config
	part   bool           // one model's share of another's pool (Split): the pool is not its own
	regs   *registrations // Config.Register: the modelled library's calls; nil: none
}

func newArena(cfg Config, eager bool) (*arenaStrategy, error) {
	pc := chunk.Config{Size: int(cfg.Chunk), TailSize: int(cfg.Tail), MaxCached: cfg.MaxCached, Budget: cfg.Budget, Scrub: cfg.Scrub}
	if !eager {
		pc.Ahead, pc.WorkerCPU = cfg.Ahead, cfg.WorkerCPU
		if cfg.Warm != 0 && cfg.MaxCached == 0 && cfg.Budget > 0 {
			// A warm pool caches up to its budget.
			size := cfg.Chunk
			if size == 0 {
				prop := acl.DeviceProp(cfg.Driver.Device(), 0)
				g, err := cfg.Driver.MemGetAllocationGranularity(&prop, acl.GranularityMinimum)
				if err != nil {
					return nil, fmt.Errorf("strategy arena: %w", err)
				}
				size = int64(chunk.SizeFor(cfg.Budget, int(g))) // what the pool will choose
			}
			pc.MaxCached = int(cfg.Budget / size)
		}
	}
	p, err := chunk.New(cfg.Driver, pc)
	if err != nil {
		return nil, fmt.Errorf("strategy arena: %w", err)
	}
	s := &arenaStrategy{pool: p, eager: eager, cfg: cfg}
	switch cfg.Register {
	case RegisterNone:
	case RegisterChunk, RegisterRun:
		s.regs = &registrations{mode: cfg.Register, cost: cfg.RegisterCost}
	default:
		return nil, errors.Join(fmt.Errorf("strategy arena: registration mode %q: want %q or %q", cfg.Register, RegisterChunk, RegisterRun), p.Close())
	}
	if !eager {
		s.tenant = chunk.NewTenant()
	}
	return s, nil
}

func (s *arenaStrategy) Name() string {
	if s.eager {
		return "arena-eager"
	}
	return "arena"
}

// Pool returns the chunk pool the arenas share.
func (s *arenaStrategy) Pool() *chunk.Pool { return s.pool }

func (s *arenaStrategy) Open(max int64) (Region, error) {
	cfg := arena.Config{Pool: s.pool, Reserve: int(max)}
	if !s.eager {
		cfg.Tenant, cfg.Headroom = s.tenant, int(s.cfg.Headroom)
		if cfg.Headroom > 0 && s.cfg.MaxHeadroom > 0 {
			cfg.MaxHeadroom = int(s.cfg.MaxHeadroom)
			if max > 0 {
				cfg.MaxHeadroom = min(cfg.MaxHeadroom, int(max)) // a region smaller than it learns less
			}
		}
		if s.cfg.Stream != 0 {
			cfg.Streams = []acl.Stream{s.cfg.Stream}
		}
	}
	a, err := arena.New(cfg)
	if err != nil {
		return nil, err
	}
	if s.regs != nil {
		if err := a.OnBackingChange(arena.RegisterWith(newModelRegistrar(s.regs))); err != nil {
			return nil, errors.Join(err, a.Close())
		}
	}
	return &arenaRegion{a: a, eager: s.eager, warmed: s.cfg.Warm != 0, headroom: int64(cfg.Headroom)}, nil
}

// Close closes the pool, unless the strategy is a model's part of another's.
func (s *arenaStrategy) Close() error {
	if s.part {
		return nil
	}
	return s.pool.Close()
}

// Prepare warms the pool: Config.Warm fresh chunks (-1: up to the budget),
// allocated before any request, as a server with a memory budget does at
// start.
func (s *arenaStrategy) Prepare() error {
	n := s.cfg.Warm
	switch {
	case s.eager || s.part || n == 0:
		return nil
	case n < 0:
		n = 1 << 30 // up to the budget and the cache's bound
	}
	_, err := s.pool.Warm(n)
	return err
}

type arenaRegion struct {
	a        *arena.Arena
	eager    bool
	warmed   bool  // the pool was warmed at start (Config.Warm)
	headroom int64 // Config.Headroom
}

// KeepsAhead is the arena's Config.Headroom: the pool's worker keeps that
// much mapped above Len (at least; the headroom may learn more), so the
// region is an AheadKeeper.
func (r *arenaRegion) KeepsAhead() int64 { return r.headroom }

func (r *arenaRegion) Grow(n int64) error { return r.a.Grow(int(n)) }

// MapsOnAlloc marks the region a Mapper: Arena.Alloc maps what it cuts.
func (r *arenaRegion) MapsOnAlloc() {}

func (r *arenaRegion) Alloc(n, align int64) (int64, error) {
	b, err := r.a.Alloc(int(n), int(align))
	if err != nil {
		return 0, err
	}
	return int64(b.Offset()), nil
}

// AllocN cuts the tensors as one Alloc of their span, as an engine that
// needs their device addresses, not a Buffer each, does: the tensors lie at
// a fixed stride from the first, as on the other strategies, whose AllocN
// returns the first offset too. (Arena.AllocN, which also fills a Buffer per
// tensor, writes 2 KiB of them for a token of 64 tensors, three to four times the
// cost of the cut itself; a region has no use for them.)
func (r *arenaRegion) AllocN(count int, n, align int64) (int64, error) {
	total, err := span(count, n, align)
	if err != nil {
		return 0, err
	}
	return r.Alloc(total, align)
}

func (r *arenaRegion) Ptr(off, n int64) (acl.DevicePtr, error) {
	b, err := r.a.Slice(int(off), int(off+n))
	if err != nil {
		return 0, err
	}
	return b.Ptr(), nil
}

// Prefetch asks the pool's worker to map n bytes above Len (Arena.Prefetch);
// the eager arena has no worker.
func (r *arenaRegion) Prefetch(n int64) error {
	if r.eager {
		return nil
	}
	return r.a.Prefetch(int(n))
}

// Keep keeps n bytes mapped for the region's next use and gives the rest
// back (Arena.ShrinkTo), where the pool was not warmed: memory one slot keeps
// past its next request is memory another slot allocates afresh. A warmed
// pool holds its budget whatever the arenas keep, so there it keeps all.
func (r *arenaRegion) Keep(n int64) error {
	if r.eager || r.warmed {
		return nil
	}
	return r.a.ShrinkTo(int(n))
}

func (r *arenaRegion) Len() int64             { return int64(r.a.Len()) }
func (r *arenaRegion) Truncate(n int64) error { return r.a.Truncate(int(n)) }
func (r *arenaRegion) Trim() error            { return r.a.Shrink() }

// Idle keeps the memory mapped (a pool under pressure reclaims it), unless
// eager.
func (r *arenaRegion) Idle() error {
	if r.eager {
		return r.a.Shrink()
	}
	return nil
}
func (r *arenaRegion) Close() error { return r.a.Close() }

// Arena returns the arena behind a region of the arena strategy, or nil.
func Arena(r Region) *arena.Arena {
	if ar, ok := r.(*arenaRegion); ok {
		return ar.a
	}
	return nil
}

// RegistrationsOf returns the calls the arena strategy's modelled library
// was made (Config.Register), and whether it registers at all.
func RegistrationsOf(s Strategy) (Registrations, bool) {
	if as, ok := s.(*arenaStrategy); ok && as.regs != nil {
		return Registrations{Register: as.regs.reg.Load(), Deregister: as.regs.dereg.Load()}, true
	}
	return Registrations{}, false
}

// Pool returns the chunk pool of the arena strategy, or nil.
func Pool(s Strategy) *chunk.Pool {
	if as, ok := s.(*arenaStrategy); ok {
		return as.pool
	}
	return nil
}
