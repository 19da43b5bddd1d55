//go:build linux && (amd64 || arm64)

package hccl_test

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/hccl"
	"github.com/vmarena/vmarena/acl/internal/cdouble"
	"github.com/vmarena/vmarena/internal/leakgate"
)

// The test double of HCCL, testdata/fakehccl.c, is compiled once per test
// binary in three variants, and the ACL double of package acl/ascend beside
// it; each test loads an instance of its own (cdouble).
var doubles = &cdouble.Set{Libs: []cdouble.Lib{
	{Name: "full", Src: filepath.Join("testdata", "fakehccl.c")},
	{Name: "nozerocopy", Src: filepath.Join("testdata", "fakehccl.c"), Flags: []string{"-DFAKEHCCL_NO_ZEROCOPY"}},
	{Name: "nocomm", Src: filepath.Join("testdata", "fakehccl.c"), Flags: []string{"-DFAKEHCCL_NO_COMM"}},
	{Name: "fakeacl", Src: filepath.Join("..", "ascend", "testdata", "fakeacl.c")},
}}

func TestMain(m *testing.M) {
	doubles.Build()
	code := leakgate.Run(m)
	doubles.Remove()
	os.Exit(code)
}

// live mirrors fakehccl_live_t.
type live struct {
	Comms, Ranges, Blocks int64
	Bytes                 uintptr
	Leaked, Exported      int64
}

// fake is one loaded instance of the double, with its test controls.
type fake struct {
	path string
	lib  *hccl.Library

	failFn  func(fn string, nth int64, result int32) int32
	callsFn func(fn string) int64
	liveFn  func(out *live)
	active  func(ptr uintptr, size *uintptr) uintptr
	setFn   func(knob string, value uintptr) int32
}

// newFake loads a fresh instance of a variant of the double, opened through
// the binding (Config.Library).
func newFake(t testing.TB, variant string) *fake {
	t.Helper()
	path := doubles.Instance(t, variant, "libhccl.so")
	f := &fake{path: path}
	runtime.LockOSThread()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	runtime.UnlockOSThread()
	require.NoError(t, err)
	for name, fn := range map[string]any{
		"fakehccl_fail":   &f.failFn,
		"fakehccl_calls":  &f.callsFn,
		"fakehccl_live":   &f.liveFn,
		"fakehccl_active": &f.active,
		"fakehccl_set":    &f.setFn,
	} {
		sym, err := purego.Dlsym(h, name)
		require.NoError(t, err, name)
		purego.RegisterFunc(fn, sym)
	}
	f.lib, err = hccl.Open(hccl.Config{Library: path})
	if variant != "nocomm" {
		require.NoError(t, err)
	}
	return f
}

func (f *fake) fail(t testing.TB, fn string, nth int64, r hccl.Result) {
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

// held is what the double holds, as the registrar suite counts it.
func (f *fake) held() acltest.RegistrationCounts {
	l := f.live()
	return acltest.RegistrationCounts{Ranges: int(l.Ranges), Mappings: int(l.Blocks), Bytes: l.Bytes}
}

// comm makes a communicator of nRanks ranks on the double; the test's
// cleanup destroys it and checks that the double leaked nothing.
func (f *fake) comm(t testing.TB, nRanks uint32) hccl.Comm {
	t.Helper()
	root, err := f.lib.GetRootInfo()
	require.NoError(t, err)
	c, err := f.lib.CommInitRootInfo(nRanks, root, 0)
	require.NoError(t, err)
	require.NotZero(t, c)
	t.Cleanup(func() {
		require.NoError(t, f.lib.CommDestroy(c))
		if l := f.live(); l.Comms == 0 {
			require.Zero(t, l.Leaked, "the double dropped set ranges or activated blocks with the last communicator")
		}
	})
	return c
}

// registrar makes a registrar of a fresh communicator of 8 ranks; the
// test's cleanup closes it, and requires that it had nothing left to undo.
func (f *fake) registrar(t testing.TB, bind acl.Binder) *hccl.Registrar {
	t.Helper()
	r, err := hccl.NewRegistrar(f.lib, f.comm(t, 8), bind)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Close()) })
	return r
}
