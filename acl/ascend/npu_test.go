package ascend_test

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/arena/arenatest"
)

// The hardware tests run on a real NPU through the runtime the default
// search finds ($VMARENA_ASCEND_LIBRARY, $ASCEND_HOME_PATH, …):
//
//	VMARENA_REQUIRE_NPU=1 go test -run NPU -v ./acl/ascend
//
// VMARENA_DEVICE=ascend:N picks NPU N (default 0). Without an NPU they skip,
// saying why; with VMARENA_REQUIRE_NPU set, or when a runtime is found but
// fails, they fail.

// RequireNPUEnv makes the hardware tests fail instead of skipping when no NPU
// can be opened.
const RequireNPUEnv = "VMARENA_REQUIRE_NPU"

func npuDevice() int32 {
	if n, ok := strings.CutPrefix(os.Getenv("VMARENA_DEVICE"), "ascend:"); ok {
		if id, err := strconv.ParseInt(n, 10, 32); err == nil {
			return int32(id)
		}
	}
	return 0
}

// openNPU opens the NPU, skipping only when there is no runtime or no NPU
// (an error matching acl.ErrNotSupported) and the NPU is not required.
func openNPU(t testing.TB) *ascend.Driver {
	t.Helper()
	d, err := ascend.Open(ascend.Config{Device: npuDevice()})
	if errors.Is(err, acl.ErrNotSupported) && os.Getenv(RequireNPUEnv) == "" {
		t.Skipf("no Ascend NPU: %v (set %s=1 to make this a failure)", err, RequireNPUEnv)
	}
	require.NoError(t, err, "an Ascend runtime is present but does not work")
	t.Cleanup(func() { assert.NoError(t, d.Close()) })
	return d
}

func TestNPUOpen(t *testing.T) {
	d := openNPU(t)
	free, total, err := d.GetMemInfo(acl.HBMMem)
	require.NoError(t, err)
	g, err := d.MemGetAllocationGranularity(prop(d.Device()), acl.GranularityRecommended)
	require.NoError(t, err)
	t.Logf("%s: %s, %s; HBM %d of %d bytes free; granularity %d", d.Name(), d.SocName(), d.Library(), free, total, g)
}

func TestNPUConformance(t *testing.T) {
	openNPU(t) // skip once, here, not in every subtest
	acltest.Run(t, acltest.Factory{Open: func(t testing.TB) acl.Driver { return openNPU(t) }})
}

func TestNPUArena(t *testing.T) {
	openNPU(t)
	arenatest.Run(t, func(t testing.TB, capacity uintptr) acl.Driver {
		return arenatest.Capped(openNPU(t), capacity)
	})
}
