package chunk_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
)

// taking is a Placer that takes n chunks for its growth, speculatively or
// not, under a lock of its own, and records the growth's state at each call.
type taking struct {
	p      chunk.Lender
	g      *chunk.Growth
	n      int
	spec   bool
	mu     sync.Mutex
	got    []chunk.Chunk
	states []chunk.GrowthState
}

func (tk *taking) Place(have []chunk.Chunk) (chunk.Step, error) {
	tk.states = append(tk.states, tk.g.State())
	take := tk.p.TakeFree
	if tk.spec {
		take = tk.p.TryAcquire
	}
	got, err := take(have, 0, chunk.Ask{Units: tk.n - len(have), Large: tk.n - len(have)})
	if err != nil {
		for _, c := range have {
			if err := tk.p.Put(c); err != nil {
				return chunk.Step{}, err
			}
		}
		return chunk.Step{Missing: tk.n, Short: err}, nil
	}
	tk.got = got
	return chunk.Step{}, nil
}

func (tk *taking) Unlock() <-chan struct{} {
	tk.states = append(tk.states, tk.g.State())
	tk.mu.Unlock()
	return nil
}

func (tk *taking) Lock() { tk.mu.Lock() }

// A speculative growth only places: its shortage ends it, counted once in
// the pool's failures, and it never relieves the pressure.
func TestSpeculativeGrowthOnlyPlaces(t *testing.T) {
	p, err := chunk.New(newDriver(t, 16<<20), chunk.Config{Budget: 2 * g})
	require.NoError(t, err)
	defer p.Close()
	held, err := p.Lender().Acquire(0, 2)
	require.NoError(t, err)
	before := p.Stats().Failures
	var gr chunk.Growth
	tk := &taking{p: p.Lender(), g: &gr, n: 1, spec: true}
	tk.mu.Lock()
	err = p.Lender().Grow(context.Background(), &gr, 0, tk, chunk.Speculative)
	tk.mu.Unlock()
	require.ErrorIs(t, err, acl.ErrOutOfMemory)
	assert.Equal(t, before+1, p.Stats().Failures, "one shortage, counted once")
	assert.Equal(t, []chunk.GrowthState{chunk.GrowLocked}, tk.states, "placed once, never unlocked")
	assert.Equal(t, chunk.GrowFailed, gr.State())
	assert.False(t, gr.End(), "it never went to a relief")
	for _, c := range held {
		require.NoError(t, p.Lender().Put(c))
	}
}

// A growth that falls short releases its lock for the relief, which finds
// room that came back (here: a chunk put back in the cache before it looked),
// and places again: locked, relieving, locked, mapped.
func TestGrowthGoesToARelief(t *testing.T) {
	p, err := chunk.New(newDriver(t, 16<<20), chunk.Config{Budget: 2 * g})
	require.NoError(t, err)
	defer p.Close()
	held, err := p.Lender().Acquire(0, 2)
	require.NoError(t, err)
	var gr chunk.Growth
	tk := &taking{p: p.Lender(), g: &gr, n: 1}
	tk.mu.Lock()
	// The budget is full at the first Place; the chunk comes back before the
	// relief looks (Unlock runs first).
	put := &putOnUnlock{taking: tk, c: held[0]}
	err = p.Lender().Grow(context.Background(), &gr, 0, put, chunk.MayRelieve)
	tk.mu.Unlock()
	require.NoError(t, err)
	require.Len(t, tk.got, 1)
	assert.Equal(t, []chunk.GrowthState{chunk.GrowLocked, chunk.GrowRelieving, chunk.GrowLocked}, tk.states)
	assert.Equal(t, chunk.GrowMapped, gr.State())
	assert.True(t, gr.End(), "it went to a relief")
	assert.False(t, gr.End(), "End ends it once")
	require.NoError(t, p.Lender().Put(tk.got[0]))
	require.NoError(t, p.Lender().Put(held[1]))
}

// putOnUnlock puts c back when its growth first releases its lock.
type putOnUnlock struct {
	*taking
	c    chunk.Chunk
	done bool
}

func (u *putOnUnlock) Unlock() <-chan struct{} {
	stop := u.taking.Unlock()
	if !u.done {
		u.done = true
		if err := u.p.Put(u.c); err != nil {
			panic(err)
		}
	}
	return stop
}
