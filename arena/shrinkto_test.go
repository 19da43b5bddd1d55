package arena_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// ShrinkTo keeps what the arena's next use needs mapped and gives back the
// rest: never below Len, never more than Cap held, the bytes below Len kept;
// with streams the chunks it gives back wait for the work queued there.
func TestShrinkTo(t *testing.T) {
	e := newDeferredEnv(t, chunk.Config{})
	a := e.arena(t, arena.Config{Streams: []acl.Stream{e.s}})
	require.NoError(t, a.Grow(8*cg))
	b, err := a.Alloc(cg+1, 256)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(b, []byte("kept")))

	// A kernel on the stream reads the kept buffer until the test lets it
	// end: the chunks given back wait for it (without one, the worker may
	// unmap them before the count is read).
	kernel := make(chan struct{})
	require.NoError(t, e.hd.Launch(e.s, b.Ptr(), uintptr(b.Len()), kernel))
	require.NoError(t, a.ShrinkTo(4*cg+1))
	assert.Equal(t, 5*cg, a.Cap(), "what is asked for, in whole chunks")
	assert.Equal(t, 3, e.pool.Stats().Pending, "the rest waits for the stream, then goes to the cache")
	close(kernel)
	require.NoError(t, e.hd.SynchronizeStream(e.s))

	require.NoError(t, a.ShrinkTo(7*cg))
	assert.Equal(t, 5*cg, a.Cap(), "ShrinkTo never maps")

	require.NoError(t, a.ShrinkTo(0))
	assert.Equal(t, 2*cg, a.Cap(), "never below Len")
	got := make([]byte, 4)
	require.NoError(t, arena.CopyOut(got, b))
	assert.Equal(t, "kept", string(got))

	require.ErrorIs(t, a.ShrinkTo(-1), arena.ErrInvalid)
	assert.Equal(t, 2*cg, a.Cap())

	maps := e.fd.Calls(faultdriver.MapMem)
	require.NoError(t, a.Truncate(0))
	require.NoError(t, a.ShrinkTo(cg))
	require.NoError(t, a.Grow(cg))
	assert.Equal(t, maps, e.fd.Calls(faultdriver.MapMem), "the next use finds what was kept mapped")
	e.pool.Lender().Settle()
}
