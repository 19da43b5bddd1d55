//go:build linux && (amd64 || arm64)

package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/internal/hostmem/hostmemtest"
	"github.com/vmarena/vmarena/arena/arenatest"
)

const g = acl.HugePageSize

func prop() *acl.PhysicalMemProp { p := acl.DeviceProp(0, 0); return &p }

// The whole acl conformance suite, with the host driver's exact codes, on the
// binding over the double, with stand-in kernels queued through the double's
// test hooks for the tests of work in flight.
func TestConformance(t *testing.T) {
	acltest.Run(t, acltest.Factory{
		Open: func(t testing.TB) acl.Driver {
			d, _ := openFake(t, 0, Config{})
			return d
		},
		OpenCapacity: func(t testing.TB, c uintptr) acl.Driver {
			d, _ := openFake(t, c, Config{})
			return d
		},
		ExactCodes: true,
		Launcher:   launcherOf,
	})
}

// The arena-level suite, over the binding over the double.
func TestArenaConformance(t *testing.T) {
	arenatest.Run(t, func(t testing.TB, c uintptr) acl.Driver {
		d, _ := openFake(t, c, Config{})
		return d
	})
}

// Where CUDA is laxer than ACL, the double is laxer too, so these prove the
// binding refuses by itself, before calling CUDA.
func TestACLRulesEnforcedOverCUDA(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	base, err := d.ReserveMemAddress(8*g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h, err := d.MallocPhysical(2*g, prop(), 0)
	require.NoError(t, err)

	maps := f.calls(t, "cuMemMap")
	// CUDA would map part of an allocation; ACL maps whole ones.
	acltest.RequireCode(t, d.MapMem(base, g, 0, h, 0), acl.ErrCodeRTParamInvalid)
	require.Equal(t, maps, f.calls(t, "cuMemMap"), "refused before CUDA was called")

	h2, err := d.MallocPhysical(2*g, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, 2*g, 0, h, 0))
	require.NoError(t, d.MapMem(base+2*g, 2*g, 0, h2, 0))
	unmaps := f.calls(t, "cuMemUnmap")
	// ACL unmaps exactly one mapping, given its start.
	acltest.RequireCode(t, d.UnmapMem(base+g), acl.ErrCodeRTDrvInternal)
	require.Equal(t, unmaps, f.calls(t, "cuMemUnmap"))
	// Release with mappings left: refused in Go.
	acltest.RequireCode(t, d.ReleaseMemAddress(base), acl.ErrCodeRTParamInvalid)

	// Free while mapped is legal (cuMemRelease), and the memory stays until
	// the last unmap.
	require.NoError(t, d.FreePhysical(h))
	assert.Equal(t, int64(2), f.live().Allocations, "a released but mapped allocation lives on")
	releases := f.calls(t, "cuMemRelease")
	acltest.RequireCode(t, d.FreePhysical(h), acl.ErrCodeRTParamInvalid)
	require.Equal(t, releases, f.calls(t, "cuMemRelease"), "a second free never reaches CUDA")
	require.NoError(t, d.UnmapMem(base))
	assert.Equal(t, int64(1), f.live().Allocations, "the last unmap freed it")
	acltest.RequireCode(t, d.FreePhysical(h), acl.ErrCodeRTInvalidHandle)

	require.NoError(t, d.UnmapMem(base+2*g))
	require.NoError(t, d.FreePhysical(h2))
	require.Equal(t, acl.LiveCounts{Reservations: 1, ReservedBytes: 8 * g}, d.Live())
}

// CUDA may hand a released handle's value out again while its memory is
// still mapped; the ACL handles the binding gives out stay distinct.
func TestHandleValuesReusedByCUDA(t *testing.T) {
	d, _ := openFake(t, 0, Config{})
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h1, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h1, 0))
	require.NoError(t, d.FreePhysical(h1)) // CUDA handle released; mapping lives
	h2, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	require.NotEqual(t, h1, h2)
	require.NoError(t, d.MapMem(base+g, g, 0, h2, 0))
	require.NoError(t, d.UnmapMem(base)) // frees h1's memory, not h2's
	require.NoError(t, d.MemSetAccess(base+g, g, acl.ReadWrite(0)))
	require.NoError(t, d.MemcpyHtoD(base+g, []byte("h2")))
	require.NoError(t, d.UnmapMem(base+g))
	require.NoError(t, d.FreePhysical(h2))
}

// A copy into a mapping without access fails, as on CUDA, and succeeds
// after MemSetAccess; calling MemSetAccess per mapping, or twice, is fine.
func TestAccessAfterEveryMap(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	for round := range 2 {
		at := base + acl.DevicePtr(round)*g
		require.NoError(t, d.MapMem(at, g, 0, h, 0))
		copies := f.calls(t, "cuMemcpyHtoD_v2")
		acltest.RequireCode(t, d.MemcpyHtoD(at, []byte{1}), acl.ErrCodeRTParamInvalid)
		require.Equal(t, copies, f.calls(t, "cuMemcpyHtoD_v2"), "refused before it reached the GPU")
		require.NoError(t, d.MemSetAccess(at, g, acl.ReadWrite(0)))
		n := f.calls(t, "cuMemSetAccess")
		require.NoError(t, d.MemSetAccess(at, g, acl.ReadWrite(0)), "again")
		require.Equal(t, n, f.calls(t, "cuMemSetAccess"), "a second grant calls nothing")
		require.NoError(t, d.MemcpyHtoD(at, []byte{byte(round)}))
		require.NoError(t, d.UnmapMem(at))
	}
	require.NoError(t, d.FreePhysical(h))

	// The binding refuses what CUDA cannot do.
	hostDesc := []acl.MemAccessDesc{{Flags: acl.MemAccessReadWrite, Location: acl.MemLocation{Type: acl.MemLocationTypeHost}}}
	acltest.RequireCode(t, d.MemSetAccess(base, g, hostDesc), acl.ErrCodeInvalidParam)
	acltest.RequireCode(t, d.MemSetAccess(base, g, acl.ReadWrite(1)), acl.ErrCodeRTInvalidDeviceID)
}

// No call but SynchronizeDevice (and Close with leaks) waits for the whole
// device: UnmapMem is the bare cuMemUnmap, and the synchronous device copies
// wait for the driver's own stream only.
func TestNoDeviceWideSync(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	ctxSyncs := f.calls(t, "cuCtxSynchronize")
	s, err := d.CreateStream()
	require.NoError(t, err)
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	require.NoError(t, d.MemcpyHtoD(base, []byte("abc")))
	require.NoError(t, d.MemcpyDtoD(base+8, base, 3))
	require.NoError(t, d.Memset(base+1, 'x', 1))
	require.NoError(t, d.MemsetAsync(base+16, 'y', 1, s))
	require.NoError(t, d.RecordEvent(ev, s))
	require.NoError(t, d.SynchronizeEvent(ev))
	require.NoError(t, d.SynchronizeStream(s))
	got := make([]byte, 17)
	require.NoError(t, d.MemcpyDtoH(got, base))
	require.Equal(t, "axc\x00\x00\x00\x00\x00abc\x00\x00\x00\x00\x00y", string(got))
	unmaps := f.calls(t, "cuMemUnmap")
	streamSyncs := f.calls(t, "cuStreamSynchronize")
	require.NoError(t, d.UnmapMem(base))
	require.Equal(t, unmaps+1, f.calls(t, "cuMemUnmap"))
	require.Equal(t, streamSyncs, f.calls(t, "cuStreamSynchronize"), "UnmapMem waits for nothing")
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
	require.NoError(t, d.DestroyEvent(ev))
	require.NoError(t, d.DestroyStream(s))
	require.Equal(t, ctxSyncs, f.calls(t, "cuCtxSynchronize"), "no device-wide synchronisation")
	require.NoError(t, d.SynchronizeDevice())
	require.Equal(t, ctxSyncs+1, f.calls(t, "cuCtxSynchronize"))
}

// The granularity is the device's, not a constant.
func TestGranularityQueriedPerDevice(t *testing.T) {
	f := newFake(t)
	f.set(t, "granularity", 4<<20)
	d, err := Open(Config{Library: f.path})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()); f.requireClean(t) }()
	for _, opt := range []acl.MemGranularityOptions{acl.GranularityMinimum, acl.GranularityRecommended} {
		gr, err := d.MemGetAllocationGranularity(prop(), opt)
		require.NoError(t, err)
		require.Equal(t, uintptr(4<<20), gr)
	}
	huge := acl.DeviceProp(0, acl.HBMMemHuge1G)
	gr, err := d.MemGetAllocationGranularity(&huge, acl.GranularityMinimum)
	require.NoError(t, err)
	require.Equal(t, uintptr(1<<30), gr)
	_, err = d.MallocPhysical(2<<20, prop(), 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid)
	base, err := d.ReserveMemAddress(5<<20, 0, 0, 0)
	require.NoError(t, err)
	require.Zero(t, uintptr(base)%(4<<20))
	require.Equal(t, uintptr(8<<20), d.Live().ReservedBytes, "rounded up to the granularity")
	h, err := d.MallocPhysical(4<<20, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, 4<<20, 0, h, 0))
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
}

// A HUGE1G allocation is rounded up to 1 GiB and maps on 1 GiB boundaries.
func TestHuge1G(t *testing.T) {
	d, _ := openFake(t, 2<<30, Config{})
	p := acl.DeviceProp(0, acl.HBMMemHuge1G)
	base, err := d.ReserveMemAddress(2<<30, 0, 0, 0)
	require.NoError(t, err)
	require.Zero(t, uintptr(base)%(1<<30))
	h, err := d.MallocPhysical(g, &p, 0)
	require.NoError(t, err)
	require.Equal(t, uintptr(1<<30), d.Live().PhysicalBytes)
	acltest.RequireCode(t, d.MapMem(base+g, 1<<30, 0, h, 0), acl.ErrCodeRTParamInvalid)
	require.NoError(t, d.MapMem(base, 1<<30, 0, h, 0))
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
}

// CUDA failures become *cuda.Error values that unwrap to the *acl.Error of
// the contract, with the CUDA function as Op and the driver's name and
// description of the result in Msg.
func TestErrorMapping(t *testing.T) {
	cases := []struct {
		r        Result
		code     int32
		sentinel error
		name     string
	}{
		{ResultInvalidValue, acl.ErrCodeRTParamInvalid, acl.ErrInvalidParam, "CUDA_ERROR_INVALID_VALUE"},
		{ResultOutOfMemory, acl.ErrCodeRTMemoryAllocation, acl.ErrOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY"},
		{ResultStubLibrary, acl.ErrCodeRTFeatureNotSupport, acl.ErrNotSupported, "CUDA_ERROR_STUB_LIBRARY"},
		{ResultNotSupported, acl.ErrCodeRTFeatureNotSupport, acl.ErrNotSupported, "CUDA_ERROR_NOT_SUPPORTED"},
		{ResultInvalidContext, acl.ErrCodeRTContextNull, acl.ErrNoContext, "CUDA_ERROR_INVALID_CONTEXT"},
		{ResultInvalidDevice, acl.ErrCodeRTInvalidDeviceID, acl.ErrNoDevice, "CUDA_ERROR_INVALID_DEVICE"},
		{ResultNoDevice, acl.ErrCodeRTNoDevice, acl.ErrNoDevice, "CUDA_ERROR_NO_DEVICE"},
		{ResultInvalidHandle, acl.ErrCodeRTInvalidHandle, acl.ErrInvalidHandle, "CUDA_ERROR_INVALID_HANDLE"},
		{ResultNotReady, acl.ErrCodeRTDrvInternal, nil, "CUDA_ERROR_NOT_READY"},
		{ResultIllegalAddress, acl.ErrCodeRTDrvInternal, nil, "CUDA_ERROR_ILLEGAL_ADDRESS"},
		{ResultUnknown, acl.ErrCodeRTDrvInternal, nil, "CUDA_ERROR_UNKNOWN"},
		{12345, acl.ErrCodeRTDrvInternal, nil, "CUresult(12345)"}, // the driver does not name it
	}
	d, f := openFake(t, 0, Config{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.fail(t, "cuMemCreate", 1, tc.r)
			h, err := d.MallocPhysical(g, prop(), 0)
			require.Error(t, err)
			require.Zero(t, h)
			acltest.RequireCode(t, err, tc.code)
			var ae *acl.Error
			require.ErrorAs(t, err, &ae)
			require.Equal(t, "cuMemCreate", ae.Op)
			require.Contains(t, ae.Msg, fmt.Sprintf("%s (%d)", tc.name, int32(tc.r)))
			if tc.sentinel != nil {
				require.ErrorIs(t, err, tc.sentinel)
			}
			var ce *Error
			require.ErrorAs(t, err, &ce)
			require.Equal(t, tc.r, ce.Result)
			require.Equal(t, "cuMemCreate", ce.Func)
			require.Equal(t, ce.ACL().Error(), err.Error())
			require.Zero(t, d.Live().Handles, "a failed call leaves nothing behind")
		})
	}
	// The driver's own description is kept.
	f.fail(t, "cuMemCreate", 1, ResultOutOfMemory)
	_, err := d.MallocPhysical(g, prop(), 0)
	require.EqualError(t, err, "cuMemCreate: ACL_ERROR_RT_MEMORY_ALLOCATION (207001): CUDA_ERROR_OUT_OF_MEMORY (2): out of memory")
}

// A CUDA call that fails leaves the driver's state as it was, and the
// operation can be retried.
func TestFailedCallsChangeNothing(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	steps := []struct {
		fn string
		do func() error
	}{
		{fn: "cuMemMap", do: func() error { return d.MapMem(base, g, 0, h, 0) }},
		{fn: "cuMemSetAccess", do: func() error { return d.MemSetAccess(base, g, acl.ReadWrite(0)) }},
		{fn: "cuMemcpyHtoD_v2", do: func() error { return d.MemcpyHtoD(base, []byte("x")) }},
		{fn: "cuMemcpyDtoH_v2", do: func() error { return d.MemcpyDtoH(make([]byte, 1), base) }},
		{fn: "cuMemcpyDtoDAsync_v2", do: func() error { return d.MemcpyDtoD(base+1, base, 1) }},
		{fn: "cuMemsetD8Async", do: func() error { return d.Memset(base, 1, 1) }},
		{fn: "cuStreamSynchronize", do: func() error { return d.Memset(base, 1, 1) }},
		{fn: "cuMemUnmap", do: func() error { return d.UnmapMem(base) }},
		{fn: "cuMemRelease", do: func() error { return d.FreePhysical(h) }},
		{fn: "cuMemAddressFree", do: func() error { return d.ReleaseMemAddress(base) }},
	}
	for _, s := range steps {
		before, fakeBefore := d.Live(), f.live()
		f.fail(t, s.fn, 1, ResultUnknown)
		err := s.do()
		require.Error(t, err, s.fn)
		require.Equal(t, ResultUnknown, resultOf(err), "%s: %v", s.fn, err)
		var ae *acl.Error
		require.ErrorAs(t, err, &ae)
		require.Equal(t, s.fn, ae.Op)
		require.Equal(t, before, d.Live(), "%s failed but changed the state", s.fn)
		require.Equal(t, fakeBefore, f.live(), "%s failed but changed CUDA's state", s.fn)
		require.NoError(t, s.do(), "%s retried", s.fn)
	}
	require.True(t, d.Live().Zero(), "%+v", d.Live())
	_, err = d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	f.fail(t, "cuMemAddressReserve", 1, ResultOutOfMemory)
	_, err = d.ReserveMemAddress(g, 0, 0, 0)
	require.ErrorIs(t, err, acl.ErrOutOfMemory)
	require.Equal(t, 1, d.Live().Reservations)
	f.fail(t, "cuMemGetInfo_v2", 1, ResultUnknown)
	_, _, err = d.GetMemInfo(acl.HBMMem)
	require.Equal(t, ResultUnknown, resultOf(err))
	// Leave one reservation for Close to find.
	err = d.Close()
	require.ErrorContains(t, err, "still live")
}

// Every CUDA call runs with the device's context current on its thread: the
// double fails calls without one (CUDA_ERROR_INVALID_CONTEXT), which the
// binding reports as acl.ErrNoContext.
func TestContextPerThread(t *testing.T) {
	f := newFake(t)
	f.set(t, "devices", 4)
	d, err := Open(Config{Library: f.path})
	require.NoError(t, err)
	t.Cleanup(func() { f.requireClean(t) })

	// Without the discipline, a fresh thread has no context.
	done := make(chan Result)
	go func() {
		runtime.LockOSThread() // a goroutine locked and never unlocked ends its thread
		f.setCurrent(0)        // as on a thread CUDA never saw
		var free, total uintptr
		done <- d.lib.cuMemGetInfo(&free, &total)
	}()
	r := <-done
	require.Equal(t, ResultInvalidContext, r)
	require.ErrorIs(t, d.lib.newError("cuMemGetInfo_v2", r), acl.ErrNoContext)

	// With it, calls on new threads work, and a thread with no context keeps
	// ours.
	go func() {
		runtime.LockOSThread()
		f.setCurrent(0)
		_, _, err := d.GetMemInfo(acl.HBMMem)
		if err != nil {
			done <- resultOf(err)
			return
		}
		if f.current() != d.ctx {
			done <- -2
			return
		}
		done <- ResultSuccess
	}()
	require.Equal(t, ResultSuccess, <-done)

	// A caller's own context, on a thread it locked, is put back.
	foreign := f.primary(3) // any context that is not ours
	go func() {
		runtime.LockOSThread()
		f.setCurrent(foreign)
		_, _, err := d.GetMemInfo(acl.HBMMem)
		if err != nil || f.current() != foreign {
			done <- -3
			return
		}
		done <- ResultSuccess
	}()
	require.Equal(t, ResultSuccess, <-done)

	// After Close, the context is released: a thread that still has it
	// current cannot call CUDA any more, and the driver refuses to.
	require.NoError(t, d.Close())
	go func() {
		runtime.LockOSThread()
		f.setCurrent(d.ctx)
		var free, total uintptr
		done <- d.lib.cuMemGetInfo(&free, &total)
	}()
	require.Equal(t, ResultInvalidContext, <-done)
	_, _, err = d.GetMemInfo(acl.HBMMem)
	acltest.RequireCode(t, err, acl.ErrCodeRTContextNull)
}

// Many goroutines, more than threads, on two devices at once: every call
// binds the right context wherever it runs.
func TestConcurrentTwoDevices(t *testing.T) {
	f := newFake(t)
	f.set(t, "devices", 2)
	var ds []*Driver
	for dev := range 2 {
		d, err := Open(Config{Library: f.path, Device: dev})
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("cuda:%d", dev), d.Name())
		ds = append(ds, d)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := ds[w%2]
			p := acl.DeviceProp(d.Device(), 0)
			for r := range 10 {
				base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
				if err != nil {
					errs <- err
					return
				}
				h, err := d.MallocPhysical(g, &p, 0)
				if err != nil {
					errs <- err
					return
				}
				err = errors.Join(d.MapMem(base, g, 0, h, 0), d.MemSetAccess(base, g, acl.ReadWrite(d.Device())))
				msg := []byte(fmt.Sprintf("w%d r%d", w, r))
				got := make([]byte, len(msg))
				err = errors.Join(err, d.MemcpyHtoD(base+100, msg), d.MemcpyDtoH(got, base+100))
				if err == nil && !bytes.Equal(got, msg) {
					err = fmt.Errorf("read %q, want %q", got, msg)
				}
				err = errors.Join(err, d.UnmapMem(base), d.FreePhysical(h), d.ReleaseMemAddress(base))
				if err != nil {
					errs <- err
					return
				}
				runtime.Gosched()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, d := range ds {
		require.True(t, d.Live().Zero())
		require.NoError(t, d.Close())
	}
	f.requireClean(t)
}

// Copies run in parallel with mapping changes elsewhere, and an unmap waits
// for copies of its range.
func TestCopiesRaceMapping(t *testing.T) {
	d, _ := openFake(t, 0, Config{})
	base, err := d.ReserveMemAddress(16*g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := bytes.Repeat([]byte{byte(w)}, 64<<10)
			got := make([]byte, len(buf))
			at := base + acl.DevicePtr(w)*(128<<10)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := errors.Join(d.MemcpyHtoD(at, buf), d.MemcpyDtoH(got, at)); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(buf, got) {
					errs <- fmt.Errorf("worker %d read back other bytes", w)
					return
				}
			}
		}()
	}
	for i := range 50 {
		at := base + acl.DevicePtr(1+i%15)*g
		h2, err := d.MallocPhysical(g, prop(), 0)
		require.NoError(t, err)
		require.NoError(t, d.MapMem(at, g, 0, h2, 0))
		require.NoError(t, d.MemSetAccess(at, g, acl.ReadWrite(0)))
		require.NoError(t, d.Memset(at, 7, g))
		require.NoError(t, d.UnmapMem(at))
		require.NoError(t, d.FreePhysical(h2))
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
}

func TestCloseReleasesLeaks(t *testing.T) {
	f := newFake(t)
	d, err := Open(Config{Library: f.path})
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	_, err = d.MallocPhysical(g, prop(), 0) // never mapped
	require.NoError(t, err)
	h3, err := d.MallocPhysical(g, prop(), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base+g, g, 0, h3, 0))
	require.NoError(t, d.FreePhysical(h3)) // freed, still mapped
	err = d.Close()
	require.ErrorContains(t, err, "still live")
	f.requireClean(t)
	require.True(t, d.Live().Zero())
	require.NoError(t, d.Close(), "second Close")
	var nilDriver *Driver
	require.NoError(t, nilDriver.Close())
	_, err = d.MallocPhysical(g, prop(), 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTContextNull)
	require.ErrorIs(t, err, acl.ErrNoContext)
}

// Close waits for calls in flight.
func TestCloseWhileCalling(t *testing.T) {
	f := newFake(t)
	d, err := Open(Config{Library: f.path})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, _, err := d.GetMemInfo(acl.HBMMem); err != nil {
					if c, _ := acl.CodeOf(err); c != acl.ErrCodeRTContextNull {
						t.Errorf("GetMemInfo: %v", err)
					}
					return
				}
			}
		}()
	}
	require.NoError(t, d.Close())
	wg.Wait()
	f.requireClean(t)
}

func TestOpenErrors(t *testing.T) {
	t.Run("NoLibrary", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "libcuda.so.1")
		_, err := Open(Config{Library: path})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		require.ErrorContains(t, err, path)
	})
	t.Run("MissingSymbol", func(t *testing.T) {
		builtDouble(t) // skips without a C compiler
		cc := os.Getenv("CC")
		if cc == "" {
			cc = "gcc"
		}
		dir := t.TempDir()
		src := filepath.Join(dir, "partial.c")
		require.NoError(t, os.WriteFile(src, []byte("int cuInit(unsigned f) { return (int)f; }\n"), 0o644))
		lib := filepath.Join(dir, "libcuda.so.1")
		out, err := exec.Command(cc, "-shared", "-fPIC", "-o", lib, src).CombinedOutput()
		require.NoError(t, err, "%s", out)
		_, err = Open(Config{Library: lib})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		require.ErrorContains(t, err, "cuDriverGetVersion")
		require.ErrorContains(t, err, lib)
	})
	t.Run("StubLibrary", func(t *testing.T) {
		f := newFake(t, "FAKECUDA_STUB", "1")
		_, err := Open(Config{Library: f.path})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		require.Equal(t, ResultStubLibrary, resultOf(err))
		require.ErrorContains(t, err, "cuInit")
		f.requireClean(t)
	})
	t.Run("NoDevice", func(t *testing.T) {
		f := newFake(t, "FAKECUDA_DEVICES", "0")
		_, err := Open(Config{Library: f.path})
		require.ErrorIs(t, err, acl.ErrNoDevice)
		require.Equal(t, ResultNoDevice, resultOf(err))
	})
	t.Run("DeviceOutOfRange", func(t *testing.T) {
		f := newFake(t)
		_, err := Open(Config{Library: f.path, Device: 1})
		require.ErrorIs(t, err, acl.ErrNoDevice)
		_, err = Open(Config{Library: f.path, Device: -1})
		require.ErrorIs(t, err, acl.ErrInvalidParam)
		f.requireClean(t)
	})
	t.Run("NoVMM", func(t *testing.T) {
		f := newFake(t)
		f.set(t, "vmm", 0)
		_, err := Open(Config{Library: f.path})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		require.ErrorContains(t, err, "VIRTUAL_MEMORY_MANAGEMENT")
		f.requireClean(t)
	})
	t.Run("OldDriver", func(t *testing.T) {
		f := newFake(t)
		f.set(t, "version", 10010)
		_, err := Open(Config{Library: f.path})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		require.ErrorContains(t, err, "10.1")
	})
	t.Run("GranularityFails", func(t *testing.T) {
		f := newFake(t)
		f.fail(t, "cuMemGetAllocationGranularity", 1, ResultNotSupported)
		_, err := Open(Config{Library: f.path})
		require.ErrorIs(t, err, acl.ErrNotSupported)
		f.requireClean(t) // the primary context was released again
	})
	t.Run("RetainFails", func(t *testing.T) {
		f := newFake(t)
		f.fail(t, "cuDevicePrimaryCtxRetain", 1, ResultOutOfMemory)
		_, err := Open(Config{Library: f.path})
		require.ErrorIs(t, err, acl.ErrOutOfMemory)
		require.ErrorContains(t, err, "cuDevicePrimaryCtxRetain")
	})
}

// $VMARENA_CUDA_LIBRARY names the library when the Config does not.
func TestLibraryFromEnv(t *testing.T) {
	f := newFake(t)
	t.Setenv(LibraryEnv, f.path)
	d, err := Open(Config{})
	require.NoError(t, err)
	require.Equal(t, f.path, d.lib.path)
	require.NoError(t, d.Close())
	t.Setenv(LibraryEnv, filepath.Join(t.TempDir(), "first.so"))
	_, err = Open(Config{})
	require.ErrorContains(t, err, "first.so")
	// An explicit path wins over the variable, and is the only one tried.
	missing := filepath.Join(t.TempDir(), "nothing.so")
	_, err = Open(Config{Library: missing})
	require.ErrorContains(t, err, missing)
	f.requireClean(t)
}

func TestMemInfoAndCapacity(t *testing.T) {
	d, _ := openFake(t, 64<<20, Config{})
	free, total, err := d.GetMemInfo(acl.HBMMem)
	require.NoError(t, err)
	require.Equal(t, uintptr(64<<20), total)
	require.Equal(t, total, free)
	_, _, err = d.GetMemInfo(acl.MemAttr(99))
	acltest.RequireCode(t, err, acl.ErrCodeInvalidParam)
	require.Equal(t, "cuda:0", d.Name())
	require.Equal(t, int32(0), d.Device())
	require.Equal(t, 12060, d.DriverVersion())
}

func TestResultString(t *testing.T) {
	require.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", ResultOutOfMemory.String())
	require.Equal(t, "CUresult(77)", Result(77).String())
	require.Equal(t, acl.Success, ACLCode(ResultSuccess))
	e := &Error{Func: "cuMemMap", Result: ResultInvalidValue} // no driver names
	require.Equal(t, "cuMemMap: ACL_ERROR_RT_PARAM_INVALID (107000): CUDA_ERROR_INVALID_VALUE (1)", e.Error())
}

// Every method binds the context itself: run each on a thread that has no
// context current, as a thread CUDA never saw.
func TestEveryCallBindsContext(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	fresh := func(fn func() error) error {
		errc := make(chan error)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			f.setCurrent(0)
			errc <- fn()
		}()
		return <-errc
	}
	var base acl.DevicePtr
	var h acl.PhysicalHandle
	var s acl.Stream
	var ev acl.Event
	steps := []struct {
		name string
		fn   func() error
	}{
		{"CreateStream", func() (err error) { s, err = d.CreateStream(); return err }},
		{"CreateEvent", func() (err error) { ev, err = d.CreateEvent(); return err }},
		{"ReserveMemAddress", func() (err error) { base, err = d.ReserveMemAddress(2*g, 0, 0, 0); return err }},
		{"MallocPhysical", func() (err error) { h, err = d.MallocPhysical(g, prop(), 0); return err }},
		{"MapMem", func() error { return d.MapMem(base, g, 0, h, 0) }},
		{"MemSetAccess", func() error { return d.MemSetAccess(base, g, acl.ReadWrite(0)) }},
		{"MemcpyHtoD", func() error { return d.MemcpyHtoD(base, []byte("abc")) }},
		{"MemcpyDtoD", func() error { return d.MemcpyDtoD(base+8, base, 3) }},
		{"Memset", func() error { return d.Memset(base+1, 'x', 1) }},
		{"MemcpyDtoH", func() error {
			got := make([]byte, 11)
			if err := d.MemcpyDtoH(got, base); err != nil {
				return err
			}
			if string(got) != "axc\x00\x00\x00\x00\x00abc" {
				return fmt.Errorf("read %q", got)
			}
			return nil
		}},
		{"GetMemInfo", func() error { _, _, err := d.GetMemInfo(acl.HBMMem); return err }},
		{"MemsetAsync", func() error { return d.MemsetAsync(base, 0, 1, s) }},
		{"RecordEvent", func() error { return d.RecordEvent(ev, s) }},
		{"QueryEvent", func() error { _, err := d.QueryEvent(ev); return err }},
		{"SynchronizeEvent", func() error { return d.SynchronizeEvent(ev) }},
		{"SynchronizeStream", func() error { return d.SynchronizeStream(s) }},
		{"SynchronizeDevice", d.SynchronizeDevice},
		{"DestroyEvent", func() error { return d.DestroyEvent(ev) }},
		{"DestroyStream", func() error { return d.DestroyStream(s) }},
		{"UnmapMem", func() error { return d.UnmapMem(base) }},
		{"FreePhysical", func() error { return d.FreePhysical(h) }},
		{"ReleaseMemAddress", func() error { return d.ReleaseMemAddress(base) }},
		{"Close", d.Close},
	}
	for _, s := range steps {
		require.NoError(t, fresh(s.fn), s.name)
	}
}

// The synchronous device copies and memsets run on the driver's own
// non-blocking stream and wait for it alone: a kernel in flight on a caller's
// stream, or on the legacy default stream, does not hold them back. Host
// copies are synchronous calls and wait for no stream of ours.
func TestSynchronousCopiesWaitForTheirOwnStream(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	l := launcherOf(d).(*launcher)
	s, err := d.CreateStream()
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(2*g, 0, 0, 0)
	require.NoError(t, err)
	hs := make([]acl.PhysicalHandle, 2)
	for i := range hs {
		hs[i], err = d.MallocPhysical(g, prop(), 0)
		require.NoError(t, err)
		require.NoError(t, d.MapMem(base+acl.DevicePtr(i)*g, g, 0, hs[i], 0))
	}
	require.NoError(t, d.MemSetAccess(base, 2*g, acl.ReadWrite(0)))
	busy := base + g // where the kernels run; the copies use the first chunk
	for _, on := range []acl.Stream{s, 0} {
		id, err := l.launch(on, busy, g)
		require.NoError(t, err)
		unblock := func() { l.f.finish(id) }
		for _, c := range []struct {
			fn    string
			calls []string
			do    func() error
		}{
			{"Memset", []string{"cuMemsetD8Async", "cuStreamSynchronize"}, func() error { return d.Memset(base, 1, 10) }},
			{"MemcpyDtoD", []string{"cuMemcpyDtoDAsync_v2", "cuStreamSynchronize"}, func() error { return d.MemcpyDtoD(base+10, base, 10) }},
		} {
			before := map[string]int64{}
			for _, fn := range append(c.calls, "cuCtxSynchronize") {
				before[fn] = f.calls(t, fn)
			}
			require.NoError(t, returnsSoon(t, unblock, c.do), c.fn)
			for _, fn := range c.calls {
				require.Equal(t, before[fn]+1, f.calls(t, fn), "%s calls %s once", c.fn, fn)
			}
			require.Equal(t, before["cuCtxSynchronize"], f.calls(t, "cuCtxSynchronize"), c.fn)
		}
		if on != 0 {
			// A host copy runs on the legacy stream, which a non-blocking
			// stream's work does not hold back either. (On the legacy
			// stream itself it would wait, as on a GPU.)
			require.NoError(t, returnsSoon(t, unblock, func() error { return d.MemcpyHtoD(base, []byte{1}) }))
		}
		require.Equal(t, int32(0), l.f.finish(id))
		require.NoError(t, d.SynchronizeStream(on))
	}
	got := make([]byte, 20)
	require.NoError(t, d.MemcpyDtoH(got, base))
	require.Equal(t, append([]byte{1}, bytes.Repeat([]byte{1}, 19)...), got)
	require.Zero(t, l.Faults(), "no copy touched the kernels' range")

	f.fail(t, "cuStreamSynchronize", 1, ResultIllegalAddress)
	err = d.Memset(base, 1, 10)
	require.Equal(t, ResultIllegalAddress, resultOf(err), "a fault reported at the wait is returned")
	for i, h := range hs {
		require.NoError(t, d.UnmapMem(base+acl.DevicePtr(i)*g))
		require.NoError(t, d.FreePhysical(h))
	}
	require.NoError(t, d.ReleaseMemAddress(base))
	require.NoError(t, d.DestroyStream(s))
}

// returnsSoon runs fn and fails the test if it has not returned within a
// second: it is waiting for work that will not finish until unblock runs.
func returnsSoon(t testing.TB, unblock func(), fn func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- fn() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(time.Second):
		unblock() // so that the call, and the test's cleanup, can end
		<-errc
		t.Fatal("the call waited for unrelated device work")
		return nil
	}
}

// A MallocHost that runs between FreeHost's cuMemFreeHost and its return,
// and gets the address just freed, keeps its buffer in the binding's books:
// FreeHost took its own out before CUDA freed it. (Forced with the
// sched.HostFreed point; the double hands the last buffer freed back to the
// next cuMemHostAlloc of its size, as a driver pooling host memory does.)
func TestFreeHostRacesMallocHost(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	hostmemtest.RequireFreeHostKeepsReuse(t, d, func() int { return int(f.live().HostBuffers) })
}

// MallocHost and FreeHost are cuMemHostAlloc and cuMemFreeHost, and the
// double agrees with the binding's books at every step.
func TestHostMemoryCalls(t *testing.T) {
	d, f := openFake(t, 0, Config{})
	b, err := d.MallocHost(3 << 20)
	require.NoError(t, err)
	require.Len(t, b, 3<<20)
	require.Equal(t, int64(1), f.calls(t, "cuMemHostAlloc"))
	require.Equal(t, int64(1), f.live().HostBuffers)
	require.Equal(t, uintptr(3<<20), f.live().HostBytes)
	require.Equal(t, 1, d.Live().HostBuffers)

	f.fail(t, "cuMemFreeHost", 1, ResultUnknown)
	require.Error(t, d.FreeHost(b))
	require.Equal(t, 1, d.Live().HostBuffers, "a failed free keeps the buffer")
	require.NoError(t, d.FreeHost(b))
	require.Zero(t, f.live().HostBuffers)
	require.Zero(t, d.Live().HostBuffers)

	f.fail(t, "cuMemHostAlloc", 1, ResultOutOfMemory)
	_, err = d.MallocHost(1 << 20)
	require.ErrorIs(t, err, acl.ErrOutOfMemory)
	require.Zero(t, d.Live().HostBuffers)
}
