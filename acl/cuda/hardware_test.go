package cuda

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
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
// sets the chunks measured (default 512). The GPU is CUDA device 0: choose
// another with CUDA_VISIBLE_DEVICES.

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
			t.Skipf("no usable NVIDIA GPU (set VMARENA_REQUIRE_GPU=1 to fail instead): %v", err)
		}
		t.Fatalf("NVIDIA GPU: %v", err)
	}
	return d
}

func TestHardware(t *testing.T) {
	d := openGPU(t)
	t.Logf("%s: CUDA driver %s, granularity %d (recommended %d)", d.Name(), versionString(d.version), d.gran, d.granRec)
	require.NoError(t, d.Close())
	t.Run("Conformance", func(t *testing.T) {
		acltest.Run(t, acltest.Factory{
			Open:       func(t testing.TB) acl.Driver { return openGPU(t) },
			ExactCodes: false,
		})
	})
	t.Run("ArenaConformance", func(t *testing.T) {
		// A GPU's memory cannot be shrunk for the out-of-memory tests, so a
		// budget in front of the driver stands in for the capacity.
		arenatest.Run(t, func(t testing.TB, capacity uintptr) acl.Driver {
			return arenatest.Capped(openGPU(t), capacity)
		})
	})
	t.Run("ChunkCosts", testChunkCosts)
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

// testChunkCosts measures, per chunk of the device's granularity, what the
// arena pays to grow and shrink on this GPU: a cold grow (cuMemCreate,
// cuMemMap, cuMemSetAccess), a shrink (cuMemUnmap, with and without the
// cuCtxSynchronize before it), a grow from the reuse cache (the same
// handles mapped again) and the final cuMemRelease. It writes a Markdown
// table to the results file.
func testChunkCosts(t *testing.T) {
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

	create := &samples{name: "MallocPhysical (cuMemCreate)"}
	mapCold := &samples{name: "MapMem (cuMemMap)"}
	accessCold := &samples{name: "MemSetAccess (cuMemSetAccess)"}
	unmapSync := &samples{name: "UnmapMem (cuCtxSynchronize + cuMemUnmap)"}
	mapReuse := &samples{name: "MapMem (cuMemMap)"}
	accessReuse := &samples{name: "MemSetAccess (cuMemSetAccess)"}
	unmapNoSync := &samples{name: "UnmapMem, SkipUnmapSync (cuMemUnmap)"}
	release := &samples{name: "FreePhysical (cuMemRelease)"}

	hs := make([]acl.PhysicalHandle, n)
	freed := false
	defer func() { // on failure, give everything back
		if freed {
			return
		}
		for i, h := range hs {
			_ = d.UnmapMem(at(i))
			if h != 0 {
				_ = d.FreePhysical(h)
			}
		}
	}()

	grow := func(m, a *samples) {
		for i := range hs {
			require.NoError(t, m.time(func() error { return d.MapMem(at(i), g, 0, hs[i], 0) }))
			require.NoError(t, a.time(func() error { return d.MemSetAccess(at(i), g, rw) }))
		}
	}
	shrink := func(u *samples) {
		for i := range hs {
			require.NoError(t, u.time(func() error { return d.UnmapMem(at(i)) }))
		}
	}
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
		require.NoError(t, accessCold.time(func() error { return d.MemSetAccess(at(i), g, rw) }))
		require.NoError(t, d.MemcpyHtoD(at(i)+acl.DevicePtr(g/2), stamp(i)))
	}
	check()
	shrink(unmapSync)
	grow(mapReuse, accessReuse)
	check()
	d.cfg.SkipUnmapSync = true // no call is in flight
	shrink(unmapNoSync)
	d.cfg.SkipUnmapSync = false
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
	fmt.Fprintf(&b, "- device: %s, %.1f GiB total; granularity %d KiB minimum, %d KiB recommended\n", d.Name(),
		float64(total)/(1<<30), d.gran>>10, d.granRec>>10)
	fmt.Fprintf(&b, "- chunks: %d × %d KiB (%d MiB), each call timed alone with time.Now; µs per chunk\n\n", n, g>>10, uintptr(n)*g>>20)
	fmt.Fprintf(&b, "| phase | call | n | mean µs | p50 µs | p99 µs | max µs |\n|---|---|---|---|---|---|---|\n")
	for _, r := range []struct {
		phase string
		s     *samples
	}{
		{"cold grow", create}, {"cold grow", mapCold}, {"cold grow", accessCold},
		{"cold grow", sum("total per chunk", create, mapCold, accessCold)},
		{"shrink", unmapSync},
		{"reuse grow", mapReuse}, {"reuse grow", accessReuse},
		{"reuse grow", sum("total per chunk", mapReuse, accessReuse)},
		{"shrink", unmapNoSync},
		{"free", release},
		{"per call", bound}, {"per call", bare},
	} {
		fmt.Fprintln(&b, r.s.row(r.phase))
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
