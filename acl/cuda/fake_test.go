//go:build linux && (amd64 || arm64)

package cuda

import (
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
	"github.com/vmarena/vmarena/internal/leakgate/arenagate"
	"github.com/vmarena/vmarena/internal/skip"
)

// The test double of libcuda (testdata/fakecuda.c) is compiled once per test
// binary, into a temporary folder TestMain removes, and copied into each
// test's t.TempDir() under a name of its own. dlopen of a new path loads a
// new instance, so every driver a test opens has a fresh double: its own
// capacity, counters, contexts and faults.

var double struct {
	once sync.Once
	dir  string // removed by TestMain
	lib  string
	old  string // built without cuMemGetHandleForAddressRange
	cc   error  // no C compiler: the tests that need the double skip (internal/skip.NoGCC)
	err  error  // the double did not build, or its source is missing: those tests fail
}

func TestMain(m *testing.M) {
	if supported && os.Getenv(envFreshChild) == "" && os.Getenv(envShareChild) == "" {
		// Before any test runs: a process that forks while its tests run
		// can hang under qemu-user (.ci/arm64.sh).
		double.once.Do(buildDouble)
	}
	code := arenagate.Run(m)
	if double.dir != "" {
		os.RemoveAll(double.dir)
	}
	os.Exit(code)
}

// buildDouble compiles the double into double.dir, once per test binary
// (from TestMain).
func buildDouble() {
	src := filepath.Join("testdata", "fakecuda.c")
	if _, err := os.Stat(src); err != nil {
		double.err = fmt.Errorf("the libcuda test double's source (a test binary run outside acl/cuda?): %w", err)
		return
	}
	cc, err := skip.CC()
	if err != nil {
		double.cc = err
		return
	}
	dir, err := os.MkdirTemp("", "vmarena-fakecuda-")
	if err != nil {
		double.err = err
		return
	}
	double.dir = dir
	lib, old := filepath.Join(dir, "libfakecuda.so"), filepath.Join(dir, "libfakecuda-nodmabuf.so")
	for _, b := range []struct {
		out   string
		flags []string
	}{{lib, nil}, {old, []string{"-DFAKECUDA_NO_DMABUF"}}} {
		args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", b.out, src}, b.flags...)
		if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
			double.err = fmt.Errorf("build the libcuda test double: %v\n%s", err, out)
			return
		}
	}
	double.lib, double.old = lib, old
}

// builtDouble returns the path of the compiled double (TestMain built it,
// unless this is a test's second process). Without a C compiler it skips the
// test (a failure under CI=true); when the double does not build, it fails
// it.
func builtDouble(t testing.TB) string {
	t.Helper()
	if !supported {
		// The build tags of this file admit only platforms the binding
		// loads libraries on; this is a guard, not a skip.
		t.Fatalf("the CUDA binding does not load libraries on %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	double.once.Do(buildDouble)
	if double.cc != nil {
		skip.NoGCC(t, double.cc)
	}
	require.NoError(t, double.err)
	return double.lib
}

// fake is one loaded instance of the double, with its test controls.
type fake struct {
	path string

	failFn     func(fn string, nth int64, result int32) int32
	callsFn    func(fn string) int64
	liveFn     func(allocs, maps, resv *int64, bytes *uintptr, refs, streams, events *int64)
	setFn      func(knob string, value uintptr) int32
	current    func() uintptr
	setCurrent func(ctx uintptr)
	primary    func(dev int32) uintptr
	flags      func(h uintptr) int32                      // a stream's or event's creation flags, or -1
	launchFn   func(s uintptr, p uint64, n uintptr) int32 // a kernel's id, or -CUresult
	finish     func(id int32) int32
	faults     func() int64
	hostLive   func(n *int64, bytes *uintptr)
	rdma       func(h uint64) int32 // 1 if allocation h is GPUDirect RDMA capable, 0 if not, -1 if no such allocation
	dmabufs    func() int64         // dma-bufs exported

	foreignStream        func(dev int32, flags uint32) uintptr // a CUstream, or 0
	destroyForeignStream func(h uintptr) int32                 // a CUresult
}

// newFake copies the double to a new path in t.TempDir() and loads it.
// env holds FAKECUDA_* settings the double reads as it loads.
func newFake(t testing.TB, env ...string) *fake {
	t.Helper()
	return newFakeOf(t, builtDouble(t), env...)
}

// newOldFake is newFake of the double built without
// cuMemGetHandleForAddressRange.
func newOldFake(t testing.TB) *fake {
	t.Helper()
	builtDouble(t)
	return newFakeOf(t, double.old)
}

func newFakeOf(t testing.TB, src string, env ...string) *fake {
	t.Helper()
	path := filepath.Join(t.TempDir(), "libcuda.so.1")
	require.NoError(t, copyFile(path, src))
	for i := 0; i+1 < len(env); i += 2 {
		t.Setenv(env[i], env[i+1])
	}
	runtime.LockOSThread()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	runtime.UnlockOSThread()
	require.NoError(t, err)
	f := &fake{path: path}
	for name, fn := range map[string]any{
		"fakecuda_fail":        &f.failFn,
		"fakecuda_calls":       &f.callsFn,
		"fakecuda_live":        &f.liveFn,
		"fakecuda_set":         &f.setFn,
		"fakecuda_current":     &f.current,
		"fakecuda_set_current": &f.setCurrent,
		"fakecuda_primary":     &f.primary,
		"fakecuda_flags":       &f.flags,
		"fakecuda_launch":      &f.launchFn,
		"fakecuda_finish":      &f.finish,
		"fakecuda_faults":      &f.faults,
		"fakecuda_host_live":   &f.hostLive,
		"fakecuda_rdma":        &f.rdma,
		"fakecuda_dmabufs":     &f.dmabufs,

		"fakecuda_foreign_stream":         &f.foreignStream,
		"fakecuda_destroy_foreign_stream": &f.destroyForeignStream,
	} {
		sym, err := purego.Dlsym(h, name)
		require.NoError(t, err)
		purego.RegisterFunc(fn, sym)
	}
	return f
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// fail makes the nth next call of fn fail with r.
func (f *fake) fail(t testing.TB, fn string, nth int64, r Result) {
	t.Helper()
	require.Zero(t, f.failFn(fn, nth, int32(r)), "the double has no function %s", fn)
}

// calls returns how often fn was called.
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

// foreign creates a stream on device dev outside the binding, as the caller's
// own CUDA code would (retaining the device's primary context), and destroys
// it when the test ends, before the driver closes. It returns the CUstream as
// an acl.Stream.
func (f *fake) foreign(t testing.TB, dev int32, flags uint32) acl.Stream {
	t.Helper()
	h := f.foreignStream(dev, flags)
	require.NotZero(t, h, "fakecuda_foreign_stream")
	t.Cleanup(func() {
		require.Equal(t, int32(0), f.destroyForeignStream(h), "fakecuda_destroy_foreign_stream(%#x)", h)
	})
	return acl.Stream(h)
}

// fakeLive is what the double holds.
type fakeLive struct {
	Allocations, Mappings, Reservations int64
	Bytes                               uintptr
	ContextRefs                         int64
	Streams, Events                     int64
	HostBuffers                         int64 // cuMemHostAlloc's, not yet freed
	HostBytes                           uintptr
}

func (f *fake) live() fakeLive {
	var l fakeLive
	f.liveFn(&l.Allocations, &l.Mappings, &l.Reservations, &l.Bytes, &l.ContextRefs, &l.Streams, &l.Events)
	f.hostLive(&l.HostBuffers, &l.HostBytes)
	return l
}

// requireClean asserts the double holds nothing: no allocation, mapping,
// reservation, stream, event or context reference.
func (f *fake) requireClean(t testing.TB) {
	t.Helper()
	require.Equal(t, fakeLive{}, f.live(), "the libcuda double still holds objects")
}

// openFake opens a driver over a fresh double whose device holds capacity
// bytes (0: the double's 1 GiB). The test's cleanup closes the driver and
// asserts that the double holds nothing afterwards.
func openFake(t testing.TB, capacity uintptr, cfg Config) (*Driver, *fake) {
	t.Helper()
	f := newFake(t)
	if capacity != 0 {
		f.set(t, "capacity", capacity)
	}
	cfg.Library = f.path
	d, err := Open(cfg)
	require.NoError(t, err)
	fakes.Store(d, f)
	t.Cleanup(func() {
		require.NoError(t, d.Close())
		f.requireClean(t)
		fakes.Delete(d)
	})
	return d, f
}

// fakes maps each driver openFake opened to its double, for the launcher.
var fakes sync.Map // *Driver → *fake

// launcher queues stand-in kernels on a driver's streams through the
// double's test hooks: it is the acl.Launcher of the conformance suite.
type launcher struct {
	d *Driver
	f *fake
}

// launcherOf returns the launcher of a driver openFake opened.
func launcherOf(d acl.Driver) acl.Launcher {
	cd, ok := d.(*Driver)
	if !ok {
		return nil
	}
	f, ok := fakes.Load(cd)
	if !ok {
		return nil
	}
	return &launcher{d: cd, f: f.(*fake)}
}

// Launch queues a kernel touching [ptr, ptr+n) on s; it finishes once done
// is closed (at once for a nil done), when a goroutine lets the double
// finish it.
func (l *launcher) Launch(s acl.Stream, ptr acl.DevicePtr, n uintptr, done <-chan struct{}) error {
	id, err := l.launch(s, ptr, n)
	if err != nil {
		return err
	}
	if done == nil {
		l.f.finish(id)
		return nil
	}
	go func() {
		<-done
		l.f.finish(id)
	}()
	return nil
}

// launch queues a kernel that stays unfinished until l.f.finish(id). Like a
// caller's kernel launch, it takes the CUstream itself: a stream the driver
// created or a foreign one. A stream the driver destroyed is refused, as the
// driver refuses it.
func (l *launcher) launch(s acl.Stream, ptr acl.DevicePtr, n uintptr) (int32, error) {
	const op = "Launch"
	st, err := l.d.holdStream(op, s)
	if err != nil {
		return 0, err
	}
	defer l.d.releaseStream(st)
	b, err := l.d.bind()
	if err != nil {
		return 0, err
	}
	id := l.f.launchFn(uintptr(s), uint64(ptr), n)
	l.d.unbind(b)
	if id < 0 {
		return 0, l.d.lib.newError("fakecuda_launch", Result(-id))
	}
	return id, nil
}

// Faults returns the double's count of faults.
func (l *launcher) Faults() int { return int(l.f.faults()) }

// resultOf returns the CUresult carried by err, or -1.
func resultOf(err error) Result {
	var e *Error
	if errors.As(err, &e) {
		return e.Result
	}
	return -1
}

func TestDoubleSymbolsAreTheBindingsSymbols(t *testing.T) {
	src := builtDouble(t)
	out, err := exec.Command("nm", "-D", "--defined-only", src).Output()
	if errors.Is(err, exec.ErrNotFound) {
		skip.NoGCC(t, fmt.Errorf("no nm (binutils, which gcc needs too): %w", err))
	}
	require.NoError(t, err, "nm -D %s", src)
	var exported []string
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 3 && fields[1] == "T" && strings.HasPrefix(fields[2], "cu") {
			exported = append(exported, fields[2])
		}
	}
	var want []string
	for _, s := range new(library).symbols() {
		want = append(want, s.name)
	}
	require.ElementsMatch(t, want, exported, "the double exports exactly the symbols the binding resolves")
}
