package model

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/internal/skip"
)

func open(t testing.TB, cfg Config) *Driver {
	t.Helper()
	d, err := New(cfg)
	require.NoError(t, err)
	return d
}

// TestConformance runs the conformance suite on the model of every shipped
// profile, keeping bytes, with exact codes and the model as its own
// Launcher.
func TestConformance(t *testing.T) {
	for _, name := range Profiles() {
		t.Run(name, func(t *testing.T) {
			p, err := LoadProfile(name)
			require.NoError(t, err)
			acltest.Run(t, acltest.Factory{
				Open: func(t testing.TB) acl.Driver { return open(t, Config{Profile: p}) },
				OpenCapacity: func(t testing.TB, capacity uintptr) acl.Driver {
					return open(t, Config{Profile: p, Capacity: capacity})
				},
				ExactCodes: true,
			})
		})
	}
}

// TestConformanceUntimed runs the suite without modelled time, and with
// access spans refused, as ACL documents.
func TestConformanceUntimed(t *testing.T) {
	p, err := LoadProfile("h200")
	require.NoError(t, err)
	p.Caps.AccessSpan.Value = false
	acltest.Run(t, acltest.Factory{
		Open: func(t testing.TB) acl.Driver { return open(t, Config{Profile: p, Untimed: true}) },
		OpenCapacity: func(t testing.TB, capacity uintptr) acl.Driver {
			return open(t, Config{Profile: p, Untimed: true, Capacity: capacity})
		},
		ExactCodes: true,
	})
}

func TestName(t *testing.T) {
	d := open(t, Config{})
	defer d.Close()
	assert.Equal(t, "model:h200", d.Name())
	assert.Contains(t, d.Modelled(), "modelled")
	assert.Contains(t, d.Modelled(), "h200")
	assert.Equal(t, acl.Caps{AccessSpan: true, Fresh: acl.FreshProcess, MaxReserve: acl.MaxReserve, Sharing: sharing, ReadOnly: true}, d.Caps())
	assert.Equal(t, uintptr(143771<<20), d.Capacity())
}

// TestLargeDevice models a 141 GiB device without data, fills it with 2 MiB
// chunks, and checks that the model's own memory stays proportional to its
// books, and that a read fails instead of returning bytes nobody wrote.
func TestLargeDevice(t *testing.T) {
	skip.IfShort(t, "maps 72192 chunks")
	const capacity = 141 << 30
	d := open(t, Config{Capacity: capacity, Untimed: true, NoData: true})
	defer func() {
		require.NoError(t, d.Close())
		runtime.GC() // leave no collection running into the timing tests
	}()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	prop := acl.DeviceProp(0, 0)
	const g = 2 << 20
	var bases []acl.DevicePtr
	var sizes []uintptr
	var hs []acl.PhysicalHandle
	for left := uintptr(capacity); left > 0; {
		size := min(left, acl.MaxReserve)
		base, err := d.ReserveMemAddress(size, 0, 0, 0)
		require.NoError(t, err)
		bases = append(bases, base)
		sizes = append(sizes, size)
		for off := uintptr(0); off < size; off += g {
			h, err := d.MallocPhysical(g, &prop, 0)
			require.NoError(t, err)
			require.NoError(t, d.MapMem(base+acl.DevicePtr(off), g, 0, h, 0))
			hs = append(hs, h)
		}
		require.NoError(t, d.MemSetAccess(base, size, acl.ReadWrite(0)), "one access call over the whole span")
		left -= size
	}
	free, total, err := d.GetMemInfo(acl.HBMMem)
	require.NoError(t, err)
	assert.Zero(t, free)
	assert.Equal(t, uintptr(capacity), total)
	_, err = d.MallocPhysical(g, &prop, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTMemoryAllocation)
	// Copies over the whole device move nothing and allocate nothing
	// beyond the caller's buffer.
	buf := make([]byte, 1<<30)
	require.NoError(t, d.MemcpyHtoD(bases[0], buf))
	require.NoError(t, d.Memset(bases[1], 0xFF, 13<<30))
	require.NoError(t, d.MemcpyDtoD(bases[1], bases[0], 1<<30))
	buf[7] = 7
	err = d.MemcpyDtoH(buf[:4096], bases[0])
	acltest.RequireCode(t, err, acl.ErrCodeRTFeatureNotSupport)
	assert.ErrorIs(t, err, acl.ErrNotSupported)
	assert.Contains(t, err.Error(), "nodata")
	assert.Equal(t, byte(7), buf[7], "a failed read leaves the destination alone")
	buf = nil

	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d chunks mapped: heap grew by %.1f MiB", len(hs), float64(grown)/(1<<20))
	assert.Less(t, grown, int64(64<<20), "the model's memory is its books, not the device's bytes")
	assert.Equal(t, acl.LiveCounts{Reservations: 2, ReservedBytes: capacity, Mappings: len(hs), MappedBytes: capacity,
		Handles: len(hs), PhysicalBytes: capacity}, d.Live())

	// Top down, as the arena unmaps, so the books never shift.
	i := len(hs)
	for k := len(bases) - 1; k >= 0; k-- {
		for off := sizes[k]; off > 0; off -= g {
			i--
			require.NoError(t, d.UnmapMem(bases[k]+acl.DevicePtr(off-g)))
			require.NoError(t, d.FreePhysical(hs[i]))
		}
		require.NoError(t, d.ReleaseMemAddress(bases[k]))
	}
	assert.True(t, d.Live().Zero())
}

func TestCloseReportsLeaks(t *testing.T) {
	d := open(t, Config{Untimed: true})
	prop := acl.DeviceProp(0, 0)
	_, err := d.MallocPhysical(2<<20, &prop, 0)
	require.NoError(t, err)
	s, err := d.CreateStream()
	require.NoError(t, err)
	done := make(chan struct{})
	base, err := d.ReserveMemAddress(2<<20, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(2<<20, &prop, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, 2<<20, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, 2<<20, acl.ReadWrite(0)))
	require.NoError(t, d.Launch(s, base, 4096, done))
	err = d.Close()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "still live")
	assert.Contains(t, err.Error(), "still queued")
	require.NoError(t, d.Close(), "a second Close does nothing")
	_, err = d.MallocPhysical(2<<20, &prop, 0)
	acltest.RequireCode(t, err, acl.ErrCodeRTContextNull)
	close(done)
}

// Freed handle values come back, as a device runtime's do.
func TestReusesFreedHandles(t *testing.T) {
	d := open(t, Config{Untimed: true})
	defer d.Close()
	acltest.RequireHandleReuse(t, d)
}
