package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/vmarena/vmarena/bench/internal/strategy"
)

// Scratch is per-step activation memory in one region. Each step allocates
// between MinBufs and MaxBufs buffers (a Grow and an Alloc each) and drops
// them all at its end. Buffer sizes are log-uniform in [MinSize, MaxSize];
// with probability SpikeProb a step is a spike (a long prompt) whose buffers
// are log-uniform in [SpikeMin, SpikeMax]. After a step, once the largest
// step of the last Window steps is at most half the largest since the last
// trim (a spike has passed), the workload trims the region.
type Scratch struct {
	Steps              int
	MinBufs, MaxBufs   int
	MinSize, MaxSize   int64
	SpikeProb          float64
	SpikeMin, SpikeMax int64
	Window             int
	Seed               uint64
}

// Name returns "scratch".
func (c Scratch) Name() string { return "scratch" }

// MaxBytes is the worst step the configuration allows.
func (c Scratch) MaxBytes() int64 {
	return int64(c.MaxBufs) * alignUp(max(c.MaxSize, c.SpikeMax), strategy.Align)
}

// Describe says in one line what the configuration does.
func (c Scratch) Describe() string {
	return fmt.Sprintf("%d steps of %d–%d buffers of %s–%s; spikes (p=%g) of %s–%s buffers; trim when the last %d steps peak under half the high-water; prealloc maps %s",
		c.Steps, c.MinBufs, c.MaxBufs, HumanBytes(c.MinSize), HumanBytes(c.MaxSize), c.SpikeProb,
		HumanBytes(c.SpikeMin), HumanBytes(c.SpikeMax), c.Window, HumanBytes(c.MaxBytes()))
}

// Budget is the physical memory budget the workload runs under (0: none).
func (c Scratch) Budget(int64) int64 { return 0 }

func (c Scratch) check() error { return c.Check() }

// Check reports the first setting that cannot work, naming the bench flag
// that sets it and what it accepts.
func (c Scratch) Check() error {
	return firstBad(
		atLeast("-scratch-steps", c.Steps, 1),
		intRange("-scratch-bufs", c.MinBufs, c.MaxBufs, 1),
		sizeRange("-scratch-size", c.MinSize, c.MaxSize),
		fraction("-scratch-spike", c.SpikeProb, true),
		sizeRange("-scratch-spike-size", c.SpikeMin, c.SpikeMax),
		atLeast("-scratch-window", c.Window, 1),
	)
}

func logUniform(rng *rand.Rand, lo, hi int64) int64 {
	if hi <= lo {
		return lo
	}
	l, h := math.Log(float64(lo)), math.Log(float64(hi))
	return int64(math.Exp(l + rng.Float64()*(h-l)))
}

// Run replays the workload on env's strategy.
func (c Scratch) Run(env *Env) (err error) {
	if err := c.check(); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x5c7a))
	r, err := env.open(c.MaxBytes())
	if err != nil {
		return fmt.Errorf("scratch: open: %w", err)
	}
	defer func() { err = errors.Join(err, env.close(r)) }()

	recent := make([]int64, c.Window)
	var high int64 // the largest step since the last trim
	for step := range c.Steps {
		lo, hi := c.MinSize, c.MaxSize
		if rng.Float64() < c.SpikeProb {
			lo, hi = c.SpikeMin, c.SpikeMax
		}
		n := c.MinBufs + rng.IntN(c.MaxBufs-c.MinBufs+1)
		var live, first int64
		for b := range n {
			size := alignUp(logUniform(rng, lo, hi), strategy.Align)
			if err := env.grow(r, size); err != nil {
				return fmt.Errorf("scratch: step %d: grow %d bytes: %w", step, size, err)
			}
			t := env.start()
			off, err := r.Alloc(size, strategy.Align)
			env.stop(t)
			if err != nil {
				return fmt.Errorf("scratch: step %d: buffer %d: %w", step, b, err)
			}
			if err := env.touch(r, off, size); err != nil {
				return fmt.Errorf("scratch: step %d: %w", step, err)
			}
			if b == 0 {
				first = size
			}
			live += size
			env.addLive(size)
		}
		// The first buffer survived the step's growth (realloc moved it).
		if err := env.verify(r, 0, min(first, 1<<20)); err != nil {
			return fmt.Errorf("scratch: step %d: %w", step, err)
		}
		env.sample(step)
		if err := env.truncate(r, 0); err != nil {
			return fmt.Errorf("scratch: step %d: %w", step, err)
		}
		env.addLive(-live)
		recent[step%c.Window] = live
		high = max(high, live)
		if w := maxOf(recent); w <= high/2 {
			if err := env.trim(r); err != nil {
				return fmt.Errorf("scratch: step %d: trim: %w", step, err)
			}
			high = w
		}
		if step%16 == 0 {
			env.progress(float64(step) / float64(c.Steps))
		}
	}
	env.final()
	return nil
}

func maxOf(s []int64) int64 {
	var m int64
	for _, v := range s {
		m = max(m, v)
	}
	return m
}
