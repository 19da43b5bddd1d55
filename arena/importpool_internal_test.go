package arena

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/host"
)

// The private pool an Import makes takes the offer's chunks as they came:
// an offer of one size gets a pool of that one size, whatever it is (a pool
// left to its default would have tails of a quarter of chunks of 8 MiB and
// more), and an offer of two sizes a pool of the largest with the offer's
// unit for its tails.
func TestImportPoolSizes(t *testing.T) {
	const mib = 1 << 20
	d, err := host.New(host.Config{Capacity: 256 * mib})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.Close()) })
	for _, c := range []struct {
		o           offer
		sizes       []uint32
		large, tail int
	}{
		{offer{chunkSize: 2 * mib, chunks: 3}, nil, 2 * mib, 2 * mib},
		{offer{chunkSize: 16 * mib, chunks: 2}, nil, 16 * mib, 16 * mib},
		{offer{chunkSize: 32 * mib, chunks: 1}, nil, 32 * mib, 32 * mib},
		{offer{chunkSize: 4 * mib, chunks: 3, flags: flagSizes}, []uint32{4, 4, 1}, 16 * mib, 4 * mib},
		{offer{chunkSize: 2 * mib, chunks: 2, flags: flagSizes}, []uint32{1, 4}, 8 * mib, 2 * mib},
	} {
		p, own, err := importPool(d, ImportConfig{}, c.o, c.sizes)
		require.NoError(t, err, "%+v %v", c.o, c.sizes)
		assert.True(t, own)
		assert.Equal(t, []int{c.large, c.tail}, []int{p.ChunkSize(), p.TailSize()}, "%+v %v", c.o, c.sizes)
		require.NoError(t, p.Close())
	}
	assert.True(t, d.Live().Zero(), "%+v", d.Live())
}
