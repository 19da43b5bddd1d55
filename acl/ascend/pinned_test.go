//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/internal/sched"
)

// A MallocHost that runs between FreeHost's aclrtFreeHost and its return,
// and gets the address just freed, keeps its buffer in the binding's books:
// FreeHost took its own out before the runtime freed it. (Forced with the
// sched.HostFreed point; the double hands the last buffer freed back to the
// next aclrtMallocHost of its size, as a runtime pooling host memory does.)
func TestFreeHostRacesMallocHost(t *testing.T) {
	d, dbl := openDouble(t, variantPath(t, "full"), 0, ascend.Config{})
	const size = 512
	old, err := d.MallocHost(size)
	require.NoError(t, err)
	var (
		again []byte
		aerr  error
		once  sync.Once
	)
	t.Cleanup(sched.Set(func(p sched.Point, who any) {
		if p == sched.HostFreed && who == d {
			once.Do(func() { again, aerr = d.MallocHost(size) })
		}
	}))
	require.NoError(t, d.FreeHost(old))
	require.NoError(t, aerr)
	require.Same(t, &old[0], &again[0], "the double gave the freed address to the MallocHost inside FreeHost (else this test forces nothing)")
	require.Equal(t, 1, d.Live().HostBuffers, "the new buffer is in the books")
	require.Equal(t, 1, dbl.Live().HostBuffers)
	require.NoError(t, d.FreeHost(again), "and can be freed")
	require.Zero(t, d.Live().HostBuffers)
	require.Zero(t, dbl.Live().HostBuffers)
}
