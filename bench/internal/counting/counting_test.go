package counting_test

import (
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/bench/internal/counting"
)

// granularity makes one driver call, counted as counting.Granularity.
func granularity(t *testing.T, d acl.Driver) {
	prop := acl.PhysicalMemProp{HandleType: acl.MemHandleTypeNone, AllocationType: acl.MemAllocationTypePinned,
		MemAttr: acl.HBMMemHuge, Location: acl.MemLocation{Type: acl.MemLocationTypeDevice}}
	_, err := d.MemGetAllocationGranularity(&prop, acl.GranularityMinimum)
	assert.NoError(t, err)
}

// A call made inside a window by another goroutine (the pool's worker, say)
// is not on the caller's path once the caller's thread is known; without
// it, the window counts every call, an upper bound.
func TestWindowCountsTheCallersCallsOnly(t *testing.T) {
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer hd.Close()
	for _, lock := range []bool{false, true} {
		d := counting.New(hd, 0)
		exact := false
		if lock {
			exact = d.ByThread(threadID)
		}
		d.Window(true)
		granularity(t, d) // the caller's
		var wg sync.WaitGroup
		wg.Go(func() {
			// The caller holds its thread while its window is open: this
			// runs on another.
			granularity(t, d)
		})
		wg.Wait()
		d.Window(false)
		granularity(t, d) // outside the window
		on, beside := d.WindowCalls().N[counting.Granularity], d.BesideCalls().N[counting.Granularity]
		switch {
		case exact:
			assert.Equal(t, int64(1), on, "the caller's call")
			assert.Equal(t, int64(1), beside, "the other goroutine's call")
		default:
			assert.Equal(t, int64(2), on, "every call in the window, an upper bound")
			assert.Zero(t, beside)
		}
		assert.Equal(t, int64(3), d.Calls().N[counting.Granularity])
		if lock && runtime.GOOS == "linux" {
			assert.True(t, exact, "on Linux the caller's thread is known")
		}
	}
}
