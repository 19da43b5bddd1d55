package faultdriver_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
)

func newHost(t testing.TB, capacity uintptr) *host.Driver {
	t.Helper()
	d, err := host.New(host.Config{Capacity: capacity})
	require.NoError(t, err)
	return d
}

// With no rules the wrapper is the driver it wraps: it passes the suite.
func TestConformance(t *testing.T) {
	acltest.Run(t, acltest.Factory{
		Open: func(t testing.TB) acl.Driver { return faultdriver.New(newHost(t, 1<<30)) },
		OpenCapacity: func(t testing.TB, c uintptr) acl.Driver {
			return faultdriver.New(newHost(t, c))
		},
		ExactCodes: true,
	})
}

func prop() *acl.PhysicalMemProp { p := acl.DeviceProp(0, 0); return &p }

const g = acl.HugePageSize

func TestFailNth(t *testing.T) {
	d := faultdriver.New(newHost(t, 64<<20))
	defer d.Close()
	d.FailNth(faultdriver.MallocPhysical, 2, acl.ErrCodeRTDeviceOOM)
	h1, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	_, err = d.MallocPhysical(g, prop(), 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTDeviceOOM)
	require.ErrorIs(t, err, acl.ErrOutOfMemory)
	require.ErrorContains(t, err, faultdriver.InjectedMsg)
	h3, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err, "the rule fires once")
	assert.Equal(t, 2, d.Live().Handles, "the failed call was not forwarded")
	assert.EqualValues(t, 1, d.Injected(faultdriver.MallocPhysical))
	assert.EqualValues(t, 1, d.Injected(faultdriver.Any))
	assert.EqualValues(t, 3, d.Calls(faultdriver.MallocPhysical))
	require.NoError(t, d.FreePhysical(h1))
	require.NoError(t, d.FreePhysical(h3))
	assert.True(t, d.Live().Zero())
}

func TestFailAfter(t *testing.T) {
	d := faultdriver.New(newHost(t, 64<<20))
	defer d.Close()
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	d.FailAfter(faultdriver.Memset, 1, 0)
	h, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	require.NoError(t, d.Memset(base, 1, 16))
	for range 3 {
		acltest.RequireCode(t, d.Memset(base, 2, 16), faultdriver.DefaultCode(faultdriver.Memset))
	}
	d.Clear()
	require.NoError(t, d.Memset(base, 3, 16))
	assert.EqualValues(t, 3, d.Injected(faultdriver.Memset))
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
	assert.True(t, d.Live().Zero())
}

// Any counts calls of every kind; code 0 picks the failing call's default.
func TestFailAny(t *testing.T) {
	d := faultdriver.New(newHost(t, 64<<20))
	defer d.Close()
	d.FailNth(faultdriver.Any, 2, 0)
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	_, err = d.MallocPhysical(g, prop(), 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTMemoryAllocation)
	err = d.ReleaseMemAddress(base)
	require.NoError(t, err)
	assert.EqualValues(t, 1, d.Injected(faultdriver.MallocPhysical))
	assert.EqualValues(t, 3, d.Calls(faultdriver.Any))
}

func TestFailRandomIsReproducible(t *testing.T) {
	run := func() []bool {
		d := faultdriver.New(newHost(t, 64<<20))
		defer d.Close()
		d.FailRandom(faultdriver.GetMemInfo, 0.3, 42, 0)
		var failed []bool
		for range 200 {
			_, _, err := d.GetMemInfo(acl.HBMMem)
			failed = append(failed, err != nil)
		}
		n := d.Injected(faultdriver.GetMemInfo)
		assert.InDelta(t, 60, n, 25, "about 30%% of 200 calls fail")
		return failed
	}
	assert.Equal(t, run(), run())
}

func TestBadRules(t *testing.T) {
	d := faultdriver.New(newHost(t, 64<<20))
	defer d.Close()
	assert.Panics(t, func() { d.FailNth(faultdriver.MapMem, 0, 0) })
	assert.Panics(t, func() { d.FailAfter(faultdriver.MapMem, -1, 0) })
	assert.Panics(t, func() { d.FailRandom(faultdriver.MapMem, 1.5, 0, 0) })
	assert.Panics(t, func() { d.FailNth(faultdriver.Op(99), 1, 0) })
	assert.Panics(t, func() { faultdriver.New(nil) })
	assert.Equal(t, "aclrtMapMem", faultdriver.MapMem.String())
	assert.Equal(t, "fault(host)", d.Name())
	assert.Equal(t, len(faultdriver.Ops), int(faultdriver.FreeHost), "Ops lists every kind")
}

// The sharing calls forward, and fail by injection without effect: an
// export that failed can be made again.
func TestShareOps(t *testing.T) {
	d := faultdriver.New(newHost(t, 64<<20))
	defer d.Close()
	p := prop()
	p.HandleType = acl.MemHandleTypePOSIX
	h, err := d.MallocPhysical(g, p, 0)
	require.NoError(t, err)
	d.FailNth(faultdriver.MemExportToShareableHandle, 1, 0)
	_, err = d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTDrvInternal)
	s, err := d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, 0)
	require.NoError(t, err)
	d.FailNth(faultdriver.MemImportFromShareableHandle, 1, acl.ErrCodeRTMemoryAllocation)
	_, err = d.MemImportFromShareableHandle(s, 0)
	require.ErrorIs(t, err, acl.ErrOutOfMemory)
	_, err = d.MemImportFromShareableHandle(s, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTDrvInternal, "the exporter's own import, forwarded")
	d.FailNth(faultdriver.DeviceGetBareTgid, 1, 0)
	_, err = d.DeviceGetBareTgid()
	require.Error(t, err)
	pid, err := d.DeviceGetBareTgid()
	require.NoError(t, err)
	require.ErrorIs(t, d.MemSetPidToShareableHandle(s, []int32{pid}), acl.ErrNotSupported)
	assert.Equal(t, int64(3), d.Injected(faultdriver.Any))
	require.NoError(t, d.FreePhysical(h))
	assert.True(t, d.Live().Zero())
}

// The host memory calls forward, and fail by injection without effect.
func TestHostMemoryOps(t *testing.T) {
	d := faultdriver.New(newHost(t, 64<<20))
	defer d.Close()
	d.FailNth(faultdriver.MallocHost, 1, 0)
	_, err := d.MallocHost(4096)
	assert.ErrorIs(t, err, acl.ErrOutOfMemory)
	assert.Zero(t, d.Live().HostBuffers)
	b, err := d.MallocHost(4096)
	require.NoError(t, err)
	d.FailNth(faultdriver.FreeHost, 1, 0)
	assert.Error(t, d.FreeHost(b))
	assert.Equal(t, 1, d.Live().HostBuffers, "a failed free keeps the buffer")
	require.NoError(t, d.FreeHost(b))
	assert.Equal(t, "aclrtMallocHost", faultdriver.MallocHost.String())
}
