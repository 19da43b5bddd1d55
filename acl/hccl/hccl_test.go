//go:build linux && (amd64 || arm64)

package hccl_test

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/acl/hccl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/internal/cdouble"
)

const g = acl.HugePageSize

func hostDriver(t testing.TB) acl.Driver {
	t.Helper()
	d, err := host.New(host.Config{Capacity: 256 << 20})
	require.NoError(t, err)
	return d
}

// The registrar suite, on the host driver, with the double's books as what
// HCCL holds: the whole protocol, no padding, refusals that leave HCCL as it
// was, and registrations from several goroutines.
func TestRegistrarConformance(t *testing.T) {
	fakes := sync.Map{} // *hccl.Registrar → *fake
	acltest.RunRegistrar(t, acltest.RegistrarFactory{
		Driver: hostDriver,
		Open: func(t testing.TB, d acl.Driver) acl.Registrar {
			f := newFake(t, "full")
			r := f.registrar(t, nil)
			fakes.Store(r, f)
			return r
		},
		Held: func(t testing.TB, r acl.Registrar) acltest.RegistrationCounts {
			f, _ := fakes.Load(r)
			return f.(*fake).held()
		},
		Align: hccl.RemoteAlign,
	})
}

// The same suite on the ACL binding over its own double: HCCL gets the ACL
// runtime's physical handles, and is called inside the driver's Bind.
func TestRegistrarOnTheACLBinding(t *testing.T) {
	fakes := sync.Map{}
	acltest.RunRegistrar(t, acltest.RegistrarFactory{
		Driver: func(t testing.TB) acl.Driver {
			d, err := ascend.Open(ascend.Config{Library: doubles.Instance(t, "fakeacl", "libascendcl.so")})
			require.NoError(t, err)
			return d
		},
		Open: func(t testing.TB, d acl.Driver) acl.Registrar {
			f := newFake(t, "full")
			r := f.registrar(t, d.(acl.Binder))
			fakes.Store(r, f)
			return r
		},
		Held: func(t testing.TB, r acl.Registrar) acltest.RegistrationCounts {
			f, _ := fakes.Load(r)
			return f.(*fake).held()
		},
		Align: hccl.RemoteAlign,
	})
}

// A set range and an activated chunk, on the double and in the registrar.
type fixture struct {
	f    *fake
	r    *hccl.Registrar
	base acl.DevicePtr
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := newFake(t, "full")
	r := f.registrar(t, nil)
	base := acl.DevicePtr(0x7f0000000000)
	require.NoError(t, r.SetMemoryRange(base, 8*g))
	t.Cleanup(func() { require.NoError(t, r.UnsetMemoryRange(base)) })
	return &fixture{f: f, r: r, base: base}
}

func (x *fixture) mapping(i uintptr) acl.Mapping {
	return acl.Mapping{Ptr: x.base.Add(i * g), Size: g, Handle: acl.PhysicalHandle(0x5000 + i)}
}

// regLive is what a registrar's Live reports.
type regLive struct {
	ranges, maps int
	bytes        uintptr
}

func liveOf(r *hccl.Registrar) regLive {
	ranges, maps, bytes := r.Live()
	return regLive{ranges, maps, bytes}
}

// requireUnchanged asserts the registrar and the double hold what they did.
func requireUnchanged(t testing.TB, x *fixture, before regLive, l live, what string) {
	t.Helper()
	require.Equal(t, before, liveOf(x.r), what)
	require.Equal(t, l, x.f.live(), what)
}

// Every HCCL call failing returns its typed error, classed by the acl
// sentinels, and changes nothing: not the registrar's books, not HCCL's. The
// same call then succeeds.
func TestFailedCallsChangeNothing(t *testing.T) {
	x := newFixture(t)
	m := x.mapping(1)
	cases := []struct {
		fn     string
		result hccl.Result
		is     error
		call   func() error
	}{
		{"HcclCommActivateCommMemory", hccl.ErrRuntime, nil, func() error { return x.r.Register(m) }},
		{"HcclCommDeactivateCommMemory", hccl.ErrPara, acl.ErrInvalidParam, func() error { return x.r.Deregister(m) }},
		{"HcclCommActivateCommMemory", hccl.ErrTCPTransfer, nil, func() error { return x.r.Register(m) }},
		{"HcclCommSetMemoryRange", hccl.ErrNotSupport, acl.ErrNotSupported, func() error { return x.r.SetMemoryRange(x.base.Add(64*g), g) }},
		{"HcclCommUnsetMemoryRange", hccl.ErrMemory, acl.ErrOutOfMemory, func() error { return x.r.UnsetMemoryRange(x.base.Add(64 * g)) }},
	}
	for _, c := range cases {
		before, l := liveOf(x.r), x.f.live()
		x.f.fail(t, c.fn, 1, c.result)
		err := c.call()
		var he *hccl.Error
		require.True(t, errors.As(err, &he), "%s: %v is not an *hccl.Error", c.fn, err)
		require.Equal(t, c.fn, he.Func)
		require.Equal(t, c.result, he.Result)
		var ae *acl.Error
		require.True(t, errors.As(err, &ae))
		require.Equal(t, hccl.ACLCode(c.result), ae.Code)
		if c.is != nil {
			require.ErrorIs(t, err, c.is)
		}
		requireUnchanged(t, x, before, l, c.fn+" failing")
		require.NoError(t, c.call(), "%s again", c.fn)
	}
	require.NoError(t, x.r.Deregister(m))
}

// The refusals the registrar makes itself never reach HCCL.
func TestRefusalsDoNotReachHCCL(t *testing.T) {
	x := newFixture(t)
	require.NoError(t, x.r.Register(x.mapping(0)))
	defer func() { require.NoError(t, x.r.Deregister(x.mapping(0))) }()
	fns := []string{"HcclCommSetMemoryRange", "HcclCommUnsetMemoryRange", "HcclCommActivateCommMemory", "HcclCommDeactivateCommMemory"}
	calls := map[string]int64{}
	for _, fn := range fns {
		calls[fn] = x.f.calls(t, fn)
	}
	for _, err := range []error{
		x.r.SetMemoryRange(x.base.Add(4*g), 8*g),                                           // overlaps
		x.r.SetMemoryRange(x.base.Add(64*g+4096), 8*g),                                     // misaligned base
		x.r.SetMemoryRange(x.base.Add(64*g), 8*g+4096),                                     // misaligned length
		x.r.UnsetMemoryRange(x.base),                                                       // still activated
		x.r.Register(x.mapping(0)),                                                         // twice
		x.r.Register(acl.Mapping{Ptr: x.base.Add(g + 4096), Size: g, Handle: 1}),           // misaligned
		x.r.Register(acl.Mapping{Ptr: x.base.Add(7 * g), Size: 2 * g, Handle: 1}),          // past the range
		x.r.Deregister(acl.Mapping{Ptr: x.base, Size: 2 * g, Handle: x.mapping(0).Handle}), // not as activated
		x.r.Deregister(x.mapping(3)),                                                       // never activated
	} {
		require.ErrorIs(t, err, acl.ErrInvalidParam)
		var he *hccl.Error
		require.False(t, errors.As(err, &he), "refused by the registrar, not by HCCL: %v", err)
	}
	for _, fn := range fns {
		require.Equal(t, calls[fn], x.f.calls(t, fn), "%s was not called", fn)
	}
}

// The double's own rules, called through the raw binding: it is as strict
// as HCCL where the source says so, and stricter (alignment) where the
// header of fakehccl.c says so.
func TestDoubleRules(t *testing.T) {
	f := newFake(t, "full")
	lib := f.lib
	c := f.comm(t, 8)
	base := acl.DevicePtr(0x7f0000000000)
	code := func(err error) hccl.Result {
		var he *hccl.Error
		if err == nil {
			return hccl.Success
		}
		require.True(t, errors.As(err, &he), "%v", err)
		return he.Result
	}
	require.Equal(t, hccl.ErrPara, code(lib.ActivateCommMemory(c, base, g, 0, 1, 0)), "no range ever set on this communicator")
	require.Equal(t, hccl.ErrPtr, code(lib.SetMemoryRange(0, base, g, 0, 0)), "NULL communicator")
	require.Equal(t, hccl.ErrPtr, code(lib.SetMemoryRange(c, 0, g, 0, 0)), "NULL base")
	require.Equal(t, hccl.ErrPara, code(lib.SetMemoryRange(c, base, g, 4096, 0)), "alignment must be 0")
	require.Equal(t, hccl.ErrPara, code(lib.SetMemoryRange(c, base, g, 0, 1)), "flags must be 0")
	require.Equal(t, hccl.ErrPara, code(lib.SetMemoryRange(c, base, 0, 0, 0)), "size 0")
	require.NoError(t, lib.SetMemoryRange(c, base, 8*g, 0, 0))
	require.Equal(t, hccl.ErrPara, code(lib.SetMemoryRange(c, base.Add(4*g), 8*g, 0, 0)), "overlap")

	require.Equal(t, hccl.ErrPtr, code(lib.ActivateCommMemory(c, base, g, 0, 0, 0)), "NULL handle")
	require.Equal(t, hccl.ErrPara, code(lib.ActivateCommMemory(c, base, g, g, 1, 0)), "offset must be 0")
	require.Equal(t, hccl.ErrPara, code(lib.ActivateCommMemory(c, base.Add(8*g), g, 0, 1, 0)), "outside the range")
	require.Equal(t, hccl.ErrPara, code(lib.ActivateCommMemory(c, base.Add(g/2), g, 0, 1, 0)), "not in whole 2 MiB pages")
	require.NoError(t, lib.ActivateCommMemory(c, base, 2*g, 0, 1, 0))
	require.Equal(t, hccl.ErrPara, code(lib.ActivateCommMemory(c, base.Add(g), 2*g, 0, 2, 0)), "overlaps activated memory")
	var size uintptr
	require.Equal(t, uintptr(1), f.active(uintptr(base), &size))
	require.Equal(t, uintptr(2*g), size)
	require.Equal(t, hccl.ErrPara, code(lib.DeactivateCommMemory(c, base.Add(g))), "part of a block")
	require.Equal(t, hccl.ErrPara, code(lib.UnsetMemoryRange(c, base)), "memory still activated")
	require.Equal(t, hccl.ErrPara, code(lib.UnsetMemoryRange(c, base.Add(g))), "not a set base")

	// The books are the process's: another communicator sees them.
	c2 := f.comm(t, 4)
	require.NoError(t, lib.SetMemoryRange(c2, base.Add(64*g), g, 0, 0))
	require.Equal(t, hccl.ErrPara, code(lib.SetMemoryRange(c2, base, g, 0, 0)), "set by the other communicator")
	require.NoError(t, lib.UnsetMemoryRange(c2, base.Add(64*g)))

	require.NoError(t, lib.DeactivateCommMemory(c, base))
	require.Equal(t, hccl.ErrPara, code(lib.DeactivateCommMemory(c, base)), "twice")
	require.NoError(t, lib.UnsetMemoryRange(c, base))
	require.Equal(t, live{Comms: 2, Exported: 1}, f.live())

	// One rank: HCCL accepts everything and does nothing.
	one := f.comm(t, 1)
	require.NoError(t, lib.SetMemoryRange(one, base, g, 0, 0))
	require.NoError(t, lib.ActivateCommMemory(one, base.Add(g/2), 5, 0, 1, 0))
	require.NoError(t, lib.DeactivateCommMemory(one, base))
	require.NoError(t, lib.UnsetMemoryRange(one, base))
	require.Equal(t, live{Comms: 3, Exported: 1}, f.live())
}

// A chip without zero-copy answers HCCL_E_NOT_SUPPORT, which the registrar
// reports as acl.ErrNotSupported.
func TestNoZeroCopyOnTheChip(t *testing.T) {
	f := newFake(t, "full")
	f.set(t, "zero_copy", 0)
	r := f.registrar(t, nil)
	err := r.SetMemoryRange(0x7f0000000000, g)
	require.ErrorIs(t, err, acl.ErrNotSupported)
	ranges, _, _ := r.Live()
	require.Zero(t, ranges)
}

// With the export_once knob the double refuses a handle activated before,
// as it would if the runtime refused a second export: the registrar reports
// HCCL's error and keeps the chunk unregistered, so the caller can undo its
// map.
func TestSecondActivationOfAHandle(t *testing.T) {
	x := newFixture(t)
	x.f.set(t, "export_once", 1)
	m := x.mapping(2)
	require.NoError(t, x.r.Register(m))
	require.NoError(t, x.r.Deregister(m))
	err := x.r.Register(m)
	var he *hccl.Error
	require.True(t, errors.As(err, &he), "%v", err)
	require.Equal(t, hccl.ErrRuntime, he.Result)
	_, n, _ := x.r.Live()
	require.Zero(t, n)
}

// Close undoes what the caller leaked, says so, and refuses later calls.
func TestRegistrarClose(t *testing.T) {
	f := newFake(t, "full")
	r, err := hccl.NewRegistrar(f.lib, f.comm(t, 2), nil)
	require.NoError(t, err)
	base := acl.DevicePtr(0x7f0000000000)
	require.NoError(t, r.SetMemoryRange(base, 4*g))
	require.NoError(t, r.Register(acl.Mapping{Ptr: base, Size: g, Handle: 7}))
	err = r.Close()
	require.ErrorContains(t, err, "1 registered mappings and 1 set ranges")
	require.Equal(t, live{Comms: 1, Exported: 1}, f.live(), "Close deactivated and unset them")
	require.NoError(t, r.Close(), "twice")
	acltest.RequireCode(t, r.Register(acl.Mapping{Ptr: base, Size: g, Handle: 7}), acl.ErrCodeRTContextNull)
}

// Opening: a library without the zero-copy calls loads, and only they fail;
// one without a required call does not load; none at all is ErrNotSupported
// naming where the search looked.
func TestOpen(t *testing.T) {
	old := newFake(t, "nozerocopy")
	require.ErrorIs(t, old.lib.ZeroCopy(), acl.ErrNotSupported)
	require.ErrorContains(t, old.lib.ZeroCopy(), "HcclCommActivateCommMemory")
	_, err := hccl.NewRegistrar(old.lib, 1, nil)
	require.ErrorIs(t, err, acl.ErrNotSupported)
	require.ErrorIs(t, old.lib.ActivateCommMemory(1, 0x1000, g, 0, 1, 0), acl.ErrNotSupported)

	bad := doubles.Instance(t, "nocomm", "libhccl.so")
	_, err = hccl.Open(hccl.Config{Library: bad})
	require.ErrorIs(t, err, acl.ErrNotSupported)
	require.ErrorContains(t, err, "HcclCommInitRootInfo")

	dir := t.TempDir()
	_, err = hccl.Open(hccl.Config{Library: dir})
	require.ErrorIs(t, err, acl.ErrNotSupported)
	require.ErrorContains(t, err, "no such file")

	t.Setenv(hccl.LibraryEnv, "")
	t.Setenv("ASCEND_HOME_PATH", dir)
	t.Setenv("ASCEND_TOOLKIT_HOME", "")
	t.Setenv("LD_LIBRARY_PATH", dir)
	if _, err := purego.Dlopen("libhccl.so", purego.RTLD_NOW|purego.RTLD_LOCAL); err == nil {
		t.Log("this machine has an HCCL of its own: the search would find it")
		return
	}
	_, err = hccl.Open(hccl.Config{})
	require.ErrorIs(t, err, acl.ErrNotSupported)
	require.ErrorContains(t, err, "$ASCEND_HOME_PATH")
	require.ErrorContains(t, err, "dynamic loader")

	// The environment names the library; a directory means libhccl.so in it.
	f := newFake(t, "full")
	t.Setenv(hccl.LibraryEnv, f.path[:len(f.path)-len("/libhccl.so")])
	lib, err := hccl.Open(hccl.Config{})
	require.NoError(t, err)
	require.Equal(t, f.path, lib.Path())
	require.Same(t, f.lib, lib, "one library per path")
}

// An HCCL error reads as the acl error it unwraps to, with HCCL's own words.
func TestErrorText(t *testing.T) {
	f := newFake(t, "full")
	_, err := f.lib.CommInitRootInfo(0, &hccl.RootInfo{}, 0)
	require.EqualError(t, err, "HcclCommInitRootInfo: ACL_ERROR_RT_PARAM_INVALID (107000): HCCL_E_PARA (1)")
	require.Equal(t, "HcclResult(99)", hccl.Result(99).String())
	require.Equal(t, acl.ErrCodeRTDrvInternal, hccl.ACLCode(hccl.ErrTCPTransfer))
	_, err = f.lib.CommInitRootInfo(2, nil, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid)
}

// The double exports exactly the HCCL symbols the binding resolves, so that
// the tests exercise every one of them.
func TestDoubleSymbolsAreTheBindingsSymbols(t *testing.T) {
	require.ElementsMatch(t, hccl.SymbolNames(), cdouble.Exported(t, doubles.Path(t, "full"), "Hccl"))
}

// gate is a Binder that holds every HCCL call at its start until released,
// once armed, and counts the calls that reached it.
type gate struct {
	armed   atomic.Bool
	calls   atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (g *gate) Bind(fn func() error) error {
	if g.armed.Load() {
		g.calls.Add(1)
		g.entered <- struct{}{}
		<-g.release
	}
	return fn()
}

// parkedOnLock reports whether a goroutine is blocked on a mutex inside fn.
func parkedOnLock(fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "[sync.Mutex.Lock") && strings.Contains(g, fn) {
			return true
		}
	}
	return false
}

// A registrar makes one HCCL call at a time and checks its books under the
// same lock: a second Register of an overlapping mapping, arriving while the
// first is inside HCCL, waits for it and is then refused by the books, never
// reaching HCCL. The test holds the first call inside HCCL, starts the
// second, and releases the first only once the second is parked on the
// registrar's lock (or, were the lock not held across the call, has reached
// HCCL too, which fails the test).
func TestRegistrarSerialisesItsCalls(t *testing.T) {
	f := newFake(t, "full")
	gt := &gate{entered: make(chan struct{}, 8), release: make(chan struct{})}
	r, err := hccl.NewRegistrar(f.lib, f.comm(t, 8), gt)
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	defer gt.armed.Store(false) // before Close, however the test ends
	base := acl.DevicePtr(0x7f0000000000)
	require.NoError(t, r.SetMemoryRange(base, 4*g))
	defer func() { require.NoError(t, r.UnsetMemoryRange(base)) }()
	m := acl.Mapping{Ptr: base, Size: g, Handle: 1}
	activations := f.calls(t, "HcclCommActivateCommMemory")

	gt.armed.Store(true)
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- r.Register(m) }()
	<-gt.entered // the first is inside HCCL
	go func() { second <- r.Register(acl.Mapping{Ptr: base, Size: 2 * g, Handle: 2}) }()
	for !parkedOnLock("regtable.(*Books).Lock") && gt.calls.Load() < 2 {
		runtime.Gosched()
	}
	close(gt.release)
	require.NoError(t, <-first)
	err = <-second
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	var he *hccl.Error
	require.False(t, errors.As(err, &he), "refused by the registrar's books, not by HCCL: %v", err)
	require.Equal(t, int32(1), gt.calls.Load(), "one call reached HCCL")
	require.Equal(t, activations+1, f.calls(t, "HcclCommActivateCommMemory"))
	gt.armed.Store(false)
	require.NoError(t, r.Deregister(m))
}
