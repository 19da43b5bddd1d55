package host_test

import (
	"bufio"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
)

func newHost(t testing.TB, cfg host.Config) *host.Driver {
	t.Helper()
	d, err := host.New(cfg)
	require.NoError(t, err)
	return d
}

func TestConformance(t *testing.T) {
	acltest.Run(t, acltest.Factory{
		Open: func(t testing.TB) acl.Driver { return newHost(t, host.Config{Capacity: 1 << 30}) },
		OpenCapacity: func(t testing.TB, c uintptr) acl.Driver {
			return newHost(t, host.Config{Capacity: c})
		},
		ExactCodes: true,
	})
}

func TestConformanceNoSetAccess(t *testing.T) {
	acltest.Run(t, acltest.Factory{
		Open: func(t testing.TB) acl.Driver {
			return newHost(t, host.Config{Capacity: 1 << 30, NoSetAccess: true})
		},
		OpenCapacity: func(t testing.TB, c uintptr) acl.Driver {
			return newHost(t, host.Config{Capacity: c, NoSetAccess: true})
		},
		ExactCodes: true,
	})
}

const g = acl.HugePageSize

func prop() *acl.PhysicalMemProp { p := acl.DeviceProp(0, 0); return &p }

// A mapping has no access until MemSetAccess: touching it faults.
func TestAccessNeedsSetAccess(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 64 << 20})
	defer d.Close()
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	acltest.RequireCode(t, d.MemcpyHtoD(base, []byte{1}), acl.ErrCodeRTParamInvalid)
	_, err = d.Bytes(base, 1)
	require.Error(t, err)
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	b, err := d.Bytes(base, g)
	require.NoError(t, err)
	b[0] = 42 // the memory is really there
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
	require.True(t, d.Live().Zero(), "%+v", d.Live())
}

// Touching memory after UnmapMem faults instead of reading stale data: the
// range is inaccessible reserved space again.
func TestUnmappedFaults(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 64 << 20})
	defer d.Close()
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	defer d.ReleaseMemAddress(base)
	h, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	b, err := d.Bytes(base, g)
	require.NoError(t, err)
	b[100] = 7
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.True(t, acltest.ReadFaults(b, 100), "read of an unmapped range did not fault")
	require.True(t, acltest.WriteFaults(b, 5), "write to an unmapped range did not fault")
}

func countMaps(t testing.TB) int {
	f, err := os.Open("/proc/self/maps")
	require.NoError(t, err)
	defer f.Close()
	n := 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		n++
	}
	return n
}

// Chunks mapped one after another merge into one kernel VMA, and the
// driver's count of VMAs agrees with the kernel's.
func TestMappingsMerge(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 512 << 20})
	defer d.Close()
	const n = 128
	before := countMaps(t)
	base, err := d.ReserveMemAddress(2*n*g, 0, 0, 0)
	require.NoError(t, err)
	hs := make([]acl.PhysicalHandle, n)
	for i := range hs {
		hs[i], err = d.MallocPhysical(g, prop(), 0)
		require.NoError(t, err)
		at := base + acl.DevicePtr(i*g)
		require.NoError(t, d.MapMem(at, g, 0, hs[i], 0))
		require.NoError(t, d.MemSetAccess(at, g, acl.ReadWrite(0)))
	}
	now, _ := d.VMAs()
	assert.Equal(t, 2, now, "one merged mapping plus the reserved tail")
	// Allow a little slack for memory the Go runtime maps meanwhile.
	assert.InDelta(t, before+now, countMaps(t), 4)

	// Unmapping one chunk in the middle splits the run: run, gap, run, tail.
	require.NoError(t, d.UnmapMem(base+acl.DevicePtr(10*g)))
	now, _ = d.VMAs()
	assert.Equal(t, 4, now)
	assert.InDelta(t, before+now, countMaps(t), 4)
	for i, h := range hs {
		if i != 10 {
			require.NoError(t, d.UnmapMem(base+acl.DevicePtr(i*g)))
		}
		require.NoError(t, d.FreePhysical(h))
	}
	now, peak := d.VMAs()
	assert.Equal(t, 1, now)
	assert.GreaterOrEqual(t, peak, 4)
	require.NoError(t, d.ReleaseMemAddress(base))
	require.True(t, d.Live().Zero())
}

// The driver refuses a mapping that would pass its VMA budget, with 207005.
func TestMapLimit(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 64 << 20, MapLimit: 4})
	defer d.Close()
	base, err := d.ReserveMemAddress(16*g, 0, 0, 0)
	require.NoError(t, err)
	var hs []acl.PhysicalHandle
	// Mappings two granules apart cannot merge: each costs a VMA and a gap.
	for i := 0; ; i += 2 {
		h, err := d.MallocPhysical(g, prop(), 0)
		require.NoError(t, err)
		err = d.MapMem(base+acl.DevicePtr(i*g), g, 0, h, 0)
		if err != nil {
			acltest.RequireCode(t, err, acl.ErrCodeRTResourceAllocFail)
			require.NoError(t, d.FreePhysical(h))
			break
		}
		hs = append(hs, h)
	}
	now, _ := d.VMAs()
	assert.LessOrEqual(t, now, 4)
	for i, h := range hs {
		require.NoError(t, d.UnmapMem(base+acl.DevicePtr(2*i*g)))
		require.NoError(t, d.FreePhysical(h))
	}
	require.NoError(t, d.ReleaseMemAddress(base))
}

func TestHuge1G(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 2 << 30})
	defer d.Close()
	p := acl.DeviceProp(0, acl.HBMMemHuge1G)
	gr, err := d.MemGetAllocationGranularity(&p, acl.GranularityRecommended)
	require.NoError(t, err)
	assert.Equal(t, uintptr(1<<30), gr)
	base, err := d.ReserveMemAddress(2<<30, 0, 0, 0)
	require.NoError(t, err)
	assert.Zero(t, uintptr(base)%(1<<30), "a 2 GiB reservation is 1 GiB-aligned")
	h, err := d.MallocPhysical(g, &p, 0) // rounded up to 1 GiB
	require.NoError(t, err)
	assert.Equal(t, uintptr(1<<30), d.Live().PhysicalBytes)
	acltest.RequireCode(t, d.MapMem(base+g, 1<<30, 0, h, 0), acl.ErrCodeRTParamInvalid) // not 1 GiB-aligned
	require.NoError(t, d.MapMem(base, 1<<30, 0, h, 0))
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
}

func TestCloseReportsLeaks(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 64 << 20})
	_, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	err = d.Close()
	require.ErrorContains(t, err, "still live")
	require.NoError(t, d.Close(), "second Close")
	_, err = d.MallocPhysical(g, prop(), 0)
	require.Error(t, err, "use after Close")
}

func TestDefault(t *testing.T) {
	d, err := host.Default()
	require.NoError(t, err)
	d2, _ := host.Default()
	require.Same(t, d, d2)
	require.NoError(t, d.Close())
	_, total, err := d.GetMemInfo(acl.HBMMem)
	require.NoError(t, err, "Close on the default driver does nothing")
	require.NotZero(t, total)
}

func TestBadConfig(t *testing.T) {
	_, err := host.New(host.Config{MapLimit: -1})
	require.ErrorIs(t, err, acl.ErrInvalidParam)
}

func TestCaps(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 8 << 20})
	defer d.Close()
	require.Equal(t, acl.Caps{Fresh: acl.FreshZeroed, Sharing: acl.SharingFD, ReadOnly: true, MaxReserve: acl.MaxReserve}, d.Caps(),
		"zeroed pages; one mapping per access call, as ACL documents; descriptors shared; read-only mappings")
	require.Equal(t, d.Caps(), faultdriver.New(d).Caps(), "seen through a wrapper")
	span := newHost(t, host.Config{Capacity: 8 << 20, AccessSpan: true})
	defer span.Close()
	require.True(t, span.Caps().AccessSpan)
}

func TestConformanceAccessSpan(t *testing.T) {
	acltest.Run(t, acltest.Factory{
		Open: func(t testing.TB) acl.Driver {
			return newHost(t, host.Config{Capacity: 1 << 30, AccessSpan: true})
		},
		OpenCapacity: func(t testing.TB, c uintptr) acl.Driver {
			return newHost(t, host.Config{Capacity: c, AccessSpan: true})
		},
		ExactCodes: true,
	})
}

// Freed handle values come back, as a device runtime's do.
func TestReusesFreedHandles(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 64 << 20})
	defer d.Close()
	acltest.RequireHandleReuse(t, d)
}
