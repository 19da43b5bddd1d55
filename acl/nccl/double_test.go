//go:build linux && (amd64 || arm64)

package nccl_test

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/internal/cdouble"
	"github.com/vmarena/vmarena/acl/nccl"
	"github.com/vmarena/vmarena/internal/leakgate"
)

// The test double of NCCL, testdata/fakenccl.c, is compiled once per test
// binary, with and without the registration calls, and the CUDA double of
// package acl/cuda beside it; each test loads an instance of its own
// (cdouble).
var doubles = &cdouble.Set{Libs: []cdouble.Lib{
	{Name: "full", Src: filepath.Join("testdata", "fakenccl.c")},
	{Name: "old", Src: filepath.Join("testdata", "fakenccl.c"), Flags: []string{"-DFAKENCCL_OLD"}},
	{Name: "fakecuda", Src: filepath.Join("..", "cuda", "testdata", "fakecuda.c")},
}}

func TestMain(m *testing.M) {
	doubles.Build()
	code := leakgate.Run(m)
	doubles.Remove()
	os.Exit(code)
}

// live mirrors fakenccl_live_t.
type live struct {
	Comms, Regs     int64
	Bytes           uintptr
	Leaked, Skipped int64
}

// fake is one loaded instance of the double, with its test controls.
type fake struct {
	path string
	lib  *nccl.Library

	failFn  func(fn string, nth int64, result int32) int32
	callsFn func(fn string) int64
	liveFn  func(out *live)
	setFn   func(knob string, value uintptr) int32
}

// newFake loads a fresh instance of the double, opened through the binding.
func newFake(t testing.TB) *fake {
	t.Helper()
	path := doubles.Instance(t, "full", "libnccl.so.2")
	f := &fake{path: path}
	runtime.LockOSThread()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	runtime.UnlockOSThread()
	require.NoError(t, err)
	for name, fn := range map[string]any{
		"fakenccl_fail":  &f.failFn,
		"fakenccl_calls": &f.callsFn,
		"fakenccl_live":  &f.liveFn,
		"fakenccl_set":   &f.setFn,
	} {
		sym, err := purego.Dlsym(h, name)
		require.NoError(t, err, name)
		purego.RegisterFunc(fn, sym)
	}
	f.lib, err = nccl.Open(nccl.Config{Library: path})
	require.NoError(t, err)
	return f
}

func (f *fake) fail(t testing.TB, fn string, nth int64, r nccl.Result) {
	t.Helper()
	require.Zero(t, f.failFn(fn, nth, int32(r)), "the double has no function %s", fn)
}

func (f *fake) calls(t testing.TB, fn string) int64 {
	t.Helper()
	n := f.callsFn(fn)
	require.GreaterOrEqual(t, n, int64(0), "the double has no function %s", fn)
	return n
}

func (f *fake) set(t testing.TB, knob string, v uintptr) {
	t.Helper()
	require.Zero(t, f.setFn(knob, v), "the double has no knob %s", knob)
}

func (f *fake) live() live {
	var l live
	f.liveFn(&l)
	return l
}

// comm makes one communicator on the double; the test's cleanup destroys it
// and checks that no registration was left for NCCL to drop.
func (f *fake) comm(t testing.TB) nccl.Comm {
	t.Helper()
	cs, err := f.lib.CommInitAll([]int32{0})
	require.NoError(t, err)
	require.Len(t, cs, 1)
	t.Cleanup(func() {
		require.NoError(t, f.lib.CommDestroy(cs[0]))
		require.Zero(t, f.live().Leaked, "registrations left for ncclCommDestroy to drop")
	})
	return cs[0]
}
