package arena_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/model"
	"github.com/vmarena/vmarena/arena"
)

// BenchmarkOffloadVsCopy sets an Offload Sleep and Wake of an arena holding
// VMARENA_OFFLOAD_MIB MiB (64 by default, and with -short) side by side with
// a raw device-to-host and
// host-to-device copy of the same bytes between the same device memory and
// a pinned host buffer, on the same driver: the host driver by the wall
// clock, and model:h200 by the wall clock and by its modelled time (the
// sum of what its calls are charged, on every goroutine: an upper bound for
// a pipeline that overlaps its copies with its unmaps or maps). Each of the
// b.N iterations takes the medians of 5 rounds, and the metrics are the
// last iteration's ratios: sleep/dtoh and wake/htod (wall), and, on the
// model, sleep/dtoh-charged and wake/htod-charged. The arena's pinned host
// copy is made by a first Sleep before the rounds, as a server's first
// sleep makes it once.
//
//	VMARENA_OFFLOAD_MIB=1024 go test ./arena -run '^$' -bench OffloadVsCopy -benchtime 1x
func BenchmarkOffloadVsCopy(b *testing.B) {
	size := 64 << 20
	if v := os.Getenv("VMARENA_OFFLOAD_MIB"); v != "" && !testing.Short() {
		mib, err := strconv.Atoi(v)
		if err != nil || mib < 1 || mib > 64<<10 {
			b.Fatalf("VMARENA_OFFLOAD_MIB=%q: want MiB from 1 to 65536", v)
		}
		size = mib << 20
	}
	b.Run("host", func(b *testing.B) {
		d, err := host.New(host.Config{Capacity: uintptr(size) + 64<<20})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Close() })
		offloadVsCopy(b, d, nil, size)
	})
	b.Run("model:h200", func(b *testing.B) {
		d, err := model.New(model.Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { d.Close() })
		offloadVsCopy(b, d, d.ChargedNS, size)
	})
}

func offloadVsCopy(b *testing.B, d acl.Driver, charged func() int64, size int) {
	ctx := context.Background()
	a, err := arena.New(arena.Config{Driver: d, Reserve: size})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := a.Close(); err != nil {
			b.Error(err)
		}
	}()
	buf, err := a.Alloc(size, 1)
	if err != nil {
		b.Fatal(err)
	}
	raw, err := d.MallocHost(uintptr(size))
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := d.FreeHost(raw); err != nil {
			b.Error(err)
		}
	}()
	for i := range raw {
		raw[i] = byte(i >> 12)
	}
	// The arena's memory touched, and its host copy pinned, once.
	if err := d.MemcpyHtoD(buf.Ptr(), raw); err != nil {
		b.Fatal(err)
	}
	if err := a.Sleep(ctx, arena.Offload); err != nil {
		b.Fatal(err)
	}
	if err := a.Wake(ctx); err != nil {
		b.Fatal(err)
	}
	type cost struct{ wall, charged int64 }
	timed := func(fn func() error) cost {
		var c0 int64
		if charged != nil {
			c0 = charged()
		}
		t0 := time.Now()
		if err := fn(); err != nil {
			b.Fatal(err)
		}
		c := cost{wall: time.Since(t0).Nanoseconds()}
		if charged != nil {
			c.charged = charged() - c0
		}
		return c
	}
	const rounds = 5
	median := func(cs []cost, f func(cost) int64) float64 {
		xs := make([]int64, len(cs))
		for i, c := range cs {
			xs[i] = f(c)
		}
		slices.Sort(xs)
		return float64(xs[len(xs)/2])
	}
	wall := func(c cost) int64 { return c.wall }
	chg := func(c cost) int64 { return c.charged }
	for b.Loop() {
		var htod, dtoh, sleep, wake []cost
		for range rounds {
			htod = append(htod, timed(func() error { return d.MemcpyHtoD(buf.Ptr(), raw) }))
			dtoh = append(dtoh, timed(func() error { return d.MemcpyDtoH(raw, buf.Ptr()) }))
			sleep = append(sleep, timed(func() error { return a.Sleep(ctx, arena.Offload) }))
			wake = append(wake, timed(func() error { return a.Wake(ctx) }))
		}
		b.ReportMetric(median(dtoh, wall)/1e6, "dtoh-ms")
		b.ReportMetric(median(sleep, wall)/1e6, "sleep-ms")
		b.ReportMetric(median(htod, wall)/1e6, "htod-ms")
		b.ReportMetric(median(wake, wall)/1e6, "wake-ms")
		b.ReportMetric(median(sleep, wall)/median(dtoh, wall), "sleep/dtoh")
		b.ReportMetric(median(wake, wall)/median(htod, wall), "wake/htod")
		if charged != nil {
			b.ReportMetric(median(sleep, chg)/median(dtoh, chg), "sleep/dtoh-charged")
			b.ReportMetric(median(wake, chg)/median(htod, chg), "wake/htod-charged")
		}
	}
}
