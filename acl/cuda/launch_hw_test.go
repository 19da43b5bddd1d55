//go:build linux && (amd64 || arm64)

package cuda

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

// launchLib is what the launch measure needs beyond the binding: a module
// with an empty kernel, its launch, and stream capture into a graph. Only
// the hardware check uses it, so the binding (and its test double) does not
// resolve these symbols.
type launchLib struct {
	cuModuleLoadData            func(mod *uintptr, image *byte) Result
	cuModuleGetFunction         func(f *uintptr, mod uintptr, name *byte) Result
	cuModuleUnload              func(mod uintptr) Result
	cuLaunchKernel              func(f uintptr, gx, gy, gz, bx, by, bz, shmem uint32, s uintptr, params, extra unsafe.Pointer) Result
	cuStreamBeginCapture        func(s uintptr, mode int32) Result // cuStreamBeginCapture_v2
	cuStreamEndCapture          func(s uintptr, g *uintptr) Result
	cuGraphInstantiateWithFlags func(exec *uintptr, g uintptr, flags uint64) Result
	cuGraphLaunch               func(exec, s uintptr) Result
	cuGraphExecDestroy          func(exec uintptr) Result
	cuGraphDestroy              func(g uintptr) Result
}

func loadLaunchLib(path string) (*launchLib, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, err
	}
	l := &launchLib{}
	for _, s := range []symbol{
		{"cuModuleLoadData", &l.cuModuleLoadData},
		{"cuModuleGetFunction", &l.cuModuleGetFunction},
		{"cuModuleUnload", &l.cuModuleUnload},
		{"cuLaunchKernel", &l.cuLaunchKernel},
		{"cuStreamBeginCapture_v2", &l.cuStreamBeginCapture},
		{"cuStreamEndCapture", &l.cuStreamEndCapture},
		{"cuGraphInstantiateWithFlags", &l.cuGraphInstantiateWithFlags},
		{"cuGraphLaunch", &l.cuGraphLaunch},
		{"cuGraphExecDestroy", &l.cuGraphExecDestroy},
		{"cuGraphDestroy", &l.cuGraphDestroy},
	} {
		addr, err := purego.Dlsym(h, s.name)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		purego.RegisterFunc(s.fn, addr)
	}
	return l, nil
}

// noopPTX is an empty kernel, compiled for the GPU by the driver when the
// module loads.
const noopPTX = ".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry noop()\n{\n\tret;\n}\n\x00"

// cuStreamCaptureModeRelaxed lets other threads make unsafe calls (the
// mapper's) while a stream is captured.
const cuStreamCaptureModeRelaxed = 2

// testLaunchWhileMapping measures the host-side latency of kernel launches,
// one at a time (eager) and as a captured graph of graphKernels, on an idle
// process and while another thread maps, sets access and unmaps chunks in a
// loop: whether the VMM calls of a background worker delay the caller's
// launches (the device model's serial reading says they may), by how much.
func testLaunchWhileMapping(t *testing.T) {
	d := openGPU(t)
	defer func() { require.NoError(t, d.Close()) }()
	ll, err := loadLaunchLib(d.lib.path)
	require.NoError(t, err, "kernel launch symbols")
	s, err := d.CreateStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyStream(s)) }()

	b, err := d.bind() // this goroutine launches, on its own thread
	require.NoError(t, err)
	defer d.unbind(b)
	check := func(name string, r Result) {
		t.Helper()
		require.NoError(t, d.lib.newError(name, r))
	}
	var mod, fn uintptr
	ptx := []byte(noopPTX)
	check("cuModuleLoadData", ll.cuModuleLoadData(&mod, &ptx[0]))
	defer func() { check("cuModuleUnload", ll.cuModuleUnload(mod)) }()
	name := []byte("noop\x00")
	check("cuModuleGetFunction", ll.cuModuleGetFunction(&fn, mod, &name[0]))
	launch := func() Result {
		return ll.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, uintptr(s), nil, nil)
	}
	const graphKernels = 32
	check("cuStreamBeginCapture_v2", ll.cuStreamBeginCapture(uintptr(s), cuStreamCaptureModeRelaxed))
	for range graphKernels {
		check("cuLaunchKernel (captured)", launch())
	}
	var graph, exec uintptr
	check("cuStreamEndCapture", ll.cuStreamEndCapture(uintptr(s), &graph))
	defer func() { check("cuGraphDestroy", ll.cuGraphDestroy(graph)) }()
	check("cuGraphInstantiateWithFlags", ll.cuGraphInstantiateWithFlags(&exec, graph, 0))
	defer func() { check("cuGraphExecDestroy", ll.cuGraphExecDestroy(exec)) }()

	measure := func(eager, graphs int) (e, g []time.Duration) {
		for i := range eager {
			t0 := time.Now()
			check("cuLaunchKernel", launch())
			e = append(e, time.Since(t0))
			if i%64 == 63 {
				require.NoError(t, d.SynchronizeStream(s))
			}
		}
		for range graphs {
			t0 := time.Now()
			check("cuGraphLaunch", ll.cuGraphLaunch(exec, uintptr(s)))
			g = append(g, time.Since(t0))
			require.NoError(t, d.SynchronizeStream(s))
		}
		require.NoError(t, d.SynchronizeStream(s))
		return e, g
	}
	measure(100, 10) // warm-up
	idleE, idleG := measure(4000, 400)

	// The mapper: one chunk at a time, map, access, unmap, as the pool's
	// worker does, until told to stop.
	p := acl.DeviceProp(d.Device(), 0)
	g, err := d.MemGetAllocationGranularity(&p, acl.GranularityMinimum)
	require.NoError(t, err)
	const chunks = 64
	base, err := d.ReserveMemAddress(chunks*g, 0, 0, 0)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.ReleaseMemAddress(base)) }()
	hs := make([]acl.PhysicalHandle, chunks)
	for i := range hs {
		hs[i], err = d.MallocPhysical(g, &p, 0)
		require.NoError(t, err)
	}
	defer func() {
		for _, h := range hs {
			require.NoError(t, d.FreePhysical(h))
		}
	}()
	rw := acl.ReadWrite(d.Device())
	var stop atomic.Bool
	var cycles atomic.Int64
	var wg sync.WaitGroup
	var mapErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; !stop.Load(); i = (i + 1) % chunks {
			at := base.Add(uintptr(i) * g)
			if mapErr = d.MapMem(at, g, 0, hs[i], 0); mapErr != nil {
				return
			}
			if mapErr = d.MemSetAccess(at, g, rw); mapErr != nil {
				return
			}
			if mapErr = d.UnmapMem(at); mapErr != nil {
				return
			}
			cycles.Add(1)
		}
	}()
	t0 := time.Now()
	busyE, busyG := measure(4000, 400)
	busy := time.Since(t0)
	stop.Store(true)
	wg.Wait()
	require.NoError(t, mapErr)

	stat := func(v []time.Duration) string {
		slices.Sort(v)
		var sum time.Duration
		for _, x := range v {
			sum += x
		}
		q := func(p float64) float64 { return us(v[min(int(p*float64(len(v))), len(v)-1)]) }
		return fmt.Sprintf("%8.2f %8.2f %8.2f %8.2f %9.1f", us(sum/time.Duration(len(v))), q(0.5), q(0.99), q(0.999), us(v[len(v)-1]))
	}
	var out strings.Builder
	fmt.Fprintf(&out, "kernel-launch latency on the host, µs (%d-kernel graph for the graph rows); mapper: %d map+access+unmap cycles of one chunk in %v (%.1f µs per cycle)\n",
		graphKernels, cycles.Load(), busy.Round(time.Millisecond), us(busy)/float64(max(cycles.Load(), 1)))
	fmt.Fprintf(&out, "%-34s %8s %8s %8s %8s %9s\n", "launch", "mean", "p50", "p99", "p99.9", "max")
	fmt.Fprintf(&out, "%-34s %s\n", "eager, idle", stat(idleE))
	fmt.Fprintf(&out, "%-34s %s\n", "eager, another thread mapping", stat(busyE))
	fmt.Fprintf(&out, "%-34s %s\n", "graph, idle", stat(idleG))
	fmt.Fprintf(&out, "%-34s %s\n", "graph, another thread mapping", stat(busyG))
	t.Log("\n" + out.String())
	path := *hwOut
	if path == "" {
		path = os.Getenv("VMARENA_HW_OUT")
	}
	if path != "" {
		path = strings.TrimSuffix(path, ".md") + "-launch.txt"
		require.NoError(t, os.WriteFile(path, []byte(out.String()), 0o644))
		t.Logf("wrote %s", path)
	}
}
