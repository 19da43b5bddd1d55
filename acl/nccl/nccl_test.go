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
func suite(t *testing.T, open func(testing.TB) acl.Driver, bind bool, opts ...nccl.Option) {
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
			r, err := nccl.NewRegistrar(f.lib, f.comm(t), b, opts...)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, r.Close()) })
			pairs.Store(r, pair{f, r})
			return r
		},
		Held: func(t testing.TB, reg acl.Registrar) acltest.RegistrationCounts {
			p, _ := pairs.Load(reg)
			l := p.(pair).f.live()
			ranges, mappings, _ := p.(pair).r.Live()
			if len(opts) == 0 {
				mappings = int(l.Regs) // one registration per mapping
			} else {
				// Runs: NCCL's registrations are fewer; its bytes are the
				// mapped bytes all the same.
				held, _ := p.(pair).r.Registrations()
				require.Equal(t, held, int(l.Regs), "the registrar's and NCCL's registrations")
				require.LessOrEqual(t, held, mappings)
			}
			return acltest.RegistrationCounts{Ranges: ranges, Mappings: mappings, Bytes: l.Bytes}
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
	suite(t, openCUDA, true)
}

func openCUDA(t testing.TB) acl.Driver {
	d, err := cuda.Open(cuda.Config{Library: doubles.Instance(t, "fakecuda", "libcuda.so.1")})
	require.NoError(t, err)
	return d
}

// The suite with runs coalesced, on the host driver and on the CUDA binding:
// NCCL holds exactly the mapped bytes, in fewer registrations.
func TestCoalescingRegistrarConformance(t *testing.T) {
	t.Run("host", func(t *testing.T) {
		suite(t, func(t testing.TB) acl.Driver {
			d, err := host.New(host.Config{Capacity: 256 << 20})
			require.NoError(t, err)
			return d
		}, false, nccl.Coalesce())
	})
	t.Run("cuda", func(t *testing.T) { suite(t, openCUDA, true, nccl.Coalesce()) })
}

// regs returns NCCL's registrations as the double holds them: how many, and
// their bytes.
func regs(f *fake) (int64, uintptr) { l := f.live(); return l.Regs, l.Bytes }

// With Coalesce, each run of adjacent mappings of one set range is one NCCL
// registration: a batch of k chunks joining a run costs one deregistration
// and one registration; a deregistration inside a run leaves its two sides
// registered; runs never cross set ranges; NCCL never holds a registration
// over a mapping deregistered (the double refuses overlapping registrations,
// so a run made before the one it replaces went would fail).
func TestCoalescedRuns(t *testing.T) {
	f := newFake(t)
	r, err := nccl.NewRegistrar(f.lib, f.comm(t), nil, nccl.Coalesce())
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	a, b := acl.DevicePtr(0x7f0000000000), acl.DevicePtr(0x7f0000000000+8*g) // two adjacent ranges
	require.NoError(t, r.SetMemoryRange(a, 8*g))
	require.NoError(t, r.SetMemoryRange(b, 8*g))
	m := func(base acl.DevicePtr, i int) acl.Mapping {
		return acl.Mapping{Ptr: base.Add(uintptr(i) * g), Size: g, Handle: acl.PhysicalHandle(100 + i + int(base>>20))}
	}
	calls := func() int64 { return f.calls(t, "ncclCommRegister") + f.calls(t, "ncclCommDeregister") }

	require.NoError(t, r.RegisterBatch([]acl.Mapping{m(a, 0), m(a, 1), m(a, 2)}))
	n, bytes := regs(f)
	require.Equal(t, int64(1), n)
	require.Equal(t, uintptr(3*g), bytes)
	before := calls()
	require.NoError(t, r.RegisterBatch([]acl.Mapping{m(a, 3), m(a, 4), m(a, 5), m(a, 6), m(a, 7)}))
	require.Equal(t, before+2, calls(), "a growth of five chunks: the run deregistered, the grown run registered")
	n, bytes = regs(f)
	require.Equal(t, int64(1), n)
	require.Equal(t, uintptr(8*g), bytes)

	// The next range's first chunk is adjacent in address, not in range.
	require.NoError(t, r.Register(m(b, 0)))
	n, bytes = regs(f)
	require.Equal(t, int64(2), n, "runs do not cross set ranges")
	require.Equal(t, uintptr(9*g), bytes)

	// A hole in the middle: two registrations, the hole's bytes not covered.
	require.NoError(t, r.Deregister(m(a, 4)))
	n, bytes = regs(f)
	require.Equal(t, int64(3), n)
	require.Equal(t, uintptr(8*g), bytes)
	held, _ := r.Registrations()
	require.Equal(t, 3, held)

	// A mapping that fills the hole joins both sides into one run.
	require.NoError(t, r.Register(m(a, 4)))
	n, _ = regs(f)
	require.Equal(t, int64(2), n)

	// A shrink of the tail: one deregistration, one registration of what
	// is left.
	before = calls()
	require.NoError(t, r.DeregisterBatch([]acl.Mapping{m(a, 7), m(a, 6), m(a, 5)}))
	require.Equal(t, before+2, calls())
	n, bytes = regs(f)
	require.Equal(t, int64(2), n)
	require.Equal(t, uintptr(6*g), bytes)

	// Everything.
	require.NoError(t, r.DeregisterBatch([]acl.Mapping{m(a, 0), m(a, 1), m(a, 2), m(a, 3), m(a, 4), m(b, 0)}))
	n, bytes = regs(f)
	require.Zero(t, n)
	require.Zero(t, bytes)
	require.NoError(t, r.UnsetMemoryRange(a))
	require.NoError(t, r.UnsetMemoryRange(b))
}

// With Coalesce, a change NCCL refuses part-way is undone: the run dropped
// is registered again, the registrar's books are as they were, and the same
// change then succeeds.
func TestCoalescedFailuresChangeNothing(t *testing.T) {
	f := newFake(t)
	r, err := nccl.NewRegistrar(f.lib, f.comm(t), nil, nccl.Coalesce())
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	base := acl.DevicePtr(0x7f0000000000)
	require.NoError(t, r.SetMemoryRange(base, 8*g))
	m := func(i int) acl.Mapping {
		return acl.Mapping{Ptr: base.Add(uintptr(i) * g), Size: g, Handle: acl.PhysicalHandle(1 + i)}
	}
	require.NoError(t, r.RegisterBatch([]acl.Mapping{m(0), m(1)}))
	state := func() (int64, uintptr, int) {
		n, bytes := regs(f)
		_, maps, _ := r.Live()
		return n, bytes, maps
	}
	n0, b0, m0 := state()

	// The growth's registration of the grown run fails after the old run
	// went: the old run is registered again.
	f.fail(t, "ncclCommRegister", 1, nccl.UnhandledCudaError)
	err = r.RegisterBatch([]acl.Mapping{m(2), m(3)})
	require.Equal(t, nccl.UnhandledCudaError, code(t, err))
	n, b, maps := state()
	require.Equal(t, []any{n0, b0, m0}, []any{n, b, maps})

	// The deregistration of the run fails: nothing changes.
	f.fail(t, "ncclCommDeregister", 1, nccl.SystemError)
	require.Equal(t, nccl.SystemError, code(t, r.RegisterBatch([]acl.Mapping{m(2), m(3)})))
	n, b, maps = state()
	require.Equal(t, []any{n0, b0, m0}, []any{n, b, maps})

	require.NoError(t, r.RegisterBatch([]acl.Mapping{m(2), m(3)}))
	// A shrink whose registration of what is left fails: the run is whole
	// again, and every mapping still registered.
	f.fail(t, "ncclCommRegister", 1, nccl.UnhandledCudaError)
	require.Equal(t, nccl.UnhandledCudaError, code(t, r.Deregister(m(3))))
	n, b, maps = state()
	require.Equal(t, []any{int64(1), uintptr(4 * g), 4}, []any{n, b, maps})
	require.NoError(t, r.DeregisterBatch([]acl.Mapping{m(0), m(1), m(2), m(3)}))
	require.NoError(t, r.UnsetMemoryRange(base))
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
