//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"runtime"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/acl/host"
)

// BenchmarkCall measures the cost of one driver call, thread handling
// included, with a call that does almost nothing in the runtime
// (aclrtGetMemInfo on the test double), against the alternatives:
//
//	host            the host driver's GetMemInfo (a mutex, no FFI)
//	ascend          the binding: lock the OS thread, aclrtSetCurrentContext,
//	                aclrtGetMemInfo, unlock
//	ascend-parallel the same from GOMAXPROCS goroutines at once
//	purego          the bare purego call on a thread whose context is set
//	setcontext      aclrtSetCurrentContext through RegisterFunc
//	setcontext-syscalln  the same through purego.SyscallN, as the binding calls it
//	worker-thread   the other design: a goroutine locked to a thread with the
//	                context set, serving calls sent over a channel
func BenchmarkCall(b *testing.B) {
	path := variantPath(b, "full")
	d, dbl := openDouble(b, path, 1<<30, ascend.Config{})

	b.Run("host", func(b *testing.B) {
		h, err := host.New(host.Config{Capacity: 1 << 30})
		require.NoError(b, err)
		defer h.Close()
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := h.GetMemInfo(acl.HBMMem); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ascend", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := d.GetMemInfo(acl.HBMMem); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ascend-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, _, err := d.GetMemInfo(acl.HBMMem); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})

	// The bare calls run on a locked thread whose context is set once.
	var ctx uintptr
	onThread(func() {
		_, _, err := d.GetMemInfo(acl.HBMMem) // makes the context current here
		require.NoError(b, err)
		require.Zero(b, dbl.getCurrentContext(&ctx))
	})
	bound := func(b *testing.B) {
		runtime.LockOSThread()
		b.Cleanup(runtime.UnlockOSThread)
		require.Zero(b, dbl.setCurrentContext(ctx))
	}
	b.Run("purego", func(b *testing.B) {
		bound(b)
		var free, total uintptr
		b.ReportAllocs()
		for b.Loop() {
			if code := dbl.getMemInfo(acl.HBMMem, &free, &total); code != 0 {
				b.Fatal(code)
			}
		}
	})
	b.Run("setcontext", func(b *testing.B) {
		bound(b)
		b.ReportAllocs()
		for b.Loop() {
			if code := dbl.setCurrentContext(ctx); code != 0 {
				b.Fatal(code)
			}
		}
	})
	b.Run("setcontext-syscalln", func(b *testing.B) {
		bound(b)
		addr, err := purego.Dlsym(dbl.h, "aclrtSetCurrentContext")
		require.NoError(b, err)
		b.ReportAllocs()
		for b.Loop() {
			if r, _, _ := purego.SyscallN(addr, ctx); int32(r) != 0 {
				b.Fatal(r)
			}
		}
	})
	b.Run("worker-thread", func(b *testing.B) {
		type result struct {
			free, total uintptr
			code        int32
		}
		reqs := make(chan acl.MemAttr)
		resps := make(chan result)
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if code := dbl.setCurrentContext(ctx); code != 0 {
				panic(code)
			}
			for attr := range reqs {
				var r result
				r.code = dbl.getMemInfo(attr, &r.free, &r.total)
				resps <- r
			}
		}()
		defer close(reqs)
		b.ReportAllocs()
		for b.Loop() {
			reqs <- acl.HBMMem
			if r := <-resps; r.code != 0 {
				b.Fatal(r.code)
			}
		}
	})
}

// BenchmarkChunkCycle is one chunk's round trip through the VMM calls:
// MallocPhysical, MapMem, UnmapMem (the bare call: it synchronises nothing),
// FreePhysical; that is, four bound calls.
func BenchmarkChunkCycle(b *testing.B) {
	d, _ := openDouble(b, variantPath(b, "full"), 1<<30, ascend.Config{})
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(b, err)
	defer d.ReleaseMemAddress(base)
	p := prop(0)
	b.ReportAllocs()
	for b.Loop() {
		h, err := d.MallocPhysical(g, p, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.MapMem(base, g, 0, h, 0); err != nil {
			b.Fatal(err)
		}
		if err := d.UnmapMem(base); err != nil {
			b.Fatal(err)
		}
		if err := d.FreePhysical(h); err != nil {
			b.Fatal(err)
		}
	}
}
