package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/bench/internal/strategy"
)

// Models is several models served from one device whose load shifts between
// them: each model has its weights and a KV cache per running sequence, as
// in KV, and its requests come in bursts, the models' bursts out of phase
// (model m bursts during the m-th of Models equal parts of every Period, and
// between its bursts it sees the idle rate). The device runs one model's
// decode step at a time, round robin over the models with work, each step a
// roofline of that model's weights and live cache (see Roofline).
//
// Every strategy runs under one device budget: every model's weights plus
// KVBudget. How each splits it is strategy.Split's: the paged pool gives each
// model a static KVBudget ÷ Models of blocks, as servers deploy several
// models today; the caching allocators each keep what their model freed;
// the arena shares one pool, a model growing into memory another holds
// unused, and a model idle for SleepAfter sleeps (its weights' memory goes
// back to the device, Discard) until a request comes, when it wakes and its
// weights are copied in again from pinned host memory.
//
// A sequence whose growth is refused is preempted (recomputed later), as in
// KV; a request waits in its model's queue while no slot is free or its
// prompt does not fit. While a sleeping model with requests cannot wake for
// want of memory, the other models admit no new requests, so that what
// their sequences free goes to it. The run serves for Duration; goodput is
// the tokens that came in it (a prefill's first token and every decoded one)
// per second.
type Models struct {
	Models                          int
	Layers, KVHeads, HeadDim, DType int
	Hidden, Vocab                   int
	BlockTokens                     int
	Slots                           int // sequences a model decodes at once, at most
	PromptMin, PromptMax            int
	GenMin, GenMax                  int
	KVBudget                        int64 // device memory beyond every model's weights
	Duration, Period                time.Duration
	BurstRate, IdleRate             float64       // requests a second for a model in its burst, and outside it
	SleepAfter                      time.Duration // the arena: a model idle this long sleeps (0: never)
	BandwidthGBps                   float64       // the roofline's; the suite sets it from the driver when 0
	Seed                            uint64
}

// Name returns "models".
func (c Models) Name() string { return "models" }

// kv is one model's KV cache as the KV workload sizes it.
func (c Models) kv() KV {
	return KV{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DType: c.DType, BlockTokens: c.BlockTokens,
		PromptMin: c.PromptMin, PromptMax: c.PromptMax, GenMin: c.GenMin, GenMax: c.GenMax, Hidden: c.Hidden, Vocab: c.Vocab,
		Roofline: true, BandwidthGBps: c.BandwidthGBps, Slots: c.Slots, Requests: 1}
}

// Weights is one model's weights in bytes.
func (c Models) Weights() int64 { return c.kv().Shape().WeightBytes() }

// Budget is the device budget: every model's weights, each in whole chunks
// of gran, and KVBudget.
func (c Models) Budget(gran int64) int64 {
	if c.Check() != nil {
		return 0
	}
	return int64(c.Models)*alignUp(c.Weights(), gran) + alignUp(c.KVBudget, gran)
}

// BlockBytes is one KV block of a model.
func (c Models) BlockBytes() int64 { return c.kv().BlockBytes() }

// Share is one model's static share of the KV budget (the paged pools').
func (c Models) Share() int64 { return c.KVBudget / int64(c.Models) }

// Describe says in one line what the configuration does.
func (c Models) Describe() string {
	sleep := "never sleep"
	if c.SleepAfter > 0 {
		sleep = fmt.Sprintf("an idle model sleeps after %v (arena)", c.SleepAfter)
	}
	return fmt.Sprintf("%d models of %s weights (%d layers, hidden %d), %s/token of KV; up to %d sequences each, prompt %d–%d + gen %d–%d; bursts of %g requests/s, %g/s between, %v per cycle, out of phase; budget %s (weights + %s of KV, %s each when split); %s; serve %v",
		c.Models, HumanBytes(c.Weights()), c.Layers, c.Hidden, HumanBytes(c.kv().TokenBytes()), c.Slots, c.PromptMin, c.PromptMax,
		c.GenMin, c.GenMax, c.BurstRate, c.IdleRate, c.Period, HumanBytes(c.Budget(2<<20)), HumanBytes(c.KVBudget),
		HumanBytes(c.Share()), sleep, c.Duration)
}

// Check reports the first setting that cannot work, naming the bench flag
// that sets it.
func (c Models) Check() error {
	return firstBad(
		intRange("-mm-models", 1, c.Models, 1),
		atLeastMax("-mm-models", c.Models, 8),
		atLeast("-mm-slots", c.Slots, 1),
		intRange("-mm-prompt", c.PromptMin, c.PromptMax, 1),
		intRange("-mm-gen", c.GenMin, c.GenMax, 1),
		notNegative("-mm-kv-budget", float64(c.KVBudget)),
		positiveDur("-mm-duration", c.Duration),
		positiveDur("-mm-period", c.Period),
		notNegative("-mm-burst-rate", c.BurstRate),
		notNegative("-mm-idle-rate", c.IdleRate),
		notNegative("-mm-sleep-after", float64(c.SleepAfter)),
		c.kv().Check(),
	)
}

// CheckBudget reports a KV budget whose share per model cannot hold the
// longest possible sequence, on a driver of granularity gran.
func (c Models) CheckBudget(gran int64) error {
	if c.Check() != nil {
		return nil // Check reports it
	}
	k := c.kv()
	need := alignUp(ceilDiv(int64(c.PromptMax+c.GenMax), int64(c.BlockTokens))*k.BlockBytes(), gran)
	if c.Share() < need {
		return fmt.Errorf("-mm-kv-budget %s: a model's share, %s, cannot hold the longest sequence, %s (its tokens in blocks of %d, in %s chunks); want at least %s",
			flagSize(c.KVBudget), HumanBytes(c.Share()), HumanBytes(need), c.BlockTokens, flagSize(gran), flagSize(need*int64(c.Models)))
	}
	return nil
}

func atLeastMax(flag string, v, hi int) error {
	if v > hi {
		return fmt.Errorf("%s %d: want at most %d", flag, v, hi)
	}
	return nil
}

func positiveDur(flag string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%s %v: want a positive duration", flag, d)
	}
	return nil
}

// arrival is a request for model m at time at after serving begins.
type arrival struct {
	at  time.Duration
	req request
}

// arrivals returns each model's requests in time order: a Poisson process
// whose rate is BurstRate during the model's part of each Period and
// IdleRate otherwise.
func (c Models) arrivals() [][]arrival {
	rng := rand.New(rand.NewPCG(c.Seed, 0x6d6d))
	out := make([][]arrival, c.Models)
	part := c.Period / time.Duration(c.Models)
	for m := range out {
		for t := time.Duration(0); t < c.Duration; {
			// The rate holds until the next boundary of a part.
			end := (t/part + 1) * part
			rate := c.IdleRate
			if int(t/part)%c.Models == m {
				rate = c.BurstRate
			}
			if rate <= 0 {
				t = end
				continue
			}
			gap := time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			if t+gap >= end {
				t = end // memoryless: draw again from the boundary
				continue
			}
			t += gap
			if t >= c.Duration {
				break
			}
			q := request{prompt: c.PromptMin + rng.IntN(c.PromptMax-c.PromptMin+1), gen: c.GenMin + rng.IntN(c.GenMax-c.GenMin+1)}
			out[m] = append(out[m], arrival{at: t, req: q})
		}
	}
	return out
}

// mmSeq is a running sequence of one model.
type mmSeq struct {
	kvSeq
	arrived time.Time // when its request came, for the first token
	first   bool      // its first token came
}

// mmModel is one model's state in the run.
type mmModel struct {
	st       strategy.Strategy
	weights  strategy.Region // where the strategy keeps them in a region (the arena), or nil
	blob     *strategy.Blob  // else: raw memory
	seqs     []mmSeq
	arrivals []arrival
	next     int // the next arrival not yet queued
	queue    []queued
	asleep   bool      // its weights' memory is given back
	ready    time.Time // after a wake: when the model serves again (the wake ran beside the loop)
	stuck    bool      // asleep, with requests, and its last wake found no memory
	idle     time.Time // when it last had nothing to do
	steps    int
	// blocked is the count of releases (Run's freed) when the model last
	// found no memory for a prompt or a wake; it tries again once memory
	// has been freed since, as a server's scheduler waits for a free.
	blocked int64
}

// queued is a request waiting for a slot: when it came, and what it is.
type queued struct {
	at  time.Time
	req request
}

// Run serves the models on env's strategy, split per model.
func (c Models) Run(env *Env) (err error) {
	if err := c.Check(); err != nil {
		return err
	}
	k := c.kv()
	w, read, block, maxBytes := c.Weights(), k.Shape().ReadBytes(), k.BlockBytes(), k.MaxBytes()
	shares := make([]int64, c.Models)
	for i := range shares {
		shares[i] = c.Share()
	}
	if strategy.Pool(env.S) != nil {
		// The arena's pool is the device's: warm it as the suite says.
		if err := env.Prepare(); err != nil {
			return err
		}
	}
	parts, err := strategy.Split(env.S, shares)
	if err != nil {
		return err
	}
	ms := make([]*mmModel, c.Models)
	arr := c.arrivals()
	host, err := env.Drv.MallocHost(uintptr(min(w, 64<<20)))
	if err != nil {
		return fmt.Errorf("models: pinned host buffer: %w", err)
	}
	defer func() {
		for _, m := range ms {
			if m == nil {
				continue
			}
			for i := range m.seqs {
				if m.seqs[i].r != nil {
					err = errors.Join(err, env.close(m.seqs[i].r))
				}
			}
			if m.weights != nil {
				err = errors.Join(err, env.close(m.weights))
			}
			err = errors.Join(err, m.blob.Close())
		}
		for _, p := range parts {
			err = errors.Join(err, p.Close())
		}
		err = errors.Join(err, env.Drv.FreeHost(host))
	}()
	// Load every model: its part of the strategy, its weights (copied in
	// from pinned host memory), its slots' regions; all setup.
	for i := range ms {
		m := &mmModel{st: parts[i], arrivals: arr[i]}
		ms[i] = m
		t := time.Now()
		err := m.st.Prepare()
		if err == nil {
			err = c.loadWeights(env, m, w, host, true)
		}
		env.setup(t)
		if err != nil {
			return fmt.Errorf("models: load model %d: %w", i, err)
		}
		env.addLive(w) // the weights are live tensors too
		m.seqs = make([]mmSeq, c.Slots)
		for j := range m.seqs {
			r, err := env.openIn(m.st, maxBytes)
			if err != nil {
				return fmt.Errorf("models: model %d: open slot %d: %w", i, j, err)
			}
			m.seqs[j].r = r
		}
	}

	tok := newTokenClock(env)
	start := tok.start
	var ttft []int64
	steps := Roofline{Read: read, GBps: c.BandwidthGBps}
	compute, err := newStepCompute(env, KV{Layers: c.Layers, Roofline: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, compute.close()) }()
	live := make([]int64, c.Models) // KV bytes per model
	freed := int64(1)               // releases of memory so far: sequences done or preempted, models asleep
	for i := range ms {
		ms[i].idle = start
	}
	for rr := 0; ; rr++ {
		now := tok.now().Sub(start)
		if now >= c.Duration {
			break
		}
		stuck := false
		for _, m := range ms {
			stuck = stuck || m.stuck
		}
		worked := false
		for turn := range ms {
			mi := (rr + turn) % len(ms)
			m := ms[mi]
			for m.next < len(m.arrivals) && m.arrivals[m.next].at <= tok.now().Sub(start) {
				a := m.arrivals[m.next]
				m.queue = append(m.queue, queued{at: start.Add(a.at), req: a.req})
				m.next++
			}
			if m.asleep && len(m.queue) > 0 && m.blocked < freed {
				ok, took, err := c.wake(env, m, w, host)
				if err != nil {
					return fmt.Errorf("models: model %d: %w", mi, err)
				}
				// The wake ran beside the serving loop, as on a thread of its
				// own: the other models did not wait for it, and this one
				// serves once it is over.
				env.skewBy(took)
				if !ok {
					m.stuck, m.blocked = true, freed // no memory yet; the others stop admitting
					continue
				}
				m.asleep, m.stuck, m.ready, m.idle = false, false, tok.now().Add(took), time.Time{}
				env.addLive(w)
				env.Res.Wakes++
			}
			if m.asleep || tok.now().Before(m.ready) {
				continue
			}
			// Admit: fill free slots from the queue while the prompts fit.
			for j := range m.seqs {
				s := &m.seqs[j]
				if s.active || len(m.queue) == 0 || stuck && !m.stuck || m.blocked >= freed {
					continue
				}
				q := m.queue[0]
				err := env.grow(s.r, ceilDiv(int64(q.req.prompt), int64(c.BlockTokens))*block)
				if errors.Is(err, acl.ErrOutOfMemory) {
					env.Res.Denied++
					m.blocked = freed
					break // the queue waits for memory to be freed
				}
				if err != nil {
					return fmt.Errorf("models: model %d: prefill %d tokens: %w", mi, q.req.prompt, err)
				}
				// The prompt's cache, a tensor per token (the paged pool holds
				// no tensor larger than a block).
				for range q.req.prompt {
					t := env.start()
					_, err = s.r.Alloc(k.TokenBytes(), strategy.Align)
					env.stop(t)
					if err != nil {
						return fmt.Errorf("models: model %d: prefill %d tokens: %w", mi, q.req.prompt, err)
					}
				}
				m.queue = m.queue[1:]
				s.kvSeq = kvSeq{r: s.r, active: true, req: q.req, gen: q.req.gen, left: q.req.gen, last: q.req.last}
				s.arrived, s.first = q.at, !q.req.last.IsZero()
				s.tokens = q.req.prompt
				live[mi] += int64(q.req.prompt) * k.TokenBytes()
				env.addLive(int64(q.req.prompt) * k.TokenBytes())
			}
			// Decode one token for every running sequence: a block's Grow where
			// it starts one, and one Alloc per token (the token's whole cache).
			emitted := 0
			for j := range m.seqs {
				s := &m.seqs[j]
				if !s.active {
					continue
				}
				var err error
				if s.tokens%c.BlockTokens == 0 {
					err = env.grow(s.r, block)
				}
				if err == nil {
					t := env.start()
					_, err = s.r.Alloc(k.TokenBytes(), strategy.Align)
					env.stop(t)
				}
				if errors.Is(err, acl.ErrOutOfMemory) {
					env.Res.Preempted++
					done := s.gen - s.left
					q := queued{at: s.arrived, req: request{prompt: s.req.prompt + done, gen: s.left, last: s.last}}
					if err := c.release(env, s, &live[mi], k.TokenBytes()); err != nil {
						return err
					}
					freed++
					m.queue = append([]queued{q}, m.queue...)
					continue
				}
				if err != nil {
					return fmt.Errorf("models: model %d: decode at %d tokens: %w", mi, s.tokens, err)
				}
				s.tokens++
				live[mi] += k.TokenBytes()
				env.addLive(k.TokenBytes())
				emitted++
			}
			if emitted == 0 {
				switch {
				case len(m.queue) > 0:
					m.idle = time.Time{} // requests wait: not idle
				case m.idle.IsZero():
					m.idle = tok.now()
				}
				continue
			}
			worked = true
			m.idle = time.Time{}
			m.steps++
			if err := compute.run(steps.Step(live[mi])); err != nil {
				return fmt.Errorf("models: model %d: compute: %w", mi, err)
			}
			t := tok.now()
			for j := range m.seqs {
				s := &m.seqs[j]
				if !s.active {
					continue
				}
				s.last = tok.token(s.last, t)
				env.Res.Tokens++
				if !s.first {
					s.first = true
					ttft = append(ttft, int64(t.Sub(s.arrived)))
				}
				if s.left--; s.left <= 0 {
					if err := c.release(env, s, &live[mi], k.TokenBytes()); err != nil {
						return err
					}
					freed++
					env.Res.Finished++
				}
			}
		}
		env.sample(rr)
		// An idle model sleeps, beside the loop as its wake does; with
		// nothing to do, wait for the next request.
		for mi, m := range ms {
			if c.SleepAfter > 0 && !m.asleep && len(m.queue) == 0 && !m.idle.IsZero() && tok.now().Sub(m.idle) >= c.SleepAfter {
				ok, took, err := c.sleep(env, m)
				if err != nil {
					return fmt.Errorf("models: model %d: %w", mi, err)
				}
				env.skewBy(took)
				if ok {
					m.asleep = true
					freed++
					env.addLive(-w)
					env.Res.Sleeps++
				}
			}
		}
		if !worked {
			nextAt := c.Duration
			for _, m := range ms {
				if m.next < len(m.arrivals) {
					nextAt = min(nextAt, m.arrivals[m.next].at)
				}
				if len(m.queue) > 0 {
					nextAt = 0 // requests wait for memory or a wake: go round
				}
			}
			if d := nextAt - tok.now().Sub(start); d > 0 {
				time.Sleep(min(d, time.Millisecond))
			}
		}
		if rr%64 == 0 {
			env.progress(float64(tok.now().Sub(start)) / float64(c.Duration))
		}
	}
	tok.end()
	env.Res.TTFTs = len(ttft)
	env.Res.TTFTP50NS, env.Res.TTFTP99NS, _ = percentiles(ttft)
	for _, m := range ms {
		env.Res.Steps += m.steps
	}
	env.final()
	return nil
}

// release drops a sequence's cache (it finished, or was preempted).
func (c Models) release(env *Env, s *mmSeq, live *int64, tok int64) error {
	if err := errors.Join(env.truncate(s.r, 0), env.idle(s.r)); err != nil {
		return fmt.Errorf("models: release: %w", err)
	}
	*live -= int64(s.tokens) * tok
	env.addLive(-int64(s.tokens) * tok)
	s.active, s.tokens = false, 0
	return nil
}

// loadWeights makes m's weights: in a region of m's strategy where it can
// sleep them (the arena), else in raw memory; and copies them in from the
// pinned host buffer, as a server loads (or reloads) a model. Only the copy
// is made when the region exists (a wake).
func (c Models) loadWeights(env *Env, m *mmModel, w int64, host []byte, open bool) error {
	if open {
		if strategy.Pool(m.st) != nil {
			r, err := m.st.Open(w)
			if err != nil {
				return err
			}
			m.weights = r
			if err := r.Grow(w); err != nil {
				return err
			}
			if _, err := r.Alloc(w, strategy.Align); err != nil {
				return err
			}
		} else {
			b, err := strategy.NewBlob(env.Drv, w)
			if err != nil {
				return err
			}
			m.blob = b
		}
	}
	for off := int64(0); off < w; off += int64(len(host)) {
		n := min(int64(len(host)), w-off)
		var err error
		if m.weights != nil {
			err = env.write(m.weights, off, host[:n])
		} else {
			err = env.Drv.MemcpyHtoD(m.blob.Ptr().Add(uintptr(off)), host[:n])
		}
		if err != nil {
			return fmt.Errorf("copy the weights in: %w", err)
		}
	}
	return nil
}

// sleep puts an idle model's weights to sleep, where the strategy can. It
// reports whether it did, and how long it took.
func (c Models) sleep(env *Env, m *mmModel) (ok bool, took time.Duration, err error) {
	sl, can := m.weights.(strategy.Sleeper)
	if !can {
		return false, 0, nil
	}
	t := env.start()
	err = sl.Sleep()
	took = time.Since(t)
	env.stopAs(&env.Res.SleepNS, t)
	if err != nil {
		return false, took, fmt.Errorf("sleep: %w", err)
	}
	return true, took, nil
}

// wake wakes a sleeping model and copies its weights in again from pinned
// host memory. It reports ok false, having changed nothing, when the device
// has no memory for it yet; and how long it took.
func (c Models) wake(env *Env, m *mmModel, w int64, host []byte) (ok bool, took time.Duration, err error) {
	sl := m.weights.(strategy.Sleeper)
	t := env.start()
	err = sl.Wake()
	if err == nil {
		err = c.loadWeights(env, m, w, host, false)
	}
	took = time.Since(t)
	env.stopAs(&env.Res.SleepNS, t)
	switch {
	case errors.Is(err, acl.ErrOutOfMemory):
		return false, took, nil
	case err != nil:
		return false, took, fmt.Errorf("wake: %w", err)
	}
	return true, took, nil
}
