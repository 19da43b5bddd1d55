package acl_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/internal/skip"
)

// GrantAccess makes one access call per mapping on a driver that allows no
// more (the host driver as ACL documents it), one over the run where
// AccessSpan says so, and none for no mapping; a failed call is returned.
func TestGrantAccess(t *testing.T) {
	const g = acl.HugePageSize
	for _, span := range []bool{false, true} {
		h, err := host.New(host.Config{Capacity: 16 * g, AccessSpan: span})
		if errors.Is(err, acl.ErrNotSupported) {
			skip.Unsupported(t, "the host driver: %v", err)
		}
		require.NoError(t, err)
		d := faultdriver.New(h)
		base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
		require.NoError(t, err)
		var hs []acl.PhysicalHandle
		prop := acl.DeviceProp(0, 0)
		for i := range 3 {
			ph, err := d.MallocPhysical(g, &prop, 0)
			require.NoError(t, err)
			require.NoError(t, d.MapMem(base.Add(uintptr(i)*g), g, 0, ph, 0))
			hs = append(hs, ph)
		}
		rw := acl.ReadWrite(0)
		if !span {
			require.Error(t, d.MemSetAccess(base, 3*g, rw), "the host driver refuses one call over three mappings")
		}
		before := d.Calls(faultdriver.MemSetAccess)
		require.NoError(t, acl.GrantAccess(d, base, g, 0, rw))
		require.Equal(t, before, d.Calls(faultdriver.MemSetAccess), "no mapping, no call")
		require.NoError(t, acl.GrantAccess(d, base, g, 3, rw), "AccessSpan %v", span)
		want := int64(3)
		if span {
			want = 1
		}
		require.Equal(t, want, d.Calls(faultdriver.MemSetAccess)-before, "AccessSpan %v: access calls", span)
		require.NoError(t, d.Memset(base, 1, 3*g), "the whole run is accessible")

		d.FailNth(faultdriver.MemSetAccess, 1, 0)
		require.Error(t, acl.GrantAccess(d, base, g, 3, rw), "a failed call is the error")

		for i, ph := range hs {
			require.NoError(t, d.UnmapMem(base.Add(uintptr(i)*g)))
			require.NoError(t, d.FreePhysical(ph))
		}
		require.NoError(t, d.ReleaseMemAddress(base))
		require.True(t, h.Live().Zero(), "%+v", h.Live())
		require.NoError(t, h.Close())
	}
}
