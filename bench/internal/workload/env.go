// Package workload holds the memory patterns of inference that the suite
// replays on every strategy: KV-cache decode under continuous batching,
// per-step activation scratch with spikes, and tenants churning under one
// budget. A workload is a deterministic function of its configuration (and
// seed): every strategy sees exactly the same calls.
package workload

import (
	"bytes"
	"fmt"
	"time"

	"github.com/vmarena/vmarena/bench/internal/counting"
	"github.com/vmarena/vmarena/bench/internal/strategy"
	"github.com/vmarena/vmarena/chunk"
)

// Workload is one memory pattern.
type Workload interface {
	// Name is a short identifier: "kv", "scratch", "churn".
	Name() string
	// Describe says in one line what the configuration does.
	Describe() string
	// Budget is the physical memory budget the workload runs under, 0 for
	// none; gran is the driver's granularity.
	Budget(gran int64) int64
	// Run replays the workload on env's strategy.
	Run(env *Env) error
}

// GrowEvent is one Grow that called the driver.
type GrowEvent struct {
	NS        int64 // wall time of the Grow
	DriverNS  int64 // time inside driver calls during it
	WrapperNS int64 // the counting wrapper's own bookkeeping during it (neither the strategy's nor the driver's)
	Calls     int64 // driver calls it made
}

// Sample is the memory at the end of one step.
type Sample struct {
	Step     int
	Live     int64 // bytes of live tensors (the workload's own count)
	Physical int64 // physical bytes held
	Mapped   int64 // bytes mapped
}

// Result is what one run of a workload on a strategy measured.
type Result struct {
	Workload    string
	Strategy    string
	Rep         int
	WallNS      int64 // the whole run: opening, steps, closing
	MemNS       int64 // inside the strategy's calls (wall minus bookkeeping and data writes)
	Steps       int
	GrowCalls   int64       // calls of Grow
	Grows       []GrowEvent // the Grows that called the driver
	Denied      int64       // Grows refused for lack of memory (budgeted workloads)
	FailedTrims int64       // Trims refused for lack of memory (budgeted workloads)
	Demand      int64       // bytes × steps asked for (budgeted workloads)
	Served      int64       // bytes × steps held (budgeted workloads)
	Regions     int
	Calls       counting.Calls
	Mem         counting.Memory // peaks over the run; the rest at the end
	Final       Sample          // before the regions closed
	PeakLive    int64
	Samples     []Sample
	Pool        *chunk.Stats // the arena's pool, before it closed
	Err         string
}

// Env is what a workload runs against, and where it records.
type Env struct {
	Drv      *counting.Driver
	S        strategy.Strategy
	Touch    bool            // write every tensor's bytes, as kernels would
	Verify   bool            // read some back after growth, and compare
	Progress func(f float64) // called now and then with the fraction done
	Res      *Result

	src     []byte
	checked int
	live    int64 // bytes of live tensors now
}

const touchChunk = 4 << 20

// NewEnv returns an environment recording into a fresh Result.
func NewEnv(drv *counting.Driver, s strategy.Strategy, workload string) *Env {
	return &Env{Drv: drv, S: s, Res: &Result{Workload: workload, Strategy: s.Name()}}
}

func (e *Env) start() time.Time { return time.Now() }
func (e *Env) stop(t time.Time) { e.Res.MemNS += int64(time.Since(t)) }

func (e *Env) open(max int64) (strategy.Region, error) {
	defer e.stop(e.start())
	r, err := e.S.Open(max)
	if err == nil {
		e.Res.Regions++
	}
	return r, err
}

func (e *Env) close(r strategy.Region) error {
	defer e.stop(e.start())
	return r.Close()
}

// grow calls r.Grow(n) and records it when it reached the driver.
func (e *Env) grow(r strategy.Region, n int64) error {
	c0, d0, s0 := e.Drv.CallCount(), e.Drv.DriverNS(), e.Drv.SelfNS()
	t := time.Now()
	err := r.Grow(n)
	ns := int64(time.Since(t))
	e.Res.MemNS += ns
	e.Res.GrowCalls++
	if c := e.Drv.CallCount() - c0; c > 0 && err == nil {
		e.Res.Grows = append(e.Res.Grows, GrowEvent{NS: ns, DriverNS: e.Drv.DriverNS() - d0,
			WrapperNS: e.Drv.SelfNS() - s0, Calls: c})
	}
	return err
}

func (e *Env) truncate(r strategy.Region, n int64) error {
	defer e.stop(e.start())
	return r.Truncate(n)
}

func (e *Env) trim(r strategy.Region) error {
	defer e.stop(e.start())
	return r.Trim()
}

// touch writes the logical range [off, off+n) of r, as a kernel producing
// the tensor would, when Env.Touch is set.
func (e *Env) touch(r strategy.Region, off, n int64) error {
	if !e.Touch {
		return nil
	}
	if e.src == nil {
		e.src = make([]byte, touchChunk)
		for i := range e.src {
			e.src[i] = byte(i*7 + 3)
		}
	}
	for n > 0 {
		k := min(n, touchChunk)
		p, err := r.Ptr(off, k)
		if err != nil {
			return err
		}
		if err := e.Drv.MemcpyHtoD(p, e.src[:k]); err != nil {
			return err
		}
		off, n = off+k, n-k
	}
	return nil
}

// verify reads back [off, off+n) of r (at most one touch chunk), written by
// touch, and compares.
func (e *Env) verify(r strategy.Region, off, n int64) error {
	if !e.Verify || !e.Touch {
		return nil
	}
	n = min(n, touchChunk)
	p, err := r.Ptr(off, n)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	got := make([]byte, n)
	if err := e.Drv.MemcpyDtoH(got, p); err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	if !bytes.Equal(got, e.src[:n]) {
		return fmt.Errorf("verify: %s lost the data of [%d, +%d)", e.S.Name(), off, n)
	}
	e.checked++
	return nil
}

// Checked returns how many ranges verify compared.
func (e *Env) Checked() int { return e.checked }

// addLive counts d more bytes of live tensors (fewer when negative).
func (e *Env) addLive(d int64) {
	e.live += d
	e.Res.PeakLive = max(e.Res.PeakLive, e.live)
}

// sample records the memory at the end of a step.
func (e *Env) sample(step int) {
	m := e.Drv.Memory()
	e.Res.Samples = append(e.Res.Samples, Sample{Step: step, Live: e.live, Physical: m.Physical, Mapped: m.Mapped})
	e.Res.Steps = step + 1
}

// final records the memory at the end of the run, before the regions close.
func (e *Env) final() {
	m := e.Drv.Memory()
	e.Res.Final = Sample{Step: e.Res.Steps, Live: e.live, Physical: m.Physical, Mapped: m.Mapped}
}

func (e *Env) progress(f float64) {
	if e.Progress != nil {
		e.Progress(f)
	}
}

func alignUp(n, a int64) int64 { return (n + a - 1) &^ (a - 1) }

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
