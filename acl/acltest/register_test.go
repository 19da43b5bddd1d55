package acltest_test

import (
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/internal/regtable"
	"github.com/vmarena/vmarena/internal/skip"
)

const g = acl.HugePageSize

func newHost(t testing.TB, cfg host.Config) acl.Driver {
	t.Helper()
	if cfg.Capacity == 0 {
		cfg.Capacity = 64 << 20
	}
	d, err := host.New(cfg)
	if err != nil && runtime.GOOS != "linux" {
		skip.Unsupported(t, "the host driver needs Linux: %v", err)
	}
	require.NoError(t, err)
	t.Cleanup(func() {
		require.True(t, d.Live().Zero(), "%+v", d.Live())
		require.NoError(t, d.Close())
	})
	return d
}

func hostProp() *acl.PhysicalMemProp { p := acl.DeviceProp(0, acl.HBMMemHuge); return &p }

// tableRegistrar is a correct registrar with no library behind it: the
// books every adapter keeps, and nothing else. The suite must pass on it.
type tableRegistrar struct {
	mu sync.Mutex
	t  regtable.Table
}

func (r *tableRegistrar) SetMemoryRange(base acl.DevicePtr, size uintptr) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.t.CheckSet("SetMemoryRange", base, size); err != nil {
		return err
	}
	r.t.Set(base, size)
	return nil
}

func (r *tableRegistrar) UnsetMemoryRange(base acl.DevicePtr) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.t.CheckUnset("UnsetMemoryRange", base); err != nil {
		return err
	}
	r.t.Unset(base)
	return nil
}

func (r *tableRegistrar) Register(m acl.Mapping) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.t.CheckRegister("Register", m); err != nil {
		return err
	}
	r.t.Register(m)
	return nil
}

func (r *tableRegistrar) Deregister(m acl.Mapping) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.t.CheckDeregister("Deregister", m); err != nil {
		return err
	}
	r.t.Deregister(m)
	return nil
}

func (r *tableRegistrar) held() acltest.RegistrationCounts {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, b := r.t.Mappings()
	return acltest.RegistrationCounts{Ranges: r.t.Ranges(), Mappings: n, Bytes: b}
}

func TestRunRegistrarOnTheBooks(t *testing.T) {
	acltest.RunRegistrar(t, acltest.RegistrarFactory{
		Driver: func(t testing.TB) acl.Driver { return newHost(t, host.Config{}) },
		Open:   func(testing.TB, acl.Driver) acl.Registrar { return &tableRegistrar{} },
		Held: func(_ testing.TB, r acl.Registrar) acltest.RegistrationCounts {
			return r.(*tableRegistrar).held()
		},
	})
}

// fixture is a reservation of four granules through the double, with a
// range set over it.
type fixture struct {
	r    *acltest.Registrations
	d    acl.Driver
	base acl.DevicePtr
}

func newFixture(t *testing.T, cfg host.Config, next acl.Registrar) *fixture {
	t.Helper()
	r := acltest.NewRegistrations(newHost(t, cfg), next)
	d := r.Driver()
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	require.NoError(t, r.SetMemoryRange(base, 4*g))
	return &fixture{r: r, d: d, base: base}
}

// mapAt maps a fresh chunk at the fixture's granule i, with access unless
// noAccess.
func (f *fixture) mapAt(t *testing.T, i uintptr, noAccess bool) acl.Mapping {
	t.Helper()
	h, err := f.d.MallocPhysical(g, hostProp(), 0)
	require.NoError(t, err)
	p := f.base.Add(i * g)
	require.NoError(t, f.d.MapMem(p, g, 0, h, 0))
	if !noAccess {
		require.NoError(t, f.d.MemSetAccess(p, g, acl.ReadWrite(0)))
	}
	return acl.Mapping{Ptr: p, Size: g, Handle: h}
}

func (f *fixture) unmapFree(t *testing.T, m acl.Mapping) {
	t.Helper()
	require.NoError(t, f.d.UnmapMem(m.Ptr))
	require.NoError(t, f.d.FreePhysical(m.Handle))
}

func (f *fixture) close(t *testing.T) {
	t.Helper()
	require.NoError(t, f.r.UnsetMemoryRange(f.base))
	require.NoError(t, f.d.ReleaseMemAddress(f.base))
}

// Every registrar call that would leave a registration over memory not
// mapped with access is refused, and recorded.
func TestRegistrationsRefuseWhatIsNotMapped(t *testing.T) {
	f := newFixture(t, host.Config{}, nil)
	m := f.mapAt(t, 0, true)
	unmapped := acl.Mapping{Ptr: f.base.Add(g), Size: g, Handle: m.Handle}

	acltest.RequireCode(t, f.r.Register(m), acl.ErrCodeRTParamInvalid, "Register before MemSetAccess")
	acltest.RequireCode(t, f.r.Register(unmapped), acl.ErrCodeRTParamInvalid, "Register of unmapped memory")
	acltest.RequireCode(t, f.r.Register(acl.Mapping{Ptr: m.Ptr, Size: g, Handle: m.Handle + 1}), acl.ErrCodeRTParamInvalid,
		"Register naming another handle")
	acltest.RequireCode(t, f.r.Register(acl.Mapping{Ptr: m.Ptr, Size: 2 * g, Handle: m.Handle}), acl.ErrCodeRTParamInvalid,
		"Register of more than the mapping")
	require.Len(t, f.r.Violations(), 4)
	require.Zero(t, f.r.Live().Mappings)

	require.NoError(t, f.d.MemSetAccess(m.Ptr, g, acl.ReadWrite(0)))
	require.NoError(t, f.r.Register(m))
	acltest.RequireCode(t, f.r.Register(m), acl.ErrCodeRTParamInvalid, "Register twice")
	require.NoError(t, f.r.Deregister(m))
	acltest.RequireCode(t, f.r.Deregister(m), acl.ErrCodeRTParamInvalid, "Deregister twice")
	f.unmapFree(t, m)
	f.close(t)
	require.Len(t, f.r.Violations(), 6)
	require.Error(t, f.r.Check())
}

// An unmap of a registered mapping, and a release of a set range, are
// forwarded (a device would do them) and recorded; Check reports them.
func TestRegistrationsRecordDriverViolations(t *testing.T) {
	f := newFixture(t, host.Config{}, nil)
	m := f.mapAt(t, 1, false)
	require.NoError(t, f.r.Register(m))
	require.NoError(t, f.r.Check())

	require.NoError(t, f.d.UnmapMem(m.Ptr), "the unmap is forwarded")
	require.Len(t, f.r.Violations(), 1)
	require.ErrorContains(t, f.r.Check(), "unmapped while registered")
	require.NoError(t, f.r.Deregister(m), "the late deregistration is accepted, so the books recover")
	require.NoError(t, f.d.FreePhysical(m.Handle))

	require.NoError(t, f.d.ReleaseMemAddress(f.base), "the release is forwarded")
	require.Len(t, f.r.Violations(), 2)
	require.ErrorContains(t, f.r.Check(), "released while the range")
	require.NoError(t, f.r.UnsetMemoryRange(f.base))
}

// At rest, a mapping inside a set range that is not registered is reported.
func TestRegistrationsCheckFindsUnregisteredMappings(t *testing.T) {
	f := newFixture(t, host.Config{}, nil)
	m := f.mapAt(t, 2, false)
	require.ErrorContains(t, f.r.Check(), "is not registered")
	require.Empty(t, f.r.Violations(), "a mapping not yet registered is no violation: Check reports it at rest")
	require.NoError(t, f.r.Register(m))
	require.NoError(t, f.r.Check())
	require.Equal(t, acltest.RegistrationCounts{Ranges: 1, Mappings: 1, Bytes: g}, f.r.Live())
	require.Equal(t, []acl.Mapping{m}, f.r.Registered())
	require.NoError(t, f.r.Deregister(m))
	f.unmapFree(t, m)
	f.close(t)
	require.NoError(t, f.r.Check())
	require.True(t, f.r.Live().Zero())
}

// On a runtime without aclrtMemSetAccess a mapping is accessible as made.
func TestRegistrationsWithoutSetAccess(t *testing.T) {
	f := newFixture(t, host.Config{NoSetAccess: true}, nil)
	m := f.mapAt(t, 0, true)
	require.ErrorIs(t, f.d.MemSetAccess(m.Ptr, g, acl.ReadWrite(0)), acl.ErrNotSupported)
	require.NoError(t, f.r.Register(m))
	require.NoError(t, f.r.Check())
	require.NoError(t, f.r.Deregister(m))
	f.unmapFree(t, m)
	f.close(t)
}

// refusing is a registrar whose library refuses the nth call of each kind.
type refusing struct {
	tableRegistrar
	fail map[string]bool
}

func (r *refusing) Register(m acl.Mapping) error {
	if r.fail["Register"] {
		return acl.NewError("Register", acl.ErrCodeRTFeatureNotSupport, "refused by the library")
	}
	return r.tableRegistrar.Register(m)
}

func (r *refusing) SetMemoryRange(base acl.DevicePtr, size uintptr) error {
	if r.fail["SetMemoryRange"] {
		return acl.NewError("SetMemoryRange", acl.ErrCodeRTFeatureNotSupport, "refused by the library")
	}
	return r.tableRegistrar.SetMemoryRange(base, size)
}

// A call the next registrar refuses is no violation, and is not recorded.
func TestRegistrationsForwardRefusals(t *testing.T) {
	next := &refusing{fail: map[string]bool{"Register": true}}
	f := newFixture(t, host.Config{}, next)
	m := f.mapAt(t, 0, false)
	require.ErrorIs(t, f.r.Register(m), acl.ErrNotSupported)
	require.Empty(t, f.r.Violations())
	require.Zero(t, f.r.Live().Mappings)
	require.Zero(t, next.held().Mappings)
	next.fail["Register"] = false
	require.NoError(t, f.r.Register(m))
	require.Equal(t, f.r.Live(), next.held())
	require.NoError(t, f.r.Deregister(m))
	f.unmapFree(t, m)
	f.close(t)

	next.fail["SetMemoryRange"] = true
	base, err := f.d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	require.ErrorIs(t, f.r.SetMemoryRange(base, g), acl.ErrNotSupported)
	require.Zero(t, f.r.Live().Ranges)
	require.NoError(t, f.d.ReleaseMemAddress(base))
	require.Empty(t, f.r.Violations())
}

// SetMemoryRange takes the base of a reservation made through the double,
// for at most its size.
func TestRegistrationsSetMemoryRangeChecks(t *testing.T) {
	r := acltest.NewRegistrations(newHost(t, host.Config{}), nil)
	d := r.Driver()
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	acltest.RequireCode(t, r.SetMemoryRange(base.Add(g), g), acl.ErrCodeRTParamInvalid, "inside a reservation")
	acltest.RequireCode(t, r.SetMemoryRange(base, 4*g), acl.ErrCodeRTParamInvalid, "past the reservation")
	require.NoError(t, r.SetMemoryRange(base, 2*g))
	require.NoError(t, r.UnsetMemoryRange(base))
	require.NoError(t, d.ReleaseMemAddress(base))
	require.Len(t, r.Violations(), 2)
	require.Equal(t, "registered(host)", d.Name())
}
