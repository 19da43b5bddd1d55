package workload

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/model"
	"github.com/vmarena/vmarena/bench/internal/counting"
	"github.com/vmarena/vmarena/bench/internal/strategy"
)

// fakeRegion is a Region of a given Len that records what it is told to
// prefetch.
type fakeRegion struct {
	strategy.Region
	len      int64
	prefetch []int64
}

func (r *fakeRegion) Len() int64 { return r.len }

func (r *fakeRegion) Prefetch(n int64) error {
	r.prefetch = append(r.prefetch, n)
	return nil
}

// keepingRegion is a fakeRegion that keeps ahead bytes mapped above its
// length by itself (strategy.AheadKeeper).
type keepingRegion struct {
	fakeRegion
	ahead int64
}

func (r *keepingRegion) KeepsAhead() int64 { return r.ahead }

// The queue's requests go to the free slots first, in slot order, then to
// the running sequences in the order they finish, within PrefetchSteps; each
// region is asked for what the prompt needs beyond its Len.
func TestPrefetchPrediction(t *testing.T) {
	m, err := model.New(model.Config{Untimed: true, NoData: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, m.Close()) }()
	env := &Env{Drv: counting.New(m, 0), Res: &Result{Workload: "kv"}}

	const block = 1000
	c := KV{BlockTokens: 16, PrefetchSteps: 8, Prefetch: true}
	r := make([]*fakeRegion, 6)
	for i := range r {
		r[i] = &fakeRegion{}
	}
	r[1].len = 1000
	r[4].len = 9000
	seqs := []kvSeq{
		{r: r[0], active: true, left: 5},   // finishes in 5 steps: fourth
		{r: r[1], active: true, left: 2},   // in 2: second
		{r: r[2]},                          // free: first
		{r: r[3], active: true, left: 9},   // beyond PrefetchSteps
		{r: r[4], active: true, left: 2},   // in 2, after slot 1: third
		{r: r[5], active: true, left: 100}, // far
		{},                                 // a slot whose region did not open
	}
	queue := []request{{prompt: 100}, {prompt: 40}, {prompt: 17}, {prompt: 130}}
	require.NoError(t, c.prefetch(env, seqs, queue, block))
	assert.Equal(t, []int64{7000}, r[2].prefetch, "the free slot takes the first request: 7 blocks")
	assert.Equal(t, []int64{2000}, r[1].prefetch, "3 blocks, less the 1000 bytes it holds")
	assert.Empty(t, r[4].prefetch, "the third request needs 2 blocks, and the region holds 9")
	assert.Equal(t, []int64{9000}, r[0].prefetch, "the fourth: 9 blocks")
	assert.Empty(t, r[3].prefetch)
	assert.Empty(t, r[5].prefetch)
	assert.Positive(t, env.Res.PrefetchNS, "timed on the caller's path")

	// With fewer requests than slots, the slots that finish first get them.
	for _, x := range r {
		x.prefetch = nil
	}
	require.NoError(t, c.prefetch(env, seqs, queue[:1], block))
	assert.Equal(t, []int64{7000}, r[2].prefetch)
	assert.Empty(t, r[1].prefetch)
}

// A running sequence due to start a block within PrefetchSteps tokens is told
// the block it will grow into; one further away, or one that ends first, is
// not.
func TestPrefetchDecodeBlocks(t *testing.T) {
	m, err := model.New(model.Config{Untimed: true, NoData: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, m.Close()) }()
	env := &Env{Drv: counting.New(m, 0), Res: &Result{Workload: "kv"}}

	c := KV{Layers: 1, KVHeads: 1, HeadDim: 128, DType: 2, BlockTokens: 16, PrefetchSteps: 4, Prefetch: true,
		PrefetchBlocks: true, PromptMax: 100, GenMax: 100}
	tok, block := c.TokenBytes(), c.BlockBytes()
	require.Equal(t, int64(512), tok)
	seq := func(tokens, left int) (kvSeq, *fakeRegion) {
		r := &fakeRegion{len: int64(tokens) * tok}
		return kvSeq{r: r, active: true, tokens: tokens, left: left}, r
	}
	a, ra := seq(30, 10) // its next block starts at 32 tokens, 2 away
	b, rb := seq(20, 50) // 12 away
	d, rd := seq(31, 1)  // ends before it
	e, re := seq(32, 5)  // grows at the next step
	require.NoError(t, c.prefetch(env, []kvSeq{a, b, d, e}, nil, block))
	assert.Equal(t, []int64{3*block - 30*tok}, ra.prefetch, "up to the end of the block it will grow into")
	assert.Empty(t, rb.prefetch)
	assert.Empty(t, rd.prefetch)
	assert.Equal(t, []int64{3*block - 32*tok}, re.prefetch)

	c.PrefetchBlocks = false
	ra.prefetch = nil
	require.NoError(t, c.prefetch(env, []kvSeq{a}, nil, block))
	assert.Empty(t, ra.prefetch, "only prompts without PrefetchBlocks")
}

// A step's skew (its time beyond the modelled length, left out of the
// serving clock) does not hide host work the caller did between the launch
// and the wait: past the device's time that work delays the step, as on a
// device. (Before, the 4 ms of host work past the device's 1 ms below were
// taken for a stalled wait and left out.)
func TestSkewKeepsHostWorkAfterTheLaunch(t *testing.T) {
	m, err := model.New(model.Config{NoData: true})
	require.NoError(t, err)
	defer m.Close()
	env := &Env{Drv: counting.New(m, 0), Res: &Result{Workload: "kv"}}
	launched, err := newStepCompute(env, KV{StepCompute: time.Millisecond, Launches: 4})
	require.NoError(t, err)
	defer func() { assert.NoError(t, launched.close()) }()
	for name, sc := range map[string]*stepCompute{"spin": {env: env}, "launched": launched} {
		before := env.skew
		cl, err := sc.launch(time.Millisecond)
		require.NoError(t, err)
		time.Sleep(5 * time.Millisecond) // host work after the launch, past the device's 1 ms
		require.NoError(t, sc.wait(cl))
		assert.Less(t, env.skew-before, time.Millisecond, "%s: the host work is not skew", name)
	}
}

// A sequence grown by its tokens (TokenGrowth, on a region that maps what it
// cuts) is told its next prompt's exact size and, while it runs, its next
// TokenAhead tokens, no more than it has left; one grown in blocks still
// gets blocks.
func TestPrefetchTokenGrowth(t *testing.T) {
	m, err := model.New(model.Config{Untimed: true, NoData: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, m.Close()) }()
	env := &Env{Drv: counting.New(m, 0), Res: &Result{Workload: "kv"}}

	c := KV{Layers: 1, KVHeads: 1, HeadDim: 128, DType: 2, BlockTokens: 16, PrefetchSteps: 4, Prefetch: true,
		PrefetchBlocks: true, TokenGrowth: true, TokenAhead: 3, PromptMax: 100, GenMax: 100}
	tok, block := c.TokenBytes(), c.BlockBytes()
	run := func(tokens, left int, exact bool) (kvSeq, *fakeRegion) {
		r := &fakeRegion{len: int64(tokens) * tok}
		return kvSeq{r: r, exact: exact, active: true, tokens: tokens, left: left}, r
	}
	a, ra := run(20, 50, true) // far from any block boundary: told its next 3 tokens
	b, rb := run(30, 2, true)  // 2 tokens left: told 2
	d, rd := run(30, 10, false)
	free := &fakeRegion{}
	require.NoError(t, c.prefetch(env, []kvSeq{a, b, d, {r: free, exact: true}}, []request{{prompt: 37}}, block))
	assert.Equal(t, []int64{37 * tok}, free.prefetch, "the prompt's tokens, not its 3 blocks")
	assert.Equal(t, []int64{3 * tok}, ra.prefetch)
	assert.Equal(t, []int64{2 * tok}, rb.prefetch)
	assert.Equal(t, []int64{3*block - 30*tok}, rd.prefetch, "a block-grown sequence: up to the end of the block it grows into")

	// A region that keeps the tokens ahead itself is not told them; one
	// that keeps fewer is.
	k3 := &keepingRegion{fakeRegion: fakeRegion{len: 20 * tok}, ahead: 3 * tok}
	k2 := &keepingRegion{fakeRegion: fakeRegion{len: 20 * tok}, ahead: 2 * tok}
	seqs := []kvSeq{{r: k3, exact: true, active: true, tokens: 20, left: 50}, {r: k2, exact: true, active: true, tokens: 20, left: 50}}
	require.NoError(t, c.prefetch(env, seqs, nil, block))
	assert.Empty(t, k3.prefetch, "it keeps its next 3 tokens mapped")
	assert.Equal(t, []int64{3 * tok}, k2.prefetch)

	c.TokenAhead = -1
	assert.ErrorContains(t, c.checkPrefetch(), "-kv-token-ahead")
	c.PrefetchBlocks = false
	assert.NoError(t, c.checkPrefetch(), "unused without -kv-prefetch-blocks")
}

// TokenAhead 0 tells a sequence the tokens of TokenLead of steps, at least
// one.
func TestTokensAhead(t *testing.T) {
	c := KV{Layers: 80, KVHeads: 8, HeadDim: 128, DType: 2, PrefetchSteps: 8}
	for _, tc := range []struct {
		step time.Duration
		want int
	}{{time.Millisecond, 4}, {1500 * time.Microsecond, 3}, {4 * time.Millisecond, 1}, {35 * time.Millisecond, 1}, {0, 8}} {
		c.StepCompute = tc.step
		assert.Equal(t, tc.want, c.TokensAhead(), "%v steps", tc.step)
	}
	c.StepCompute, c.TokenAhead = time.Millisecond, 2
	assert.Equal(t, 2, c.TokensAhead(), "told")
	r := KV{Layers: 80, KVHeads: 8, HeadDim: 128, DType: 2, Hidden: 8192, Roofline: true, BandwidthGBps: 4000}
	assert.Equal(t, 1, r.TokensAhead(), "a 70B-class step: %v", r.Steps().Step(0))
	r.Layers, r.Hidden = 32, 4096
	assert.Equal(t, 2, r.TokensAhead(), "an 8B-class step: %v", r.Steps().Step(0))
}

// The arena grown by its tokens maps what its sequences hold, within a chunk
// and the tokens told ahead per sequence, where grown in blocks it maps the
// unused part of each sequence's last block too; the other strategies, and
// the tokens served, are the same either way.
func TestTokenGrowthMapsTheTokens(t *testing.T) {
	c := KV{Layers: 2, KVHeads: 8, HeadDim: 128, DType: 2, BlockTokens: 512, Slots: 4, Requests: 4,
		PromptMin: 100, PromptMax: 600, GenMin: 10, GenMax: 90, Prefetch: true, PrefetchSteps: 4,
		PrefetchBlocks: true, TokenAhead: 1, Seed: 3}
	tok := c.TokenBytes() // 8 KiB: a block is 4 MiB, a chunk 256 tokens
	const chunk = 2 << 20
	run := func(name string, tokens bool, headroom ...int64) *Result {
		m, err := model.New(model.Config{Untimed: true, NoData: true})
		require.NoError(t, err)
		defer func() { require.NoError(t, m.Close()) }()
		cd := counting.New(m, 0)
		cfg := strategy.Config{Driver: cd, Chunk: chunk}
		if len(headroom) > 0 {
			cfg.Headroom, cfg.MaxHeadroom = headroom[0], headroom[0]
		}
		st, err := strategy.New(name, cfg)
		require.NoError(t, err)
		env := NewEnv(cd, st, "kv")
		k := c
		k.TokenGrowth = tokens
		require.NoError(t, k.Run(env))
		env.Res.Mem = cd.Memory()
		require.NoError(t, st.Close())
		return env.Res
	}
	blocks, exact := run("arena", false), run("arena", true)
	assert.Equal(t, blocks.Tokens, exact.Tokens)
	assert.Equal(t, blocks.PeakLive, exact.PeakLive)
	assert.LessOrEqual(t, exact.Mem.PeakMapped, exact.PeakLive+int64(c.Slots)*(chunk+tok),
		"each sequence maps at most its tokens and the next one, in whole chunks")
	assert.Less(t, exact.Mem.PeakMapped, blocks.Mem.PeakMapped)
	t.Logf("peak live %d, mapped in blocks %d, by tokens %d", exact.PeakLive, blocks.Mem.PeakMapped, exact.Mem.PeakMapped)
	assert.Zero(t, exact.Preempted)

	// The arena keeping its next token as headroom, in bytes (the bench's
	// -kv-token-headroom; TestPrefetchTokenGrowth: it is not told the
	// tokens), holds what one told them every step does.
	kept := run("arena", true, tok)
	assert.Equal(t, exact.Tokens, kept.Tokens)
	assert.LessOrEqual(t, kept.Mem.PeakMapped, kept.PeakLive+int64(c.Slots)*(chunk+tok),
		"each sequence maps at most its tokens and the next one, in whole chunks")
	assert.Less(t, kept.Mem.PeakMapped, blocks.Mem.PeakMapped)
	assert.Zero(t, kept.Preempted)

	pb, pe := run("paged", false), run("paged", true)
	assert.Equal(t, pb.Mem.PeakPhysical, pe.Mem.PeakPhysical, "a paged pool grows in blocks either way")
}

// A run whose budget cannot hold even one sequence fails with an error that
// says so and names the flags that raise the budget, wrapping the driver's
// out-of-memory error; it once said "a sequence of 0 tokens".
func TestOneSequenceOverTheBudget(t *testing.T) {
	c := KV{Layers: 2, KVHeads: 8, HeadDim: 128, DType: 2, BlockTokens: 16, Slots: 2, Requests: 2,
		PromptMin: 2000, PromptMax: 2000, GenMin: 4, GenMax: 4, Seed: 1}
	for _, name := range []string{"arena", "caching"} { // paged sizes its pool from the budget: it refuses first
		t.Run(name, func(t *testing.T) {
			m, err := model.New(model.Config{Untimed: true, NoData: true})
			require.NoError(t, err)
			defer func() { require.NoError(t, m.Close()) }()
			cd := counting.New(m, 8<<20) // a prompt is 2000 × 8 KiB: 15.6 MiB
			st, err := strategy.New(name, strategy.Config{Driver: cd, Chunk: 2 << 20})
			require.NoError(t, err)
			err = c.Run(NewEnv(cd, st, "kv"))
			require.ErrorIs(t, err, acl.ErrOutOfMemory)
			require.ErrorContains(t, err, "one sequence alone (prompt 2000 tokens, 0 of them cached so far) does not fit in the budget")
			require.ErrorContains(t, err, "-kv-budget")
			require.NoError(t, st.Close())
		})
	}
}
