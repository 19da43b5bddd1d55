package arena_test

// Forcing tests of sleep and wake at their edges: copies racing a Sleep, a
// private pool that keeps chunks ahead, faults that hit an undo, frees that
// race a growth that gets the freed handle back, waits for memory.

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/internal/sched"
)

// A copy into an arena that an Offload Sleep is copying to the host either
// lands before the sleep's copy (and comes back with the wake) or fails with
// ErrAsleep: forced right after the sleep copied the step the buffer lies
// in, before it unmaps it, a CopyIn that returned nil would be lost.
func TestCopyRacingSleepIsNotLost(t *testing.T) {
	e := newSleepEnv(t)
	a := e.arena(t, arena.Config{})
	b, old := fill(t, a, 3*sleepChunk, 3)
	fresh := bytes.Repeat([]byte{0x5A}, b.Len())

	copied := make(chan struct{})
	resume := make(chan struct{})
	defer sched.Set(func(p sched.Point, who any) {
		if p == sched.SleepCopied && who == a {
			select {
			case <-copied:
			default:
				close(copied)
				<-resume
			}
		}
	})()
	slept := make(chan error, 1)
	go func() { slept <- a.Sleep(context.Background(), arena.Offload) }()
	<-copied
	copyErr := make(chan error, 1)
	go func() { copyErr <- arena.CopyIn(b, fresh) }()
	var err error
	returned := false
	select {
	case err = <-copyErr: // returned while the sleep held the step it copied
		returned = true
	case <-time.After(50 * time.Millisecond): // it waits for the sleep to end
	}
	close(resume)
	require.NoError(t, <-slept)
	if !returned {
		err = <-copyErr
	}
	require.ErrorIs(t, err, arena.ErrAsleep, "a copy racing the sleep: unless it fails, its bytes are lost")
	require.NoError(t, a.Wake(context.Background()))
	require.True(t, bytes.Equal(old, contents(t, b)), "the wake restored what the sleep copied, and the refused copy changed nothing")
}
