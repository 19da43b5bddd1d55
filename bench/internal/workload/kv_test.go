package workload

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
