//go:build linux && (amd64 || arm64)

package cuda

import (
	"runtime"
	"testing"

	"github.com/vmarena/vmarena/acl"
)

// BenchmarkCallOverhead measures what the thread discipline costs per call,
// over the test double (whose calls do almost nothing, so the figures are
// the binding's overhead; on a GPU the driver's own work is added):
//
//	ffi/*            a bare purego call, on a locked thread with the context current
//	bound/*          the driver's path: LockOSThread, cuCtxGetCurrent, the call, unlock
//	bound-foreign/*  the same from a thread with a caller's context current (set, call, restore)
//	worker/*         the alternative design: a request to one locked worker goroutine
//
// The parallel variants run one caller per GOMAXPROCS: the bound path scales
// with callers, the worker serialises them.
func BenchmarkCallOverhead(b *testing.B) {
	f := newFake(b)
	f.set(b, "devices", 2)
	d, err := Open(Config{Library: f.path})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()

	b.Run("ffi/cuCtxGetCurrent", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var cur uintptr
		b.ReportAllocs()
		for b.Loop() {
			d.lib.cuCtxGetCurrent(&cur)
		}
	})
	b.Run("ffi/cuMemGetInfo_v2", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		d.lib.cuCtxSetCurrent(d.ctx)
		var free, total uintptr
		b.ReportAllocs()
		for b.Loop() {
			if r := d.lib.cuMemGetInfo(&free, &total); r != ResultSuccess {
				b.Fatal(r)
			}
		}
	})
	b.Run("bound/GetMemInfo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := d.GetMemInfo(acl.HBMMem); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bound-foreign/GetMemInfo", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		f.setCurrent(f.primary(1))
		defer f.setCurrent(0)
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := d.GetMemInfo(acl.HBMMem); err != nil {
				b.Fatal(err)
			}
		}
	})
	w := newWorker(d)
	defer w.stop()
	b.Run("worker/GetMemInfo", func(b *testing.B) {
		j := &job{done: make(chan struct{})}
		b.ReportAllocs()
		for b.Loop() {
			if r := w.memInfo(j); r != ResultSuccess {
				b.Fatal(r)
			}
		}
	})
	b.Run("bound/GetMemInfo-parallel", func(b *testing.B) {
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
	b.Run("worker/GetMemInfo-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			j := &job{done: make(chan struct{})}
			for pb.Next() {
				if r := w.memInfo(j); r != ResultSuccess {
					b.Error(r)
					return
				}
			}
		})
	})
}

// worker is the design not taken: one goroutine locked to a thread with the
// context current, serving every call.
type worker struct {
	d   *Driver
	req chan *job
}

type job struct {
	free, total uintptr
	r           Result
	done        chan struct{}
}

func newWorker(d *Driver) *worker {
	w := &worker{d: d, req: make(chan *job)}
	ready := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		d.lib.cuCtxSetCurrent(d.ctx)
		close(ready)
		for j := range w.req {
			j.r = d.lib.cuMemGetInfo(&j.free, &j.total)
			j.done <- struct{}{}
		}
	}()
	<-ready
	return w
}

func (w *worker) memInfo(j *job) Result {
	w.req <- j
	<-j.done
	return j.r
}

func (w *worker) stop() { close(w.req) }

// BenchmarkChunkCycle is one 2 MiB chunk through the arena's grow and shrink
// path on the double: MallocPhysical, MapMem, MemSetAccess, UnmapMem,
// FreePhysical.
func BenchmarkChunkCycle(b *testing.B) {
	d, _ := openFake(b, 0, Config{})
	base, err := d.ReserveMemAddress(g, 0, 0, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer d.ReleaseMemAddress(base)
	p := prop()
	b.ReportAllocs()
	for b.Loop() {
		h, err := d.MallocPhysical(g, p, 0)
		if err == nil {
			err = d.MapMem(base, g, 0, h, 0)
		}
		if err == nil {
			err = d.MemSetAccess(base, g, acl.ReadWrite(0))
		}
		if err == nil {
			err = d.UnmapMem(base)
		}
		if err == nil {
			err = d.FreePhysical(h)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}
