//go:build linux && (amd64 || arm64)

package nccl_test

import (
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/nccl"
)

// loaded reports whether the library at path is mapped into the process.
func loaded(t testing.TB, path string) bool {
	t.Helper()
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	return strings.Contains(string(maps), path)
}

// An Open that fails after dlopen leaves nothing loaded: a library lacking
// the registration calls, and one whose ncclGetVersion fails.
func TestFailedOpenUnloads(t *testing.T) {
	t.Run("missing symbol", func(t *testing.T) {
		old := doubles.Instance(t, "old", "libnccl.so.2")
		_, err := nccl.Open(nccl.Config{Library: old})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		require.False(t, loaded(t, old), "a failed Open left %s loaded", old)
	})
	t.Run("version fails", func(t *testing.T) {
		path := doubles.Instance(t, "full", "libnccl.so.2")
		runtime.LockOSThread()
		h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
		runtime.UnlockOSThread()
		require.NoError(t, err)
		var failFn func(fn string, nth int64, result int32) int32
		sym, err := purego.Dlsym(h, "fakenccl_fail")
		require.NoError(t, err)
		purego.RegisterFunc(&failFn, sym)
		require.Zero(t, failFn("ncclGetVersion", 1, int32(nccl.SystemError)))
		_, err = nccl.Open(nccl.Config{Library: path})
		require.Equal(t, nccl.SystemError, code(t, err))
		require.NoError(t, purego.Dlclose(h)) // the test's own reference
		require.False(t, loaded(t, path), "a failed Open left %s loaded", path)
	})
}

// With Coalesce, a Close whose deregistration of a run fails leaves the
// books and NCCL agreeing: every mapping the books still hold is covered by
// a registration NCCL holds.
func TestCoalescedCloseFailureBooksAgree(t *testing.T) {
	f := newFake(t)
	r, err := nccl.NewRegistrar(f.lib, rawComm(t, f), nil, nccl.Coalesce())
	require.NoError(t, err)
	base := acl.DevicePtr(0x7f0000000000)
	require.NoError(t, r.SetMemoryRange(base, 4*g))
	a := acl.Mapping{Ptr: base, Size: g, Handle: 1}
	b := acl.Mapping{Ptr: base.Add(g), Size: g, Handle: 2}
	require.NoError(t, r.RegisterBatch([]acl.Mapping{a, b}))
	require.Equal(t, int64(1), f.live().Regs)

	f.fail(t, "ncclCommDeregister", 1, nccl.SystemError)
	require.Error(t, r.Close())
	_, maps, bytes := r.Live()
	l := f.live()
	require.Equal(t, bytes, l.Bytes, "books hold %d mappings (%d bytes), NCCL %d registrations (%d bytes)",
		maps, bytes, l.Regs, l.Bytes)
}

// After a Close that could not deregister a mapping, Registrations still
// reports what NCCL holds, and the calls made.
func TestRegistrationsAfterFailedClose(t *testing.T) {
	f := newFake(t)
	r, err := nccl.NewRegistrar(f.lib, rawComm(t, f), nil)
	require.NoError(t, err)
	base := acl.DevicePtr(0x7f0000000000)
	require.NoError(t, r.SetMemoryRange(base, 2*g))
	require.NoError(t, r.Register(acl.Mapping{Ptr: base, Size: g, Handle: 1}))
	f.fail(t, "ncclCommDeregister", 1, nccl.SystemError)
	require.Error(t, r.Close())
	require.Equal(t, int64(1), f.live().Regs, "NCCL still holds it")
	held, calls := r.Registrations()
	require.Equal(t, 1, held, "Registrations after Close")
	require.Equal(t, int64(2), calls, "one ncclCommRegister, one ncclCommDeregister")
}

// rawComm is fake.comm without its check that nothing was left to drop: a
// failed Close leaves registrations for ncclCommDestroy by design.
func rawComm(t testing.TB, f *fake) nccl.Comm {
	t.Helper()
	cs, err := f.lib.CommInitAll([]int32{0})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, f.lib.CommDestroy(cs[0])) })
	return cs[0]
}
