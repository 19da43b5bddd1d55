//go:build linux

package host_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/host"
)

// One reservation holds this process's own memory or imported memory, never
// both at once (ACL's rule); once the one kind is unmapped, the other may
// come.
func TestMapRefusesMixedSources(t *testing.T) {
	d := newHost(t, host.Config{Capacity: 64 << 20})
	defer func() { require.NoError(t, d.Close()) }()
	fd := memfd(t, chunk, sealed)
	imp, err := d.MemImportFromShareableHandle(acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(fd)}, 0)
	require.NoError(t, err)
	p := acl.DeviceProp(0, 0)
	own, err := d.MallocPhysical(chunk, &p, 0)
	require.NoError(t, err)
	base, err := d.ReserveMemAddress(2*chunk, 0, 0, 0)
	require.NoError(t, err)

	require.NoError(t, d.MapMem(base, chunk, 0, own, 0))
	acltest.RequireCode(t, d.MapMem(base.Add(chunk), chunk, 0, imp, 0), acl.ErrCodeRTParamInvalid, "imported beside own")
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.MapMem(base.Add(chunk), chunk, 0, imp, 0), "imported alone")
	acltest.RequireCode(t, d.MapMem(base, chunk, 0, own, 0), acl.ErrCodeRTParamInvalid, "own beside imported")
	require.NoError(t, d.UnmapMem(base.Add(chunk)))
	require.NoError(t, d.MapMem(base, chunk, 0, own, 0), "own alone again")
	require.NoError(t, d.UnmapMem(base))

	require.NoError(t, d.FreePhysical(own))
	require.NoError(t, d.FreePhysical(imp))
	require.NoError(t, d.ReleaseMemAddress(base))
	assert.True(t, d.Live().Zero(), "%+v", d.Live())
}

// MallocPhysical commits its memory outside the driver's lock. Stopped
// there (host.StopMallocAt), a Close meanwhile waits for the commit before
// it closes the memory file (whose number could otherwise name another file
// by then); stopped once the commit ran, a Close that ends first makes the
// allocation fail (107002) instead of the driver panicking on its emptied
// books (a nil map, before).
func TestMallocRacesClose(t *testing.T) {
	for _, point := range []int{host.PointCommit, host.PointCommitted} {
		d := newHost(t, host.Config{Capacity: 1 << 30})
		closed := make(chan error, 1)
		restore := host.StopMallocAt(func(p int) {
			if p != point {
				return
			}
			go func() { closed <- d.Close() }()
			for !host.Closed(d) {
				runtime.Gosched()
			}
			if point == host.PointCommit {
				select {
				case err := <-closed:
					t.Errorf("Close returned (%v) with a commit under way", err)
				case <-time.After(20 * time.Millisecond):
				}
				return
			}
			<-closed // it ends first; the error reports nothing live yet
		})
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("point %d: MallocPhysical panicked beside Close: %v", point, r)
				}
			}()
			p := acl.DeviceProp(0, 0)
			_, err = d.MallocPhysical(2<<20, &p, 0)
		}()
		restore()
		acltest.RequireCode(t, err, acl.ErrCodeRTContextNull, "point %d", point)
		if point == host.PointCommit {
			require.NoError(t, <-closed)
		}
	}
}

// A per-call limit near the address space's size let a reservation's size
// round up past zero: the host driver booked a 0-byte reservation it could
// never release. Config.MaxReserve is bounded (64 TiB).
func TestMaxReserveBounded(t *testing.T) {
	_, err := host.New(host.Config{Capacity: 64 << 20, MaxReserve: ^uintptr(0)})
	require.ErrorIs(t, err, acl.ErrInvalidParam)
}
