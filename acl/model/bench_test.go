package model

import (
	"slices"
	"testing"
	"time"

	"github.com/vmarena/vmarena/acl"
)

// report adds the overshoot percentiles of overs (ns past the deadline) to
// b's results: p50-ns and p99-ns are the spin's accuracy on a quiet
// machine; the mean also carries the times the OS took the CPU away.
func report(b *testing.B, overs []int64) {
	slices.Sort(overs)
	var sum int64
	for _, o := range overs {
		sum += o
	}
	b.ReportMetric(float64(overs[len(overs)/2]), "p50-over-ns")
	b.ReportMetric(float64(overs[len(overs)*99/100]), "p99-over-ns")
	b.ReportMetric(float64(sum)/float64(len(overs)), "mean-over-ns")
}

// BenchmarkWaitUntil measures how late the model's wait ends (waiting
// allocates nothing: TestWaitUntil checks it).
//
//	go test -run '^$' -bench WaitUntil ./acl/model
func BenchmarkWaitUntil(b *testing.B) {
	for _, d := range []time.Duration{time.Microsecond, 10 * time.Microsecond, 100 * time.Microsecond, 3 * time.Millisecond} {
		b.Run(d.String(), func(b *testing.B) {
			overs := make([]int64, 0, 1<<12)
			for b.Loop() {
				deadline := now() + int64(d)
				waitUntil(deadline)
				overs = append(overs, now()-deadline)
			}
			report(b, overs)
		})
	}
}

// BenchmarkCall measures a call charged 10 µs: the overshoot is the model's
// overhead and the spin's lateness together.
func BenchmarkCall(b *testing.B) {
	p := zeroProfile(b)
	p.Calls["meminfo"].Base.Value = 10
	d, err := New(Config{Profile: p})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	overs := make([]int64, 0, 1<<12)
	for b.Loop() {
		t0 := now()
		_, _, _ = d.GetMemInfo(acl.HBMMem)
		overs = append(overs, now()-t0-10_000)
	}
	report(b, overs)
}

// BenchmarkUntimed measures the model's own cost per call, with nothing
// charged: a map and an unmap of one chunk, and a GetMemInfo.
func BenchmarkUntimed(b *testing.B) {
	d, err := New(Config{Untimed: true})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	prop := acl.DeviceProp(0, 0)
	base, _ := d.ReserveMemAddress(2<<20, 0, 0, 0)
	h, _ := d.MallocPhysical(2<<20, &prop, 0)
	b.Run("MapUnmap", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = d.MapMem(base, 2<<20, 0, h, 0)
			_ = d.UnmapMem(base)
		}
	})
	b.Run("GetMemInfo", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _, _ = d.GetMemInfo(acl.HBMMem)
		}
	})
	_ = d.FreePhysical(h)
	_ = d.ReleaseMemAddress(base)
}

// BenchmarkBytes measures what keeping the device's bytes costs the model
// per call, untimed, against NoData: a 128 KiB host-to-device copy (the
// bench's kv workload writes tokens this size), a 2 MiB scrub, and a 2 MiB
// device-side copy, into memory written before.
func BenchmarkBytes(b *testing.B) {
	for _, mode := range []struct {
		name   string
		noData bool
	}{{"data", false}, {"nodata", true}} {
		d, err := New(Config{Untimed: true, NoData: mode.noData})
		if err != nil {
			b.Fatal(err)
		}
		const c = 2 << 20
		prop := acl.DeviceProp(0, 0)
		base, _ := d.ReserveMemAddress(2*c, 0, 0, 0)
		var hs []acl.PhysicalHandle
		for i := range 2 {
			h, _ := d.MallocPhysical(c, &prop, 0)
			_ = d.MapMem(base.Add(uintptr(i)*c), c, 0, h, 0)
			_ = d.MemSetAccess(base.Add(uintptr(i)*c), c, acl.ReadWrite(0))
			hs = append(hs, h)
		}
		src := make([]byte, 128<<10)
		for i := range src {
			src[i] = byte(i) | 1
		}
		for off := uintptr(0); off < 2*c; off += uintptr(len(src)) {
			_ = d.MemcpyHtoD(base.Add(off), src)
		}
		b.Run("HtoD128KiB/"+mode.name, func(b *testing.B) {
			b.SetBytes(int64(len(src)))
			for b.Loop() {
				_ = d.MemcpyHtoD(base, src)
			}
		})
		b.Run("Memset2MiB/"+mode.name, func(b *testing.B) {
			b.SetBytes(c)
			for b.Loop() {
				_ = d.Memset(base, 7, c)
			}
		})
		b.Run("DtoD2MiB/"+mode.name, func(b *testing.B) {
			b.SetBytes(c)
			for b.Loop() {
				_ = d.MemcpyDtoD(base.Add(c), base, c)
			}
		})
		for i := range hs {
			_ = d.UnmapMem(base.Add(uintptr(i) * c))
			_ = d.FreePhysical(hs[i])
		}
		_ = d.ReleaseMemAddress(base)
		if err := d.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
