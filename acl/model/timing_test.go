package model

import (
	"fmt"
	"math"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

// Timing tests measure ratios of elapsed to modelled time and assert only
// loose bounds, so that they hold on a loaded two-core machine and under the
// race detector; the benchmarks give the figures.

// zeroProfile returns h200 with every cost zero and every call concurrent,
// for tests to set the costs they need.
func zeroProfile(t testing.TB) *Profile {
	t.Helper()
	p, err := LoadProfile("h200")
	require.NoError(t, err)
	p.Name = "test"
	for _, cc := range p.Calls {
		cc.Base.Value = 0
		if cc.PerMiB != nil {
			cc.PerMiB.Value = 0
		}
		if cc.PerMapping != nil {
			cc.PerMapping.Value = 0
		}
		cc.Serial.Value = false
	}
	p.Device.Latency.Value = 0
	p.Device.LocalGBps.Value = 1e9
	p.Device.HtoDGBps.Value = 1e9
	p.Device.DtoHGBps.Value = 1e9
	return p
}

// sample times fn n times and returns the times, sorted.
func sample(n int, fn func()) []time.Duration {
	ts := make([]time.Duration, n)
	for i := range ts {
		t0 := time.Now()
		fn()
		ts[i] = time.Since(t0)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	return ts
}

// timing runs scenario up to three times, until its times are within their
// upper bounds: a loaded machine can make any run slow, but never fast, so
// the lower bounds are checked on every run and the upper ones on the best.
func timing(t *testing.T, scenario func(c *clock)) {
	t.Helper()
	for try := 1; ; try++ {
		c := &clock{t: t}
		runtime.GC() // no collection of an earlier test's garbage runs alongside
		scenario(c)
		if len(c.slow) == 0 || t.Failed() {
			return
		}
		if try == 3 {
			t.Errorf("three runs too slow:\n%s", strings.Join(c.slow, "\n"))
			return
		}
		t.Logf("run %d too slow (a loaded machine?), once more: %s", try, strings.Join(c.slow, "; "))
	}
}

// clock checks the times of one run of a timing scenario.
type clock struct {
	t    *testing.T
	slow []string
}

// within checks that got is at least want (less a 1% margin for the
// clocks) and notes whether it is over hi times want.
func (c *clock) within(got, want time.Duration, hi float64, what string) {
	c.t.Helper()
	r := float64(got) / float64(want)
	c.t.Logf("%s: %v against %v modelled (%.3f×)", what, got, want, r)
	if r < 0.99 {
		c.t.Errorf("%s: %v is sooner than the modelled %v", what, got, want)
	}
	if r > hi {
		c.slow = append(c.slow, fmt.Sprintf("%s: %v is %.2f× the modelled %v", what, got, r, want))
	}
}

// charged checks that fn, timed n times, never returns before want (the
// model spins until then) and usually returns soon after: its lower
// quartile within 1.5× want.
func (c *clock) charged(n int, want time.Duration, what string, fn func()) {
	c.t.Helper()
	ts := sample(n, fn)
	c.within(ts[0], want, math.Inf(1), what+", fastest")
	c.within(ts[len(ts)/4], want, 1.5, what+", lower quartile")
}

func TestWaitUntil(t *testing.T) {
	timing(t, func(c *clock) {
		for _, d := range []time.Duration{5 * time.Microsecond, 50 * time.Microsecond, 500 * time.Microsecond, 5 * time.Millisecond} {
			c.charged(21, d, "waitUntil "+d.String(), func() { waitUntil(now() + int64(d)) })
		}
	})
	if !raceEnabled {
		allocs := testing.AllocsPerRun(100, func() { waitUntil(now() + 2000) })
		assert.Zero(t, allocs, "waiting allocates nothing")
	}
}

// TestCallCosts checks that calls take their modelled time: the base, the
// per-MiB part, and a copy's bandwidth.
func TestCallCosts(t *testing.T) {
	p := zeroProfile(t)
	p.Calls["meminfo"].Base.Value = 100
	p.Calls["map"].Base.Value = 40
	p.Calls["map"].PerMiB.Value = 5
	p.Calls["htod"].Base.Value = 20
	p.Device.HtoDGBps.Value = 2 // 2 bytes per ns: 1 MiB in 524 µs
	p.Calls["memset"].Base.Value = 10
	p.Device.Latency.Value = 200
	p.Device.LocalGBps.Value = 4
	// Without data: moving real bytes on the host (slow under the race
	// detector) would add its own time to the copies this test times.
	d := open(t, Config{Profile: p, NoData: true})
	defer func() { require.NoError(t, d.Close()) }()
	if !raceEnabled {
		allocs := testing.AllocsPerRun(20, func() { _, _, _ = d.GetMemInfo(acl.HBMMem) })
		assert.Zero(t, allocs, "a call allocates nothing")
	}

	const g, size = 2 << 20, 8 << 20
	prop := acl.DeviceProp(0, 0)
	base, err := d.ReserveMemAddress(size, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(size, &prop, 0)
	require.NoError(t, err)
	buf := make([]byte, 1<<20)
	timing(t, func(c *clock) {
		c.charged(21, 100*time.Microsecond, "GetMemInfo", func() { _, _, _ = d.GetMemInfo(acl.HBMMem) })
		c.charged(21, 40*time.Microsecond+5*(size-g)/(1<<20)*time.Microsecond, "MapMem of 8 MiB", func() {
			require.NoError(t, d.MapMem(base, size, 0, h, 0))
			require.NoError(t, d.UnmapMem(base)) // charged nothing
		})
		require.NoError(t, d.MapMem(base, size, 0, h, 0))
		require.NoError(t, d.MemSetAccess(base, size, acl.ReadWrite(0)))
		c.charged(11, 20*time.Microsecond+time.Duration(len(buf)/2), "MemcpyHtoD of 1 MiB",
			func() { require.NoError(t, d.MemcpyHtoD(base, buf)) })
		c.charged(11, 210*time.Microsecond+(1<<20)/4, "Memset of 1 MiB",
			func() { require.NoError(t, d.Memset(base, 0, 1<<20)) })
		c.charged(11, 200*time.Microsecond+(2<<20)/4, "MemcpyDtoD of 1 MiB (2 MiB moved)",
			func() { require.NoError(t, d.MemcpyDtoD(base+(4<<20), base, 1<<20)) })
		require.NoError(t, d.UnmapMem(base))
	})
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
}

// TestSerial checks that calls the profile marks serial exclude each other
// across goroutines, and that others do not.
func TestSerial(t *testing.T) {
	const per, calls = 5 * time.Millisecond, 4
	p := zeroProfile(t)
	p.Calls["meminfo"].Base.Value = float64(per.Microseconds())
	p.Calls["query_event"].Base.Value = float64(per.Microseconds())
	p.Calls["meminfo"].Serial.Value = true
	d := open(t, Config{Profile: p})
	defer func() { require.NoError(t, d.Close()) }()
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyEvent(ev)) }()

	run := func(fn func()) time.Duration {
		var wg sync.WaitGroup
		t0 := time.Now()
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range calls {
					fn()
				}
			}()
		}
		wg.Wait()
		return time.Since(t0)
	}
	timing(t, func(c *clock) {
		serial := run(func() { _, _, _ = d.GetMemInfo(acl.HBMMem) })
		c.within(serial, 2*calls*per, 2, "2 goroutines of serial calls")
		parallel := run(func() { _, _ = d.QueryEvent(ev) })
		c.within(parallel, calls*per, 1.8, "2 goroutines of concurrent calls (against one goroutine's worth)")
	})
}
