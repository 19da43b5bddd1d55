package strategy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// PyTorch's expandable-segments mode splits a block of either pool when at
// least 512 bytes remain (should_split: is_small || expandable_segments), so
// the 0.5 MiB left at the end of the first 20 MiB page after three 6.5 MiB
// tensors stays free and a 20.5 MiB tensor grows it by one page: 40 MiB.
func TestCachingExpandableSplitsLikePyTorch(t *testing.T) {
	cd := newDriver(t, 0)
	st, err := New("caching-expandable", Config{Driver: cd})
	require.NoError(t, err)
	r, err := st.Open(0)
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, r.Grow(6*mib+mib/2))
	}
	assert.Equal(t, int64(20*mib), cd.Memory().Physical)
	require.NoError(t, r.Grow(20*mib+mib/2))
	assert.Equal(t, int64(40*mib), cd.Memory().Physical, "the free 0.5 MiB at the end grows by one page")
	require.NoError(t, r.Close())
	require.NoError(t, st.Close())
}
