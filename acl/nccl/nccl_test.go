//go:build linux && (amd64 || arm64)

package nccl_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/cuda"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/internal/cdouble"
	"github.com/vmarena/vmarena/acl/nccl"
)

const g = acl.HugePageSize

// suite runs the registrar suite with registrars of fresh doubles on the
// drivers open opens. NCCL holds no ranges: the ranges are the registrar's
// books, the registrations and bytes the double's.
func suite(t *testing.T, open func(testing.TB) acl.Driver, bind bool) {
	type pair struct {
		f *fake
		r *nccl.Registrar
	}
	pairs := sync.Map{}
	acltest.RunRegistrar(t, acltest.RegistrarFactory{
		Driver: open,
		Open: func(t testing.TB, d acl.Driver) acl.Registrar {
			f := newFake(t)
			var b acl.Binder
			if bind {
				b = d.(acl.Binder)
			}
			r, err := nccl.NewRegistrar(f.lib, f.comm(t), b)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, r.Close()) })
			pairs.Store(r, pair{f, r})
			return r
		},
		Held: func(t testing.TB, reg acl.Registrar) acltest.RegistrationCounts {
			p, _ := pairs.Load(reg)
			l := p.(pair).f.live()
			ranges, _, _ := p.(pair).r.Live()
			return acltest.RegistrationCounts{Ranges: ranges, Mappings: int(l.Regs), Bytes: l.Bytes}
		},
	})
}

// The registrar suite on the host driver: the whole protocol checked against
// the host driver's mappings, no padding, refusals that leave NCCL as it was.
func TestRegistrarConformance(t *testing.T) {
	suite(t, func(t testing.TB) acl.Driver {
		d, err := host.New(host.Config{Capacity: 256 << 20})
		require.NoError(t, err)
		return d
	}, false)
}

// The same suite on the CUDA binding over its double, calling NCCL inside
// the driver's Bind.
func TestRegistrarOnTheCUDABinding(t *testing.T) {
	suite(t, func(t testing.TB) acl.Driver {
		d, err := cuda.Open(cuda.Config{Library: doubles.Instance(t, "fakecuda", "libcuda.so.1")})
		require.NoError(t, err)
		return d
	}, true)
}

func code(t testing.TB, err error) nccl.Result {
	t.Helper()
	if err == nil {
		return nccl.Success
	}
	var ne *nccl.Error
	require.True(t, errors.As(err, &ne), "%v is not an *nccl.Error", err)
	return ne.Result
}

// Registration and deregistration failing in NCCL return its typed error
// and change nothing; the same call then succeeds.
func TestFailedCallsChangeNothing(t *testing.T) {
	f := newFake(t)
	r, err := nccl.NewRegistrar(f.lib, f.comm(t), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	base := acl.DevicePtr(0x7f0000000000)
	require.NoError(t, r.SetMemoryRange(base, 4*g))
	m := acl.Mapping{Ptr: base, Size: g, Handle: 9}

	f.fail(t, "ncclCommRegister", 1, nccl.UnhandledCudaError)
	err = r.Register(m)
	require.Equal(t, nccl.UnhandledCudaError, code(t, err))
	acltest.RequireCode(t, err, acl.ErrCodeRTDrvInternal)
	_, n, _ := r.Live()
	require.Zero(t, n)
	require.Zero(t, f.live().Regs)
	require.NoError(t, r.Register(m))

	f.fail(t, "ncclCommDeregister", 1, nccl.SystemError)
	require.Equal(t, nccl.SystemError, code(t, r.Deregister(m)))
	_, n, _ = r.Live()
	require.Equal(t, 1, n)
	require.Equal(t, int64(1), f.live().Regs)
	require.NoError(t, r.Deregister(m))
	require.NoError(t, r.UnsetMemoryRange(base))
}

// With NCCL_LOCAL_REGISTER=0 NCCL registers nothing and returns a NULL
// handle; the registrar keeps the mapping in its books all the same, and
// deregisters the NULL handle, which NCCL accepts.
func TestNothingRegisteredByNCCL(t *testing.T) {
	f := newFake(t)
	f.set(t, "local_register", 0)
	r, err := nccl.NewRegistrar(f.lib, f.comm(t), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	base := acl.DevicePtr(0x7f0000000000)
	require.NoError(t, r.SetMemoryRange(base, 2*g))
	m := acl.Mapping{Ptr: base, Size: g, Handle: 9}
	require.NoError(t, r.Register(m))
	require.Equal(t, live{Comms: 1, Skipped: 1}, f.live())
	require.NoError(t, r.Deregister(m))
	require.NoError(t, r.UnsetMemoryRange(base))
}

// The registrar's own refusals never reach NCCL.
func TestRefusalsDoNotReachNCCL(t *testing.T) {
	f := newFake(t)
	r, err := nccl.NewRegistrar(f.lib, f.comm(t), nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	base := acl.DevicePtr(0x7f0000000000)
	require.NoError(t, r.SetMemoryRange(base, 4*g))
	m := acl.Mapping{Ptr: base, Size: g, Handle: 9}
	require.NoError(t, r.Register(m))
	regs, deregs := f.calls(t, "ncclCommRegister"), f.calls(t, "ncclCommDeregister")
	for _, err := range []error{
		r.Register(m),
		r.Register(acl.Mapping{Ptr: base.Add(3 * g), Size: 2 * g, Handle: 1}),
		r.Register(acl.Mapping{Ptr: base.Add(8 * g), Size: g, Handle: 1}),
		r.Deregister(acl.Mapping{Ptr: base, Size: g, Handle: 8}),
		r.Deregister(acl.Mapping{Ptr: base.Add(g), Size: g, Handle: 9}),
		r.UnsetMemoryRange(base),
	} {
		require.ErrorIs(t, err, acl.ErrInvalidParam)
		var ne *nccl.Error
		require.False(t, errors.As(err, &ne), "refused by the registrar, not by NCCL: %v", err)
	}
	require.Equal(t, regs, f.calls(t, "ncclCommRegister"))
	require.Equal(t, deregs, f.calls(t, "ncclCommDeregister"))
	require.NoError(t, r.Deregister(m))
	require.NoError(t, r.UnsetMemoryRange(base))
}

// The double's own rules, called through the raw binding.
func TestDoubleRules(t *testing.T) {
	f := newFake(t)
	lib := f.lib
	c := f.comm(t)
	base := acl.DevicePtr(0x7f0000000000)
	_, err := lib.CommRegister(0, base, g)
	require.Equal(t, nccl.InvalidArgument, code(t, err), "no such communicator")
	_, err = lib.CommRegister(c, base, 0)
	require.Equal(t, nccl.InvalidArgument, code(t, err), "0 bytes")
	h, err := lib.CommRegister(c, base, 2*g)
	require.NoError(t, err)
	require.NotZero(t, h)
	_, err = lib.CommRegister(c, base.Add(g), 2*g)
	require.Equal(t, nccl.InvalidUsage, code(t, err), "overlap")
	require.ErrorContains(t, err, "overlaps a registered one", "ncclGetLastError is in the message")
	require.Equal(t, nccl.InvalidUsage, code(t, lib.CommDeregister(c, h+1)), "not a handle")
	require.NoError(t, lib.CommDeregister(c, 0), "NULL is accepted")
	require.NoError(t, lib.CommDeregister(c, h))
	require.Equal(t, nccl.InvalidUsage, code(t, lib.CommDeregister(c, h)), "twice")

	// Destroying a communicator drops what it still holds: the double
	// counts it as leaked (on a double of its own, which no cleanup checks).
	f2 := newFake(t)
	cs, err := f2.lib.CommInitAll([]int32{0, 1})
	require.NoError(t, err)
	_, err = f2.lib.CommRegister(cs[1], base, g)
	require.NoError(t, err)
	require.NoError(t, f2.lib.CommDestroy(cs[0]))
	require.NoError(t, f2.lib.CommDestroy(cs[1]))
	require.Equal(t, live{Leaked: 1}, f2.live())
	require.Equal(t, nccl.InvalidArgument, code(t, f2.lib.CommDestroy(cs[1])), "destroyed twice")
}

// Close deregisters what the caller leaked, says so, and refuses later calls.
func TestRegistrarClose(t *testing.T) {
	f := newFake(t)
	r, err := nccl.NewRegistrar(f.lib, f.comm(t), nil)
	require.NoError(t, err)
	base := acl.DevicePtr(0x7f0000000000)
	require.NoError(t, r.SetMemoryRange(base, 2*g))
	require.NoError(t, r.Register(acl.Mapping{Ptr: base, Size: g, Handle: 1}))
	require.ErrorContains(t, r.Close(), "1 registered mappings and 1 set ranges")
	require.Zero(t, f.live().Regs)
	require.NoError(t, r.Close())
	acltest.RequireCode(t, r.SetMemoryRange(base, g), acl.ErrCodeRTContextNull)
}

// Opening: an NCCL without registration (before 2.19) is refused naming
// what it lacks; a library that does not load is ErrNotSupported; the
// environment names the library.
func TestOpen(t *testing.T) {
	old := doubles.Instance(t, "old", "libnccl.so.2")
	_, err := nccl.Open(nccl.Config{Library: old})
	require.ErrorIs(t, err, acl.ErrNotSupported)
	require.ErrorContains(t, err, "ncclCommRegister")
	_, err = nccl.Open(nccl.Config{Library: "/nonexistent/libnccl.so.2"})
	require.ErrorIs(t, err, acl.ErrNotSupported)

	f := newFake(t)
	require.Equal(t, 22807, f.lib.Version())
	t.Setenv(nccl.LibraryEnv, f.path)
	lib, err := nccl.Open(nccl.Config{})
	require.NoError(t, err)
	require.Same(t, f.lib, lib, "one library per path")
	require.Equal(t, f.path, lib.Path())
	_, err = nccl.NewRegistrar(lib, 0, nil)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid)
}

// An NCCL error reads as the acl error it unwraps to, with NCCL's words.
func TestErrorText(t *testing.T) {
	f := newFake(t)
	c := f.comm(t)
	err := f.lib.CommDeregister(c, 1)
	require.EqualError(t, err, "ncclCommDeregister: ACL_ERROR_RT_PARAM_INVALID (107000): ncclInvalidUsage (5): invalid usage: Deregister: Could not find handle")
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	require.Equal(t, "ncclResult_t(42)", nccl.Result(42).String())
}

// The double exports exactly the NCCL symbols the binding resolves, so that
// the tests exercise every one of them.
func TestDoubleSymbolsAreTheBindingsSymbols(t *testing.T) {
	require.ElementsMatch(t, nccl.SymbolNames(), cdouble.Exported(t, doubles.Path(t, "full"), "nccl"))
}
