//go:build linux

package arena_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// The shared buffer of the two-size hand-overs below: an arena on a pool of
// 8 MiB chunks with 2 MiB tails allocates 3 MiB ahead of it (two tails),
// then the buffer from there to 1 KiB short of 26 MiB, which the arena lays
// as [u, u, u, u, C, C, u]; the buffer lies in all of them but the first,
// 1 MiB into the second.
const (
	mixedU, mixedC = 2 << 20, 8 << 20
	mixedAhead     = 3 << 20
	mixedLen       = 26<<20 - 1024 - mixedAhead
)

var mixedShared = []int{mixedU, mixedU, mixedU, mixedC, mixedC, mixedU}

// An arena on a pool of two sizes shares a buffer that spans tail and large
// chunks: the consumer, with a pool of the same two sizes or a private one,
// maps the same chunks, of the same sizes, in the same order, and sees the
// producer's bytes; a write is seen both ways, and nothing leaks.
func TestMixedShareHandoff(t *testing.T) {
	for _, withPool := range []bool{true, false} {
		name := map[bool]string{true: "pool of both sizes", false: "private pool"}[withPool]
		t.Run(name, func(t *testing.T) {
			p := spawn(t, peerSpec{Role: "producer", Chunks: 13, ChunkSize: mixedC, TailSize: mixedU,
				Ahead: mixedAhead, SharedLen: mixedLen})
			d := newShareHost(t)
			fd := faultdriver.New(d)
			cfg := arena.ImportConfig{Driver: fd}
			var pool *chunk.Pool
			if withPool {
				var err error
				pool, err = chunk.New(fd, chunk.Config{Size: mixedC, TailSize: mixedU, MaxCached: -1})
				require.NoError(t, err)
				t.Cleanup(func() { assert.NoError(t, pool.Close()) }) // before the driver's check
				cfg = arena.ImportConfig{Pool: pool}
			}
			v, err := arena.Import(p.conn, cfg)
			require.NoError(t, err)
			require.Empty(t, p.reply().Err)

			b := v.Buffer()
			va := b.Arena()
			assert.Equal(t, mixedLen, b.Len())
			assert.Equal(t, mixedAhead-mixedU, b.Offset(), "where the buffer lay in the producer's first shared chunk")
			assert.Equal(t, mixedShared, arena.Layout(va), "the producer's chunks, each of its size")
			assert.Equal(t, 24<<20, va.Cap())
			assert.Equal(t, 24<<20, va.Reserved(), "a reservation of exactly the chunks")
			assert.Equal(t, mixedU, va.TailSize())
			assert.Equal(t, int64(len(mixedShared)), fd.Calls(faultdriver.MemImportFromShareableHandle))
			assert.Equal(t, int64(len(mixedShared)), fd.Calls(faultdriver.MapMem))
			l := d.Live()
			assert.Equal(t, len(mixedShared), l.Imported)
			assert.Equal(t, uintptr(24<<20), l.ImportedBytes)
			if withPool {
				st := pool.Stats()
				assert.Equal(t, int64(24<<20), st.HeldBytes, "the pool books each chunk at its size")
				assert.Equal(t, len(mixedShared), st.InUse)
			}

			got := make([]byte, mixedLen)
			require.NoError(t, arena.CopyOut(got, b))
			require.True(t, bytes.Equal(sharedBytes(mixedLen), got), "the view holds what the producer wrote, across tails and large chunks")
			require.NoError(t, arena.CopyIn(b, []byte("the consumer wrote this")))
			p.send('r')
			assert.Equal(t, "the consumer wrote this", string(p.reply().Data[:23]))

			p.send('q')
			assert.False(t, p.wait(), "the producer leaked nothing")
			require.NoError(t, v.Close())
			assert.True(t, d.Live().Zero(), "leaked: %+v", d.Live())
			if withPool {
				assert.Zero(t, pool.Stats().HeldBytes)
			}
		})
	}
}

// This process shares a buffer of an arena on a pool of two sizes with a
// consumer that imports it into a private pool, and gives the chunks back
// afterwards: the shared ones freed, not cached.
func TestMixedShareToConsumer(t *testing.T) {
	d := newShareHost(t)
	pool, err := chunk.New(d, chunk.Config{Size: mixedC, TailSize: mixedU, Shareable: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, pool.Close()) }()
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 64 << 20})
	require.NoError(t, err)
	_, err = a.Alloc(mixedAhead, 1)
	require.NoError(t, err)
	b, err := a.Alloc(mixedLen, 1024)
	require.NoError(t, err)
	require.Equal(t, []int{mixedU, mixedU, mixedU, mixedU, mixedC, mixedC, mixedU}, arena.Layout(a))
	require.NoError(t, arena.CopyIn(b, sharedBytes(b.Len())))

	p := spawn(t, peerSpec{Role: "consumer"})
	require.NoError(t, b.Share(p.conn, arena.ShareOptions{PID: p.pid()}))
	r := p.reply()
	require.Empty(t, r.Err)
	assert.Equal(t, sharedBytes(32), r.Data)
	assert.Equal(t, len(mixedShared), r.Live.Imported)
	assert.Equal(t, uintptr(24<<20), r.Live.ImportedBytes)
	assert.Equal(t, int64(len(mixedShared)), pool.Stats().Exported, "the chunks holding the buffer, of both sizes")

	requireConsumerWrites(t, p, b)
	p.send('q')
	assert.False(t, p.wait(), "the consumer leaked nothing")

	require.NoError(t, a.Close())
	st := pool.Stats()
	assert.Equal(t, 1, st.Cached, "the shared chunks are freed, not cached: only the first tail is")
	assert.Equal(t, int64(mixedU), st.HeldBytes)
}
