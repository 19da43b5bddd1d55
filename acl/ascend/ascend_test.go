//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/acl/device"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/arena/arenatest"
	"github.com/vmarena/vmarena/internal/skip"
)

// factory opens drivers over the double at path for the conformance suite,
// with the double's stand-in kernels as the Launcher.
func factory(path string, cfg ascend.Config) acltest.Factory {
	return acltest.Factory{
		Open: func(t testing.TB) acl.Driver {
			d, dbl := openDouble(t, path, 1<<30, cfg)
			return counted{d, dbl, t}
		},
		OpenCapacity: func(t testing.TB, c uintptr) acl.Driver {
			d, dbl := openDouble(t, path, c, cfg)
			return counted{d, dbl, t}
		},
		ExactCodes: true,
		Launcher: func(d acl.Driver) acl.Launcher {
			return launcher{d.(counted).dbl, d.Device()}
		},
	}
}

func TestConformance(t *testing.T) {
	acltest.Run(t, factory(variantPath(t, "full"), ascend.Config{}))
}

// Device 1, with the double's default of two devices.
func TestConformanceDevice1(t *testing.T) {
	acltest.Run(t, factory(variantPath(t, "full"), ascend.Config{Device: 1}))
}

// A runtime without the aclrtMemSetAccess symbol (before CANN 8.5): the lazy
// lookup fails and MemSetAccess returns 207000; everything else works.
func TestConformanceNoSetAccessSymbol(t *testing.T) {
	path := variantPath(t, "nosetaccess")
	acltest.Run(t, factory(path, ascend.Config{}))
	d, _ := openDouble(t, path, 0, ascend.Config{})
	err := d.MemSetAccess(0x100000000000, g, acl.ReadWrite(0))
	acltest.RequireCode(t, err, acl.ErrCodeRTFeatureNotSupport)
	require.ErrorIs(t, err, acl.ErrNotSupported)
	assert.Contains(t, err.Error(), "aclrtMemSetAccess not found in "+path)
}

// A runtime that has the symbol but whose driver lacks the feature: 207000
// from the runtime itself.
func TestConformanceSetAccessUnsupported(t *testing.T) {
	path := freshCopy(t, "full", "", "libascendcl.so")
	control(t, path).setNoSetAccess(1)
	acltest.Run(t, factory(path, ascend.Config{}))
}

// A runtime without aclrtStreamQuery: DestroyStream asks an event whether
// the stream is idle.
func TestConformanceNoStreamQuery(t *testing.T) {
	acltest.Run(t, factory(variantPath(t, "nostreamquery"), ascend.Config{}))
}

// The arena-level suite, over the binding and the double.
func TestArena(t *testing.T) {
	path := variantPath(t, "full")
	arenatest.Run(t, func(t testing.TB, capacity uintptr) acl.Driver {
		d, dbl := openDouble(t, path, capacity, ascend.Config{})
		return counted{d, dbl, t}
	})
}

// The arena over a runtime without aclrtMemSetAccess, and over one without
// the event calls.
func TestArenaOlderRuntimes(t *testing.T) {
	for _, v := range []string{"nosetaccess", "noevents"} {
		t.Run(v, func(t *testing.T) {
			path := variantPath(t, v)
			arenatest.Run(t, func(t testing.TB, capacity uintptr) acl.Driver {
				d, dbl := openDouble(t, path, capacity, ascend.Config{})
				return counted{d, dbl, t}
			})
		})
	}
}

// The Go types and the C structs agree on every size and offset, and a
// struct the driver passes is read by C field by field as Go wrote it.
func TestLayout(t *testing.T) {
	d, dbl := openDouble(t, variantPath(t, "full"), 0, ascend.Config{})
	var p acl.PhysicalMemProp
	var a acl.MemAccessDesc
	want := []uint64{
		uint64(unsafe.Sizeof(acl.MemLocation{})), uint64(unsafe.Offsetof(acl.MemLocation{}.ID)),
		uint64(unsafe.Offsetof(acl.MemLocation{}.Type)),
		uint64(unsafe.Sizeof(p)), uint64(unsafe.Offsetof(p.HandleType)), uint64(unsafe.Offsetof(p.AllocationType)),
		uint64(unsafe.Offsetof(p.MemAttr)), uint64(unsafe.Offsetof(p.Location)), uint64(unsafe.Offsetof(p.Reserve)),
		uint64(unsafe.Sizeof(a)), uint64(unsafe.Offsetof(a.Flags)), uint64(unsafe.Offsetof(a.Location)),
		uint64(unsafe.Offsetof(a.Rsv)),
		uint64(unsafe.Sizeof(acl.LiveCounts{})),
		uint64(unsafe.Sizeof(acl.GranularityMinimum)), uint64(unsafe.Sizeof(acl.MemcpyHostToDevice)),
	}
	got := make([]uint64, 32)
	n := dbl.layout(&got[0], uintptr(len(got)))
	require.Equal(t, want, got[:n], "sizeof/offsetof of the C structs vs the Go types")

	// Distinct values in every field of a prop: C must read each by name.
	p = acl.PhysicalMemProp{HandleType: 0x11, AllocationType: 0x22, MemAttr: 0x33,
		Location: acl.MemLocation{ID: 0x44, Type: 0x55}, Reserve: 0x6677_8899_aabb_ccdd}
	_, err := d.MemGetAllocationGranularity(&p, acl.GranularityMinimum)
	acltest.RequireCode(t, err, acl.ErrCodeInvalidParam)
	var seen [6]uint64
	dbl.lastProp(&seen)
	assert.Equal(t, [6]uint64{0x11, 0x22, 0x33, 0x44, 0x55, 0x6677_8899_aabb_ccdd}, seen)

	// And an array of two descriptors: the stride must be 24 bytes too.
	desc := []acl.MemAccessDesc{
		{Flags: 0x3, Location: acl.MemLocation{ID: 7, Type: 1}, Rsv: [12]byte{0: 0xe1, 11: 0xe2}},
		{Flags: 0x1, Location: acl.MemLocation{ID: 9, Type: 0}, Rsv: [12]byte{0: 0xf1, 11: 0xf2}},
	}
	require.Error(t, d.MemSetAccess(0x100000000000, g, desc))
	for i, w := range [][5]uint64{{3, 7, 1, 0xe1, 0xe2}, {1, 9, 0, 0xf1, 0xf2}} {
		var out [5]uint64
		count := dbl.lastDesc(uintptr(i), &out)
		assert.Equal(t, uintptr(2), count)
		assert.Equal(t, w, out, "descriptor %d", i)
	}
}

// Every driver error names the ACL function and carries the code and the
// runtime's message, read on the thread that failed: goroutines that fail at
// once each get their own message.
func TestErrorsCarryOpCodeMessage(t *testing.T) {
	d, _ := openDouble(t, variantPath(t, "full"), 1<<30, ascend.Config{})
	base, err := d.ReserveMemAddress(64*g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h, err := d.MallocPhysical(g, prop(0), 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreePhysical(h)) }()

	e := requireACLError(t, d.MapMem(base, 2*g, 0, h, 0), "aclrtMapMem", acl.ErrCodeRTParamInvalid)
	assert.Contains(t, e.Msg, "size 4194304 differs")
	assert.Contains(t, e.Error(), "aclrtMapMem: ACL_ERROR_RT_PARAM_INVALID (107000): fakeacl aclrtMapMem")
	requireACLError(t, d.UnmapMem(base), "aclrtUnmapMem", acl.ErrCodeRTDrvInternal)
	_, err = d.ReserveMemAddress(1<<20, 0, 0, 7)
	requireACLError(t, err, "aclrtReserveMemAddress", acl.ErrCodeInvalidParam)
	requireACLError(t, d.Memset(base, 1, 10), "aclrtMemset", acl.ErrCodeRTParamInvalid)
	requireACLError(t, d.MemcpyHtoD(base, []byte{1}), "aclrtMemcpy", acl.ErrCodeRTParamInvalid)
	_, _, err = d.GetMemInfo(99)
	requireACLError(t, err, "aclrtGetMemInfo", acl.ErrCodeInvalidParam)

	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 50 {
				size := uintptr(w*1000+i+2) * g // never the handle's size
				err := d.MapMem(base, size, 0, h, 0)
				var e *acl.Error
				if !errors.As(err, &e) || !bytes.Contains([]byte(e.Msg), []byte(fmt.Sprintf("size %d differs", size))) {
					t.Errorf("worker %d: got %v, want the message of its own call", w, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// ACL's current context is per OS thread. Goroutines that hop threads, and
// threads that have no context at all, never make a driver call fail with
// 107002: the driver makes the context current on whatever thread it runs.
func TestThreadHopping(t *testing.T) {
	path := variantPath(t, "full")
	d, dbl := openDouble(t, path, 1<<30, ascend.Config{})
	before := dbl.Stats()

	// The double does refuse a thread without a context, like ACL.
	var raw int32
	var msg string
	onThread(func() {
		dbl.clearContext()
		var free, total uintptr
		raw = dbl.getMemInfo(acl.HBMMem, &free, &total)
		msg = dbl.getRecentErrMsg()
		// The driver, on this same thread, sets its context and succeeds.
		_, _, err := d.GetMemInfo(acl.HBMMem)
		assert.NoError(t, err)
	})
	require.Equal(t, acl.ErrCodeRTContextNull, raw, "a thread without a context: %s", msg)
	require.Equal(t, before.NoContextErrors+1, dbl.Stats().NoContextErrors)

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 40 {
				switch i % 4 {
				case 0: // leave a context-less thread behind for someone
					runtime.LockOSThread()
					dbl.clearContext()
					runtime.UnlockOSThread()
				case 1: // end this thread, so new ones start
					onThread(func() {})
				}
				runtime.Gosched()
				if err := cycle(d, w, i); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	after := dbl.Stats()
	assert.Equal(t, before.NoContextErrors+1, after.NoContextErrors, "a driver call ran without its context")
	assert.Greater(t, after.ThreadsSeen-before.ThreadsSeen, int64(4), "the calls ran on several threads")
	t.Logf("driver calls ran on %d new OS threads", after.ThreadsSeen-before.ThreadsSeen)
}

// cycle runs one small reserve/map/copy/unmap round.
func cycle(d *ascend.Driver, w, i int) error {
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	if err != nil {
		return err
	}
	h, err := d.MallocPhysical(g, prop(0), 0)
	if err != nil {
		return errors.Join(err, d.ReleaseMemAddress(base))
	}
	msg := []byte(fmt.Sprintf("w%d i%d", w, i))
	got := make([]byte, len(msg))
	err = errors.Join(
		d.MapMem(base, g, 0, h, 0),
		d.MemcpyHtoD(base+100, msg),
		d.MemcpyDtoH(got, base+100),
	)
	if err == nil && !bytes.Equal(got, msg) {
		err = fmt.Errorf("read %q, want %q", got, msg)
	}
	return errors.Join(err, d.UnmapMem(base), d.FreePhysical(h), d.ReleaseMemAddress(base))
}

// onThread runs fn on a goroutine locked to its thread, which exits with it.
func onThread(fn func()) {
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		defer close(done)
		fn()
	}()
	<-done
}

// Faults injected below the binding come back as typed errors with the
// code and message, and leave nothing behind.
func TestFaultInjection(t *testing.T) {
	path := variantPath(t, "full")

	t.Run("MallocPhysical", func(t *testing.T) {
		d, dbl := openDouble(t, path, 1<<30, ascend.Config{})
		dbl.Inject(t, "aclrtMallocPhysical", 2, acl.ErrCodeRTMemoryAllocation)
		h, err := d.MallocPhysical(g, prop(0), 0)
		require.NoError(t, err)
		_, err = d.MallocPhysical(g, prop(0), 0)
		e := requireACLError(t, err, "aclrtMallocPhysical", acl.ErrCodeRTMemoryAllocation)
		assert.Contains(t, e.Msg, "injected fault")
		assert.ErrorIs(t, err, acl.ErrOutOfMemory)
		require.NoError(t, d.FreePhysical(h))
		assert.True(t, dbl.Live().Zero(), "%+v", dbl.Live())
	})

	// The arena's Grow maps several chunks; the third map fails. The arena
	// rolls back: the error is the driver's, the arena is as it was, and
	// nothing leaks in the runtime.
	for _, tc := range []struct {
		fn   string
		code int32
	}{
		{"aclrtMapMem", acl.ErrCodeRTParamInvalid},
		{"aclrtMallocPhysical", acl.ErrCodeRTMemoryAllocation},
	} {
		t.Run("ArenaGrow/"+tc.fn, func(t *testing.T) {
			d, dbl := openDouble(t, path, 256<<20, ascend.Config{})
			a, err := arena.New(arena.Config{Driver: d, Reserve: 64 << 20})
			require.NoError(t, err)
			require.NoError(t, a.Grow(2*a.ChunkSize()))
			before, liveBefore := a.Stats(), dbl.Live()
			dbl.Inject(t, tc.fn, 3, tc.code)
			err = a.Grow(8 * a.ChunkSize())
			e := requireACLError(t, err, tc.fn, tc.code)
			assert.Contains(t, e.Msg, "injected fault")
			after := a.Stats()
			before.Maps, before.Unmaps = after.Maps, after.Unmaps
			assert.Equal(t, before, after, "the arena is as it was")
			assert.Equal(t, liveBefore.Mappings, dbl.Live().Mappings, "no mapping leaked")
			require.NoError(t, a.Grow(8*a.ChunkSize()), "and grows once the fault is gone")
			require.NoError(t, a.Close())
			assert.True(t, dbl.Live().Zero(), "leaked: %+v", dbl.Live())
		})
	}

	t.Run("SetCurrentContext", func(t *testing.T) {
		d, _ := openDouble(t, path, 1<<30, ascend.Config{})
		dbl := control(t, path)
		dbl.Inject(t, "aclrtSetCurrentContext", 1, acl.ErrCodeRTContextNull)
		_, _, err := d.GetMemInfo(acl.HBMMem)
		requireACLError(t, err, "aclrtSetCurrentContext", acl.ErrCodeRTContextNull)
		assert.Contains(t, err.Error(), "aclrtGetMemInfo on ascend:0")
		assert.ErrorIs(t, err, acl.ErrNoContext)
	})

	t.Run("MemcpyAsync", func(t *testing.T) {
		d, dbl := openDouble(t, path, 1<<30, ascend.Config{})
		base, h := mapped(t, d, 2)
		dbl.Inject(t, "aclrtMemcpyAsync", 1, acl.ErrCodeRTInternal)
		requireACLError(t, d.MemcpyDtoD(base+acl.DevicePtr(g), base, 4096), "aclrtMemcpyAsync", acl.ErrCodeRTInternal)
		unmapped(t, d, base, h)
	})

	t.Run("NoVMM", func(t *testing.T) {
		dbl := control(t, path)
		refs := dbl.Stats().DeviceRefs
		dbl.Inject(t, "aclrtMemGetAllocationGranularity", 1, acl.ErrCodeRTFeatureNotSupport)
		_, err := ascend.Open(ascend.Config{Library: path})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		assert.Contains(t, err.Error(), "no virtual memory management")
		assert.Equal(t, refs, dbl.Stats().DeviceRefs, "the failed Open reset the device")
	})
}

// mapped reserves n granules and maps one chunk of n granules there.
func mapped(t *testing.T, d *ascend.Driver, n uintptr) (acl.DevicePtr, acl.PhysicalHandle) {
	t.Helper()
	base, err := d.ReserveMemAddress(n*g, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(n*g, prop(d.Device()), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, n*g, 0, h, 0))
	return base, h
}

func unmapped(t *testing.T, d *ascend.Driver, base acl.DevicePtr, h acl.PhysicalHandle) {
	t.Helper()
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
}

// Physical memory comes back as the device left it, not zeroed.
func TestMemoryNotZeroed(t *testing.T) {
	d, _ := openDouble(t, variantPath(t, "full"), 1<<30, ascend.Config{})
	base, h := mapped(t, d, 1)
	defer unmapped(t, d, base, h)
	b := make([]byte, 16)
	require.NoError(t, d.MemcpyDtoH(b, base))
	assert.Equal(t, bytes.Repeat([]byte{0xA5}, 16), b, "the double's fresh memory")
	require.NoError(t, d.Memset(base, 0, 16))
	require.NoError(t, d.MemcpyDtoH(b, base))
	assert.Equal(t, make([]byte, 16), b)

	// The arena's pool clears fresh chunks, since the driver does not
	// promise zeros: a new buffer reads zero.
	a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	buf, err := a.Alloc(4096, 64)
	require.NoError(t, err)
	got := make([]byte, 4096)
	require.NoError(t, arena.CopyOut(got, buf))
	assert.Equal(t, make([]byte, 4096), got)
}

// Device-to-device copies: aligned and disjoint through aclrtMemcpyAsync on
// the device's stream (the double refuses the synchronous aclrtMemcpy there,
// as ACL does for reserved memory), anything else through the host, with
// memmove semantics.
func TestMemcpyDtoD(t *testing.T) {
	d, dbl := openDouble(t, variantPath(t, "full"), 1<<30, ascend.Config{})
	base, h := mapped(t, d, 8)
	defer unmapped(t, d, base, h)
	const size = 8 * g
	ref := make([]byte, size)
	for i := range ref {
		ref[i] = byte(i*131 + i>>9)
	}
	require.NoError(t, d.MemcpyHtoD(base, ref))
	check := func(what string) {
		got := make([]byte, size)
		require.NoError(t, d.MemcpyDtoH(got, base))
		require.True(t, bytes.Equal(ref, got), what)
	}
	streams := dbl.Stats().StreamsAlive
	for _, c := range []struct {
		dst, src, n uintptr
	}{
		{4 * g, 0, g},             // aligned, disjoint: the async path
		{64, 5*g + 64, 4096},      // aligned, disjoint, small
		{6*g + 3, 7, 1000},        // unaligned, disjoint: through the host
		{3, 2*g + 7, 3*g + 11},    // overlapping, dst below src: forwards, 4 MiB at a time
		{100, 0, 6 * g},           // overlapping, dst above src: backwards
		{g + 1, g / 2, 5*g + 123}, // overlapping, backwards, unaligned
	} {
		require.NoError(t, d.MemcpyDtoD(base+acl.DevicePtr(c.dst), base+acl.DevicePtr(c.src), c.n))
		copy(ref[c.dst:c.dst+c.n], ref[c.src:c.src+c.n])
		check(fmt.Sprintf("copy %+v", c))
	}
	assert.Equal(t, streams+1, dbl.Stats().StreamsAlive, "one copy stream for the device")
	require.Error(t, d.MemcpyDtoD(base+acl.DevicePtr(size), base, 64), "past the mapping")
}

// Where the runtime is found, and what the error says when it is not.
func TestLoading(t *testing.T) {
	full := variantPath(t, "full")

	t.Run("ExplicitDirectory", func(t *testing.T) {
		d, err := ascend.Open(ascend.Config{Library: filepath.Dir(full)})
		require.NoError(t, err)
		assert.Equal(t, full, d.Library())
		require.NoError(t, d.Close())
	})
	t.Run("EnvVar", func(t *testing.T) {
		t.Setenv(ascend.LibraryEnv, full)
		d, err := ascend.Open(ascend.Config{})
		require.NoError(t, err)
		assert.Equal(t, full, d.Library())
		assert.Equal(t, "FakeAscend910B", d.SocName())
		require.NoError(t, d.Close())
	})
	t.Run("AscendHomePath", func(t *testing.T) {
		home := t.TempDir()
		lib := freshCopy(t, "full", home, "lib64/libascendcl.so")
		t.Setenv(ascend.LibraryEnv, "")
		t.Setenv("ASCEND_HOME_PATH", home)
		d, err := ascend.Open(ascend.Config{})
		require.NoError(t, err)
		assert.Equal(t, lib, d.Library())
		require.NoError(t, d.Close())
	})
	t.Run("ToolkitHomeAfterAnEmptyHomePath", func(t *testing.T) {
		home := t.TempDir()
		lib := freshCopy(t, "full", home, "lib64/libascendcl.so")
		t.Setenv(ascend.LibraryEnv, "")
		t.Setenv("ASCEND_HOME_PATH", t.TempDir())
		t.Setenv("ASCEND_TOOLKIT_HOME", home)
		d, err := ascend.Open(ascend.Config{})
		require.NoError(t, err)
		assert.Equal(t, lib, d.Library())
		require.NoError(t, d.Close())
	})
	t.Run("SplitRuntime", func(t *testing.T) {
		// libascendcl.so without the aclrt* symbols; they are in libacl_rt.so.
		dir := t.TempDir()
		compat := freshCopy(t, "compat", dir, "libascendcl.so")
		rt := freshCopy(t, "full", dir, "libacl_rt.so")
		d, err := ascend.Open(ascend.Config{Library: compat})
		require.NoError(t, err)
		assert.Equal(t, compat+" + "+rt, d.Library())
		require.NoError(t, cycle(d, 0, 0))
		require.NoError(t, d.Close())
		assert.True(t, control(t, rt).Live().Zero())
	})
	t.Run("RuntimeOnlyDirectory", func(t *testing.T) {
		dir := t.TempDir()
		rt := freshCopy(t, "full", dir, "libacl_rt.so")
		d, err := ascend.Open(ascend.Config{Library: dir})
		require.NoError(t, err)
		assert.Equal(t, rt, d.Library())
		require.NoError(t, d.Close())
	})
	t.Run("MissingRequiredSymbol", func(t *testing.T) {
		broken := variantPath(t, "broken")
		_, err := ascend.Open(ascend.Config{Library: broken})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		assert.Contains(t, err.Error(), "lacks aclrtMapMem")
		assert.Contains(t, err.Error(), broken)
		assert.Contains(t, err.Error(), "libacl_rt.so", "the fallback was tried")
	})
	t.Run("NoSuchFile", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "libascendcl.so")
		_, err := ascend.Open(ascend.Config{Library: missing})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		assert.Contains(t, err.Error(), missing+" (Config.Library): no such file")
	})
	t.Run("NotALibrary", func(t *testing.T) {
		bad := filepath.Join(t.TempDir(), "libascendcl.so")
		require.NoError(t, os.WriteFile(bad, []byte("not ELF"), 0o644))
		_, err := ascend.Open(ascend.Config{Library: bad})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		assert.Contains(t, err.Error(), bad)
	})
	t.Run("SearchFindsNothing", func(t *testing.T) {
		if _, err := os.Stat(ascend.DefaultInstall); err == nil {
			skip.NoDevice(t, "CANN is installed here (%s): the search would find it", ascend.DefaultInstall)
		}
		t.Setenv(ascend.LibraryEnv, "")
		t.Setenv("ASCEND_HOME_PATH", "/nonexistent/ascend")
		t.Setenv("ASCEND_TOOLKIT_HOME", "")
		_, err := ascend.Open(ascend.Config{})
		if err == nil {
			skip.NoDevice(t, "the dynamic loader finds a libascendcl.so here")
		}
		require.ErrorIs(t, err, acl.ErrNotSupported)
		for _, s := range []string{"/nonexistent/ascend/lib64/libascendcl.so ($ASCEND_HOME_PATH)",
			ascend.DefaultInstall + "/lib64/libascendcl.so (default install)", "libascendcl.so (dynamic loader"} {
			assert.Contains(t, err.Error(), s)
		}
	})
	t.Run("DeviceSelector", func(t *testing.T) {
		t.Setenv(ascend.LibraryEnv, full)
		for spec, name := range map[string]string{"ascend": "ascend:0", "ascend:1": "ascend:1"} {
			c, err := device.Open(spec)
			require.NoError(t, err, spec)
			assert.Equal(t, name, c.Driver.Name())
			require.NoError(t, c.Driver.Close())
		}
		_, err := device.Open("ascend:7")
		require.ErrorIs(t, err, acl.ErrNoDevice)
		require.NotErrorIs(t, err, acl.ErrNotSupported, "a missing device on a working runtime is not a skip")
		c, err := device.Open("auto")
		require.NoError(t, err)
		assert.Equal(t, "ascend:0", c.Driver.Name(), c.Reason)
		require.NoError(t, c.Driver.Close())
	})
}

// aclInit, device references and finalisation, each on a runtime instance
// of its own.
func TestRuntimeLifecycle(t *testing.T) {
	t.Run("OwnInitAndFinalize", func(t *testing.T) {
		path := freshCopy(t, "full", "", "libascendcl.so")
		dbl := control(t, path)
		d1, err := ascend.Open(ascend.Config{Library: path})
		require.NoError(t, err)
		d2, err := ascend.Open(ascend.Config{Library: path})
		require.NoError(t, err)
		d3, err := ascend.Open(ascend.Config{Library: path, Device: 1})
		require.NoError(t, err)
		s := dbl.Stats()
		assert.Equal(t, int64(1), s.InitCalls)
		assert.Equal(t, int64(2), s.DeviceRefs, "each device set once")
		require.Error(t, ascend.Finalize(), "drivers are open")

		require.NoError(t, d1.Close())
		require.NoError(t, d1.Close(), "twice")
		_, _, err = d2.GetMemInfo(acl.HBMMem)
		require.NoError(t, err, "the other driver of the device still works")
		_, _, err = d1.GetMemInfo(acl.HBMMem)
		acltest.RequireCode(t, err, acl.ErrCodeRTContextNull)
		require.ErrorIs(t, err, acl.ErrNoContext)
		require.NoError(t, d2.Close())
		require.NoError(t, d3.Close())
		s = dbl.Stats()
		assert.Zero(t, s.DeviceRefs)
		assert.Zero(t, s.ContextsAlive)
		assert.Zero(t, s.StreamsAlive)

		require.NoError(t, ascend.Finalize())
		s = dbl.Stats()
		assert.Equal(t, int64(1), s.FinalizeCalls)
		assert.Zero(t, s.Initialised)
		require.NoError(t, ascend.Finalize(), "nothing left to finalise")
		assert.Equal(t, int64(1), dbl.Stats().FinalizeCalls)

		d4, err := ascend.Open(ascend.Config{Library: path})
		require.NoError(t, err, "Open initialises again")
		assert.Equal(t, int64(2), dbl.Stats().InitCalls)
		require.NoError(t, d4.Close())
		require.NoError(t, ascend.Finalize())
	})
	t.Run("ForeignInit", func(t *testing.T) {
		path := freshCopy(t, "full", "", "libascendcl.so")
		dbl := control(t, path)
		require.Zero(t, dbl.aclInit(nil), "another user initialises ACL")
		d, err := ascend.Open(ascend.Config{Library: path})
		require.NoError(t, err, "100002 is not a failure")
		require.NoError(t, cycle(d, 0, 0))
		require.NoError(t, d.Close())
		require.NoError(t, ascend.Finalize())
		s := dbl.Stats()
		assert.Zero(t, s.FinalizeCalls, "left to its owner")
		assert.Equal(t, int64(1), s.Initialised)
	})
	t.Run("InitFails", func(t *testing.T) {
		path := freshCopy(t, "full", "", "libascendcl.so")
		control(t, path).Inject(t, "aclInit", 1, acl.ErrCodeRTInternal)
		_, err := ascend.Open(ascend.Config{Library: path})
		requireACLError(t, err, "aclInit", acl.ErrCodeRTInternal)
		require.NotErrorIs(t, err, acl.ErrNotSupported, "a runtime that loads but fails is broken, not absent")
		d, err := ascend.Open(ascend.Config{Library: path})
		require.NoError(t, err, "a later Open tries again")
		require.NoError(t, d.Close())
	})
	t.Run("NoDevices", func(t *testing.T) {
		path := freshCopy(t, "full", "", "libascendcl.so")
		control(t, path).setDeviceCount(0)
		_, err := ascend.Open(ascend.Config{Library: path})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		assert.Contains(t, err.Error(), "sees no NPU")
	})
	t.Run("BadDevice", func(t *testing.T) {
		path := variantPath(t, "full")
		_, err := ascend.Open(ascend.Config{Library: path, Device: 2})
		requireACLError(t, err, "aclrtSetDevice", acl.ErrCodeRTInvalidDeviceID)
		assert.Contains(t, err.Error(), "2 NPUs visible")
		_, err = ascend.Open(ascend.Config{Library: path, Device: -1})
		require.ErrorIs(t, err, acl.ErrInvalidParam)
	})
	t.Run("SetDeviceFails", func(t *testing.T) {
		path := freshCopy(t, "full", "", "libascendcl.so")
		dbl := control(t, path)
		dbl.Inject(t, "aclrtSetDevice", 1, acl.ErrCodeRTNoDevice)
		_, err := ascend.Open(ascend.Config{Library: path})
		requireACLError(t, err, "aclrtSetDevice", acl.ErrCodeRTNoDevice)
		assert.Zero(t, dbl.Stats().DeviceRefs)
	})
	var nilDriver *ascend.Driver
	require.NoError(t, nilDriver.Close())
}

// Bind runs its function on a thread with the device's context current,
// even a thread that had none, returns its error, and refuses once the
// driver is closed.
func TestBind(t *testing.T) {
	path := freshCopy(t, "full", "", "libascendcl.so")
	d, dbl := openDouble(t, path, 0, ascend.Config{})
	var ctx uintptr
	var code int32
	var err error
	onThread(func() {
		dbl.clearContext()
		err = d.Bind(func() error {
			code = dbl.getCurrentContext(&ctx)
			return nil
		})
	})
	require.NoError(t, err)
	require.Equal(t, acl.Success, code)
	require.NotZero(t, ctx, "the device's context is current inside Bind")
	want := errors.New("from fn")
	require.Equal(t, want, d.Bind(func() error { return want }))

	d2, err := ascend.Open(ascend.Config{Library: path, Device: 1})
	require.NoError(t, err)
	require.NoError(t, d2.Close())
	acltest.RequireCode(t, d2.Bind(func() error { return nil }), acl.ErrCodeRTContextNull)
}

// The double hands a freed handle's value out again, as the runtime's heap
// does with the record behind a handle.
func TestDoubleReusesFreedHandles(t *testing.T) {
	d, _ := openDouble(t, variantPath(t, "full"), 1<<30, ascend.Config{})
	acltest.RequireHandleReuse(t, d)
}
