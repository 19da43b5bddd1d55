//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/internal/leakgate/arenagate"
	"github.com/vmarena/vmarena/internal/skip"
)

// The test double of the ACL runtime, testdata/fakeacl.c, is built with the C
// compiler ($CC, else gcc) once per test binary, in these variants.
var variants = map[string]struct {
	flags []string
	file  string
}{
	"full":          {nil, "libascendcl.so"},
	"nosetaccess":   {[]string{"-DFAKEACL_NO_SETACCESS"}, "libascendcl.so"},
	"broken":        {[]string{"-DFAKEACL_NO_MAPMEM"}, "libascendcl.so"},
	"compat":        {[]string{"-DFAKEACL_COMPAT_ONLY"}, "libascendcl.so"},
	"nostreamquery": {[]string{"-DFAKEACL_NO_STREAMQUERY"}, "libascendcl.so"},
	// An old runtime: no event calls and no aclrtStreamQuery.
	"noevents": {[]string{"-DFAKEACL_NO_EVENTS", "-DFAKEACL_NO_STREAMQUERY"}, "libascendcl.so"},
	// A runtime without the calls that share memory between processes.
	"noshare": {[]string{"-DFAKEACL_NO_SHARE"}, "libascendcl.so"},
}

var built struct {
	once sync.Once
	dir  string // variant/<file> lives under it; TestMain removes it
	cc   error  // no C compiler: the tests that need the double skip (internal/skip.NoGCC)
	err  error  // the double did not build: those tests fail
}

func TestMain(m *testing.M) {
	if os.Getenv(envShareChild) == "" {
		// Before any test runs: a process that forks while its tests run
		// can hang under qemu-user (.ci/arm64.sh), which deadlocked the
		// child of a fork made from a busy test binary.
		built.once.Do(buildDouble)
	}
	code := arenagate.Run(m)
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// buildDouble builds every variant of the double into built.dir, once per
// test binary (from TestMain; a test of a second process that needs it
// builds it on first use).
func buildDouble() {
	cc, err := skip.CC()
	if err != nil {
		built.cc = err
		return
	}
	src, err := filepath.Abs(filepath.Join("testdata", "fakeacl.c"))
	if err == nil {
		_, err = os.Stat(src)
	}
	if err != nil {
		built.err = fmt.Errorf("the ACL test double's source: %w", err)
		return
	}
	dir, err := os.MkdirTemp("", "fakeacl")
	if err != nil {
		built.err = err
		return
	}
	built.dir = dir
	for name, v := range variants {
		out := filepath.Join(dir, name, v.file)
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			built.err = err
			return
		}
		args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", out, src}, v.flags...)
		if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
			built.err = fmt.Errorf("building the ACL test double (variant %s) with %s failed: %v\n%s", name, cc, err, b)
			return
		}
	}
}

// variantPath returns the built library of a variant. Without a C compiler
// it skips the test (a failure under CI=true); when the double does not
// build, it fails it.
func variantPath(t testing.TB, name string) string {
	t.Helper()
	built.once.Do(buildDouble)
	if built.cc != nil {
		skip.NoGCC(t, built.cc)
	}
	if built.err != nil {
		t.Fatal(built.err)
	}
	return filepath.Join(built.dir, name, variants[name].file)
}

// freshCopy copies a variant's library to a new file: loaded, it is a new
// instance of the runtime with a state of its own.
func freshCopy(t testing.TB, name, dir, file string) string {
	t.Helper()
	src := variantPath(t, name)
	if dir == "" {
		dir = t.TempDir()
	}
	dst := filepath.Join(dir, file)
	require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
	copyFile(t, src, dst)
	return dst
}

func copyFile(t testing.TB, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.Create(dst)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, err)
	require.NoError(t, out.Close())
}

// stats mirrors fakeacl_stats_t.
type stats struct {
	Initialised, InitCalls, FinalizeCalls, DeviceRefs, ContextsAlive, StreamsAlive int64
	SyncDeviceCalls, PendingWork, Faults, NoContextErrors, SetContextCalls         int64
	ThreadsSeen, ForeignStreams                                                    int64
}

// double is the control panel of one loaded instance of the test double: its
// test-only functions and a few raw ACL calls, through purego.
type double struct {
	path string
	h    uintptr

	setDeviceCount func(n uint32)
	setCapacity    func(dev int32, bytes uintptr)
	setNoSetAccess func(on int32)
	inject         func(fn string, nth, code int32) int32
	launch         func(dev int32, stream acl.Stream, ptr acl.DevicePtr, n uintptr) int32
	finish         func(id int32) int32
	faults         func() int64
	live           func(out *acl.LiveCounts)
	stats          func(out *stats)
	layout         func(out *uint64, n uintptr) uintptr
	lastProp       func(out *[6]uint64)
	lastDesc       func(i uintptr, out *[5]uint64) uintptr
	clearContext   func()
	drain          func()
	setPid         func(pid int32)

	foreignStream        func(dev int32, s *acl.Stream) int32
	destroyForeignStream func(s acl.Stream) int32
	setReuseStreams      func(on int32)

	// Raw ACL calls, for the tests that bypass the driver.
	aclInit           func(path *byte) int32
	setDevice         func(id int32) int32
	resetDevice       func(id int32) int32
	getCurrentContext func(ctx *uintptr) int32
	setCurrentContext func(ctx uintptr) int32
	getMemInfo        func(attr acl.MemAttr, free, total *uintptr) int32
	getRecentErrMsg   func() string
}

var doubles sync.Map // path → *double

// control returns the control panel of the instance loaded from path (the
// same instance the driver loads: dlopen of one path gives one handle).
func control(t testing.TB, path string) *double {
	t.Helper()
	if d, ok := doubles.Load(path); ok {
		return d.(*double)
	}
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	d := &double{path: path, h: h}
	for name, fn := range map[string]any{
		"fakeacl_set_device_count": &d.setDeviceCount,
		"fakeacl_set_capacity":     &d.setCapacity,
		"fakeacl_set_no_setaccess": &d.setNoSetAccess,
		"fakeacl_inject":           &d.inject,
		"fakeacl_launch":           &d.launch,
		"fakeacl_finish":           &d.finish,
		"fakeacl_faults":           &d.faults,
		"fakeacl_live":             &d.live,
		"fakeacl_stats":            &d.stats,
		"fakeacl_layout":           &d.layout,
		"fakeacl_last_prop":        &d.lastProp,
		"fakeacl_last_desc":        &d.lastDesc,
		"fakeacl_clear_context":    &d.clearContext,
		"fakeacl_drain":            &d.drain,
		"fakeacl_set_pid":          &d.setPid,

		"fakeacl_foreign_stream":         &d.foreignStream,
		"fakeacl_destroy_foreign_stream": &d.destroyForeignStream,
		"fakeacl_set_reuse_streams":      &d.setReuseStreams,

		"aclInit":                &d.aclInit,
		"aclrtSetDevice":         &d.setDevice,
		"aclrtResetDevice":       &d.resetDevice,
		"aclrtGetCurrentContext": &d.getCurrentContext,
		"aclrtSetCurrentContext": &d.setCurrentContext,
		"aclrtGetMemInfo":        &d.getMemInfo,
		"aclGetRecentErrMsg":     &d.getRecentErrMsg,
	} {
		sym, err := purego.Dlsym(h, name)
		require.NoError(t, err, name)
		purego.RegisterFunc(fn, sym)
	}
	actual, _ := doubles.LoadOrStore(path, d)
	return actual.(*double)
}

// Foreign creates a stream on device dev outside the driver, as the caller's
// own CANN code would (with a device reference of its own), and destroys it
// when the test ends: before the driver closes, when the driver was opened
// first. Its work must be done by then.
func (d *double) Foreign(t testing.TB, dev int32) acl.Stream {
	t.Helper()
	var s acl.Stream
	require.Zero(t, d.foreignStream(dev, &s), "fakeacl_foreign_stream")
	require.NotZero(t, s)
	t.Cleanup(func() {
		require.Zero(t, d.destroyForeignStream(s), "fakeacl_destroy_foreign_stream(%#x)", uintptr(s))
	})
	return s
}

// Live reports the double's live objects.
func (d *double) Live() acl.LiveCounts {
	var c acl.LiveCounts
	d.live(&c)
	return c
}

// Stats reports the double's other state.
func (d *double) Stats() stats {
	var s stats
	d.stats(&s)
	return s
}

// Inject makes the nth next call of fn fail with code.
func (d *double) Inject(t testing.TB, fn string, nth int, code int32) {
	t.Helper()
	require.Zero(t, d.inject(fn, int32(nth), code), "fakeacl_inject(%s)", fn)
	t.Cleanup(func() { d.inject(fn, 0, 0) })
}

// Launch queues a stand-in kernel on s (0: the default stream of dev) that
// touches [ptr, ptr+n), finished when done is closed (at once for a nil
// done). It is the acl.Launcher of a driver over the double.
func (d *double) Launch(dev int32, s acl.Stream, ptr acl.DevicePtr, n uintptr, done <-chan struct{}) error {
	var id int32
	var msg string
	func() {
		runtime.LockOSThread() // the error message is the thread's
		defer runtime.UnlockOSThread()
		if id = d.launch(dev, s, ptr, n); id < 0 {
			msg = d.getRecentErrMsg()
		}
	}()
	if id < 0 {
		return acl.NewError("fakeacl_launch", -id, msg)
	}
	if done == nil {
		d.finish(id)
		return nil
	}
	go func() {
		<-done
		d.finish(id)
	}()
	return nil
}

// launcher is the acl.Launcher of a driver over the double.
type launcher struct {
	dbl *double
	dev int32
}

func (l launcher) Launch(s acl.Stream, ptr acl.DevicePtr, n uintptr, done <-chan struct{}) error {
	return l.dbl.Launch(l.dev, s, ptr, n, done)
}

func (l launcher) Faults() int { return int(l.dbl.faults()) }

// counted is a Driver over the double whose Live is the driver's own books,
// checked against the double's live objects (less the driver's private copy
// stream) every time it is read: the books must be exact.
type counted struct {
	*ascend.Driver
	dbl *double
	t   testing.TB
}

func (c counted) Live() acl.LiveCounts {
	got := c.Driver.Live()
	want := c.dbl.Live()
	want.Streams -= ascend.PrivateStreams(c.Driver)
	if got != want {
		c.t.Errorf("%s: the driver's books %+v differ from the runtime's live objects %+v", c.Name(), got, want)
	}
	return got
}

// openDouble opens the driver over the library at path, with capacity bytes
// of device memory (0 leaves it as it is), and closes it when the test ends.
func openDouble(t testing.TB, path string, capacity uintptr, cfg ascend.Config) (*ascend.Driver, *double) {
	t.Helper()
	dbl := control(t, path)
	if capacity != 0 {
		dbl.setCapacity(cfg.Device, capacity)
	}
	cfg.Library = path
	d, err := ascend.Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d, dbl
}

// requireACLError asserts err is (or wraps) an *acl.Error of op with code
// and a message from the runtime, and returns it.
func requireACLError(t testing.TB, err error, op string, code int32) *acl.Error {
	t.Helper()
	require.Error(t, err)
	var e *acl.Error
	require.True(t, errors.As(err, &e), "%v is not an *acl.Error", err)
	require.Equal(t, op, e.Op, "%v", err)
	require.Equal(t, acl.CodeName(code), acl.CodeName(e.Code), "%v", err)
	require.True(t, strings.HasPrefix(e.Msg, "fakeacl "+op), "message %q is the runtime's, for %s", e.Msg, op)
	return e
}

// connPair returns the two ends of a connected Unix socket pair, both
// closed when the test ends (an end the test closes first is closed
// again, harmlessly), each with a 10 s deadline, so that a side that stops
// answering fails the test instead of hanging it.
func connPair(t testing.TB) (mine, theirs *net.UnixConn) {
	t.Helper()
	mine, f, err := ipc.Socketpair()
	require.NoError(t, err)
	t.Cleanup(func() { mine.Close() })
	theirs, err = ipc.FileConn(f)
	f.Close()
	require.NoError(t, err)
	t.Cleanup(func() { theirs.Close() })
	deadline := time.Now().Add(10 * time.Second)
	require.NoError(t, mine.SetDeadline(deadline))
	require.NoError(t, theirs.SetDeadline(deadline))
	return mine, theirs
}
