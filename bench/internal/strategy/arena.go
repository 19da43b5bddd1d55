package strategy

import (
	"fmt"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// arenaStrategy gives every region its own arena; all of them draw chunks
// from one pool, so a chunk one region gives back is reused by the next.
type arenaStrategy struct {
	pool *chunk.Pool
}

func newArena(cfg Config) (*arenaStrategy, error) {
	p, err := chunk.New(cfg.Driver, chunk.Config{Size: int(cfg.Chunk), MaxCached: cfg.MaxCached, Budget: cfg.Budget,
		Scrub: cfg.Scrub})
	if err != nil {
		return nil, fmt.Errorf("strategy arena: %w", err)
	}
	return &arenaStrategy{pool: p}, nil
}

func (s *arenaStrategy) Name() string { return "arena" }

// Pool returns the chunk pool the arenas share.
func (s *arenaStrategy) Pool() *chunk.Pool { return s.pool }

func (s *arenaStrategy) Open(max int64) (Region, error) {
	a, err := arena.New(arena.Config{Pool: s.pool, Reserve: max})
	if err != nil {
		return nil, err
	}
	return &arenaRegion{a: a}, nil
}

func (s *arenaStrategy) Close() error { return s.pool.Close() }

type arenaRegion struct{ a *arena.Arena }

func (r *arenaRegion) Grow(n int64) error { return r.a.Grow(int(n)) }

func (r *arenaRegion) Alloc(n, align int64) (int64, error) {
	b, err := r.a.Alloc(int(n), int(align))
	if err != nil {
		return 0, err
	}
	return int64(b.Offset()), nil
}

func (r *arenaRegion) Ptr(off, n int64) (acl.DevicePtr, error) {
	b, err := r.a.Slice(int(off), int(n))
	if err != nil {
		return 0, err
	}
	return b.Ptr(), nil
}

func (r *arenaRegion) Len() int64             { return int64(r.a.Len()) }
func (r *arenaRegion) Truncate(n int64) error { return r.a.Truncate(int(n)) }
func (r *arenaRegion) Trim() error            { return r.a.Shrink() }
func (r *arenaRegion) Close() error           { return r.a.Close() }

// Arena returns the arena behind a region of the arena strategy, or nil.
func Arena(r Region) *arena.Arena {
	if ar, ok := r.(*arenaRegion); ok {
		return ar.a
	}
	return nil
}

// Pool returns the chunk pool of the arena strategy, or nil.
func Pool(s Strategy) *chunk.Pool {
	if as, ok := s.(*arenaStrategy); ok {
		return as.pool
	}
	return nil
}
