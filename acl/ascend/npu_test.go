package ascend_test

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
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
		return &budget{Driver: openNPU(t), capacity: capacity, sizes: map[acl.PhysicalHandle]uintptr{}}
	})
}

// budget gives a real device the capacity the arena suite asks for: a
// MallocPhysical past it fails with 207001, as the device would when full.
type budget struct {
	acl.Driver
	capacity uintptr

	mu    sync.Mutex
	used  uintptr
	sizes map[acl.PhysicalHandle]uintptr
}

func (b *budget) MallocPhysical(size uintptr, p *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+size > b.capacity {
		return 0, acl.Errorf("aclrtMallocPhysical", acl.ErrCodeRTMemoryAllocation, "test budget: %d of %d bytes in use",
			b.used, b.capacity)
	}
	h, err := b.Driver.MallocPhysical(size, p, flags)
	if err == nil {
		b.used += size
		b.sizes[h] = size
	}
	return h, err
}

func (b *budget) FreePhysical(h acl.PhysicalHandle) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.Driver.FreePhysical(h)
	if err == nil {
		b.used -= b.sizes[h]
		delete(b.sizes, h)
	}
	return err
}

func (b *budget) GetMemInfo(attr acl.MemAttr) (free, total uintptr, err error) {
	if _, _, err := b.Driver.GetMemInfo(attr); err != nil {
		return 0, 0, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.capacity - b.used, b.capacity, nil
}
