package arena_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

func benchDriver(b *testing.B) *host.Driver {
	d, err := host.New(host.Config{Capacity: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	return d
}

func benchArena(b *testing.B, cfg arena.Config) *arena.Arena {
	a, err := arena.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := a.Close(); err != nil {
			b.Error(err)
		}
	})
	return a
}

// BenchmarkAlloc is the fast path: a 256-byte, 64-aligned allocation inside
// mapped memory. Target: under 20 ns/op, 0 allocs/op.
func BenchmarkAlloc(b *testing.B) {
	a := benchArena(b, arena.Config{Driver: benchDriver(b), Reserve: 64 << 20})
	if err := a.Grow(64 << 20); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	done := cpuPerOp(b)
	for b.Loop() {
		if _, err := a.Alloc(256, 64); err != nil {
			b.Fatal(err)
		}
		if i++; i == (64<<20)/256 {
			i = 0
			a.Reset()
		}
	}
	done()
}

// BenchmarkAllocParallel is the fast path from every P at once: the
// compare-and-swap is contended.
func BenchmarkAllocParallel(b *testing.B) {
	a := benchArena(b, arena.Config{Driver: benchDriver(b), Reserve: 1 << 30})
	if err := a.Grow(1 << 30); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var n atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if n.Add(1)%(1<<21) == 0 {
				a.Reset()
			}
			if _, err := a.Alloc(256, 64); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// timed wraps a driver and adds up the time spent in the calls a Grow or a
// Shrink makes, so the benchmarks can subtract it from the arena's time.
type timed struct {
	acl.Driver
	ns atomic.Int64
}

func (d *timed) since(t time.Time) { d.ns.Add(int64(time.Since(t))) }

// Unwrap lets the pool see that the host driver's fresh memory is zero.
func (d *timed) Unwrap() acl.Driver { return d.Driver }

func (d *timed) MallocPhysical(size uintptr, p *acl.PhysicalMemProp, f uint64) (acl.PhysicalHandle, error) {
	defer d.since(time.Now())
	return d.Driver.MallocPhysical(size, p, f)
}
func (d *timed) FreePhysical(h acl.PhysicalHandle) error {
	defer d.since(time.Now())
	return d.Driver.FreePhysical(h)
}
func (d *timed) MapMem(p acl.DevicePtr, size, off uintptr, h acl.PhysicalHandle, f uint64) error {
	defer d.since(time.Now())
	return d.Driver.MapMem(p, size, off, h, f)
}
func (d *timed) UnmapMem(p acl.DevicePtr) error {
	defer d.since(time.Now())
	return d.Driver.UnmapMem(p)
}
func (d *timed) Memset(p acl.DevicePtr, v byte, n uintptr) error {
	defer d.since(time.Now())
	return d.Driver.Memset(p, v, n)
}
func (d *timed) MemSetAccess(p acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc) error {
	defer d.since(time.Now())
	return d.Driver.MemSetAccess(p, size, desc)
}

// BenchmarkGrow grows an empty arena by chunks and reports, beside ns/op,
// the time inside the driver (driver-ns/op) and the share of the time the
// arena itself spends (arena-%). cold has no reuse cache, so every chunk is a
// MallocPhysical; cache takes every chunk from the pool's cache.
// Targets: cache ≤ 1/4 of cold; arena-% under 10.
func BenchmarkGrow(b *testing.B) {
	for _, mode := range []struct {
		name      string
		maxCached int
	}{{"cold", -1}, {"cache", 0}} {
		for _, chunks := range []int{1, 16} {
			b.Run(mode.name+"/chunks="+itoa(chunks), func(b *testing.B) {
				d := &timed{Driver: benchDriver(b)}
				a := benchArena(b, arena.Config{Driver: d, Reserve: 64 << 20,
					Chunk: chunk.Config{MaxCached: mode.maxCached}})
				n := chunks * a.ChunkSize()
				// Warm the cache (and the page tables) once.
				if err := a.Grow(n); err != nil {
					b.Fatal(err)
				}
				if err := a.Shrink(); err != nil {
					b.Fatal(err)
				}
				var inDriver time.Duration
				for b.Loop() {
					d.ns.Store(0)
					if err := a.Grow(n); err != nil {
						b.Fatal(err)
					}
					inDriver += time.Duration(d.ns.Load())
					b.StopTimer()
					if err := a.Shrink(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				perOp := float64(inDriver.Nanoseconds()) / float64(b.N)
				b.ReportMetric(perOp, "driver-ns/op")
				b.ReportMetric(float64(chunks), "chunks/op")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "total-ns/op")
				if el := float64(b.Elapsed().Nanoseconds()) / float64(b.N); el > 0 {
					b.ReportMetric(100*(el-perOp)/el, "arena-%")
				}
			})
		}
	}
}

// BenchmarkShrink unmaps one chunk back into the pool's cache.
func BenchmarkShrink(b *testing.B) {
	d := &timed{Driver: benchDriver(b)}
	a := benchArena(b, arena.Config{Driver: d, Reserve: 64 << 20})
	var inDriver time.Duration
	for b.Loop() {
		b.StopTimer()
		if err := a.Grow(a.ChunkSize()); err != nil {
			b.Fatal(err)
		}
		d.ns.Store(0)
		b.StartTimer()
		if err := a.Shrink(); err != nil {
			b.Fatal(err)
		}
		inDriver += time.Duration(d.ns.Load())
	}
	b.ReportMetric(float64(inDriver.Nanoseconds())/float64(b.N), "driver-ns/op")
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// BenchmarkCopyIn4K copies 4 KiB into a buffer through the host driver: the
// checks a copy makes (the buffer inside the arena's bytes in use, not
// stale) against the copy itself. fresh copies into a buffer cut after the
// arena's last drop; below into one cut before a Truncate that left Len
// above it; searched into one cut between a Reset and a Truncate above it
// (a KV cache rolled back after the buffer was cut), whose staleness check
// searches the arena's drops.
func BenchmarkCopyIn4K(b *testing.B) {
	for _, name := range []string{"fresh", "below", "searched"} {
		b.Run(name, func(b *testing.B) {
			a := benchArena(b, arena.Config{Driver: benchDriver(b), Reserve: 4 << 20})
			if name == "searched" {
				if _, err := a.Alloc(64, 1); err != nil {
					b.Fatal(err)
				}
				if err := a.Reset(); err != nil {
					b.Fatal(err)
				}
			}
			buf, err := a.Alloc(4096, 64)
			if err != nil {
				b.Fatal(err)
			}
			if name != "fresh" {
				if _, err := a.Alloc(4096, 64); err != nil {
					b.Fatal(err)
				}
				if err := a.Truncate(4096 + 64); err != nil {
					b.Fatal(err)
				}
			}
			src := make([]byte, 4096)
			b.SetBytes(4096)
			b.ReportAllocs()
			done := cpuPerOp(b)
			for b.Loop() {
				if err := arena.CopyIn(buf, src); err != nil {
					b.Fatal(err)
				}
			}
			done()
		})
	}
}
