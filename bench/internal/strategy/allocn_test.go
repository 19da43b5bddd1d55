package strategy

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every strategy's AllocN cuts what as many Allocs in a row would (the same
// first offset and Len, on a paged region across a block boundary too), and
// a failed one cuts nothing.
func TestAllocNIsAllocsInARow(t *testing.T) {
	for _, name := range Names {
		t.Run(name, func(t *testing.T) {
			cd := newDriver(t, 64*mib)
			cfg := Config{Driver: cd, Budget: 64 * mib, Block: 2 * mib}
			open := func(st Strategy) Region {
				r, err := st.Open(16 * mib)
				require.NoError(t, err)
				t.Cleanup(func() { assert.NoError(t, r.Close()) })
				require.NoError(t, r.Grow(4*mib))
				return r
			}
			st, err := New(name, cfg)
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, st.Close()) })
			require.NoError(t, st.Prepare())
			each, batch := open(st), open(st)
			for _, r := range []Region{each, batch} {
				_, err := r.Alloc(3, 1) // Len off the alignment
				require.NoError(t, err)
			}
			// 2·16 tensors of 40,000 bytes (stride 40,192 at 256) twice: the
			// second batch crosses the paged pool's first 2 MiB block.
			for round := range 2 {
				first := int64(-1)
				for range 32 {
					off, err := each.Alloc(40000, 256)
					require.NoError(t, err)
					if first < 0 {
						first = off
					}
				}
				got, err := batch.AllocN(32, 40000, 256)
				require.NoError(t, err)
				assert.Equal(t, first, got, "round %d: first offset", round)
				assert.Equal(t, each.Len(), batch.Len(), "round %d: Len", round)
			}

			l := batch.Len()
			_, err = batch.AllocN(500, 40000, 256) // 20 MiB: past the region's most
			require.Error(t, err)
			assert.Equal(t, l, batch.Len(), "a failed AllocN cuts nothing")
			for _, bad := range []struct {
				count    int
				n, align int64
			}{{0, 1, 1}, {-1, 1, 1}, {2, -1, 1}, {2, 1, 3}, {1 << 62, 1 << 20, 256}} {
				_, err := batch.AllocN(bad.count, bad.n, bad.align)
				require.Error(t, err, fmt.Sprint(bad))
				assert.Equal(t, l, batch.Len(), "%v cut nothing", bad)
			}
			require.NoError(t, batch.Truncate(0))
			require.NoError(t, each.Truncate(0))
		})
	}
}
