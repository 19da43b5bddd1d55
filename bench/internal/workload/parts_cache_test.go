package workload

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/model"
	"github.com/vmarena/vmarena/bench/internal/counting"
	"github.com/vmarena/vmarena/bench/internal/strategy"
)

// On the models workload the caching allocator serves from per-model parts
// (strategy.Split): the bytes those parts hold in free blocks are cache, free
// to take, as a single caching allocator's are on kv; a sample must count
// them, or the committed memory and fragmentation count the cache as used.
func TestSampleCountsTheCachingPartsCache(t *testing.T) {
	m, err := model.New(model.Config{Untimed: true, NoData: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, m.Close()) }()
	cd := counting.New(m, 0)
	st, err := strategy.New("caching", strategy.Config{Driver: cd})
	require.NoError(t, err)
	env := NewEnv(cd, st, "models")
	parts, err := strategy.Split(st, []int64{0, 0})
	require.NoError(t, err)
	r, err := env.openIn(parts[0], 0)
	require.NoError(t, err)
	require.NoError(t, env.grow(r, 3<<20)) // a 20 MiB segment
	require.NoError(t, env.truncate(r, 0)) // all of it cached
	env.sample(0)
	s := env.Res.Samples[0]
	assert.Equal(t, int64(20<<20), s.Physical)
	assert.Equal(t, int64(20<<20), s.Cached, "the part's free blocks are cache")
	assert.Zero(t, s.Committed())
	require.NoError(t, env.close(r))
	for _, p := range parts {
		require.NoError(t, p.Close())
	}
	require.NoError(t, st.Close())
}
