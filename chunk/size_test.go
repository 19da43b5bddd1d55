package chunk_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/chunk"
)

// SizeFor's rule at its edges: no budget and small budgets give the
// granularity, the size follows the budget by powers of two (switching at
// √2 between them), stops at MaxAutoSize, and stays a multiple of a
// granularity that is not a power of two.
func TestSizeForRule(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		budget int64
		g      int
		want   int
	}{
		{0, g, g},                         // no budget
		{-1, g, g},                        // not a budget
		{1, g, g},                         // tiny: below one chunk (New refuses it)
		{g, g, g},                         // one chunk
		{2 << 30, g, g},                   // 2 MiB exactly
		{1448 * g, g, g},                  // just below 2√2 MiB per chunk
		{1449 * g, g, 4 * mib},            // just above
		{5044 * mib, g, 4 * mib},          // the bench's default KV budget
		{16 << 30, g, 16 * mib},           // 16 MiB exactly
		{18058 * mib, g, 16 * mib},        // the bench's server-size budget
		{54170 * mib, g, 32 * mib},        // three models' weights and their KV
		{32 << 30, g, 32 * mib},           // MaxAutoSize exactly
		{128 << 30, g, 32 * mib},          // past it: capped
		{1 << 50, g, chunk.MaxAutoSize},   // huge: capped
		{1<<63 - 1, g, chunk.MaxAutoSize}, // the largest budget
		{64 << 30, 3 * mib, 30 * mib},     // 32 MiB rounded down to a multiple of 3 MiB
		{4 << 30, 3 * mib, 3 * mib},       // 4 MiB rounds down to one granule
		{8 << 30, 3 * mib, 6 * mib},       // 8 MiB rounds down to two
		{1 << 40, 48 * mib, 48 * mib},     // a granularity above the cap
		{16 << 30, 0, 0},                  // no granularity: nothing to choose
	} {
		t.Run(fmt.Sprintf("%d/%d", c.budget, c.g), func(t *testing.T) {
			got := chunk.SizeFor(c.budget, c.g)
			assert.Equal(t, c.want, got)
			if c.g > 0 {
				assert.Zero(t, got%c.g, "a multiple of the granularity")
			}
		})
	}
	// Monotonic in the budget: a larger budget never gets smaller chunks.
	last := 0
	for b := int64(g); b < 1<<40; b += b / 7 {
		s := chunk.SizeFor(b, g)
		require.GreaterOrEqual(t, s, last, "budget %d", b)
		last = s
	}
}

// DefaultTailSize's rule: a quarter of the chunk where that is a multiple
// of the granularity, else the chunk itself (one size); nonsense in, the
// size back.
func TestDefaultTailSizeRule(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct{ size, g, want int }{
		{g, g, g},                     // one granule: one size
		{4 * mib, g, 4 * mib},         // a quarter below the granularity
		{6 * mib, g, 6 * mib},         // a quarter not a multiple of it
		{8 * mib, g, 2 * mib},         // the smallest chunk with tails
		{16 * mib, g, 4 * mib},        // the bench's server size
		{32 * mib, g, 8 * mib},        // MaxAutoSize
		{24 * mib, g, 6 * mib},        // a quarter of three granules
		{30 * mib, 3 * mib, 30 * mib}, // 7.5 MiB: not a multiple of 3 MiB
		{48 * mib, 3 * mib, 12 * mib},
		{1 << 30, 1 << 30, 1 << 30}, // HUGE1G granules
		{0, g, 0},
		{-1, g, -1},
		{16 * mib, 0, 16 * mib},
	} {
		assert.Equal(t, c.want, chunk.DefaultTailSize(c.size, c.g), "size %d, granularity %d", c.size, c.g)
	}
}

// New chooses SizeFor's size for Config.Size 0 with a budget, the
// granularity without one; an explicit Size wins; SetBudget never changes
// the size; a driver whose reservations cannot hold the chosen size gets
// the granularity.
func TestNewChoosesTheChunkSize(t *testing.T) {
	d := newDriver(t, 64<<20)
	for _, c := range []struct {
		cfg  chunk.Config
		want int
	}{
		{chunk.Config{}, g},
		{chunk.Config{Budget: 3 * g}, g},
		{chunk.Config{Budget: 16 << 30}, 16 << 20},
		{chunk.Config{Budget: 1 << 40}, chunk.MaxAutoSize},
		{chunk.Config{Size: g, Budget: 16 << 30}, g},                 // explicit Size wins
		{chunk.Config{Size: 128 << 20, Budget: 16 << 30}, 128 << 20}, // even above the cap
	} {
		p, err := chunk.New(d, c.cfg)
		require.NoError(t, err, "%+v", c.cfg)
		assert.Equal(t, c.want, p.ChunkSize(), "%+v", c.cfg)
		assert.Equal(t, c.want, p.Stats().ChunkSize, "%+v", c.cfg)
		require.NoError(t, p.SetBudget(4*g))
		assert.Equal(t, c.want, p.ChunkSize(), "SetBudget keeps the size: %+v", c.cfg)
		require.NoError(t, p.SetBudget(1<<40))
		assert.Equal(t, c.want, p.ChunkSize(), "SetBudget keeps the size: %+v", c.cfg)
		require.NoError(t, p.Close())
	}

	small, err := host.New(host.Config{Capacity: 64 << 20, MaxReserve: 16 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, small.Close()) }()
	p, err := chunk.New(small, chunk.Config{Budget: 1 << 40})
	require.NoError(t, err)
	assert.Equal(t, g, p.ChunkSize(), "64 MiB chunks pass a 16 MiB reservation")
	require.NoError(t, p.Close())
}

// A pool that chose large chunks hands them out, caches and reuses them,
// and keeps its budget in bytes of them.
func TestChosenChunksWork(t *testing.T) {
	d := newDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{Budget: 8 << 30}) // 8 MiB chunks
	require.NoError(t, err)
	defer func() { assert.NoError(t, p.Close()) }()
	require.NoError(t, p.SetBudget(32<<20)) // four of them; the size stays
	cs, err := p.Lender().Acquire(chunk.NewTenant(), 4)
	require.NoError(t, err)
	st := p.Stats()
	assert.Equal(t, int64(32<<20), st.HeldBytes)
	assert.Equal(t, int64(4), st.Allocs)
	_, err = p.Lender().Get()
	assert.ErrorIs(t, err, chunk.ErrBudget, "a fifth chunk passes the budget")
	for _, c := range cs {
		require.NoError(t, p.Lender().Put(c))
	}
	c, err := p.Lender().Get()
	require.NoError(t, err)
	assert.Equal(t, int64(1), p.Stats().Hits, "reused from the cache")
	require.NoError(t, p.Lender().Put(c))
}
