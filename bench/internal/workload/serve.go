package workload

import (
	"slices"
	"time"
)

// tokenClock records what a user of a server feels: when the first token
// comes (from Env.Start: the process's start in a fresh run, so the
// strategy's setup is in it), the time between a sequence's tokens, and how
// long the serving took. A token comes when its step's device compute ends,
// as a server samples it then. Its clock is the wall clock less Env's skew:
// every device wait counts as long as it was modelled (stepCompute.wait).
type tokenClock struct {
	env   *Env
	start time.Time // serving began: after the setup
	first bool
	tbt   []int64
}

func newTokenClock(env *Env) *tokenClock {
	env.Res.OpenNS = env.Res.SetupNS
	return &tokenClock{env: env, start: time.Now()}
}

// now returns the serving clock's time.
func (t *tokenClock) now() time.Time { return time.Now().Add(-t.env.skew) }

// token records a token that came at now in a sequence whose previous token
// came at last (zero: none, its first), and returns now.
func (t *tokenClock) token(last, now time.Time) time.Time {
	if !t.first {
		t.first = true
		t.env.Res.FirstTokenNS = int64(now.Sub(t.env.Start))
	}
	if !last.IsZero() {
		t.tbt = append(t.tbt, int64(now.Sub(last)))
	}
	return now
}

// end records the serving time and the distribution of the times between
// tokens.
func (t *tokenClock) end() {
	r := t.env.Res
	r.ServeNS = int64(t.now().Sub(t.start))
	r.TBTs = len(t.tbt)
	r.TBTP50NS, r.TBTP99NS, r.TBTMaxNS = percentiles(t.tbt)
}

// percentiles returns the p50, p99 and maximum of v (zeros when empty),
// sorting v.
func percentiles(v []int64) (p50, p99, most int64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	slices.Sort(v)
	at := func(p float64) int64 {
		i := int(p*float64(len(v))+0.999999) - 1
		return v[min(max(i, 0), len(v)-1)]
	}
	return at(0.50), at(0.99), v[len(v)-1]
}
