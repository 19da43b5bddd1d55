package ascend_test

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/arena/arenatest"
	"github.com/vmarena/vmarena/internal/skip"
)

// The hardware tests run on a real NPU through the runtime the default
// search finds ($VMARENA_ASCEND_LIBRARY, $ASCEND_HOME_PATH, …):
//
//	VMARENA_REQUIRE_NPU=1 go test -run NPU -v ./acl/ascend
//
// One run gives every figure the docs lack: the conformance suites (the
// stream and event tests included; the ones that need a stand-in kernel
// skip), the cost of each stream, event and memset call on an idle NPU, and
// what fresh physical memory holds (TestNPUStreamTimings, TestNPUFreshMemory).
//
// VMARENA_DEVICE=ascend:N picks NPU N (default 0). Without an NPU they skip,
// saying why; with VMARENA_REQUIRE_NPU set, or when a runtime is found but
// fails, they fail.

// RequireNPUEnv makes the hardware tests fail instead of skipping when no NPU
// can be opened.
const RequireNPUEnv = "VMARENA_REQUIRE_NPU"

func npuDevice() int32 {
	if n, ok := strings.CutPrefix(os.Getenv("VMARENA_DEVICE"), "ascend:"); ok {
		if id, err := strconv.ParseInt(n, 10, 32); err == nil {
			return int32(id)
		}
	}
	return 0
}

// openNPU opens the NPU, skipping only when there is no runtime or no NPU
// (an error matching acl.ErrNotSupported) and the NPU is not required.
func openNPU(t testing.TB) *ascend.Driver {
	t.Helper()
	d, err := ascend.Open(ascend.Config{Device: npuDevice()})
	if errors.Is(err, acl.ErrNotSupported) && os.Getenv(RequireNPUEnv) == "" {
		skip.NoDevice(t, "no Ascend NPU: %v (set %s=1 to make this a failure)", err, RequireNPUEnv)
	}
	require.NoError(t, err, "an Ascend runtime is present but does not work")
	t.Cleanup(func() { assert.NoError(t, d.Close()) })
	return d
}

func TestNPUOpen(t *testing.T) {
	d := openNPU(t)
	free, total, err := d.GetMemInfo(acl.HBMMem)
	require.NoError(t, err)
	g, err := d.MemGetAllocationGranularity(prop(d.Device()), acl.GranularityRecommended)
	require.NoError(t, err)
	t.Logf("%s: %s, %s; HBM %d of %d bytes free; granularity %d", d.Name(), d.SocName(), d.Library(), free, total, g)
}

// The driver contract on the NPU, streams and events included. No kernel can
// be launched from Go, so Launcher is nil and the tests of work in flight
// skip; the codes ACL leaves undocumented are not checked.
func TestNPUConformance(t *testing.T) {
	openNPU(t) // skip once, here, not in every subtest
	acltest.Run(t, acltest.Factory{Open: func(t testing.TB) acl.Driver { return openNPU(t) }, Hardware: true})
}

// A stream the caller's own CANN code created (aclrtCreateStream called
// directly) works with the driver: MemsetAsync, RecordEvent, QueryEvent,
// SynchronizeEvent and SynchronizeStream pass it on, DestroyStream refuses
// it, and the books do not count it.
func TestNPUForeignStream(t *testing.T) {
	testRawForeignStream(t, openNPU(t))
}

// testRawForeignStream is TestNPUForeignStream's body, which the tests on the
// double run too.
func testRawForeignStream(t *testing.T, d *ascend.Driver) {
	fs, destroy, err := ascend.RawStream(d)
	require.NoError(t, err)
	defer func() { require.NoError(t, destroy()) }()
	g, err := d.MemGetAllocationGranularity(prop(d.Device()), acl.GranularityMinimum)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	h, err := d.MallocPhysical(g, prop(d.Device()), 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreePhysical(h)) }()
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	defer func() { require.NoError(t, d.UnmapMem(base)) }()
	if err := d.MemSetAccess(base, g, acl.ReadWrite(d.Device())); !errors.Is(err, acl.ErrNotSupported) {
		require.NoError(t, err)
	}
	ev, err := d.CreateEvent()
	if errors.Is(err, acl.ErrNotSupported) {
		skip.NoDevice(t, "no events on this runtime: %v", err)
	}
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyEvent(ev)) }()

	require.NoError(t, d.MemsetAsync(base, 0xC3, g, fs))
	require.NoError(t, d.RecordEvent(ev, fs))
	require.NoError(t, d.SynchronizeEvent(ev))
	complete, err := d.QueryEvent(ev)
	require.NoError(t, err)
	assert.True(t, complete)
	require.NoError(t, d.SynchronizeStream(fs))
	got := make([]byte, 4)
	require.NoError(t, d.MemcpyDtoH(got, base+acl.DevicePtr(g-4)))
	assert.Equal(t, []byte{0xC3, 0xC3, 0xC3, 0xC3}, got)
	acltest.RequireCode(t, d.DestroyStream(fs), acl.ErrCodeRTParamInvalid, "a foreign stream")
	assert.Zero(t, d.Live().Streams, "not in the books")
}

func TestNPUArena(t *testing.T) {
	openNPU(t)
	arenatest.Run(t, func(t testing.TB, capacity uintptr) acl.Driver {
		return arenatest.Capped(openNPU(t), capacity)
	})
}

// npuChunk maps one granule of HBM with access, for the measurements.
func npuChunk(t *testing.T, d *ascend.Driver) (acl.DevicePtr, acl.PhysicalHandle, uintptr) {
	t.Helper()
	g, err := d.MemGetAllocationGranularity(prop(d.Device()), acl.GranularityMinimum)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(g, prop(d.Device()), 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	if err := d.MemSetAccess(base, g, acl.ReadWrite(d.Device())); !errors.Is(err, acl.ErrNotSupported) {
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		assert.NoError(t, d.UnmapMem(base))
		assert.NoError(t, d.FreePhysical(h))
		assert.NoError(t, d.ReleaseMemAddress(base))
	})
	return base, h, g
}

// timing collects the durations of one call.
type timing struct {
	name string
	d    []time.Duration
}

func (tm *timing) run(t *testing.T, fn func() error) {
	t.Helper()
	t0 := time.Now()
	err := fn()
	tm.d = append(tm.d, time.Since(t0))
	require.NoError(t, err, tm.name)
}

func (tm *timing) String() string {
	d := slices.Clone(tm.d)
	slices.Sort(d)
	us := func(x time.Duration) float64 { return float64(x.Nanoseconds()) / 1e3 }
	return fmt.Sprintf("%-58s %5d %9.1f %9.1f %9.1f %9.1f", tm.name, len(d),
		us(d[0]), us(d[len(d)/2]), us(d[len(d)*9/10]), us(d[len(d)-1]))
}

// TestNPUStreamTimings measures, on an idle NPU, the calls that order unmaps
// without a device-wide wait, next to the ones they replace, and logs them in
// microseconds: the first NPU run gives every figure docs/ascend.md lacks.
// VMARENA_NPU_ROUNDS sets the samples per call (default 200).
func TestNPUStreamTimings(t *testing.T) {
	d := openNPU(t)
	rounds := 200
	if n, err := strconv.Atoi(os.Getenv("VMARENA_NPU_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	base, _, g := npuChunk(t, d)
	s, err := d.CreateStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyStream(s)) }()
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyEvent(ev)) }()

	chunk := fmt.Sprintf("%d KiB", g>>10)
	var (
		createStream = &timing{name: "aclrtCreateStream + aclrtDestroyStream"}
		createEvent  = &timing{name: "aclrtCreateEvent + aclrtDestroyEvent"}
		record       = &timing{name: "aclrtRecordEvent, idle stream"}
		queryDone    = &timing{name: "aclrtQueryEventStatus, complete"}
		syncEvent    = &timing{name: "aclrtSynchronizeEvent, idle stream"}
		recordQuery  = &timing{name: "aclrtRecordEvent + aclrtQueryEventStatus, idle stream"}
		memsetAsync  = &timing{name: "aclrtMemsetAsync, " + chunk + ", no sync"}
		memsetSync   = &timing{name: "aclrtMemsetAsync + aclrtSynchronizeStream, " + chunk}
		memset       = &timing{name: "aclrtMemset (synchronous), " + chunk}
		syncStream   = &timing{name: "aclrtSynchronizeStream, idle"}
		syncDevice   = &timing{name: "aclrtSynchronizeDevice, idle"}
		remap        = &timing{name: "aclrtMapMem, " + chunk}
		unmap        = &timing{name: "aclrtUnmapMem (bare), " + chunk}
	)
	h2, err := d.MallocPhysical(g, prop(d.Device()), 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.FreePhysical(h2)) }()
	base2, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base2)) }()

	for i := range rounds {
		createStream.run(t, func() error {
			s2, err := d.CreateStream()
			if err != nil {
				return err
			}
			return d.DestroyStream(s2)
		})
		createEvent.run(t, func() error {
			e2, err := d.CreateEvent()
			if err != nil {
				return err
			}
			return d.DestroyEvent(e2)
		})
		record.run(t, func() error { return d.RecordEvent(ev, s) })
		syncEvent.run(t, func() error { return d.SynchronizeEvent(ev) })
		queryDone.run(t, func() error {
			done, err := d.QueryEvent(ev)
			if err == nil && !done {
				err = fmt.Errorf("an event after SynchronizeEvent is not complete")
			}
			return err
		})
		recordQuery.run(t, func() error {
			if err := d.RecordEvent(ev, s); err != nil {
				return err
			}
			_, err := d.QueryEvent(ev)
			return err
		})
		require.NoError(t, d.SynchronizeStream(s))
		memsetAsync.run(t, func() error { return d.MemsetAsync(base, byte(i), g, s) })
		require.NoError(t, d.SynchronizeStream(s))
		memsetSync.run(t, func() error {
			if err := d.MemsetAsync(base, byte(i), g, s); err != nil {
				return err
			}
			return d.SynchronizeStream(s)
		})
		memset.run(t, func() error { return d.Memset(base, byte(i), g) })
		syncStream.run(t, func() error { return d.SynchronizeStream(s) })
		syncDevice.run(t, func() error { return d.SynchronizeDevice() })
		remap.run(t, func() error { return d.MapMem(base2, g, 0, h2, 0) })
		unmap.run(t, func() error { return d.UnmapMem(base2) })
	}
	lines := []string{fmt.Sprintf("%s (%s), %s: %d rounds, microseconds", d.Name(), d.SocName(), d.Library(), rounds),
		fmt.Sprintf("%-58s %5s %9s %9s %9s %9s", "call", "n", "min", "median", "p90", "max")}
	for _, tm := range []*timing{createStream, createEvent, record, queryDone, syncEvent, recordQuery,
		memsetAsync, memsetSync, memset, syncStream, syncDevice, remap, unmap} {
		lines = append(lines, tm.String())
	}
	t.Log("\n" + strings.Join(lines, "\n"))
}

// TestNPUFreshMemory logs what fresh physical memory holds on this NPU, the
// evidence that Caps().Fresh waits for: each round allocates a chunk, counts
// its zero bytes and the bytes this process wrote into the previous chunk
// before freeing it (0xEE), then dirties it and frees it. It asserts nothing:
// the binding promises nothing (acl.FreshUnknown) until such runs agree.
func TestNPUFreshMemory(t *testing.T) {
	d := openNPU(t)
	g, err := d.MemGetAllocationGranularity(prop(d.Device()), acl.GranularityMinimum)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	buf := make([]byte, g)
	for round := range 8 {
		h, err := d.MallocPhysical(g, prop(d.Device()), 0)
		require.NoError(t, err)
		require.NoError(t, d.MapMem(base, g, 0, h, 0))
		if err := d.MemSetAccess(base, g, acl.ReadWrite(d.Device())); !errors.Is(err, acl.ErrNotSupported) {
			require.NoError(t, err)
		}
		require.NoError(t, d.MemcpyDtoH(buf, base))
		var zero, own int
		for _, b := range buf {
			switch b {
			case 0:
				zero++
			case 0xEE:
				own++
			}
		}
		t.Logf("fresh chunk %d (handle %#x): %d bytes: %d zero, %d 0xEE (this process's, freed before), %d other",
			round, uintptr(h), g, zero, own, int(g)-zero-own)
		require.NoError(t, d.Memset(base, 0xEE, g))
		require.NoError(t, d.UnmapMem(base))
		require.NoError(t, d.FreePhysical(h))
	}
	t.Logf("the binding reports Caps().Fresh = %v", d.Caps().Fresh)
}
