package arena_test

import (
	"bytes"
	"context"
	"io"
	"runtime/trace"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	xtrace "golang.org/x/exp/trace"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/skip"
)

// An execution trace shows the arena's slow paths and the driver calls
// under them as regions, and a waiting growth inside the caller's task.
// The trace is read back with golang.org/x/exp/trace: the standard library
// writes traces but has no reader.
func TestTraceRegions(t *testing.T) {
	const g = acl.HugePageSize
	d := isoDriver(t, 64<<20)
	pool, err := chunk.New(d, chunk.Config{Budget: 2 * g})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, pool.Close()) })
	a := isoArena(t, arena.Config{Pool: pool, Reserve: 8 << 20})
	other := isoArena(t, arena.Config{Pool: pool, Reserve: 8 << 20})

	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		skip.ByFlag(t, "a trace is already being recorded (go test -trace?): %v", err)
	}
	ctx, task := trace.NewTask(context.Background(), "decode step")
	b, err := a.AllocContext(ctx, 2*g, 1) // grows: malloc, map, access
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(b, []byte("x")))
	done := make(chan error, 1)
	go func() { done <- other.GrowContext(ctx, g) }() // waits: the budget is a's
	for pool.Lender().Waiters() != 1 {
		time.Sleep(100 * time.Microsecond)
	}
	require.NoError(t, a.Truncate(g)) // wakes it; it reclaims from a
	require.NoError(t, <-done)
	require.NoError(t, other.Reset())
	require.NoError(t, other.Shrink()) // device-wide wait, unmap
	task.End()
	trace.Stop()

	regions := map[string]int{}
	inTask := map[string]bool{}
	var taskID xtrace.TaskID
	r, err := xtrace.NewReader(&buf)
	require.NoError(t, err)
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		switch ev.Kind() {
		case xtrace.EventTaskBegin:
			if ev.Task().Type == "decode step" {
				taskID = ev.Task().ID
			}
		case xtrace.EventRegionBegin:
			reg := ev.Region()
			regions[reg.Type]++
			if reg.Task == taskID && taskID != 0 {
				inTask[reg.Type] = true
			}
		}
	}
	for _, name := range []string{arena.RegionGrow, arena.RegionShrink, arena.RegionReclaim, arena.RegionWait,
		arena.RegionCopy, chunk.RegionRelieve, chunk.RegionRelease, "acl.MallocPhysical", "acl.MapMem",
		"acl.MemSetAccess", "acl.UnmapMem", "acl.SynchronizeDevice"} {
		assert.Positive(t, regions[name], "region %s", name)
	}
	for _, name := range []string{arena.RegionWait, arena.RegionGrow, chunk.RegionRelieve} {
		assert.True(t, inTask[name], "%s is in the caller's task", name)
	}
}
