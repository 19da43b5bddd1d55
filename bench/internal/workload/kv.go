package workload

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/vmarena/vmarena/bench/internal/strategy"
)

// KV is KV-cache decode under continuous batching. Slots sequences run at
// once; each starts with a prefill of its prompt, then adds one token per
// step until it has generated its tokens, and is then replaced by the next
// request. Every token appends a K and a V tensor for every layer. A
// sequence's cache is one region: it grows a block of BlockTokens tokens at a
// time (the prompt's blocks at once), and is truncated and trimmed when the
// sequence finishes.
type KV struct {
	Layers, KVHeads, HeadDim, DType int // the model: bytes per token = 2·Layers·KVHeads·HeadDim·DType
	BlockTokens                     int // tokens a Grow makes room for while decoding
	Slots                           int // sequences decoded at once
	Requests                        int // sequences served in all
	PromptMin, PromptMax            int // prompt length, uniform
	GenMin, GenMax                  int // generated tokens, uniform
	Seed                            uint64
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
	return fmt.Sprintf("%d slots, %d requests, prompt %d–%d + gen %d–%d tokens, %s/token (%d layers × K,V × %d heads × %d × %dB), block %d tokens = %s; prealloc maps %s",
		c.Slots, c.Requests, c.PromptMin, c.PromptMax, c.GenMin, c.GenMax, HumanBytes(c.TokenBytes()),
		c.Layers, c.KVHeads, c.HeadDim, c.DType, c.BlockTokens, HumanBytes(c.BlockBytes()),
		HumanBytes(int64(c.Slots)*c.MaxBytes()))
}

// Budget is the physical memory budget the workload runs under (0: none).
func (c KV) Budget(int64) int64 { return 0 }

func (c KV) check() error {
	if c.Layers <= 0 || c.KVHeads <= 0 || c.HeadDim <= 0 || c.DType <= 0 || c.BlockTokens <= 0 ||
		c.Slots <= 0 || c.Requests <= 0 || c.PromptMin <= 0 || c.PromptMax < c.PromptMin ||
		c.GenMin <= 0 || c.GenMax < c.GenMin {
		return fmt.Errorf("kv: bad configuration %+v", c)
	}
	return nil
}

type kvSeq struct {
	r         strategy.Region
	active    bool
	tokens    int // in the cache
	gen, left int // tokens to generate, still to generate
}

// Run replays the workload on env's strategy.
func (c KV) Run(env *Env) (err error) {
	if err := c.check(); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0x6b76))
	type req struct{ prompt, gen int }
	reqs := make([]req, c.Requests)
	var totalTokens int64
	for i := range reqs {
		reqs[i] = req{c.PromptMin + rng.IntN(c.PromptMax-c.PromptMin+1), c.GenMin + rng.IntN(c.GenMax-c.GenMin+1)}
		totalTokens += int64(reqs[i].prompt + reqs[i].gen)
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
	for i := range seqs {
		r, err := env.open(c.MaxBytes())
		if err != nil {
			return fmt.Errorf("kv: open slot %d: %w", i, err)
		}
		seqs[i].r = r
	}

	// appendTokens appends n tokens to s: per token, K and V for every layer.
	appendTokens := func(s *kvSeq, n int) error {
		for range n {
			t := env.start()
			first := int64(-1)
			for range 2 * c.Layers {
				off, err := s.r.Alloc(layer, strategy.Align)
				if err != nil {
					env.stop(t)
					return err
				}
				if first < 0 {
					first = off
				}
			}
			env.stop(t)
			if err := env.touch(s.r, first, tok); err != nil {
				return err
			}
			s.tokens++
			env.addLive(tok)
		}
		return nil
	}

	next := 0
	var done int64
	for step := 0; ; step++ {
		busy := false
		for i := range seqs {
			s := &seqs[i]
			switch {
			case !s.active && next < len(reqs):
				// Prefill: the prompt's blocks at once.
				q := reqs[next]
				next++
				*s = kvSeq{r: s.r, active: true, gen: q.gen, left: q.gen}
				if err := env.grow(s.r, ceilDiv(int64(q.prompt), int64(c.BlockTokens))*block); err != nil {
					return fmt.Errorf("kv: step %d: prefill %d tokens: %w", step, q.prompt, err)
				}
				if err := appendTokens(s, q.prompt); err != nil {
					return fmt.Errorf("kv: step %d: prefill: %w", step, err)
				}
				done += int64(q.prompt)
			case s.active:
				if s.tokens%c.BlockTokens == 0 {
					if err := env.grow(s.r, block); err != nil {
						return fmt.Errorf("kv: step %d: grow at %d tokens: %w", step, s.tokens, err)
					}
				}
				if err := appendTokens(s, 1); err != nil {
					return fmt.Errorf("kv: step %d: decode: %w", step, err)
				}
				done++
				s.left--
			default:
				continue
			}
			busy = true
			if s.active && s.left == 0 {
				// Finished: check the prompt survived the growth, drop the
				// cache and give the memory back.
				if err := env.verify(s.r, 0, tok); err != nil {
					return fmt.Errorf("kv: step %d: %w", step, err)
				}
				if err := errors.Join(env.truncate(s.r, 0), env.trim(s.r)); err != nil {
					return fmt.Errorf("kv: step %d: release: %w", step, err)
				}
				env.addLive(-int64(s.tokens) * tok)
				s.active = false
			}
		}
		env.sample(step)
		if step%64 == 0 {
			env.progress(float64(done) / float64(totalTokens))
		}
		if !busy {
			break
		}
	}
	env.final()
	return nil
}
