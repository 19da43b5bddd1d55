package chunk_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/chunk"
)

// woken reports whether w is woken within d.
func woken(w *chunk.Waiter, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return w.Wait(ctx) == nil
}

// Waiters queue first come, first served: a release wakes the head only,
// and the next one's turn comes when the head leaves.
func TestWaitQueueOrder(t *testing.T) {
	d := newDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{Budget: 2 * g})
	require.NoError(t, err)
	defer p.Close()
	cs, err := p.Lender().Acquire(0, 2)
	require.NoError(t, err)

	mark := p.Lender().Mark()
	_, err = p.Lender().Acquire(0, 1)
	require.ErrorIs(t, err, chunk.ErrBudget)
	first, err := p.Lender().Enqueue(mark)
	require.NoError(t, err)
	second, err := p.Lender().Enqueue(p.Lender().Mark())
	require.NoError(t, err)
	assert.Equal(t, 2, p.Lender().Waiters())
	assert.False(t, woken(first, 20*time.Millisecond), "nothing was released")

	go func() { assert.NoError(t, p.Lender().Put(cs[0])) }()
	assert.True(t, woken(first, 5*time.Second), "a Put wakes the head")
	assert.False(t, woken(second, 20*time.Millisecond), "and only the head")
	first.Done()
	assert.True(t, woken(second, 5*time.Second), "the head's leaving gives the next its turn")
	second.Done()
	second.Done() // twice is harmless
	assert.Zero(t, p.Lender().Waiters())
	require.NoError(t, p.Lender().Put(cs[1]))
}

// A release between a failed try and Enqueue is not lost: the mark taken
// before the try tells Enqueue, which wakes the waiter at once.
func TestWaitMarkCatchesEarlyRelease(t *testing.T) {
	d := newDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{Budget: g})
	require.NoError(t, err)
	defer p.Close()
	c, err := p.Lender().Get()
	require.NoError(t, err)
	mark := p.Lender().Mark()
	_, err = p.Lender().Get()
	require.ErrorIs(t, err, chunk.ErrBudget)
	require.NoError(t, p.Lender().Put(c)) // before the Enqueue
	w, err := p.Lender().Enqueue(mark)
	require.NoError(t, err)
	defer w.Done()
	assert.True(t, woken(w, time.Second))
}

// Freed memory wakes waiters in every pool on the device; Close wakes its
// own, and Enqueue then fails.
func TestWaitWokenByFreeAndClose(t *testing.T) {
	d := newDriver(t, 64<<20)
	p, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	peer, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	defer peer.Close()
	_, err = peer.Warm(2)
	require.NoError(t, err)

	w, err := p.Lender().Enqueue(p.Lender().Mark())
	require.NoError(t, err)
	assert.False(t, woken(w, 20*time.Millisecond))
	require.NoError(t, peer.Trim())
	assert.True(t, woken(w, 5*time.Second), "a peer's free is room on the device")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, w.Wait(ctx), context.Canceled)
	go p.Close()
	assert.True(t, woken(w, 5*time.Second), "Close wakes the waiters")
	w.Done()
	require.NoError(t, p.Close())
	_, err = p.Lender().Enqueue(p.Lender().Mark())
	require.ErrorIs(t, err, chunk.ErrClosed)
}
