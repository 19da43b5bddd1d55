package arena_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// Arenas on a pool that chose its chunk size from a large budget (8 MiB
// chunks for 8 GiB), asked for one size (TailSize equal to it), grow in those chunks, keep their bytes, shrink whole
// chunks back, and share them: a chunk one arena gave back serves the other,
// cleared, and the first arena's bytes never reach it.
func TestArenasOnAChosenChunkSize(t *testing.T) {
	const cs = 8 << 20
	d := isoDriver(t, 128<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 8 << 30, TailSize: cs})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	require.Equal(t, []int{cs, cs}, []int{pool.ChunkSize(), pool.TailSize()})
	require.NoError(t, pool.SetBudget(6*cs)) // what the host driver holds; the size stays

	a := isoArena(t, arena.Config{Pool: pool, Reserve: 64 << 20})
	b := isoArena(t, arena.Config{Pool: pool, Reserve: 64 << 20})
	assert.Equal(t, cs, a.ChunkSize())

	// Growing: 10 MiB takes two chunks, the bytes written stay.
	buf, err := a.Alloc(10<<20, 1)
	require.NoError(t, err)
	assert.Equal(t, 2*cs, a.Cap())
	data := bytes.Repeat([]byte{0xAB}, buf.Len())
	require.NoError(t, arena.CopyIn(buf, data))
	require.NoError(t, a.Grow(cs)) // room for 8 MiB beyond the 10 in use
	assert.Equal(t, 3*cs, a.Cap())
	assert.Equal(t, int64(3), pool.Stats().Allocs)

	// Shrinking: what is past the length goes back in whole chunks.
	require.NoError(t, a.Truncate(cs+1))
	require.NoError(t, a.Shrink())
	assert.Equal(t, 2*cs, a.Cap(), "the partial chunk under the length stays")
	assert.Equal(t, cs+1, a.Len())
	assert.Equal(t, data[:cs+1], readAll(t, d, a)[:cs+1], "the bytes under the length survive the shrink")

	// Sharing: a's dropped chunk serves b from the cache, cleared.
	hits := pool.Stats().Hits
	require.NoError(t, b.Grow(cs))
	assert.Equal(t, hits+1, pool.Stats().Hits, "b reuses the chunk a gave back")
	assert.Equal(t, int64(3), pool.Stats().Allocs, "no new allocation")
	assert.Equal(t, make([]byte, cs), readAll(t, d, b), "none of a's bytes reach b")

	// The budget counts bytes of these chunks: four more do not fit.
	err = b.Grow(5 * cs)
	require.ErrorIs(t, err, arena.ErrOutOfMemory)
	assert.Equal(t, cs, b.Cap(), "the failed Grow kept nothing")

	require.NoError(t, a.Reset())
	require.NoError(t, a.Shrink())
	require.NoError(t, b.Shrink())
	assert.Zero(t, a.Cap()+b.Cap())
	st := pool.Stats()
	assert.Zero(t, st.InUse)
	assert.Equal(t, int64(st.Cached)*cs, st.HeldBytes)
}

// By default the same pool has tails of a quarter of its chunks
// (chunk.DefaultTailSize): an arena maps a growth's whole chunks and the
// rest in tails, so it holds less than a tail beyond what it was asked for,
// and its bytes stay where they were written.
func TestChosenChunkSizeHasTails(t *testing.T) {
	const cs, tail = 8 << 20, 2 << 20
	d := isoDriver(t, 128<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 8 << 30})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	require.Equal(t, []int{cs, tail}, []int{pool.ChunkSize(), pool.TailSize()})

	a := isoArena(t, arena.Config{Pool: pool, Reserve: 64 << 20})
	buf, err := a.Alloc(10<<20, 1)
	require.NoError(t, err)
	assert.Equal(t, 10<<20, a.Cap(), "one chunk and one tail")
	assert.Equal(t, int64(2), pool.Stats().Allocs)
	data := bytes.Repeat([]byte{0xCD}, buf.Len())
	require.NoError(t, arena.CopyIn(buf, data))

	require.NoError(t, a.Grow(cs)) // room for 8 MiB beyond the 10 in use
	assert.GreaterOrEqual(t, a.Cap(), 18<<20)
	assert.Less(t, a.Cap()-18<<20, tail, "less than a tail beyond the growth")
	assert.Equal(t, data, readAll(t, d, a)[:10<<20], "the bytes stay where they were written")

	require.NoError(t, a.Reset())
	require.NoError(t, a.Shrink())
	assert.Zero(t, a.Cap())
	assert.Zero(t, pool.Stats().InUse)
}
