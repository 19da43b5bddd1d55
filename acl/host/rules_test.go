//go:build linux

package host_test

import (
	"sync"
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

// MallocPhysical commits its memory outside the driver's lock: a Close
// meanwhile fails the allocation (107002) instead of the driver panicking
// on its emptied books, and waits for the commit before it closes the
// memory file (whose number could otherwise name another file by then).
func TestMallocRacesClose(t *testing.T) {
	for try := range 10 {
		d := newHost(t, host.Config{Capacity: 1 << 30})
		var wg sync.WaitGroup
		errs := make([]error, 4)
		panics := make(chan any, len(errs))
		for i := range errs {
			wg.Go(func() {
				defer func() {
					if r := recover(); r != nil {
						panics <- r
					}
				}()
				p := acl.DeviceProp(0, 0)
				if i%2 == 1 {
					p.HandleType = acl.MemHandleTypePOSIX
				}
				_, errs[i] = d.MallocPhysical(128<<20, &p, 0)
			})
		}
		time.Sleep(time.Duration(try) * time.Millisecond)
		_ = d.Close() // may report the allocations that made it as live
		wg.Wait()
		close(panics)
		for r := range panics {
			t.Fatalf("try %d: MallocPhysical panicked beside Close: %v", try, r)
		}
		for i, err := range errs {
			if err != nil {
				acltest.RequireCode(t, err, acl.ErrCodeRTContextNull, "try %d, allocation %d", try, i)
			}
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
