package workload

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/bench/internal/strategy"
)

// Churn is several tenants (models, adapters, request queues) sharing one
// device under one memory budget. Each tenant is a region whose demand swings
// between Lo and Hi bytes with period Period steps, the tenants evenly out of
// phase, with ±Jitter noise. Each step a tenant grows to its demand a tensor
// (Tensor bytes: a Grow and an Alloc) at a time, or truncates to it and
// marks the memory above idle (Region.Idle).
// A Grow refused for lack of memory is counted as denied and the tenant waits
// for the next step.
type Churn struct {
	Tenants int
	Steps   int
	Period  int
	Lo, Hi  int64 // per tenant
	Tensor  int64
	Jitter  float64
	// BudgetBytes is the physical budget; 0 means the most the tenants ask
	// for at once (without noise), raised by Jitter and another 5%, plus two
	// chunks per tenant.
	BudgetBytes int64
	Seed        uint64
}

// Name returns "churn".
func (c Churn) Name() string { return "churn" }

func (c Churn) demand(i, step int, noise float64) int64 {
	phase := float64(step)/float64(c.Period) + float64(i)/float64(c.Tenants)
	d := float64(c.Lo) + float64(c.Hi-c.Lo)*(1-math.Cos(2*math.Pi*phase))/2
	d *= 1 + c.Jitter*noise
	return int64(d) / c.Tensor * c.Tensor
}

// MaxBytes is the most one tenant can ask for.
func (c Churn) MaxBytes() int64 {
	return alignUp(int64(float64(c.Hi)*(1+c.Jitter)), c.Tensor)
}

// Budget returns the budget the tenants share.
func (c Churn) Budget(gran int64) int64 {
	if c.BudgetBytes > 0 {
		return c.BudgetBytes
	}
	var most int64
	for step := range c.Steps {
		var sum int64
		for i := range c.Tenants {
			sum += c.demand(i, step, 0)
		}
		most = max(most, sum)
	}
	b := int64(float64(most)*(1+c.Jitter)*1.05) + 2*int64(c.Tenants)*gran
	return alignUp(b, gran)
}

// Describe says in one line what the configuration does.
func (c Churn) Describe() string {
	return fmt.Sprintf("%d tenants, %d steps, demand %s–%s each (period %d steps, out of phase, ±%g%%), tensors of %s; prealloc needs %s",
		c.Tenants, c.Steps, HumanBytes(c.Lo), HumanBytes(c.Hi), c.Period, 100*c.Jitter, HumanBytes(c.Tensor),
		HumanBytes(int64(c.Tenants)*c.MaxBytes()))
}

func (c Churn) check() error { return c.Check() }

// Check reports the first setting that cannot work, naming the bench flag
// that sets it and what it accepts.
func (c Churn) Check() error {
	var tensor error
	if c.Tensor <= 0 || c.Tensor%strategy.Align != 0 {
		tensor = fmt.Errorf("-churn-tensor %s: want a positive multiple of %d bytes", flagSize(c.Tensor), strategy.Align)
	}
	var demand error
	if c.Lo < 0 || c.Hi < c.Lo {
		demand = fmt.Errorf("-churn-demand %s:%s: want lo:hi sizes with lo ≤ hi", flagSize(c.Lo), flagSize(c.Hi))
	}
	return firstBad(
		atLeast("-churn-tenants", c.Tenants, 1),
		atLeast("-churn-steps", c.Steps, 1),
		atLeast("-churn-period", c.Period, 1),
		demand,
		tensor,
		fraction("-churn-jitter", c.Jitter, false),
		notNegative("-churn-budget", float64(c.BudgetBytes)),
	)
}

// Run replays the workload on env's strategy.
func (c Churn) Run(env *Env) (err error) {
	if err := c.check(); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xc4a2))
	regions := make([]strategy.Region, c.Tenants)
	defer func() {
		for _, r := range regions {
			if r != nil {
				err = errors.Join(err, env.close(r))
			}
		}
	}()
	for i := range regions {
		r, err := env.open(c.MaxBytes())
		switch {
		case errors.Is(err, acl.ErrOutOfMemory):
			// The tenant cannot start (prealloc past the budget): all its
			// demand is denied.
		case err != nil:
			return fmt.Errorf("churn: open tenant %d: %w", i, err)
		}
		regions[i] = r
	}
	live := make([]int64, c.Tenants)
	for step := range c.Steps {
		for i, r := range regions {
			target := c.demand(i, step, 2*rng.Float64()-1)
			env.Res.Demand += target
			switch {
			case r == nil:
				env.Res.Denied++
			case live[i] < target:
				for live[i] < target {
					err := env.grow(r, c.Tensor)
					if errors.Is(err, acl.ErrOutOfMemory) {
						env.Res.Denied++
						break
					}
					if err != nil {
						return fmt.Errorf("churn: step %d: tenant %d: grow: %w", step, i, err)
					}
					t := env.start()
					off, err := r.Alloc(c.Tensor, strategy.Align)
					env.stop(t)
					if err != nil {
						return fmt.Errorf("churn: step %d: tenant %d: %w", step, i, err)
					}
					if err := env.touch(r, off, c.Tensor); err != nil {
						return fmt.Errorf("churn: step %d: %w", step, err)
					}
					live[i] += c.Tensor
					env.addLive(c.Tensor)
				}
			case live[i] > target:
				if err := env.verify(r, 0, min(live[i], 1<<20)); err != nil {
					return fmt.Errorf("churn: step %d: tenant %d: %w", step, i, err)
				}
				if err := env.truncate(r, target); err != nil {
					return fmt.Errorf("churn: step %d: tenant %d: truncate: %w", step, i, err)
				}
				// The tenant will grow again: it gives back what its
				// strategy cannot keep cheaply (the arena keeps the chunks
				// mapped until another tenant needs them). Giving memory
				// back can need memory (realloc copies into a smaller
				// buffer): under the budget that may fail, and the tenant
				// keeps what it holds.
				if err := env.idle(r); errors.Is(err, acl.ErrOutOfMemory) {
					env.Res.FailedTrims++
				} else if err != nil {
					return fmt.Errorf("churn: step %d: tenant %d: trim: %w", step, i, err)
				}
				env.addLive(target - live[i])
				live[i] = target
			}
			env.Res.Served += min(live[i], target)
		}
		env.sample(step)
		if step%16 == 0 {
			env.progress(float64(step) / float64(c.Steps))
		}
	}
	env.final()
	return nil
}
