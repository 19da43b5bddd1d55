//go:build linux && (amd64 || arm64)

package hccl_test

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

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/hccl"
)

// The test double of HCCL, testdata/fakehccl.c, is compiled with the C
// compiler ($CC, else gcc) once per test binary, in these variants, into a
// folder TestMain removes. Each test loads a copy of its own under a new
// path: dlopen of a new path is a new instance, with books of its own.
var variants = map[string][]string{
	"full":       nil,
	"nozerocopy": {"-DFAKEHCCL_NO_ZEROCOPY"},
	"nocomm":     {"-DFAKEHCCL_NO_COMM"},
}

var built struct {
	once   sync.Once
	dir    string
	noCC   string // why there is no C compiler; the only reason to skip
	err    error  // the build failed: every test that needs the double fails
	fakeac string // the ACL double of package acl/ascend, built too
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
		built.noCC = fmt.Sprintf("no C compiler (%s) to build the HCCL test double: %v", cc, err)
		return
	}
	dir, err := os.MkdirTemp("", "vmarena-fakehccl-")
	if err != nil {
		built.err = err
		return
	}
	built.dir = dir
	compile := func(src, out string, flags []string) error {
		args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", out, src}, flags...)
		if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("building %s with %s: %v\n%s", src, cc, err, b)
		}
		return nil
	}
	for name, flags := range variants {
		if built.err = compile(filepath.Join("testdata", "fakehccl.c"), filepath.Join(dir, name+".so"), flags); built.err != nil {
			return
		}
	}
	built.fakeac = filepath.Join(dir, "fakeacl.so")
	built.err = compile(filepath.Join("..", "ascend", "testdata", "fakeacl.c"), built.fakeac, nil)
}

// builtPath returns the compiled variant, building every variant on first
// use.
func builtPath(t testing.TB, variant string) string {
	t.Helper()
	built.once.Do(build)
	if built.noCC != "" {
		skipWithoutCompiler(t, built.noCC)
	}
	require.NoError(t, built.err, "the HCCL test double must build")
	return filepath.Join(built.dir, variant+".so")
}

// copyTo copies src to a new file name in a new folder of the test's, and
// returns its path.
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
	path := copyTo(t, builtPath(t, variant), "libhccl.so")
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
