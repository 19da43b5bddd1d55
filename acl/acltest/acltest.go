// Package acltest is the conformance suite of the acl.Driver contract, in the
// manner of testing/fstest: a driver is correct when [Run] passes on it.
//
// Every driver runs it: the host driver, the ACL binding over its test double,
// the CUDA binding over its test double, and real hardware when present. A
// rule of the contract is tested here once, for all of them.
//
// Where ACL documents the exact error code, the suite checks the code. Where
// the code is not documented (docs/ascend.md lists which), it checks only that
// the call fails with an *acl.Error unless Factory.ExactCodes is set, so the
// suite stays true on a real NPU.
package acltest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/skip"
)

// Factory opens drivers for the suite.
type Factory struct {
	// Open returns a fresh driver for one test. The suite closes it.
	Open func(t testing.TB) acl.Driver
	// OpenCapacity returns a fresh driver whose device holds capacity bytes,
	// so that the suite can run it out of memory. It may be nil only on
	// Hardware, where those tests skip; a simulator without it fails them.
	OpenCapacity func(t testing.TB, capacity uintptr) acl.Driver
	// ExactCodes makes the suite check the codes the simulators choose where
	// ACL's are not documented. Leave it false on real hardware.
	ExactCodes bool
	// Launcher returns a way to queue stand-in device work on d, for the tests
	// of work in flight. nil means d itself, when it implements acl.Launcher
	// (the host driver, the device model). Only on Hardware may there be
	// none (no kernel can be launched from Go), and those tests skip; a
	// simulator without one fails them.
	Launcher func(d acl.Driver) acl.Launcher
	// Hardware says the drivers are a real device: what only a simulator can
	// do (limit the capacity, queue stand-in work) skips as a limit of the
	// device, where a simulator that cannot do it fails.
	Hardware bool
}

// A test of the suite that applies only to drivers with some capability:
// the suite runs it where the driver's Caps promise it, and does not list it
// elsewhere (a driver that promises nothing about fresh memory has nothing
// to check there).
type capTest struct {
	name  string
	fn    func(*testing.T, acl.Driver, Factory)
	needs func(acl.Caps) bool
}

// Run runs the conformance suite against the drivers f opens.
func Run(t *testing.T, f Factory) {
	tests := []capTest{
		{"Granularity", testGranularity, nil},
		{"MallocPhysicalChecks", testMallocChecks, nil},
		{"ReserveChecks", testReserveChecks, nil},
		{"MapRules", testMapRules, nil},
		{"UnmapRules", testUnmapRules, nil},
		{"ReleaseRules", testReleaseRules, nil},
		{"FreeRefcount", testFreeRefcount, nil},
		{"SetAccessRules", testSetAccess, nil},
		{"CopyRoundTrip", testCopy, nil},
		{"RemapKeepsData", testRemap, nil},
		{"HostMemory", testHostMemory, nil},
		{"HostMemoryConcurrent", testHostMemoryConcurrent, nil},
		{"GetMemInfo", testMemInfo, nil},
		{"Concurrent", testConcurrent, nil},
		{"Streams", testStreams, nil},
		{"Events", testEvents, nil},
		{"MemsetAsync", testMemsetAsync, nil},
		{"AccessSpan", testAccessSpan, nil},
		{"FreshMemory", testFresh, func(c acl.Caps) bool { return c.Fresh == acl.FreshZeroed }},
		{"WorkInFlight", testInFlight, nil},
		{"UnmapUnderWorkFaults", testUnmapFault, nil},
		{"CopyRacingWorkFaults", testCopyRaceFault, nil},
		{"ShareArgs", testShareArgs, nil},
		{"ShareExport", testShareExport, func(c acl.Caps) bool { return c.Sharing != acl.SharingNone }},
	}
	d := f.Open(t) // for its Caps, which say which tests apply
	require.NotNil(t, d)
	caps := d.Caps()
	require.NoError(t, d.Close())
	for _, tc := range tests {
		if tc.needs != nil && !tc.needs(caps) {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			d := open(t, f.Open)
			tc.fn(t, d, f)
		})
	}
	t.Run("OutOfMemory", func(t *testing.T) {
		if f.OpenCapacity == nil {
			simulatorOnly(t, f, "the factory cannot limit the device's capacity (Factory.OpenCapacity)")
		}
		testOOM(t, f)
	})
}

// simulatorOnly ends a test that needs what only a simulator can do: a skip
// on Hardware, a failure for a simulator whose factory does not provide it.
func simulatorOnly(t *testing.T, f Factory, what string) {
	t.Helper()
	if f.Hardware {
		skip.NoDevice(t, "%s: a real device", what)
	}
	t.Fatalf("%s, and Factory.Hardware is false: a simulator must provide it", what)
}

// open opens a driver and registers a cleanup that asserts nothing leaked.
func open(t *testing.T, fn func(testing.TB) acl.Driver) acl.Driver {
	t.Helper()
	d := fn(t)
	require.NotNil(t, d)
	t.Cleanup(func() {
		if c, ok := d.(acl.Counter); ok {
			assert.True(t, c.Live().Zero(), "driver %s leaked: %+v", d.Name(), c.Live())
		}
		assert.NoError(t, d.Close())
	})
	return d
}

// RequireCode asserts that err is an *acl.Error with the given code.
func RequireCode(t testing.TB, err error, code int32, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	var e *acl.Error
	require.True(t, errors.As(err, &e), "error %v is not an *acl.Error", err)
	require.Equal(t, acl.CodeName(code), acl.CodeName(e.Code), "%v", err)
}

// requireFail asserts err is an *acl.Error, with code when exact.
func requireFail(t testing.TB, f Factory, err error, code int32, what string) {
	t.Helper()
	if f.ExactCodes {
		RequireCode(t, err, code, what)
		return
	}
	require.Error(t, err, what)
	var e *acl.Error
	require.True(t, errors.As(err, &e), "%s: error %v is not an *acl.Error", what, err)
}

func prop(d acl.Driver) *acl.PhysicalMemProp {
	p := acl.DeviceProp(d.Device(), acl.HBMMemHuge)
	return &p
}

func granule(t testing.TB, d acl.Driver) uintptr {
	t.Helper()
	g, err := d.MemGetAllocationGranularity(prop(d), acl.GranularityMinimum)
	require.NoError(t, err)
	return g
}

// mapChunk allocates a granule and maps it at ptr with access.
func mapChunk(t testing.TB, d acl.Driver, ptr acl.DevicePtr, size uintptr) acl.PhysicalHandle {
	t.Helper()
	h, err := d.MallocPhysical(size, prop(d), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(ptr, size, 0, h, 0))
	setAccess(t, d, ptr, size)
	return h
}

func setAccess(t testing.TB, d acl.Driver, ptr acl.DevicePtr, size uintptr) {
	t.Helper()
	err := d.MemSetAccess(ptr, size, acl.ReadWrite(d.Device()))
	if errors.Is(err, acl.ErrNotSupported) {
		return // mappings are accessible without it on this runtime
	}
	require.NoError(t, err)
}

func unmapFree(t testing.TB, d acl.Driver, ptr acl.DevicePtr, h acl.PhysicalHandle) {
	t.Helper()
	require.NoError(t, d.UnmapMem(ptr))
	require.NoError(t, d.FreePhysical(h))
}

func reserve(t testing.TB, d acl.Driver, size uintptr) acl.DevicePtr {
	t.Helper()
	p, err := d.ReserveMemAddress(size, 0, 0, 0)
	require.NoError(t, err)
	require.NotZero(t, p)
	return p
}

func testGranularity(t *testing.T, d acl.Driver, f Factory) {
	minimum, err := d.MemGetAllocationGranularity(prop(d), acl.GranularityMinimum)
	require.NoError(t, err)
	recommended, err := d.MemGetAllocationGranularity(prop(d), acl.GranularityRecommended)
	require.NoError(t, err)
	if f.ExactCodes {
		// ACL answers 2 MiB for both (docs/acl.md, "Granularity"); so do the simulators.
		assert.Equal(t, uintptr(acl.HugePageSize), minimum)
		assert.Equal(t, uintptr(acl.HugePageSize), recommended)
	} else {
		require.NotZero(t, minimum)
		assert.Zero(t, recommended%minimum, "recommended %d is a multiple of minimum %d", recommended, minimum)
	}
	_, err = d.MemGetAllocationGranularity(nil, acl.GranularityMinimum)
	RequireCode(t, err, acl.ErrCodeInvalidParam)
	bad := prop(d)
	bad.MemAttr = acl.HBMMem // not a physical attribute
	_, err = d.MemGetAllocationGranularity(bad, acl.GranularityMinimum)
	RequireCode(t, err, acl.ErrCodeInvalidParam)
	assert.ErrorIs(t, err, acl.ErrInvalidParam)
}

func testMallocChecks(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	cases := []struct {
		name  string
		size  uintptr
		mod   func(*acl.PhysicalMemProp)
		flags uint64
		code  int32
	}{
		{"size0", 0, nil, 0, acl.ErrCodeInvalidParam},
		{"flags", g, nil, 1, acl.ErrCodeInvalidParam},
		{"handleType", g, func(p *acl.PhysicalMemProp) { p.HandleType = 7 }, 0, acl.ErrCodeInvalidParam},
		{"allocationType", g, func(p *acl.PhysicalMemProp) { p.AllocationType = 1 }, 0, acl.ErrCodeInvalidParam},
		{"managed", g, func(p *acl.PhysicalMemProp) { p.Location.Type = acl.MemLocationTypeManaged }, 0, acl.ErrCodeInvalidParam},
		{"ddrOnDevice", g, func(p *acl.PhysicalMemProp) { p.MemAttr = acl.DDRMemHuge }, 0, acl.ErrCodeInvalidParam},
		{"hbmMem", g, func(p *acl.PhysicalMemProp) { p.MemAttr = acl.HBMMem }, 0, acl.ErrCodeInvalidParam},
		{"device", g, func(p *acl.PhysicalMemProp) { p.Location.ID = 4096 }, 0, acl.ErrCodeRTInvalidDeviceID},
		// ACL's own checks come before the device's (and before this
		// module's exportable property is looked at).
		{"size0 before device", 0, func(p *acl.PhysicalMemProp) { p.Location.ID = 4096 }, 0, acl.ErrCodeInvalidParam},
		{"flags before device", g, func(p *acl.PhysicalMemProp) { p.Location.ID = 4096 }, 1, acl.ErrCodeInvalidParam},
		{"size0 before host location", 0, func(p *acl.PhysicalMemProp) { p.Location.Type = acl.MemLocationTypeHost }, 0, acl.ErrCodeInvalidParam},
		{"size0 exportable", 0, func(p *acl.PhysicalMemProp) { p.HandleType = acl.MemHandleTypePOSIX }, 0, acl.ErrCodeInvalidParam},
	}
	for _, tc := range cases {
		p := prop(d)
		if tc.mod != nil {
			tc.mod(p)
		}
		h, err := d.MallocPhysical(tc.size, p, tc.flags)
		RequireCode(t, err, tc.code, tc.name)
		assert.Zero(t, h, tc.name)
	}
	_, err := d.MallocPhysical(g, nil, 0)
	RequireCode(t, err, acl.ErrCodeInvalidParam, "nil prop")
	p := prop(d)
	p.Reserve = 1
	_, err = d.MallocPhysical(g, p, 0)
	requireFail(t, f, err, acl.ErrCodeRTParamInvalid, "reserve != 0")
	_, err = d.MallocPhysical(g+4096, prop(d), 0)
	requireFail(t, f, err, acl.ErrCodeRTParamInvalid, "unaligned size")
}

func testReserveChecks(t *testing.T, d acl.Driver, f Factory) {
	_, err := d.ReserveMemAddress(0, 0, 0, 0)
	RequireCode(t, err, acl.ErrCodeInvalidParam, "size 0")
	_, err = d.ReserveMemAddress(1<<30, 0, 0, 2)
	RequireCode(t, err, acl.ErrCodeInvalidParam, "flags 2")
	_, err = d.ReserveMemAddress(1<<30, 1<<21, 0, 0)
	requireFail(t, f, err, acl.ErrCodeRTParamInvalid, "alignment")
	_, err = d.ReserveMemAddress(acl.MaxReserve+acl.HugePageSize, 0, 0, 0)
	requireFail(t, f, err, acl.ErrCodeRTParamInvalid, "over 128 GiB")

	g := granule(t, d)
	for _, size := range []uintptr{g, 3 * g, 1 << 30, 4 << 30} {
		p := reserve(t, d, size)
		assert.Zero(t, uintptr(p)%g, "base %v of %d bytes not granule-aligned", p, size)
		require.NoError(t, d.ReleaseMemAddress(p))
	}
	// Reservations do not overlap.
	a, b := reserve(t, d, 8*g), reserve(t, d, 8*g)
	assert.True(t, a+acl.DevicePtr(8*g) <= b || b+acl.DevicePtr(8*g) <= a, "%v and %v overlap", a, b)
	require.NoError(t, d.ReleaseMemAddress(a))
	require.NoError(t, d.ReleaseMemAddress(b))
}

func testMapRules(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	base := reserve(t, d, 8*g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h, err := d.MallocPhysical(2*g, prop(d), 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreePhysical(h)) }()

	RequireCode(t, d.MapMem(0, 2*g, 0, h, 0), acl.ErrCodeInvalidParam, "NULL ptr")
	RequireCode(t, d.MapMem(base, 2*g, 0, 0, 0), acl.ErrCodeInvalidParam, "NULL handle")
	RequireCode(t, d.MapMem(base, 0, 0, h, 0), acl.ErrCodeInvalidParam, "size 0")
	RequireCode(t, d.MapMem(base, 2*g, 0, h, 1), acl.ErrCodeInvalidParam, "flags")
	requireFail(t, f, d.MapMem(base, 2*g, g, h, 0), acl.ErrCodeRTParamInvalid, "offset")
	requireFail(t, f, d.MapMem(base, g, 0, h, 0), acl.ErrCodeRTParamInvalid, "size smaller than the handle")
	requireFail(t, f, d.MapMem(base, 4*g, 0, h, 0), acl.ErrCodeRTParamInvalid, "size larger than the handle")
	requireFail(t, f, d.MapMem(base+4096, 2*g, 0, h, 0), acl.ErrCodeRTParamInvalid, "unaligned address")
	requireFail(t, f, d.MapMem(base+acl.DevicePtr(7*g), 2*g, 0, h, 0), acl.ErrCodeRTParamInvalid, "past the reservation")

	require.NoError(t, d.MapMem(base+acl.DevicePtr(2*g), 2*g, 0, h, 0))
	h2, err := d.MallocPhysical(2*g, prop(d), 0)
	require.NoError(t, err)
	requireFail(t, f, d.MapMem(base+acl.DevicePtr(2*g), 2*g, 0, h2, 0), acl.ErrCodeRTParamInvalid, "double map")
	requireFail(t, f, d.MapMem(base+acl.DevicePtr(3*g), 2*g, 0, h2, 0), acl.ErrCodeRTParamInvalid, "overlapping map")
	// A handle may be mapped in several places.
	require.NoError(t, d.MapMem(base+acl.DevicePtr(4*g), 2*g, 0, h2, 0))
	require.NoError(t, d.UnmapMem(base+acl.DevicePtr(4*g)))
	require.NoError(t, d.FreePhysical(h2))
	require.NoError(t, d.UnmapMem(base+acl.DevicePtr(2*g)))
	// A freed handle cannot be mapped.
	requireFail(t, f, d.MapMem(base, 2*g, 0, h2, 0), acl.ErrCodeRTInvalidHandle, "freed handle")
}

func testUnmapRules(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	base := reserve(t, d, 4*g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	RequireCode(t, d.UnmapMem(0), acl.ErrCodeInvalidParam, "NULL")
	requireFail(t, f, d.UnmapMem(base), acl.ErrCodeRTDrvInternal, "nothing mapped")
	h, err := d.MallocPhysical(2*g, prop(d), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, 2*g, 0, h, 0))
	requireFail(t, f, d.UnmapMem(base+acl.DevicePtr(g)), acl.ErrCodeRTDrvInternal, "inside a mapping")
	require.NoError(t, d.UnmapMem(base))
	requireFail(t, f, d.UnmapMem(base), acl.ErrCodeRTDrvInternal, "twice")
	require.NoError(t, d.FreePhysical(h))
}

func testReleaseRules(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	base := reserve(t, d, 4*g)
	RequireCode(t, d.ReleaseMemAddress(0), acl.ErrCodeInvalidParam, "NULL")
	requireFail(t, f, d.ReleaseMemAddress(base+acl.DevicePtr(g)), acl.ErrCodeRTParamInvalid, "not the base")
	h := mapChunk(t, d, base, g)
	requireFail(t, f, d.ReleaseMemAddress(base), acl.ErrCodeRTParamInvalid, "still mapped")
	unmapFree(t, d, base, h)
	require.NoError(t, d.ReleaseMemAddress(base))
	requireFail(t, f, d.ReleaseMemAddress(base), acl.ErrCodeRTParamInvalid, "twice")
}

func testFreeRefcount(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	RequireCode(t, d.FreePhysical(0), acl.ErrCodeInvalidParam, "NULL")
	base := reserve(t, d, 2*g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	// Free before unmap is legal: the mapping keeps the memory alive.
	h := mapChunk(t, d, base, g)
	require.NoError(t, d.MemcpyHtoD(base, []byte("still here")))
	require.NoError(t, d.FreePhysical(h))
	requireFail(t, f, d.FreePhysical(h), acl.ErrCodeRTParamInvalid, "free twice while mapped")
	got := make([]byte, 10)
	require.NoError(t, d.MemcpyDtoH(got, base))
	assert.Equal(t, "still here", string(got))
	require.NoError(t, d.UnmapMem(base))
	requireFail(t, f, d.FreePhysical(h), acl.ErrCodeRTInvalidHandle, "free after the last reference")
}

func testSetAccess(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	base := reserve(t, d, 4*g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h, err := d.MallocPhysical(2*g, prop(d), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, 2*g, 0, h, 0))
	defer unmapFree(t, d, base, h)
	err = d.MemSetAccess(base, 2*g, acl.ReadWrite(d.Device()))
	if errors.Is(err, acl.ErrNotSupported) {
		RequireCode(t, err, acl.ErrCodeRTFeatureNotSupport)
		return
	}
	require.NoError(t, err)
	requireFail(t, f, d.MemSetAccess(base, g, acl.ReadWrite(d.Device())), acl.ErrCodeRTParamInvalid, "part of a mapping")
	requireFail(t, f, d.MemSetAccess(base+acl.DevicePtr(2*g), 2*g, acl.ReadWrite(d.Device())), acl.ErrCodeRTParamInvalid, "unmapped")
	require.Error(t, d.MemSetAccess(base, 2*g, nil), "no descriptor")
	ro := acl.ReadWrite(d.Device())
	ro[0].Flags = acl.MemAccessRead
	if !d.Caps().ReadOnly {
		require.Error(t, d.MemSetAccess(base, 2*g, ro), "read-only is not supported")
		return
	}
	// A read-only mapping reads, refuses writes, and takes read-write again.
	require.NoError(t, d.MemcpyHtoD(base, []byte("before")))
	require.NoError(t, d.MemSetAccess(base, 2*g, ro))
	got := make([]byte, 6)
	require.NoError(t, d.MemcpyDtoH(got, base))
	assert.Equal(t, "before", string(got))
	requireFail(t, f, d.MemcpyHtoD(base, []byte("after")), acl.ErrCodeRTParamInvalid, "copy into a read-only mapping")
	requireFail(t, f, d.Memset(base, 0, g), acl.ErrCodeRTParamInvalid, "memset of a read-only mapping")
	require.NoError(t, d.MemSetAccess(base, 2*g, acl.ReadWrite(d.Device())))
	require.NoError(t, d.MemcpyHtoD(base, []byte("after")))
}

func testCopy(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	base := reserve(t, d, 4*g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h1 := mapChunk(t, d, base, g)
	h2 := mapChunk(t, d, base+acl.DevicePtr(g), g)
	defer unmapFree(t, d, base, h1)
	defer unmapFree(t, d, base+acl.DevicePtr(g), h2)

	// A copy may span adjacent mappings.
	src := make([]byte, g)
	for i := range src {
		src[i] = byte(i*7 + i>>12)
	}
	at := base + acl.DevicePtr(g/2)
	require.NoError(t, d.MemcpyHtoD(at, src))
	dst := make([]byte, g)
	require.NoError(t, d.MemcpyDtoH(dst, at))
	require.True(t, bytes.Equal(src, dst), "round trip differs")

	require.NoError(t, d.MemcpyDtoD(base, at, 4096))
	small := make([]byte, 4096)
	require.NoError(t, d.MemcpyDtoH(small, base))
	require.Equal(t, src[:4096], small)

	require.NoError(t, d.Memset(base, 0xAB, 100))
	require.NoError(t, d.MemcpyDtoH(small[:100], base))
	require.Equal(t, bytes.Repeat([]byte{0xAB}, 100), small[:100])

	require.NoError(t, d.MemcpyHtoD(base, nil), "empty copy")
	require.Error(t, d.MemcpyHtoD(base+acl.DevicePtr(2*g), src[:1]), "copy into unmapped memory")
	require.Error(t, d.MemcpyDtoH(dst, base+acl.DevicePtr(g+g/2)), "copy out past the mapped range")
}

func testRemap(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	base := reserve(t, d, 2*g)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h := mapChunk(t, d, base, g)
	require.NoError(t, d.MemcpyHtoD(base, []byte("kept")))
	require.NoError(t, d.UnmapMem(base))
	// The same handle mapped elsewhere in the range shows the same memory.
	require.NoError(t, d.MapMem(base+acl.DevicePtr(g), g, 0, h, 0))
	setAccess(t, d, base+acl.DevicePtr(g), g)
	got := make([]byte, 4)
	require.NoError(t, d.MemcpyDtoH(got, base+acl.DevicePtr(g)))
	assert.Equal(t, "kept", string(got))
	unmapFree(t, d, base+acl.DevicePtr(g), h)
}

func testMemInfo(t *testing.T, d acl.Driver, f Factory) {
	free, total, err := d.GetMemInfo(acl.HBMMem)
	require.NoError(t, err)
	require.LessOrEqual(t, free, total)
	require.NotZero(t, total)
	if f.OpenCapacity == nil {
		return // a real device has other users; free memory moves on its own
	}
	g := granule(t, d)
	h, err := d.MallocPhysical(4*g, prop(d), 0)
	require.NoError(t, err)
	free2, _, err := d.GetMemInfo(acl.HBMMem)
	require.NoError(t, err)
	assert.Equal(t, free-4*g, free2)
	require.NoError(t, d.FreePhysical(h))
	free3, _, err := d.GetMemInfo(acl.HBMMem)
	require.NoError(t, err)
	assert.Equal(t, free, free3)
}

func testOOM(t *testing.T, f Factory) {
	d := open(t, func(t testing.TB) acl.Driver { return f.OpenCapacity(t, 8*acl.HugePageSize) })
	g := granule(t, d)
	var hs []acl.PhysicalHandle
	for range 8 {
		h, err := d.MallocPhysical(g, prop(d), 0)
		require.NoError(t, err)
		hs = append(hs, h)
	}
	_, err := d.MallocPhysical(g, prop(d), 0)
	RequireCode(t, err, acl.ErrCodeRTMemoryAllocation)
	require.ErrorIs(t, err, acl.ErrOutOfMemory)
	require.NoError(t, d.FreePhysical(hs[0]))
	h, err := d.MallocPhysical(g, prop(d), 0)
	require.NoError(t, err, "memory came back after FreePhysical")
	hs[0] = h
	for _, h := range hs {
		require.NoError(t, d.FreePhysical(h))
	}
}

// testConcurrent runs the whole lifecycle from many goroutines at once.
func testConcurrent(t *testing.T, d acl.Driver, f Factory) {
	g := granule(t, d)
	const workers, rounds = 8, 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- lifecycle(d, g, w, rounds)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

func lifecycle(d acl.Driver, g uintptr, w, rounds int) error {
	p := prop(d)
	for r := range rounds {
		base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
		if err != nil {
			return err
		}
		var hs []acl.PhysicalHandle
		for i := range 3 {
			h, err := d.MallocPhysical(g, p, 0)
			if err != nil {
				return err
			}
			hs = append(hs, h)
			at := base + acl.DevicePtr(uintptr(i)*g)
			if err := d.MapMem(at, g, 0, h, 0); err != nil {
				return err
			}
			if err := d.MemSetAccess(at, g, acl.ReadWrite(d.Device())); err != nil && !errors.Is(err, acl.ErrNotSupported) {
				return err
			}
		}
		msg := []byte(fmt.Sprintf("worker %d round %d", w, r))
		at := base + acl.DevicePtr(g-4)
		if err := d.MemcpyHtoD(at, msg); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if err := d.MemcpyDtoH(got, at); err != nil {
			return err
		}
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("worker %d round %d: read %q", w, r, got)
		}
		for i, h := range hs {
			if err := d.UnmapMem(base + acl.DevicePtr(uintptr(i)*g)); err != nil {
				return err
			}
			if err := d.FreePhysical(h); err != nil {
				return err
			}
		}
		if err := d.ReleaseMemAddress(base); err != nil {
			return err
		}
	}
	return nil
}

// RequireHandleReuse asserts that d hands a freed physical handle's value
// out again, the value freed last first, as a device runtime's heap does
// with the record behind a handle. The simulated devices (the host driver,
// the model, the C doubles) do, so that code keeping books by handle value
// in the wrong order (a value dropped from its books after the free that
// made it reusable) fails over them too. Real runtimes may or may not: this
// is not part of the contract Run checks.
func RequireHandleReuse(t testing.TB, d acl.Driver) {
	t.Helper()
	p := acl.DeviceProp(d.Device(), 0)
	g, err := d.MemGetAllocationGranularity(&p, acl.GranularityMinimum)
	require.NoError(t, err)
	malloc := func() acl.PhysicalHandle {
		t.Helper()
		h, err := d.MallocPhysical(g, &p, 0)
		require.NoError(t, err)
		return h
	}
	h1, h2 := malloc(), malloc()
	require.NotEqual(t, h1, h2)
	require.NoError(t, d.FreePhysical(h1))
	require.NoError(t, d.FreePhysical(h2))
	h3 := malloc()
	require.Equal(t, h2, h3, "the value freed last comes back first")
	h4 := malloc()
	require.Equal(t, h1, h4)
	require.NoError(t, d.FreePhysical(h3))
	require.NoError(t, d.FreePhysical(h4))
	RequireCode(t, d.FreePhysical(h4), acl.ErrCodeRTInvalidHandle, "freed, and not handed out again since")
}
