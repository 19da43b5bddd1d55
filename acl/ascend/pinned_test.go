//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"testing"

	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/acl/internal/hostmem/hostmemtest"
)

// A MallocHost that runs between FreeHost's aclrtFreeHost and its return,
// and gets the address just freed, keeps its buffer in the binding's books:
// FreeHost took its own out before the runtime freed it. (Forced with the
// sched.HostFreed point; the double hands the last buffer freed back to the
// next aclrtMallocHost of its size, as a runtime pooling host memory does.)
func TestFreeHostRacesMallocHost(t *testing.T) {
	d, dbl := openDouble(t, variantPath(t, "full"), 0, ascend.Config{})
	hostmemtest.RequireFreeHostKeepsReuse(t, d, func() int { return dbl.Live().HostBuffers })
}
