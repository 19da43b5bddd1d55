package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/bench/internal/counting"
	"github.com/vmarena/vmarena/bench/internal/strategy"
)

// KV is KV-cache decode under continuous batching. Slots sequences run at
// once; each starts with a prefill of its prompt, then adds one token per
// step until it has generated its tokens, and is then replaced by the next
// request. Every token appends a K and a V tensor for every layer. A
// sequence's cache is one region: it grows a block of BlockTokens tokens at a
// time (the prompt's blocks at once), or, with TokenGrowth on a region that
// maps what it cuts, by its tokens; when the sequence finishes, the region
// is truncated and marked idle, and the slot's next request starts in it.
//
// Every strategy runs under the same physical budget (Budget). A sequence
// whose growth the budget or the device refuses is preempted, as serving
// engines do: its cache is dropped and the request is served again later
// from its prompt and what it had generated (the recomputed tokens are the
// price). A slot whose region cannot even open (a preallocation beyond the
// budget) stays empty.
type KV struct {
	Layers, KVHeads, HeadDim, DType int // the model: bytes per token = 2·Layers·KVHeads·HeadDim·DType
	BlockTokens                     int // tokens a Grow makes room for while decoding
	Slots                           int // sequences decoded at once
	Requests                        int // sequences served in all
	PromptMin, PromptMax            int // prompt length, uniform
	GenMin, GenMax                  int // generated tokens, uniform
	// BudgetBytes is the physical budget; 0 means BudgetFactor × the peak
	// of live KV bytes (from the schedule), plus two chunks per slot.
	BudgetBytes  int64
	BudgetFactor float64 // 0 means no budget, unless BudgetBytes is set
	// StepCompute is the device compute of one decode step, which the host
	// waits for (to sample the next tokens) between steps: the time a
	// background worker has to map ahead. It is not allocator time. The
	// host spins through it, as a CUDA or ACL host thread spins in a stream
	// synchronisation by default: a sleep would add the timer slack of the
	// machine, which other goroutines' timers change, to every step.
	StepCompute time.Duration
	// Roofline sets each decode step's compute from the model instead of
	// StepCompute: the weights (estimated from the shape and Hidden, see
	// Shape) and every running sequence's KV cache, read once over
	// BandwidthGBps (Roofline.Step), as a memory-bound decode step takes.
	Roofline bool
	// Hidden is the model's hidden size, and Vocab its vocabulary (0:
	// DefaultVocab), for its weights.
	Hidden, Vocab int
	// BandwidthGBps is the roofline's bandwidth in GB/s; the suite sets it
	// from the driver (the device model's local bandwidth) when it is 0.
	BandwidthGBps float64
	// Launches is the kernel launches of one decode step (0: one per
	// layer, as an eager model launches; 1: one graph launch). On a driver
	// that can queue timed stand-in work (the device model), the step's
	// compute is that many launches on a stream of the workload's, waited
	// for by polling an event, so that what delays a launch (the pessimistic
	// model's serial calls) shows in the step; elsewhere the host spins
	// through StepCompute.
	Launches int
	// Prefetch tells a region the size of the prompt the next request it
	// will serve brings, where the strategy can use it (strategy.Prefetcher:
	// the arena maps it in the background), PrefetchSteps steps ahead: the
	// scheduler knows the queue's order, and from each running sequence's
	// token limit when its slot frees at the latest (here every sequence
	// runs to its limit).
	Prefetch      bool
	PrefetchSteps int
	// PrefetchBlocks also tells each running sequence, PrefetchSteps tokens
	// ahead, the KV block it will grow into (with Prefetch).
	PrefetchBlocks bool
	// TokenGrowth grows a region that maps what it cuts (strategy.Mapper:
	// the arena) by the tokens it appends instead of in blocks: a prefill
	// makes room for its prompt's tokens, a decode step cuts its token and
	// the region maps what that needs, as a contiguous cache, which has no
	// blocks, can; the other strategies still grow in blocks. With Prefetch
	// such a region is told its next prompt's exact size, and, with
	// PrefetchBlocks, each running sequence's next TokenAhead tokens
	// (at most the tokens it has left) instead of its next block; 0 means
	// the tokens of TokenLead of steps (TokensAhead).
	TokenGrowth bool
	TokenAhead  int
	// Load copies the model's weights (Shape's) into device memory before
	// serving, as a server loads its model: from pinned host memory, into
	// one allocation outside the strategy and its budget, timed as setup.
	// The first prompts are known at start, so they are prefetched (with
	// Prefetch) before the load: an arena maps them meanwhile. A device
	// without room for the weights beside the budget skips the load
	// (Result.Loaded says).
	Load bool
	// PerToken cuts one tensor per token (every layer's K and V together,
	// as a layout with the token outermost would) instead of one per
	// layer's K and V: a tensor per token instead of 2·Layers.
	PerToken bool
	Seed     uint64
}

// Name returns "kv".
func (c KV) Name() string { return "kv" }

// LayerBytes is one layer's K (or V) for one token, aligned.
func (c KV) LayerBytes() int64 {
	return alignUp(int64(c.KVHeads*c.HeadDim*c.DType), strategy.Align)
}

// TokenBytes is the cache of one token over every layer.
func (c KV) TokenBytes() int64 { return 2 * int64(c.Layers) * c.LayerBytes() }

// BlockBytes is the cache of one block of tokens.
func (c KV) BlockBytes() int64 { return int64(c.BlockTokens) * c.TokenBytes() }

// MaxBytes is the cache of the longest possible sequence, in whole blocks.
func (c KV) MaxBytes() int64 {
	return ceilDiv(int64(c.PromptMax+c.GenMax), int64(c.BlockTokens)) * c.BlockBytes()
}

// Describe says in one line what the configuration does.
func (c KV) Describe() string {
	b := "no budget"
	switch {
	case c.BudgetBytes > 0:
		b = "budget " + HumanBytes(c.BudgetBytes)
	case c.Budget(2<<20) > 0:
		b = fmt.Sprintf("budget %g× peak live (%s) + 2 chunks per slot", c.BudgetFactor, HumanBytes(c.PeakLive()))
	}
	compute := ""
	if c.StepCompute > 0 || c.Roofline {
		compute = "; " + c.Steps().Describe()
	}
	if c.Load {
		compute += fmt.Sprintf("; %s of weights loaded before serving, where the device has room", HumanBytes(c.Shape().WeightBytes()))
	}
	return fmt.Sprintf("%d slots, %d requests, prompt %d–%d + gen %d–%d tokens, %s/token (%d layers × K,V × %d heads × %d × %dB), block %d tokens = %s; %s%s; prealloc maps %s",
		c.Slots, c.Requests, c.PromptMin, c.PromptMax, c.GenMin, c.GenMax, HumanBytes(c.TokenBytes()),
		c.Layers, c.KVHeads, c.HeadDim, c.DType, c.BlockTokens, HumanBytes(c.BlockBytes()), b, compute,
		HumanBytes(int64(c.Slots)*c.MaxBytes()))
}

// Shape is the model's shape, for its weights.
func (c KV) Shape() Shape {
	return Shape{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DType: c.DType, Hidden: c.Hidden, Vocab: c.Vocab}
}

// Steps is how long a decode step's device compute takes.
func (c KV) Steps() Roofline {
	if !c.Roofline {
		return Roofline{Fixed: c.StepCompute}
	}
	return Roofline{Read: c.Shape().ReadBytes(), GBps: c.BandwidthGBps}
}

// Budget is the physical memory budget every strategy runs under (0: none);
// gran is the driver's granularity.
func (c KV) Budget(gran int64) int64 {
	switch {
	case c.BudgetBytes > 0:
		return c.BudgetBytes
	case c.BudgetFactor <= 0 || c.check() != nil:
		return 0
	}
	return alignUp(int64(c.BudgetFactor*float64(c.PeakLive()))+2*int64(c.Slots)*gran, gran)
}

// request is one sequence to serve: its prompt (with what it generated
// before a preemption) and the tokens still to generate.
type request struct {
	prompt, gen int
	last        time.Time // when its last token came, if it ran before (a preempted request)
}

func (c KV) requests() []request {
	rng := rand.New(rand.NewPCG(c.Seed, 0x6b76))
	reqs := make([]request, c.Requests)
	for i := range reqs {
		reqs[i] = request{prompt: c.PromptMin + rng.IntN(c.PromptMax-c.PromptMin+1), gen: c.GenMin + rng.IntN(c.GenMax-c.GenMin+1)}
	}
	return reqs
}

// PeakLive is the most live KV bytes at once in the schedule without
// preemption: the same for every strategy.
func (c KV) PeakLive() int64 {
	reqs := c.requests()
	type slot struct{ tokens, left int }
	slots := make([]slot, c.Slots)
	var live, peak int64
	next := 0
	for {
		busy := false
		for i := range slots {
			s := &slots[i]
			switch {
			case s.left == 0 && next < len(reqs):
				s.tokens, s.left = reqs[next].prompt, reqs[next].gen
				next++
				live += int64(s.tokens)
			case s.left > 0:
				s.tokens++
				s.left--
				live++
			default:
				continue
			}
			busy = true
			peak = max(peak, live)
			if s.left == 0 {
				live -= int64(s.tokens)
				s.tokens = 0
			}
		}
		if !busy {
			return peak * c.TokenBytes()
		}
	}
}

func (c KV) check() error { return c.Check() }

// Check reports the first setting that cannot work, naming the bench flag
// that sets it and what it accepts.
func (c KV) Check() error {
	return firstBad(
		atLeast("-kv-layers", c.Layers, 1),
		atLeast("-kv-heads", c.KVHeads, 1),
		atLeast("-kv-headdim", c.HeadDim, 1),
		oneOf("-kv-dtype", c.DType, "bytes per element", 1, 2, 4, 8),
		atLeast("-kv-block", c.BlockTokens, 1),
		atLeast("-kv-slots", c.Slots, 1),
		atLeast("-kv-requests", c.Requests, 1),
		intRange("-kv-prompt", c.PromptMin, c.PromptMax, 1),
		intRange("-kv-gen", c.GenMin, c.GenMax, 1),
		notNegative("-kv-budget", float64(c.BudgetBytes)),
		notNegative("-kv-budget-factor", c.BudgetFactor),
		notNegative("-kv-compute", float64(c.StepCompute)),
		atLeast("-kv-launches", c.Launches, 0),
		c.checkPrefetch(),
		cacheSize("-kv-layers, -kv-heads, -kv-headdim, -kv-dtype", c.TokenBytes(), c.Layers, c.KVHeads, c.HeadDim, c.DType),
		c.checkRoofline(),
	)
}

// checkRoofline checks the model's hidden size and the bandwidth when the
// step time is the roofline's.
func (c KV) checkRoofline() error {
	if !c.Roofline {
		return nil
	}
	if c.Hidden < 1 || c.Hidden > 1<<16 {
		return fmt.Errorf("-kv-hidden %d: want a hidden size from 1 to 65536", c.Hidden)
	}
	if c.Vocab < 0 || c.Vocab > 1<<24 {
		return fmt.Errorf("-kv-vocab %d: want 0 (Llama 3's, %d) or a vocabulary of at most 16777216", c.Vocab, DefaultVocab)
	}
	if w := float64(c.Layers) * 13 * float64(c.Hidden) * float64(c.Hidden) * float64(c.DType); w > 1<<44 {
		return fmt.Errorf("-kv-hidden %d, -kv-layers %d: the weights would be %.3g bytes; want at most 16 TiB", c.Hidden, c.Layers, w)
	}
	return notNegative("-kv-bandwidth", c.BandwidthGBps)
}

// checkPrefetch checks PrefetchSteps when Prefetch is on.
func (c KV) checkPrefetch() error {
	if !c.Prefetch {
		return nil
	}
	return firstBad(
		atLeast("-kv-prefetch-steps", c.PrefetchSteps, 1),
		c.checkTokenAhead(),
	)
}

// checkTokenAhead checks TokenAhead where it is used.
func (c KV) checkTokenAhead() error {
	if !c.TokenGrowth || !c.PrefetchBlocks {
		return nil
	}
	return atLeast("-kv-token-ahead", c.TokenAhead, 0)
}

// MinBudget is the least -kv-budget with which every request can be served
// (on a driver of granularity gran): the cache of the longest request, alone,
// in whole blocks and chunks. A smaller budget fails in the middle of the
// run, when that request runs alone.
func (c KV) MinBudget(gran int64) int64 {
	if c.Check() != nil {
		return 0
	}
	most := 0
	for _, q := range c.requests() {
		most = max(most, q.prompt+q.gen)
	}
	return alignUp(ceilDiv(int64(most), int64(c.BlockTokens))*c.BlockBytes(), gran)
}

// CheckBudget reports a -kv-budget that cannot serve every request on a
// driver of granularity gran.
func (c KV) CheckBudget(gran int64) error {
	if c.BudgetBytes == 0 {
		return nil
	}
	if need := c.MinBudget(gran); c.BudgetBytes < need {
		return fmt.Errorf("-kv-budget %s: the longest request's cache alone needs %s (its tokens in blocks of %d, in %s chunks); want at least that, or 0 for the default",
			flagSize(c.BudgetBytes), flagSize(need), c.BlockTokens, flagSize(gran))
	}
	return nil
}

type kvSeq struct {
	r         strategy.Region
	active    bool
	req       request
	tokens    int       // in the cache
	gen, left int       // tokens to generate, still to generate
	exact     bool      // grown by its tokens, not in blocks (TokenGrowth)
	last      time.Time // when its last token came
	// kept is what the empty region was last told to keep (Keeper), when
	// keptSet: an idle slot is told again only when its next prompt changes.
	kept    int64
	keptSet bool
}

// Run replays the workload on env's strategy.
func (c KV) Run(env *Env) (err error) {
	if err := c.check(); err != nil {
		return err
	}
	queue := c.requests()
	var totalTokens int64
	for _, q := range queue {
		totalTokens += int64(q.prompt + q.gen)
	}
	tok, layer, block := c.TokenBytes(), c.LayerBytes(), c.BlockBytes()

	seqs := make([]kvSeq, c.Slots)
	defer func() {
		for i := range seqs {
			if seqs[i].r != nil {
				err = errors.Join(err, env.close(seqs[i].r))
			}
		}
	}()
	open := 0
	for i := range seqs {
		r, err := env.open(c.MaxBytes())
		switch {
		case errors.Is(err, acl.ErrOutOfMemory):
			env.Res.Denied++ // the slot stays empty: its region does not fit the budget
			continue
		case err != nil:
			return fmt.Errorf("kv: open slot %d: %w", i, err)
		}
		seqs[i].r = r
		_, maps := r.(strategy.Mapper)
		seqs[i].exact = c.TokenGrowth && maps
		open++
	}
	if open == 0 {
		return fmt.Errorf("kv: no slot fits the budget of %s", HumanBytes(c.Budget(block)))
	}
	if c.Prefetch {
		// The queue is known at start: every slot's first prompt.
		if err := c.prefetch(env, seqs, queue, block); err != nil {
			return fmt.Errorf("kv: prefetch the first prompts: %w", err)
		}
	}
	if c.Load {
		unload, lerr := c.load(env, block)
		if lerr != nil {
			return fmt.Errorf("kv: load the weights: %w", lerr)
		}
		defer func() { err = errors.Join(err, unload()) }()
	}

	// appendTokens appends n tokens to s: per token, K and V of every layer
	// as a tensor each, cut in one call (Region.AllocN), or, with PerToken,
	// the token's whole cache as one tensor.
	allocs, each := 2*c.Layers, layer
	if c.PerToken {
		allocs, each = 1, tok
	}
	appendTokens := func(s *kvSeq, n int) error {
		for range n {
			t := env.start()
			first, err := s.r.AllocN(allocs, each, strategy.Align)
			env.stop(t)
			if err != nil {
				return err
			}
			if err := env.touch(s.r, first, tok); err != nil {
				return err
			}
			s.tokens++
			env.addLive(tok)
		}
		return nil
	}
	// release drops s's cache and marks its region idle.
	release := func(s *kvSeq) error {
		if err := errors.Join(env.truncate(s.r, 0), env.idle(s.r)); err != nil {
			return err
		}
		env.addLive(-int64(s.tokens) * tok)
		s.active, s.tokens = false, 0
		return nil
	}
	// preempt drops a sequence the budget refused and queues its request
	// again, first, with what it generated as part of its prompt.
	preempt := func(s *kvSeq, step int, cause error) error {
		active := 0
		for i := range seqs {
			if seqs[i].active {
				active++
			}
		}
		if active == 1 {
			return fmt.Errorf("kv: step %d: one sequence alone (prompt %d tokens, %d of them cached so far) does not fit in the budget on this strategy (raise -kv-budget or -kv-budget-factor): %w",
				step, s.req.prompt, s.tokens, cause)
		}
		done := s.gen - s.left
		q := request{prompt: s.req.prompt + done, gen: s.left, last: s.last}
		env.Res.Preempted++
		if err := release(s); err != nil {
			return err
		}
		queue = append([]request{q}, queue...)
		return nil
	}

	var done int64
	finished := 0
	env.Res.SteadyFrom = -1
	compute, err := newStepCompute(env, c)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, compute.close()) }()
	steps := c.Steps()
	tok0 := newTokenClock(env)
	emitted := make([]int, 0, len(seqs)) // the sequences that sample a token at the end of this step
	for step := 0; ; step++ {
		busy := false
		emitted = emitted[:0]
		w0, t0 := env.Drv.WindowCalls(), env.Res.Tokens
		stepStart := env.Res.MemNS
		var decodeNS int64 // the step's decode work in the allocator: appends and block grows
		for i := range seqs {
			s := &seqs[i]
			if s.r == nil {
				continue
			}
			switch {
			case !s.active && len(queue) > 0:
				// Prefill: the prompt's blocks (or tokens) at once.
				q := queue[0]
				queue = queue[1:]
				*s = kvSeq{r: s.r, exact: s.exact, active: true, req: q, gen: q.gen, left: q.gen, last: q.last}
				err := env.grow(s.r, c.promptBytes(s, q.prompt, block))
				if err == nil {
					err = appendTokens(s, q.prompt)
				}
				if errors.Is(err, acl.ErrOutOfMemory) {
					if err := preempt(s, step, err); err != nil {
						return err
					}
					busy = true
					continue
				}
				if err != nil {
					return fmt.Errorf("kv: step %d: prefill %d tokens: %w", step, q.prompt, err)
				}
				done += int64(q.prompt)
				emitted = append(emitted, i) // the prefill samples its next token
			case s.active:
				var err error
				m := env.Res.MemNS
				if !s.exact && s.tokens%c.BlockTokens == 0 {
					err = env.grow(s.r, block)
				}
				if err == nil {
					err = appendTokens(s, 1)
				}
				decodeNS += env.Res.MemNS - m
				if errors.Is(err, acl.ErrOutOfMemory) {
					if err := preempt(s, step, err); err != nil {
						return err
					}
					busy = true
					continue
				}
				if err != nil {
					return fmt.Errorf("kv: step %d: decode at %d tokens: %w", step, s.tokens, err)
				}
				done++
				env.Res.Tokens++
				s.left--
				emitted = append(emitted, i)
			default:
				continue
			}
			busy = true
			if s.active && s.left == 0 {
				// Finished: check the prompt survived the growth, drop the
				// cache; the slot's next request starts in the same region.
				if err := env.verify(s.r, 0, tok); err != nil {
					return fmt.Errorf("kv: step %d: %w", step, err)
				}
				if err := release(s); err != nil {
					return fmt.Errorf("kv: step %d: release: %w", step, err)
				}
				finished++
				if finished == open && env.Res.SteadyFrom < 0 {
					env.Res.SteadyFrom = step + 1 // every slot has served its first request
				}
			}
		}
		// The step's kernels are launched, and then, while the device runs
		// them, the next steps' needs are told, as an engine that schedules
		// ahead does: the worker's driver calls overlap the device's work,
		// not the launches.
		d := steps.Step(env.live)
		computes := d > 0 && busy
		var launched computeLaunch
		if computes {
			if launched, err = compute.launch(d); err != nil {
				return fmt.Errorf("kv: step %d: compute: %w", step, err)
			}
		}
		if c.Prefetch {
			if err := c.prefetch(env, seqs, queue, block); err != nil {
				return fmt.Errorf("kv: step %d: prefetch: %w", step, err)
			}
		}
		env.Res.StepAllNS = append(env.Res.StepAllNS, env.Res.MemNS-stepStart)
		wc := env.Drv.WindowCalls()
		n1, _ := wc.Sum(counting.MemoryOps...)
		n0, _ := w0.Sum(counting.MemoryOps...)
		env.Res.StepNS = append(env.Res.StepNS, decodeNS)
		env.Res.StepCalls = append(env.Res.StepCalls, n1-n0)
		env.Res.StepTokens = append(env.Res.StepTokens, env.Res.Tokens-t0)
		env.sample(step)
		if computes {
			if err := compute.wait(launched); err != nil {
				return fmt.Errorf("kv: step %d: compute: %w", step, err)
			}
		}
		if busy {
			now := tok0.now()
			for _, i := range emitted {
				seqs[i].last = tok0.token(seqs[i].last, now)
			}
		}
		if step%64 == 0 {
			env.progress(float64(done) / float64(totalTokens))
		}
		if !busy {
			break
		}
	}
	tok0.end()
	env.final()
	return nil
}

// load copies the model's weights into one allocation of the driver under
// the counting wrapper (they are neither the strategy's memory nor in its
// budget), from a pinned host buffer, timed as setup, and returns what
// frees them. It loads nothing when the device lacks room for the weights
// beside the budget.
func (c KV) load(env *Env, gran int64) (func() error, error) {
	t := time.Now()
	defer env.setup(t)
	drv := env.Drv.Unwrap()
	w := c.Shape().WeightBytes()
	free, _, err := drv.GetMemInfo(acl.HBMMem)
	if err != nil {
		return nil, err
	}
	if uint64(free) < uint64(w+c.Budget(gran)) {
		return func() error { return nil }, nil // no room: serve without
	}
	blob, err := strategy.NewBlob(drv, w)
	if err != nil {
		return nil, err
	}
	host, err := drv.MallocHost(uintptr(min(w, 64<<20)))
	if err != nil {
		return nil, errors.Join(err, blob.Close())
	}
	for off := int64(0); off < w && err == nil; off += int64(len(host)) {
		err = drv.MemcpyHtoD(blob.Ptr().Add(uintptr(off)), host[:min(int64(len(host)), w-off)])
	}
	err = errors.Join(err, drv.FreeHost(host))
	if err != nil {
		return nil, errors.Join(err, blob.Close())
	}
	env.Res.Loaded, env.Res.LoadNS = true, int64(time.Since(t))
	return blob.Close, nil
}

// prefetch tells the slots whose next request is known, and due within
// PrefetchSteps steps, the size of its prompt: the queue's requests go to the
// free slots first, in slot order, then to the running sequences in the
// order they will finish. A region keeps what its last sequence mapped, so
// only what the prompt needs beyond Len is asked for. With PrefetchBlocks it
// also tells each running sequence due to start a block within
// PrefetchSteps tokens the block it will grow into.
func (c KV) prefetch(env *Env, seqs []kvSeq, queue []request, block int64) error {
	type due struct{ slot, steps int }
	var next []due
	for i := range seqs {
		s := &seqs[i]
		switch {
		case s.r == nil:
		case !s.active:
			next = append(next, due{i, 0})
		case s.left <= c.PrefetchSteps:
			next = append(next, due{i, s.left})
		}
	}
	slices.SortStableFunc(next, func(a, b due) int { return a.steps - b.steps })
	for k, d := range next {
		s := &seqs[d.slot]
		prompt := int64(0) // no request left for it: it needs nothing more
		if k < len(queue) {
			prompt = c.promptBytes(s, queue[k].prompt, block)
		}
		if kp, ok := s.r.(strategy.Keeper); ok && !s.active && s.r.Len() == 0 && (!s.keptSet || s.kept != prompt) {
			// An empty slot keeps what its next prompt needs, no more: told
			// once, as an engine would when the slot frees or its next
			// request changes, not at every step it waits.
			if err := env.keep(kp, prompt); err != nil {
				return err
			}
			s.kept, s.keptSet = prompt, true
		}
		p, ok := s.r.(strategy.Prefetcher)
		if !ok || k >= len(queue) {
			continue
		}
		need := prompt - s.r.Len()
		if need <= 0 {
			continue
		}
		if err := env.prefetch(p, need); err != nil {
			return err
		}
	}
	if !c.PrefetchBlocks {
		return nil
	}
	// A running sequence that will reach its next block within
	// PrefetchSteps tokens is told the block it will grow into; one grown
	// by its tokens, its next TokenAhead tokens.
	bt, tokensAhead := c.BlockTokens, c.TokensAhead()
	for i := range seqs {
		s := &seqs[i]
		if s.r == nil || !s.active {
			continue
		}
		p, ok := s.r.(strategy.Prefetcher)
		if !ok {
			continue
		}
		if s.exact {
			// The region ignores what it has mapped already: no call
			// reaches the worker until the tokens pass into a chunk not yet
			// mapped. A region that keeps the tokens ahead itself (an arena
			// with that much headroom) is not told them.
			if n := min(tokensAhead, s.left); n > 0 && !keepsAhead(s.r, int64(n)*c.TokenBytes()) {
				if err := env.prefetch(p, int64(n)*c.TokenBytes()); err != nil {
					return err
				}
			}
			continue
		}
		at := ceilDiv(int64(s.tokens), int64(bt)) * int64(bt) // the token count of the next block's Grow
		if ahead := at - int64(s.tokens); ahead >= int64(c.PrefetchSteps) || int64(s.left) <= ahead {
			continue // not yet, or the sequence ends first
		}
		need := (at/int64(bt)+1)*block - s.r.Len()
		if need <= 0 || need > c.MaxBytes()-s.r.Len() {
			continue
		}
		if err := env.prefetch(p, need); err != nil {
			return err
		}
	}
	return nil
}

// keepsAhead reports whether region r keeps n bytes mapped above its
// length by itself (strategy.AheadKeeper).
func keepsAhead(r strategy.Region, n int64) bool {
	k, ok := r.(strategy.AheadKeeper)
	return ok && k.KeepsAhead() >= n
}

// TokenLead is how far ahead, in device time, a sequence grown by its tokens
// is told what it will need when TokenAhead is 0: long enough for the pool's
// worker to map a chunk for each of the sequences that cross into one in
// the same step (each a few hundred microseconds of driver calls on a
// device), short enough that the chunks mapped early are few.
const TokenLead = 4 * time.Millisecond

// TokensAhead is the tokens a running sequence grown by its tokens is told
// ahead: TokenAhead, or, when it is 0, the steps of TokenLead at the
// shortest step time (the empty cache's), at least 1; PrefetchSteps where
// the steps take no time.
func (c KV) TokensAhead() int {
	if c.TokenAhead > 0 {
		return c.TokenAhead
	}
	d := c.Steps().Step(0)
	if d <= 0 {
		return max(c.PrefetchSteps, 1)
	}
	return int(max(1, ceilDiv(int64(TokenLead), int64(d))))
}

// promptBytes is what s makes room for to prefill a prompt of n tokens:
// its tokens, or, where s grows in blocks, its blocks of block bytes.
func (c KV) promptBytes(s *kvSeq, n int, block int64) int64 {
	if s.exact {
		return int64(n) * c.TokenBytes()
	}
	return ceilDiv(int64(n), int64(c.BlockTokens)) * block
}

// timedLauncher is a driver that queues stand-in device work of a given
// duration (the device model).
type timedLauncher interface {
	LaunchFor(s acl.Stream, ptr acl.DevicePtr, n uintptr, dur time.Duration) error
}

// stepCompute is a decode step's device compute: launches on a stream of
// its own, on the driver under the counting wrapper (it is the workload's
// work, not the strategy's), or a spin where the driver cannot launch.
type stepCompute struct {
	env    *Env
	c      KV
	drv    acl.Driver
	l      timedLauncher
	stream acl.Stream
	ev     acl.Event
	n      int
}

func newStepCompute(env *Env, c KV) (*stepCompute, error) {
	sc := &stepCompute{env: env, c: c}
	drv := env.Drv.Unwrap()
	l, ok := drv.(timedLauncher)
	if !ok || !c.Roofline && c.StepCompute <= 0 {
		return sc, nil
	}
	s, err := drv.CreateStream()
	if err != nil {
		return nil, fmt.Errorf("kv: the compute stream: %w", err)
	}
	ev, err := drv.CreateEvent()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("kv: the compute event: %w", err), drv.DestroyStream(s))
	}
	sc.drv, sc.l, sc.stream, sc.ev = drv, l, s, ev
	sc.n = c.Launches
	if sc.n == 0 {
		sc.n = c.Layers
	}
	return sc, nil
}

// computeLaunch is a step's launch, for its wait: when it began, how long
// the launches took, and the device time asked for.
type computeLaunch struct {
	start    time.Time
	launched time.Duration
	d, per   time.Duration
}

// launch launches the step's kernels, d of device time in all, timing each
// launch, and records the event wait waits for.
func (sc *stepCompute) launch(d time.Duration) (computeLaunch, error) {
	sc.env.Res.ComputeNS += int64(d)
	cl := computeLaunch{start: time.Now(), d: d}
	if sc.l == nil {
		return cl, nil
	}
	cl.per = d / time.Duration(sc.n)
	res := sc.env.Res
	w0 := sc.waited()
	for range sc.n {
		t := time.Now()
		if err := sc.l.LaunchFor(sc.stream, 0, 0, cl.per); err != nil {
			return cl, err
		}
		res.LaunchNS += int64(time.Since(t))
		res.Launches++
	}
	cl.launched = time.Since(cl.start)
	res.LaunchWaitNS += sc.waited() - w0
	return cl, sc.drv.RecordEvent(sc.ev, sc.stream)
}

// run launches the step's kernels and waits for them.
func (sc *stepCompute) run(d time.Duration) error {
	cl, err := sc.launch(d)
	if err != nil {
		return err
	}
	return sc.wait(cl)
}

// wait waits for the kernels of launch cl.
//
// The wait is the device's time, which the model computes; the host's
// share of the machine is not in it. So the time the step took beyond its
// modelled length is added to Env's skew: the serving clock (tokenClock)
// leaves it out, so that another process taking the host's CPU mid-wait
// does not move the figures, while the strategy's own calls, on the
// caller's path or competing with it, still do. The modelled length is the
// longest of d, the launches (host work) and one kernel, and the host work
// the caller did between the launch and the wait: that work overlaps the
// device's, and what passes the device's time delays the step, as on a
// device.
func (sc *stepCompute) wait(cl computeLaunch) error {
	host := time.Since(cl.start) // the launches and what the caller did after them
	if sc.l == nil {
		for time.Since(cl.start) < cl.d {
			runtime.Gosched() // a spin on the monotonic clock, yielding as below
		}
		sc.env.skewBy(time.Since(cl.start) - max(cl.d, host))
		return nil
	}
	for {
		done, err := sc.drv.QueryEvent(sc.ev)
		if err != nil {
			return err
		}
		if done {
			sc.env.skewBy(time.Since(cl.start) - max(cl.d, cl.launched+cl.per, host))
			return nil
		}
		// Between polls the thread lets other goroutines run, as CUDA's
		// default synchronisation yields its thread when the host has fewer
		// cores than it needs: on one CPU the pool's worker maps during the
		// device's work, not only when the scheduler preempts this loop.
		runtime.Gosched()
	}
}

// waited returns the time the driver's launches have waited for other
// threads' serial calls, where the driver counts it (the device model).
func (sc *stepCompute) waited() int64 {
	if w, ok := sc.drv.(interface{ LaunchWaitNS() int64 }); ok {
		return w.LaunchWaitNS()
	}
	return 0
}

func (sc *stepCompute) close() error {
	if sc.l == nil {
		return nil
	}
	return errors.Join(sc.drv.SynchronizeStream(sc.stream), sc.drv.DestroyEvent(sc.ev), sc.drv.DestroyStream(sc.stream))
}
