//go:build linux && (amd64 || arm64)

package nccl_test

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/nccl"
)

// The test double of NCCL, testdata/fakenccl.c, is compiled with the C
// compiler ($CC, else gcc) once per test binary, with and without the
// registration calls, into a folder TestMain removes; the CUDA double of
// package acl/cuda is built beside it. Each test loads a copy of its own
// under a new path: dlopen of a new path is a new instance.
var built struct {
	once     sync.Once
	dir      string
	noCC     string // why there is no C compiler; the only reason to skip
	err      error  // the build failed: every test that needs the double fails
	full     string
	old      string // without ncclCommRegister and ncclCommDeregister
	fakecuda string
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// skipWithoutCompiler skips t because the machine has no C compiler to
// build the double: the one reason a test of this package may skip. A
// double that fails to build is a failure, not a skip.
func skipWithoutCompiler(t testing.TB, why string) {
	t.Helper()
	t.Skip(why)
}

func build() {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		built.noCC = fmt.Sprintf("no C compiler (%s) to build the NCCL test double: %v", cc, err)
		return
	}
	dir, err := os.MkdirTemp("", "vmarena-fakenccl-")
	if err != nil {
		built.err = err
		return
	}
	built.dir = dir
	built.full, built.old, built.fakecuda = filepath.Join(dir, "full.so"), filepath.Join(dir, "old.so"), filepath.Join(dir, "fakecuda.so")
	for _, b := range []struct {
		src, out string
		flags    []string
	}{
		{filepath.Join("testdata", "fakenccl.c"), built.full, nil},
		{filepath.Join("testdata", "fakenccl.c"), built.old, []string{"-DFAKENCCL_OLD"}},
		{filepath.Join("..", "cuda", "testdata", "fakecuda.c"), built.fakecuda, nil},
	} {
		args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", b.out, b.src}, b.flags...)
		if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
			built.err = fmt.Errorf("building %s with %s: %v\n%s", b.src, cc, err, out)
			return
		}
	}
}

// builtPath returns a built library (built.full, built.old, built.fakecuda),
// building them all on first use.
func builtPath(t testing.TB, which *string) string {
	t.Helper()
	built.once.Do(build)
	if built.noCC != "" {
		skipWithoutCompiler(t, built.noCC)
	}
	require.NoError(t, built.err, "the NCCL test double must build")
	return *which
}

// copyTo copies src to a file name in a new folder of the test's.
func copyTo(t testing.TB, src, name string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), name)
	in, err := os.Open(src)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.Create(dst)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, errors.Join(err, out.Close()))
	return dst
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
	path := copyTo(t, builtPath(t, &built.full), "libnccl.so.2")
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

// exported lists the functions lib defines and exports whose names start
// with prefix, read from its dynamic symbol table.
func exported(t testing.TB, lib, prefix string) []string {
	t.Helper()
	f, err := elf.Open(lib)
	require.NoError(t, err)
	defer f.Close()
	syms, err := f.DynamicSymbols()
	require.NoError(t, err)
	var names []string
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF && strings.HasPrefix(s.Name, prefix) {
			names = append(names, s.Name)
		}
	}
	return names
}
