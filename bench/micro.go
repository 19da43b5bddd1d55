package main

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/bench/internal/counting"
	"github.com/vmarena/vmarena/bench/internal/workload"
	"github.com/vmarena/vmarena/chunk"
)

// microResult holds the arena's own micro-measures.
type microResult struct {
	AllocIters   int     `json:"alloc_iters"`
	AllocNS      float64 `json:"alloc_ns_per_op"`     // Alloc(256, 64) inside mapped memory
	AllocAllocs  float64 `json:"alloc_allocs_per_op"` // Go heap allocations per Alloc
	AllocMallocs uint64  `json:"alloc_mallocs"`       // Go heap allocations during the whole loop
	ChunkSize    int     `json:"chunk_size"`
	// Grows of one chunk into an empty arena, alternating: Cold has no reuse
	// cache (every chunk a MallocPhysical), Cache takes its chunk from the
	// pool's cache (map and access only).
	Cold  []workload.GrowEvent `json:"-"`
	Cache []workload.GrowEvent `json:"-"`
}

func runMicro(drv acl.Driver, o *options, progress func(float64)) (m *microResult, err error) {
	m = &microResult{}
	if err := microAlloc(drv, o, m); err != nil {
		return nil, fmt.Errorf("micro alloc: %w", err)
	}
	progress(0.2)

	type side struct {
		cd   *counting.Driver
		a    *arena.Arena
		evts *[]workload.GrowEvent
	}
	var sides []side
	defer func() {
		for _, s := range sides {
			err = errors.Join(err, s.a.Close())
		}
	}()
	for _, c := range []struct {
		maxCached int
		evts      *[]workload.GrowEvent
	}{{-1, &m.Cold}, {0, &m.Cache}} {
		cd := counting.New(drv, 0)
		a, err := arena.New(arena.Config{Driver: cd, Reserve: 64 << 20,
			Chunk: chunk.Config{Size: int(o.chunk), MaxCached: c.maxCached}})
		if err != nil {
			return nil, err
		}
		sides = append(sides, side{cd, a, c.evts})
	}
	n := sides[0].a.ChunkSize()
	m.ChunkSize = n
	// Warm up: page tables, the cache's one chunk.
	for _, s := range sides {
		if err := errors.Join(s.a.Grow(n), s.a.Shrink()); err != nil {
			return nil, err
		}
	}
	for i := range o.microIters {
		for k := range sides {
			s := sides[(k+i)%len(sides)] // alternate which goes first
			c0, d0, s0 := s.cd.CallCount(), s.cd.DriverNS(), s.cd.SelfNS()
			t := time.Now()
			if err := s.a.Grow(n); err != nil {
				return nil, err
			}
			ns := int64(time.Since(t))
			*s.evts = append(*s.evts, workload.GrowEvent{NS: ns, DriverNS: s.cd.DriverNS() - d0,
				WrapperNS: s.cd.SelfNS() - s0, Calls: s.cd.CallCount() - c0})
			if err := s.a.Shrink(); err != nil {
				return nil, err
			}
		}
		if i%8 == 0 {
			progress(0.2 + 0.8*float64(i)/float64(o.microIters))
		}
	}
	return m, nil
}

// microAlloc times the lock-free fast path: 256-byte, 64-aligned Allocs
// inside 64 MiB of mapped memory, reset whenever it is full.
func microAlloc(drv acl.Driver, o *options, m *microResult) (err error) {
	const size = 64 << 20
	a, err := arena.New(arena.Config{Driver: drv, Reserve: size, Chunk: chunk.Config{Size: int(o.chunk)}})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, a.Close()) }()
	if err := a.Grow(size); err != nil {
		return err
	}
	per := size / 256
	iters := max(o.allocIters, 1)
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	t := time.Now()
	for i := range iters {
		if _, err := a.Alloc(256, 64); err != nil {
			return err
		}
		if (i+1)%per == 0 {
			if err := a.Reset(); err != nil {
				return err
			}
		}
	}
	el := time.Since(t)
	runtime.ReadMemStats(&m1)
	m.AllocIters = iters
	m.AllocNS = float64(el.Nanoseconds()) / float64(iters)
	// As testing.B reports it: whole allocations per op, rounded down. The
	// total also counts whatever the runtime allocated meanwhile.
	m.AllocMallocs = m1.Mallocs - m0.Mallocs
	m.AllocAllocs = float64(m.AllocMallocs / uint64(iters))
	return nil
}
