package model

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
)

// A range that wraps the address space is refused by the host driver
// (107000); the model must refuse it too, not queue the work unchecked.
func TestEnqueueWrappedRange(t *testing.T) {
	d := open(t, Config{Untimed: true})
	defer func() { require.NoError(t, d.Close()) }()
	base, undo := chunk(t, d, 2<<20)
	defer undo()
	h, err := host.New(host.Config{})
	require.NoError(t, err)
	defer h.Close()

	n := ^uintptr(0) - uintptr(base) + 2 // base+n wraps to 1
	hostErr := h.MemsetAsync(base, 1, n, 0)
	require.ErrorIs(t, hostErr, acl.ErrInvalidParam, "host")
	require.Error(t, d.MemsetAsync(base, 1, n, 0), "model MemsetAsync over a wrapping range")
	require.Error(t, d.Launch(0, base, n, nil), "model Launch over a wrapping range")
	require.NoError(t, d.SynchronizeDevice())
}

// A synchronous device-side copy whose source and destination both lie
// under unfinished work records the faults the host driver records.
func TestDtoDFaultsAsHost(t *testing.T) {
	run := func(d interface {
		acl.Driver
		acl.Launcher
	}) int {
		prop := acl.DeviceProp(0, 0)
		const size = 2 << 20
		base, err := d.ReserveMemAddress(size, 0, 0, 0)
		require.NoError(t, err)
		h, err := d.MallocPhysical(size, &prop, 0)
		require.NoError(t, err)
		require.NoError(t, d.MapMem(base, size, 0, h, 0))
		require.NoError(t, d.MemSetAccess(base, size, acl.ReadWrite(0)))
		s, err := d.CreateStream()
		require.NoError(t, err)
		done := make(chan struct{})
		require.NoError(t, d.Launch(s, base, size, done))
		require.NoError(t, d.MemcpyDtoD(base.Add(size/2), base, size/2))
		f := d.Faults()
		close(done)
		require.NoError(t, d.SynchronizeStream(s))
		require.NoError(t, d.DestroyStream(s))
		require.NoError(t, d.UnmapMem(base))
		require.NoError(t, d.FreePhysical(h))
		require.NoError(t, d.ReleaseMemAddress(base))
		return f
	}
	hd, err := host.New(host.Config{})
	require.NoError(t, err)
	defer func() { require.NoError(t, hd.Close()) }()
	md := open(t, Config{Untimed: true})
	defer func() { require.NoError(t, md.Close()) }()
	require.Equal(t, run(hd), run(md), "faults: host, model")
}

// A synchronisation under way gives up when the driver closes (107002), as
// the host driver's does, also when the work it waits for has a known end.
func TestSyncReturnsOnClose(t *testing.T) {
	d := open(t, Config{Untimed: true})
	s, err := d.CreateStream()
	require.NoError(t, err)
	require.NoError(t, d.LaunchFor(s, 0, 0, 3*time.Second))
	waiting := make(chan struct{})
	var once sync.Once
	f := func() { once.Do(func() { close(waiting) }) }
	syncWaits.Store(&f)
	defer syncWaits.Store(nil)
	errc := make(chan error, 1)
	go func() { errc <- d.SynchronizeStream(s) }()
	<-waiting                   // the synchronisation waits for the 3 s of work
	require.Error(t, d.Close()) // reports the queued work
	select {
	case err := <-errc:
		require.ErrorIs(t, err, acl.ErrNoContext)
	case <-time.After(time.Second):
		t.Fatal("SynchronizeStream still waiting a second after Close")
	}
}

// Memsets on two streams land in the order the device runs them, whatever
// order the streams are synchronised in: B's memset ends at once, A's after a
// 20 ms kernel, so the range holds A's value.
func TestMemsetsLandInDeviceOrder(t *testing.T) {
	d := open(t, Config{Untimed: true})
	defer func() { require.NoError(t, d.Close()) }()
	base, undo := chunk(t, d, 2<<20)
	defer undo()
	a, err := d.CreateStream()
	require.NoError(t, err)
	b, err := d.CreateStream()
	require.NoError(t, err)
	require.NoError(t, d.LaunchFor(a, 0, 0, 20*time.Millisecond))
	require.NoError(t, d.MemsetAsync(base, 1, 4096, a)) // runs at 20 ms
	require.NoError(t, d.MemsetAsync(base, 2, 4096, b)) // runs at once
	require.NoError(t, d.SynchronizeStream(a))
	require.NoError(t, d.SynchronizeStream(b))
	got := make([]byte, 1)
	require.NoError(t, d.MemcpyDtoH(got, base))
	require.Equal(t, byte(1), got[0], "the later memset (stream a, at 20 ms) wins")
	require.Zero(t, d.Faults())
	require.NoError(t, d.DestroyStream(a))
	require.NoError(t, d.DestroyStream(b))
}

// Under the pessimistic reading an access span over k one-granule mappings
// costs k one-mapping calls (Config.Pessimistic, docs/model.md): no more,
// no less.
func TestPessimisticSpanCostsKCalls(t *testing.T) {
	p, err := LoadProfile("h200")
	require.NoError(t, err)
	d := open(t, Config{Profile: p, Pessimistic: true, NoData: true})
	defer func() { require.NoError(t, d.Close()) }()
	const g, k = 2 << 20, 4
	prop := acl.DeviceProp(0, 0)
	base, err := d.ReserveMemAddress(k*g, 0, 0, 0)
	require.NoError(t, err)
	var hs []acl.PhysicalHandle
	for i := range k {
		h, err := d.MallocPhysical(g, &prop, 0)
		require.NoError(t, err)
		require.NoError(t, d.MapMem(base.Add(uintptr(i)*g), g, 0, h, 0))
		hs = append(hs, h)
	}
	c0 := d.ChargedNS()
	for i := range k {
		require.NoError(t, d.MemSetAccess(base.Add(uintptr(i)*g), g, acl.ReadWrite(0)))
	}
	calls := d.ChargedNS() - c0
	c0 = d.ChargedNS()
	require.NoError(t, d.MemSetAccess(base, k*g, acl.ReadWrite(0)))
	span := d.ChargedNS() - c0
	require.Equal(t, calls, span, "a span of %d mappings against %d one-mapping calls", k, k)
	for i, h := range hs {
		require.NoError(t, d.UnmapMem(base.Add(uintptr(i)*g)))
		require.NoError(t, d.FreePhysical(h))
	}
	require.NoError(t, d.ReleaseMemAddress(base))
}

// A per-call limit near the address space's size let a reservation's size
// round up past zero and be booked with 0 bytes: Config.MaxReserve is
// bounded (rules.ReserveCeiling), and a reservation up to it cannot wrap.
func TestReserveSizeCannotWrap(t *testing.T) {
	_, err := New(Config{Untimed: true, MaxReserve: ^uintptr(0)})
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	d, err := New(Config{Untimed: true, MaxReserve: 1 << 46})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	p, err := d.ReserveMemAddress(1<<46, 0, 0, 0)
	require.NoError(t, err)
	require.Equal(t, uintptr(1<<46), d.Live().ReservedBytes)
	require.NoError(t, d.ReleaseMemAddress(p))
	_, err = d.ReserveMemAddress(1<<46+1, 0, 0, 0)
	require.ErrorIs(t, err, acl.ErrInvalidParam)
}

// A profile whose times no longer fit int64 nanoseconds (1e16 µs) made
// every call wait for centuries: Validate bounds times and bandwidths, and
// costs saturate.
func TestProfileBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(p *Profile)
	}{
		{"a call's base", func(p *Profile) { p.Calls["granularity"].Base.Value = 1e16 }},
		{"a per-MiB cost", func(p *Profile) { p.Calls["map"].PerMiB.Value = 1e12 }},
		{"a bandwidth", func(p *Profile) { p.Device.LocalGBps.Value = 1e-300 }},
		{"the device latency", func(p *Profile) { p.Device.Latency.Value = 1e16 }},
	} {
		p, err := LoadProfile("h200")
		require.NoError(t, err)
		tc.set(p)
		require.Error(t, p.Validate(), tc.name)
	}
	require.Equal(t, int64(maxNS), nanos(1e30))
	require.Zero(t, nanos(-1))
}
