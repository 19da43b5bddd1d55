//go:build linux && (amd64 || arm64)

package cuda

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/arena/arenatest"
	"github.com/vmarena/vmarena/internal/skip"
)

// The hardware check. It needs an NVIDIA GPU with its driver, and neither a
// C compiler nor the test double, so a prebuilt test binary runs it:
//
//	go test ./acl/cuda -run Hardware -v
//	go test -c -o cuda.test ./acl/cuda && ./cuda.test -test.run Hardware -test.v
//
// Environment: VMARENA_REQUIRE_GPU=1 turns every skip into a failure;
// VMARENA_HW_OUT (or -cuda.hwout) names the results file, by default a new
// file in the temporary directory, printed at the end; VMARENA_HW_CHUNKS
// sets the chunks measured (default 512); VMARENA_HW_FRESH_GIB the memory
// the fresh-memory check fills (default 90% of what is free, at most 120
// GiB). The GPU is CUDA device 0: choose another with CUDA_VISIBLE_DEVICES.

var hwOut = flag.String("cuda.hwout", "", "file for the hardware check's results (default $VMARENA_HW_OUT, else a temporary file)")

// openGPU opens CUDA device 0 through the real driver library. It skips when
// there is no usable GPU (no library, the stub, no device, no VMM), unless
// VMARENA_REQUIRE_GPU is set, and fails when the GPU is there but broken.
func openGPU(t testing.TB) *Driver {
	t.Helper()
	d, err := Open(Config{})
	if err != nil {
		absent := errors.Is(err, acl.ErrNotSupported) || errors.Is(err, acl.ErrNoDevice)
		if absent && os.Getenv("VMARENA_REQUIRE_GPU") == "" {
			skip.NoDevice(t, "no usable NVIDIA GPU (set VMARENA_REQUIRE_GPU=1 to fail instead): %v", err)
		}
		t.Fatalf("NVIDIA GPU: %v", err)
	}
	return d
}

func TestHardware(t *testing.T) {
	// The checks that cross processes start this test again as the second
	// process, with a variable that says which part it plays.
	if os.Getenv(envFreshChild) != "" {
		freshChild(t)
		return
	}
	if os.Getenv(envShareChild) != "" {
		shareChild(t)
		return
	}
	d := openGPU(t)
	t.Logf("%s: CUDA driver %s, granularity %d (recommended %d), caps %+v", d.Name(), versionString(d.version), d.gran, d.granRec, d.Caps())
	require.NoError(t, d.Close())
	// First, while this process holds no memory on the GPU and has written
	// nothing there.
	var fresh string
	t.Run("FreshAcrossProcesses", func(t *testing.T) { fresh = testFreshAcrossProcesses(t) })
	t.Run("Conformance", func(t *testing.T) {
		// Launcher nil: no kernel can be queued from Go, so the tests of
		// work in flight skip (Hardware); streams, events, MemsetAsync and
		// access spans run on the GPU.
		acltest.Run(t, acltest.Factory{
			Open:       func(t testing.TB) acl.Driver { return openGPU(t) },
			ExactCodes: false,
			Hardware:   true,
		})
	})
	t.Run("ArenaConformance", func(t *testing.T) {
		// A GPU's memory cannot be shrunk for the out-of-memory tests, so a
		// budget in front of the driver stands in for the capacity.
		arenatest.Run(t, func(t testing.TB, capacity uintptr) acl.Driver {
			return arenatest.Capped(openGPU(t), capacity)
		})
	})
	t.Run("ForeignStream", testForeignStream)
	t.Run("ChunkCosts", func(t *testing.T) { testChunkCosts(t, fresh) })
	t.Run("ShareAcrossProcesses", testShareAcrossProcesses)
	t.Run("LaunchWhileMapping", testLaunchWhileMapping)
	t.Run("ArenaDMABuf", func(t *testing.T) {
		// An arena's mapped prefix as a dma-buf, exported again at every
		// change, through cuMemGetHandleForAddressRange.
		d := openGPU(t)
		defer func() { require.NoError(t, d.Close()) }()
		if rdma, dmaBuf := d.RDMACapable(); !dmaBuf || !rdma {
			skip.NoDevice(t, "the GPU or its driver cannot export RDMA-capable VMM memory as dma-bufs (GPUDirect RDMA with VMM %v, dma-buf %v)", rdma, dmaBuf)
		}
		t.Logf("%d exports", arenaDMABuf(t, d))
	})
}

// testForeignStream passes the driver a CUstream it did not create, made
// with cuStreamCreate(flags 0) as cudaStreamCreate makes one: MemsetAsync,
// RecordEvent, QueryEvent, SynchronizeEvent and SynchronizeStream take it as
// it is, DestroyStream refuses it, and the driver does not count it.
func testForeignStream(t *testing.T) {
	d := openGPU(t)
	defer func() { require.NoError(t, d.Close()) }()
	var fs uintptr
	b, err := d.bind()
	require.NoError(t, err)
	r := d.lib.cuStreamCreate(&fs, 0)
	d.unbind(b)
	require.NoError(t, d.lib.newError("cuStreamCreate", r))
	defer func() {
		b, err := d.bind()
		require.NoError(t, err)
		r := d.lib.cuStreamDestroy(fs)
		d.unbind(b)
		require.NoError(t, d.lib.newError("cuStreamDestroy_v2", r))
	}()
	s := acl.Stream(fs)

	g := d.gran
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	p := acl.DeviceProp(d.Device(), 0)
	h, err := d.MallocPhysical(g, &p, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, g, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(d.Device())))
	ev, err := d.CreateEvent()
	require.NoError(t, err)

	require.NoError(t, d.MemsetAsync(base, 0xC3, g, s))
	require.NoError(t, d.RecordEvent(ev, s))
	require.NoError(t, d.SynchronizeEvent(ev))
	complete, err := d.QueryEvent(ev)
	require.NoError(t, err)
	require.True(t, complete)
	require.NoError(t, d.SynchronizeStream(s))
	got := make([]byte, 4)
	require.NoError(t, d.MemcpyDtoH(got, base+acl.DevicePtr(g-4)))
	require.Equal(t, []byte{0xC3, 0xC3, 0xC3, 0xC3}, got)
	acltest.RequireCode(t, d.DestroyStream(s), acl.ErrCodeRTParamInvalid, "a foreign stream")
	require.Equal(t, acl.LiveCounts{Reservations: 1, ReservedBytes: g, Mappings: 1, MappedBytes: g, Handles: 1, PhysicalBytes: g, Events: 1}, d.Live())

	require.NoError(t, d.DestroyEvent(ev))
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
}

// samples collects durations of one call.
type samples struct {
	name string
	d    []time.Duration
}

func (s *samples) time(fn func() error) error {
	t0 := time.Now()
	err := fn()
	s.d = append(s.d, time.Since(t0))
	return err
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// row formats n, mean, p50, p99 and max in µs.
func (s *samples) row(phase string) string {
	if len(s.d) == 0 {
		return fmt.Sprintf("| %s | %s | 0 | | | | |", phase, s.name)
	}
	sorted := slices.Clone(s.d)
	slices.Sort(sorted)
	var sum time.Duration
	for _, d := range sorted {
		sum += d
	}
	pct := func(p float64) time.Duration {
		return sorted[int(math.Ceil(p*float64(len(sorted))))-1]
	}
	return fmt.Sprintf("| %s | %s | %d | %.1f | %.1f | %.1f | %.1f |", phase, s.name, len(sorted),
		us(sum/time.Duration(len(sorted))), us(pct(0.50)), us(pct(0.99)), us(sorted[len(sorted)-1]))
}

// sum returns per-chunk totals of several calls measured chunk by chunk.
func sum(name string, parts ...*samples) *samples {
	s := &samples{name: name, d: make([]time.Duration, len(parts[0].d))}
	for _, p := range parts {
		for i, d := range p.d {
			s.d[i] += d
		}
	}
	return s
}

// scaled returns s with every sample divided by k: per-chunk figures of calls
// that each cover k chunks.
func scaled(name string, s *samples, k int) *samples {
	out := &samples{name: name, d: make([]time.Duration, len(s.d))}
	for i, d := range s.d {
		out.d[i] = d / time.Duration(k)
	}
	return out
}

// testChunkCosts measures, per chunk of the device's granularity, what the
// arena pays to grow and shrink on this GPU: a cold grow (cuMemCreate,
// cuMemMap, cuMemSetAccess), a shrink (the bare cuMemUnmap), a grow from the
// reuse cache (the same handles mapped again), a shrink behind the fallback
// cuCtxSynchronize, access granted by one call over spans of 8, 32 and 64
// chunks, and the calls that order unmaps and clear chunks: events, stream
// and device synchronisation, queued and synchronous memsets. It writes a
// Markdown table, and the lines of the fresh-memory check, to the results
// file.
func testChunkCosts(t *testing.T, fresh string) {
	d := openGPU(t)
	defer func() { require.NoError(t, d.Close()) }()
	n := 512
	if v := os.Getenv("VMARENA_HW_CHUNKS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err, "VMARENA_HW_CHUNKS")
	}
	p := acl.DeviceProp(d.Device(), 0)
	g, err := d.MemGetAllocationGranularity(&p, acl.GranularityMinimum)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(uintptr(n)*g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	at := func(i int) acl.DevicePtr { return base + acl.DevicePtr(uintptr(i)*g) }
	rw := acl.ReadWrite(d.Device())
	s, err := d.CreateStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyStream(s)) }()
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyEvent(ev)) }()

	create := &samples{name: "MallocPhysical (cuMemCreate)"}
	mapCold := &samples{name: "MapMem (cuMemMap)"}
	accessCold := &samples{name: "MemSetAccess (cuMemSetAccess)"}
	unmap := &samples{name: "UnmapMem (cuMemUnmap)"}
	mapReuse := &samples{name: "MapMem (cuMemMap)"}
	accessReuse := &samples{name: "MemSetAccess (cuMemSetAccess)"}
	syncBefore := &samples{name: "SynchronizeDevice, idle (cuCtxSynchronize)"}
	unmapAfter := &samples{name: "UnmapMem (cuMemUnmap)"}
	release := &samples{name: "FreePhysical (cuMemRelease)"}

	hs := make([]acl.PhysicalHandle, n)
	mapped := make([]bool, n)
	freed := false
	defer func() { // on failure, give everything back
		if freed {
			return
		}
		_ = d.SynchronizeDevice()
		for i, h := range hs {
			if mapped[i] {
				_ = d.UnmapMem(at(i))
			}
			if h != 0 {
				_ = d.FreePhysical(h)
			}
		}
	}()

	mapAll := func(m, a *samples) {
		for i := range hs {
			require.NoError(t, m.time(func() error { return d.MapMem(at(i), g, 0, hs[i], 0) }))
			mapped[i] = true
			if a != nil {
				require.NoError(t, a.time(func() error { return d.MemSetAccess(at(i), g, rw) }))
			}
		}
	}
	unmapAll := func(u *samples) {
		for i := range hs {
			require.NoError(t, u.time(func() error { return d.UnmapMem(at(i)) }))
			mapped[i] = false
		}
	}
	untimed := &samples{}
	// The data must survive the round trip through the reuse cache.
	stamp := func(i int) []byte { return []byte(fmt.Sprintf("chunk %d of %d", i, n)) }
	check := func() {
		for i := range hs {
			got := make([]byte, len(stamp(i)))
			require.NoError(t, d.MemcpyDtoH(got, at(i)+acl.DevicePtr(g/2)))
			require.Equal(t, string(stamp(i)), string(got))
		}
	}

	// Cold grow.
	for i := range hs {
		require.NoError(t, create.time(func() (err error) {
			hs[i], err = d.MallocPhysical(g, &p, 0)
			return err
		}))
		require.NoError(t, mapCold.time(func() error { return d.MapMem(at(i), g, 0, hs[i], 0) }))
		mapped[i] = true
		require.NoError(t, accessCold.time(func() error { return d.MemSetAccess(at(i), g, rw) }))
		require.NoError(t, d.MemcpyHtoD(at(i)+acl.DevicePtr(g/2), stamp(i)))
	}
	check()
	unmapAll(unmap)
	mapAll(mapReuse, accessReuse)
	check()
	// The fallback where no event orders an unmap: drain the device first.
	for i := range hs {
		require.NoError(t, syncBefore.time(d.SynchronizeDevice))
		require.NoError(t, unmapAfter.time(func() error { return d.UnmapMem(at(i)) }))
		mapped[i] = false
	}

	// One access call over a span of k adjacent chunks.
	spans := map[int]*samples{}
	for _, k := range []int{8, 32, 64} {
		spans[k] = &samples{name: fmt.Sprintf("MemSetAccess over %d chunks, per call (cuMemSetAccess)", k)}
		mapAll(untimed, nil)
		for i := 0; i < n; i += k {
			m := min(k, n-i)
			if m == k {
				require.NoError(t, spans[k].time(func() error { return d.MemSetAccess(at(i), uintptr(k)*g, rw) }))
			} else {
				require.NoError(t, d.MemSetAccess(at(i), uintptr(m)*g, rw))
			}
		}
		check()
		unmapAll(untimed)
	}

	// Ordering and clearing, with every chunk mapped.
	mapAll(untimed, untimed)
	record := &samples{name: "RecordEvent, idle stream (cuEventRecord)"}
	query := &samples{name: "QueryEvent, complete (cuEventQuery)"}
	waitEvent := &samples{name: "SynchronizeEvent, idle stream (cuEventSynchronize)"}
	idleDevice := &samples{name: "SynchronizeDevice, idle (cuCtxSynchronize)"}
	for range 2000 {
		require.NoError(t, record.time(func() error { return d.RecordEvent(ev, s) }))
		require.NoError(t, waitEvent.time(func() error { return d.SynchronizeEvent(ev) }))
		require.NoError(t, query.time(func() error {
			done, err := d.QueryEvent(ev)
			if err == nil && !done {
				err = fmt.Errorf("an event recorded on an idle stream is not complete after SynchronizeEvent")
			}
			return err
		}))
		require.NoError(t, idleDevice.time(d.SynchronizeDevice))
	}
	queue := &samples{name: "MemsetAsync of one chunk, queued (cuMemsetD8Async)"}
	for i := range hs {
		require.NoError(t, queue.time(func() error { return d.MemsetAsync(at(i), 0x11, g, s) }))
	}
	drain := &samples{name: "SynchronizeStream after them all (cuStreamSynchronize)"}
	require.NoError(t, drain.time(func() error { return d.SynchronizeStream(s) }))
	queueSync := &samples{name: "MemsetAsync of one chunk + SynchronizeStream"}
	syncClear := &samples{name: "Memset of one chunk (own stream: cuMemsetD8Async + cuStreamSynchronize)"}
	for i := range hs {
		require.NoError(t, queueSync.time(func() error {
			return errors.Join(d.MemsetAsync(at(i), 0x22, g, s), d.SynchronizeStream(s))
		}))
		require.NoError(t, syncClear.time(func() error { return d.Memset(at(i), 0x33, g) }))
	}
	got := make([]byte, 64)
	require.NoError(t, d.MemcpyDtoH(got, at(n-1)+acl.DevicePtr(g-64)))
	require.Equal(t, strings.Repeat("\x33", 64), string(got), "the memsets landed")
	streams := &samples{name: "CreateStream + DestroyStream (cuStreamCreate, cuStreamDestroy_v2)"}
	events := &samples{name: "CreateEvent + DestroyEvent (cuEventCreate, cuEventDestroy_v2)"}
	for range 100 {
		require.NoError(t, streams.time(func() error {
			s, err := d.CreateStream()
			if err != nil {
				return err
			}
			return d.DestroyStream(s)
		}))
		require.NoError(t, events.time(func() error {
			ev, err := d.CreateEvent()
			if err != nil {
				return err
			}
			return d.DestroyEvent(ev)
		}))
	}
	unmapAll(untimed)
	for _, h := range hs {
		require.NoError(t, release.time(func() error { return d.FreePhysical(h) }))
	}
	freed = true

	// The binding's own cost per call on this machine.
	bound := &samples{name: "GetMemInfo through the driver (bind + cuMemGetInfo_v2)"}
	bare := &samples{name: "cuMemGetInfo_v2, bare purego call"}
	for range 2000 {
		require.NoError(t, bound.time(func() error { _, _, err := d.GetMemInfo(acl.HBMMem); return err }))
	}
	func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		require.Equal(t, ResultSuccess, d.lib.cuCtxSetCurrent(d.ctx))
		var free, total uintptr
		for range 2000 {
			require.NoError(t, bare.time(func() error { return d.lib.newError("cuMemGetInfo_v2", d.lib.cuMemGetInfo(&free, &total)) }))
		}
	}()

	_, total, err := d.GetMemInfo(acl.HBMMem)
	require.NoError(t, err)
	host, _ := os.Hostname()
	var b strings.Builder
	fmt.Fprintf(&b, "# vmarena CUDA hardware check\n\n")
	fmt.Fprintf(&b, "- date: %s\n- host: %s, %s/%s, %d CPUs, %s\n", time.Now().UTC().Format(time.RFC3339), host,
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	fmt.Fprintf(&b, "- library: %s; driver API version %s (%d)\n", d.lib.path, versionString(d.version), d.version)
	fmt.Fprintf(&b, "- device: %s, %.1f GiB total; granularity %d KiB minimum, %d KiB recommended; caps %+v\n", d.Name(),
		float64(total)/(1<<30), d.gran>>10, d.granRec>>10, d.Caps())
	fmt.Fprintf(&b, "- chunks: %d × %d KiB (%d MiB), each call timed alone with time.Now; µs per chunk unless the row says per call\n\n", n, g>>10, uintptr(n)*g>>20)
	fmt.Fprintf(&b, "| phase | call | n | mean µs | p50 µs | p99 µs | max µs |\n|---|---|---|---|---|---|---|\n")
	type row struct {
		phase string
		s     *samples
	}
	rows := []row{
		{"cold grow", create}, {"cold grow", mapCold}, {"cold grow", accessCold},
		{"cold grow", sum("total per chunk", create, mapCold, accessCold)},
		{"shrink", unmap},
		{"reuse grow", mapReuse}, {"reuse grow", accessReuse},
		{"reuse grow", sum("total per chunk", mapReuse, accessReuse)},
		{"shrink, device sync first", syncBefore}, {"shrink, device sync first", unmapAfter},
		{"shrink, device sync first", sum("total per chunk", syncBefore, unmapAfter)},
	}
	for _, k := range []int{8, 32, 64} {
		phase := fmt.Sprintf("access span of %d", k)
		rows = append(rows, row{phase, spans[k]}, row{phase, scaled("the same, per chunk", spans[k], k)})
	}
	rows = append(rows,
		row{"per call", record}, row{"per call", query}, row{"per call", waitEvent}, row{"per call", idleDevice},
		row{"clear", queue}, row{"clear", drain}, row{"clear", queueSync}, row{"clear", syncClear},
		row{"per call", streams}, row{"per call", events},
		row{"free", release},
		row{"per call", bound}, row{"per call", bare},
	)
	for _, r := range rows {
		fmt.Fprintln(&b, r.s.row(r.phase))
	}
	if fresh != "" {
		fmt.Fprintf(&b, "\n## Fresh memory\n\n%s", fresh)
	}
	report := b.String()
	t.Log("\n" + report)

	path := *hwOut
	if path == "" {
		path = os.Getenv("VMARENA_HW_OUT")
	}
	if path == "" {
		f, err := os.CreateTemp("", "vmarena-cuda-hw-*.md")
		require.NoError(t, err)
		path = f.Name()
		require.NoError(t, f.Close())
	}
	require.NoError(t, os.WriteFile(path, []byte(report), 0o644))
	t.Logf("results written to %s", path)
	fmt.Printf("vmarena CUDA hardware check: results in %s\n", path)
}

// The fresh-memory check. Caps().Fresh says FreshProcess: memory another
// process freed reaches this one cleared. The check tests that on the GPU: a
// child process (this test binary again) fills most of the device's free
// memory with a byte, frees it and exits; then this process allocates as
// much and samples 4 KiB at the start of every 2 MiB block for the child's
// byte. It then does the same within this process (fill, free, allocate
// again), which FreshProcess allows to show old bytes, and reports what it
// saw. VMARENA_HW_FRESH_GIB sets how much (default 90% of free memory, at
// most 120 GiB, in 1 GiB allocations).

const (
	envFreshChild = "VMARENA_FRESH_CHILD" // "GiB,byte": run as the child
	freshSample   = 4 << 10
	freshBlock    = 2 << 20
)

// fillHuge allocates gib 1 GiB allocations in one reservation, maps them with
// access and, unless value is 0, fills them with value. It returns the base
// and the handles.
func fillHuge(t testing.TB, d *Driver, gib int, value byte) (acl.DevicePtr, []acl.PhysicalHandle) {
	t.Helper()
	p := acl.DeviceProp(d.Device(), acl.HBMMemHuge1G)
	base, err := d.ReserveMemAddress(uintptr(gib)<<30, 0, 0, 0)
	require.NoError(t, err)
	hs := make([]acl.PhysicalHandle, gib)
	for i := range hs {
		at := base + acl.DevicePtr(uintptr(i)<<30)
		hs[i], err = d.MallocPhysical(1<<30, &p, 0)
		require.NoError(t, err)
		require.NoError(t, d.MapMem(at, 1<<30, 0, hs[i], 0))
		require.NoError(t, d.MemSetAccess(at, 1<<30, acl.ReadWrite(d.Device())))
		if value != 0 {
			require.NoError(t, d.Memset(at, value, 1<<30))
		}
	}
	return base, hs
}

func freeHuge(t testing.TB, d *Driver, base acl.DevicePtr, hs []acl.PhysicalHandle) {
	t.Helper()
	for i, h := range hs {
		require.NoError(t, d.UnmapMem(base+acl.DevicePtr(uintptr(i)<<30)))
		require.NoError(t, d.FreePhysical(h))
	}
	require.NoError(t, d.ReleaseMemAddress(base))
}

// sampleHuge counts the 2 MiB blocks whose first 4 KiB are all value, all
// zero, or neither.
func sampleHuge(t testing.TB, d *Driver, base acl.DevicePtr, gib int, value byte) (same, zero, other int) {
	t.Helper()
	buf := make([]byte, freshSample)
	for off := uintptr(0); off < uintptr(gib)<<30; off += freshBlock {
		require.NoError(t, d.MemcpyDtoH(buf, base+acl.DevicePtr(off)))
		switch {
		case allBytes(buf, value):
			same++
		case allBytes(buf, 0):
			zero++
		default:
			other++
		}
	}
	return same, zero, other
}

func allBytes(b []byte, v byte) bool {
	for _, c := range b {
		if c != v {
			return false
		}
	}
	return true
}

// freshChild is the child of the fresh-memory check: TestHardware, started
// by it with envFreshChild set.
func freshChild(t *testing.T) {
	spec := os.Getenv(envFreshChild)
	var gib, value int
	_, err := fmt.Sscanf(spec, "%d,%d", &gib, &value)
	require.NoError(t, err, envFreshChild)
	d := openGPU(t)
	defer func() { require.NoError(t, d.Close()) }()
	base, hs := fillHuge(t, d, gib, byte(value))
	freeHuge(t, d, base, hs)
	t.Logf("filled and freed %d GiB with %#x", gib, value)
}

// testFreshAcrossProcesses runs the fresh-memory check and returns its
// results as Markdown lines.
func testFreshAcrossProcesses(t *testing.T) string {
	d := openGPU(t)
	free, _, err := d.GetMemInfo(acl.HBMMem)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	gib := min(int(free/10*9)>>30, 120)
	if v := os.Getenv("VMARENA_HW_FRESH_GIB"); v != "" {
		gib, err = strconv.Atoi(v)
		require.NoError(t, err, "VMARENA_HW_FRESH_GIB")
	}
	if gib < 1 {
		skip.NoDevice(t, "%d MiB free on the GPU: too little for the check", free>>20)
	}
	// Bytes nothing else in the tests writes.
	theirs, ours := byte(0xC3), byte(0x3C)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHardware$", "-test.v")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%d", envFreshChild, gib, theirs))
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the child process:\n%s", out)
	require.Contains(t, string(out), "filled and freed", "the child ran the check:\n%s", out)
	child := time.Since(t0)

	d = openGPU(t)
	defer func() { require.NoError(t, d.Close()) }()
	base, hs := fillHuge(t, d, gib, 0)
	same, zero, other := sampleHuge(t, d, base, gib, theirs)
	blocks := gib << 30 / freshBlock
	var b strings.Builder
	fmt.Fprintf(&b, "- another process's memory (it filled and freed %d GiB with %#x, %s): of %d blocks of 2 MiB, "+
		"%d held its bytes, %d read zero, %d held something else\n", gib, theirs, child.Round(time.Millisecond), blocks, same, zero, other)
	if same > 0 && d.Caps().Fresh != acl.FreshUnknown {
		t.Errorf("%d of %d blocks still held another process's bytes, against Caps().Fresh = %v: "+
			"the NVIDIA driver does not scrub memory between processes here (set Config.NoScrubOnFree, see docs/cuda.md)",
			same, blocks, d.Caps().Fresh)
	}
	for i := range hs {
		require.NoError(t, d.Memset(base+acl.DevicePtr(uintptr(i)<<30), ours, 1<<30))
	}
	freeHuge(t, d, base, hs)
	base, hs = fillHuge(t, d, gib, 0)
	same, zero, other = sampleHuge(t, d, base, gib, ours)
	freeHuge(t, d, base, hs)
	fmt.Fprintf(&b, "- this process's own freed memory (filled with %#x, freed, allocated again): of %d blocks, "+
		"%d held its bytes, %d read zero, %d held something else (FreshProcess allows its own bytes)\n", ours, blocks, same, zero, other)
	t.Log(b.String())
	return b.String()
}
