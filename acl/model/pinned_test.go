package model

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

// TestPinnedCopiesCharged: a copy from or to a MallocHost buffer (or a part
// of one) is charged the pinned bandwidth, one from Go memory the pageable
// one, and a profile without pinned figures charges both alike. ChargedNS
// gives the modelled times exactly, whatever the host's load.
func TestPinnedCopiesCharged(t *testing.T) {
	const n = 1 << 20
	for _, tc := range []struct {
		name             string
		pinnedGBps       float64 // 0: the profile has none
		pageable, pinned int64   // ns charged for n bytes
	}{
		{"with pinned figures", 4, n, n / 4},
		{"without", 0, n, n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := zeroProfile(t)
			p.Device.HtoDGBps.Value, p.Device.DtoHGBps.Value = 1, 1 // 1 byte per ns
			p.Device.PinnedHtoDGBps, p.Device.PinnedDtoHGBps = nil, nil
			if tc.pinnedGBps > 0 {
				p.Device.PinnedHtoDGBps = &Coef{Value: tc.pinnedGBps, Estimate: true, Source: "test"}
				p.Device.PinnedDtoHGBps = &Coef{Value: tc.pinnedGBps, Estimate: true, Source: "test"}
			}
			require.NoError(t, p.Validate())
			d := open(t, Config{Profile: p})
			defer func() { require.NoError(t, d.Close()) }()
			g := d.cost.gran
			base, err := d.ReserveMemAddress(g, 0, 0, 0)
			require.NoError(t, err)
			prop := acl.DeviceProp(0, 0)
			h, err := d.MallocPhysical(g, &prop, 0)
			require.NoError(t, err)
			require.NoError(t, d.MapMem(base, g, 0, h, 0))
			require.NoError(t, d.MemSetAccess(base, g, acl.ReadWrite(0)))
			pinned, err := d.MallocHost(2 * n)
			require.NoError(t, err)
			goMem := make([]byte, n)

			charged := func(fn func() error) int64 {
				before := d.ChargedNS()
				require.NoError(t, fn())
				return d.ChargedNS() - before
			}
			assert.Equal(t, tc.pageable, charged(func() error { return d.MemcpyHtoD(base, goMem) }), "HtoD from Go memory")
			assert.Equal(t, tc.pageable, charged(func() error { return d.MemcpyDtoH(goMem, base) }), "DtoH to Go memory")
			assert.Equal(t, tc.pinned, charged(func() error { return d.MemcpyHtoD(base, pinned[:n]) }), "HtoD from a pinned buffer")
			assert.Equal(t, tc.pinned, charged(func() error { return d.MemcpyDtoH(pinned[n:], base) }), "DtoH into the second half of one")
			copied := append([]byte(nil), pinned[:n]...)
			assert.Equal(t, tc.pageable, charged(func() error { return d.MemcpyHtoD(base, copied) }), "pinned bytes copied to Go memory")

			require.NoError(t, d.FreeHost(pinned))
			assert.Equal(t, tc.pageable, charged(func() error { return d.MemcpyHtoD(base, pinned[:n]) }), "a freed buffer is ordinary memory")
			require.NoError(t, d.UnmapMem(base))
			require.NoError(t, d.FreePhysical(h))
			require.NoError(t, d.ReleaseMemAddress(base))
		})
	}
}
