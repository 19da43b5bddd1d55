package workload

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// Swap measures an arena's Sleep and Wake against what they are made of:
// Offload against the raw copies of the same bytes between device memory
// and pinned host memory (the link's limit), Discard against the bare driver
// calls that free and map the same chunks, and a Wake against a full reload
// (free, allocate, copy in from host memory). It runs on the arena alone, not
// on every strategy: no other strategy can sleep and keep its addresses.
type Swap struct {
	Size  int64 // bytes in use in the arena that sleeps
	Chunk int64 // chunk size; 0: the driver's granularity
	Reps  int   // repetitions of each measurement; the median is reported
}

// Name returns "swap".
func (c Swap) Name() string { return "swap" }

// Describe says in one line what the configuration does.
func (c Swap) Describe() string {
	return fmt.Sprintf("sleep and wake an arena holding %s (Offload and Discard), against raw copies, bare driver calls and a full reload; median of %d",
		HumanBytes(c.Size), c.Reps)
}

// SwapResult is what Swap measured, in nanoseconds (medians over Reps).
type SwapResult struct {
	Bytes     int64 `json:"bytes"`
	ChunkSize int64 `json:"chunk_size"`

	RawHtoDNS int64 `json:"raw_htod_ns"` // one MemcpyHtoD of Bytes from pinned host memory into mapped device memory
	RawDtoHNS int64 `json:"raw_dtoh_ns"` // one MemcpyDtoH of Bytes into pinned host memory
	// The same copies in the steps Sleep and Wake copy in (16 MiB), one
	// after another: what the copies alone cost at the arena's granularity.
	StepHtoDNS int64 `json:"step_htod_ns"`
	StepDtoHNS int64 `json:"step_dtoh_ns"`

	OffloadSleepNS      int64 `json:"offload_sleep_ns"`       // Sleep(Offload), the pinned buffer kept from an earlier cycle
	OffloadWakeNS       int64 `json:"offload_wake_ns"`        // Wake of it
	OffloadFirstSleepNS int64 `json:"offload_first_sleep_ns"` // the first Sleep(Offload), which pins its host buffer (MallocHost)

	DiscardSleepNS int64 `json:"discard_sleep_ns"` // Sleep(Discard)
	DiscardWakeNS  int64 `json:"discard_wake_ns"`  // Wake of it
	BareNS         int64 `json:"bare_ns"`          // the same chunks' UnmapMem, FreePhysical, MallocPhysical, MapMem and MemSetAccess calls, bare

	ReloadNS int64 `json:"reload_ns"` // Close, New, Alloc and CopyIn from Go memory: what a wake replaces

	FreeAwake  int64 `json:"free_awake"`  // the device's free memory (GetMemInfo) with the arena awake
	FreeAsleep int64 `json:"free_asleep"` // and asleep
}

// Measure runs the measurements on drv.
func (c Swap) Measure(drv acl.Driver) (r SwapResult, err error) {
	if c.Size <= 0 || c.Reps <= 0 || c.Chunk < 0 {
		return r, fmt.Errorf("swap: bad configuration %+v", c)
	}
	ctx := context.Background()
	pool, err := chunk.New(drv, chunk.Config{Size: int(c.Chunk)})
	if err != nil {
		return r, err
	}
	defer func() { err = errors.Join(err, pool.Close()) }()
	cs := int64(pool.ChunkSize())
	size := (c.Size + cs - 1) / cs * cs
	r.Bytes, r.ChunkSize = size, cs
	host, err := drv.MallocHost(uintptr(size))
	if err != nil {
		return r, err
	}
	defer func() { err = errors.Join(err, drv.FreeHost(host)) }()
	for i := range host {
		host[i] = byte(i >> 12)
	}
	reloadSrc := make([]byte, size) // a checkpoint in ordinary memory
	copy(reloadSrc, host)
	tenant := chunk.NewTenant() // one model: its memory needs no clearing between its arenas
	newArena := func() (*arena.Arena, arena.Buffer, error) {
		a, err := arena.New(arena.Config{Pool: pool, Reserve: int(size), Tenant: tenant})
		if err != nil {
			return nil, arena.Buffer{}, err
		}
		b, err := a.Alloc(int(size), 1)
		if err == nil {
			err = drv.MemcpyHtoD(b.Ptr(), host) // touched, as a model's weights are
		}
		if err != nil {
			return nil, arena.Buffer{}, errors.Join(err, a.Close())
		}
		return a, b, nil
	}
	a, b, err := newArena()
	if err != nil {
		return r, err
	}
	defer func() { err = errors.Join(err, a.Close()) }()
	timed := func(fn func() error) (int64, error) {
		t0 := time.Now()
		err := fn()
		return time.Since(t0).Nanoseconds(), err
	}

	const step = 16 << 20
	steps := func(fn func(lo, hi int64) error) func() error {
		return func() error {
			for lo := int64(0); lo < size; lo += step {
				if err := fn(lo, min(lo+step, size)); err != nil {
					return err
				}
			}
			return nil
		}
	}
	var shtod, sdtoh []int64
	var htod, dtoh, osleep, owake, dsleep, dwake, bare, reload []int64
	for rep := range c.Reps {
		// The raw copies run on memory mapped and touched already: the
		// limit of the link, without what fresh memory costs.
		if err := drv.MemcpyHtoD(b.Ptr(), host); err != nil {
			return r, err
		}
		ns, err := timed(func() error { return drv.MemcpyHtoD(b.Ptr(), host) })
		if err != nil {
			return r, err
		}
		htod = append(htod, ns)
		if ns, err = timed(func() error { return drv.MemcpyDtoH(host, b.Ptr()) }); err != nil {
			return r, err
		}
		dtoh = append(dtoh, ns)
		if ns, err = timed(steps(func(lo, hi int64) error { return drv.MemcpyHtoD(b.Ptr().Add(uintptr(lo)), host[lo:hi]) })); err != nil {
			return r, err
		}
		shtod = append(shtod, ns)
		if ns, err = timed(steps(func(lo, hi int64) error { return drv.MemcpyDtoH(host[lo:hi], b.Ptr().Add(uintptr(lo))) })); err != nil {
			return r, err
		}
		sdtoh = append(sdtoh, ns)

		if ns, err = timed(func() error { return a.Sleep(ctx, arena.Offload) }); err != nil {
			return r, err
		}
		if rep == 0 {
			r.OffloadFirstSleepNS = ns
			free, _, _ := drv.GetMemInfo(acl.HBMMem)
			r.FreeAsleep = int64(free)
		} else {
			osleep = append(osleep, ns)
		}
		if ns, err = timed(func() error { return a.Wake(ctx) }); err != nil {
			return r, err
		}
		owake = append(owake, ns)
		if rep == 0 {
			free, _, _ := drv.GetMemInfo(acl.HBMMem)
			r.FreeAwake = int64(free)
		}

		if ns, err = timed(func() error { return a.Sleep(ctx, arena.Discard) }); err != nil {
			return r, err
		}
		dsleep = append(dsleep, ns)
		if ns, err = timed(func() error { return a.Wake(ctx) }); err != nil {
			return r, err
		}
		dwake = append(dwake, ns)

		if ns, err = c.bare(drv, pool, size); err != nil {
			return r, err
		}
		bare = append(bare, ns)

		// A full reload: a model's memory given back and loaded afresh:
		// close an arena, make a new one, allocate, copy in from ordinary
		// memory. On an arena of its own, so that a keeps its host buffer
		// as a model that sleeps and wakes does.
		ra, _, err := newArena()
		if err != nil {
			return r, err
		}
		if ns, err = timed(func() error {
			if err := ra.Close(); err != nil {
				return err
			}
			if err := pool.Trim(); err != nil {
				return err
			}
			var err error
			if ra, err = arena.New(arena.Config{Pool: pool, Reserve: int(size), Tenant: tenant}); err != nil {
				return err
			}
			rb, err := ra.Alloc(int(size), 1)
			if err != nil {
				return err
			}
			return arena.CopyIn(rb, reloadSrc)
		}); err != nil {
			return r, errors.Join(err, ra.Close())
		}
		if err := ra.Close(); err != nil {
			return r, err
		}
		reload = append(reload, ns)
	}
	if len(osleep) == 0 {
		osleep = []int64{r.OffloadFirstSleepNS}
	}
	r.RawHtoDNS, r.RawDtoHNS = median(htod), median(dtoh)
	r.StepHtoDNS, r.StepDtoHNS = median(shtod), median(sdtoh)
	r.OffloadSleepNS, r.OffloadWakeNS = median(osleep), median(owake)
	r.DiscardSleepNS, r.DiscardWakeNS = median(dsleep), median(dwake)
	r.BareNS, r.ReloadNS = median(bare), median(reload)
	return r, a.DropHostCopy()
}

// bare times the driver calls a Discard sleep and wake make for size bytes,
// with nothing around them: map and grant access to every chunk and write
// it (untimed), then unmap and free each, allocate and map each again, and
// grant access (timed), then give everything back (untimed).
func (c Swap) bare(drv acl.Driver, pool *chunk.Pool, size int64) (int64, error) {
	cs := uintptr(pool.ChunkSize())
	n := int(uintptr(size) / cs)
	prop := acl.DeviceProp(drv.Device(), acl.HBMMemHuge)
	base, err := drv.ReserveMemAddress(uintptr(size), 0, 0, 0)
	if err != nil {
		return 0, err
	}
	hs := make([]acl.PhysicalHandle, n)
	access := acl.ReadWrite(drv.Device())
	mapAll := func() error {
		for i := range hs {
			h, err := drv.MallocPhysical(cs, &prop, 0)
			if err != nil {
				return err
			}
			hs[i] = h
			at := base.Add(uintptr(i) * cs)
			if err := drv.MapMem(at, cs, 0, h, 0); err != nil {
				return err
			}
			if err := drv.MemSetAccess(at, cs, access); err != nil && !errors.Is(err, acl.ErrNotSupported) {
				return err
			}
		}
		return nil
	}
	unmapAll := func() error {
		for i, h := range hs {
			if err := drv.UnmapMem(base.Add(uintptr(i) * cs)); err != nil {
				return err
			}
			if err := drv.FreePhysical(h); err != nil {
				return err
			}
		}
		return nil
	}
	if err := mapAll(); err != nil {
		return 0, err
	}
	// Written, as the arena's memory is when it sleeps: on the host driver
	// unmapping touched memory costs more than unmapping untouched memory.
	if err := drv.Memset(base, 1, uintptr(size)); err != nil {
		return 0, err
	}
	if err := drv.SynchronizeDevice(); err != nil {
		return 0, err
	}
	t0 := time.Now()
	err = unmapAll()
	if err == nil {
		err = mapAll()
	}
	ns := time.Since(t0).Nanoseconds()
	if err != nil {
		return 0, err
	}
	if err := unmapAll(); err != nil {
		return 0, err
	}
	return ns, drv.ReleaseMemAddress(base)
}

func median(xs []int64) int64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// Budget is 0: the swap runs under no budget.
func (c Swap) Budget(int64) int64 { return 0 }

// Run refuses: the swap does not replay on strategies, Measure runs it.
func (c Swap) Run(*Env) error {
	return errors.New("swap: runs on the arena alone (Measure), not on a strategy")
}

// Ratios are the figures the targets are about.
type SwapRatios struct {
	OffloadWakeVsHtoD   float64 `json:"offload_wake_vs_htod"`   // Offload Wake ÷ raw HtoD of the same bytes
	OffloadSleepVsDtoH  float64 `json:"offload_sleep_vs_dtoh"`  // Offload Sleep ÷ raw DtoH
	DiscardCycleVsBare  float64 `json:"discard_cycle_vs_bare"`  // Discard Sleep + Wake ÷ the bare driver calls
	ReloadVsOffloadWake float64 `json:"reload_vs_offload_wake"` // full reload ÷ Offload Wake
	OffloadWakeVsSteps  float64 `json:"offload_wake_vs_steps"`  // Offload Wake ÷ the HtoD copies in 16 MiB steps
	OffloadSleepVsSteps float64 `json:"offload_sleep_vs_steps"` // Offload Sleep ÷ the DtoH copies in 16 MiB steps
	FirstSleepVsSteady  float64 `json:"first_sleep_vs_steady"`  // the first Offload Sleep (pinning) ÷ a later one
}

// Ratios computes them.
func (r SwapResult) Ratios() SwapRatios {
	div := func(a, b int64) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	return SwapRatios{
		OffloadWakeVsHtoD:   div(r.OffloadWakeNS, r.RawHtoDNS),
		OffloadSleepVsDtoH:  div(r.OffloadSleepNS, r.RawDtoHNS),
		DiscardCycleVsBare:  div(r.DiscardSleepNS+r.DiscardWakeNS, r.BareNS),
		ReloadVsOffloadWake: div(r.ReloadNS, r.OffloadWakeNS),
		FirstSleepVsSteady:  div(r.OffloadFirstSleepNS, r.OffloadSleepNS),
		OffloadWakeVsSteps:  div(r.OffloadWakeNS, r.StepHtoDNS),
		OffloadSleepVsSteps: div(r.OffloadSleepNS, r.StepDtoHNS),
	}
}
