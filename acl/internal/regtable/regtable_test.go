package regtable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

const g = 2 << 20

func TestBoundaries(t *testing.T) {
	var tb Table
	base := acl.DevicePtr(0x100000000)
	require.NoError(t, tb.CheckSet("set", base, 4*g))
	tb.Set(base, 4*g)
	// A range ending where another starts, and one starting where it ends,
	// do not overlap it.
	require.NoError(t, tb.CheckSet("set", base-2*g, 2*g))
	require.NoError(t, tb.CheckSet("set", base.Add(4*g), g))
	require.ErrorIs(t, tb.CheckSet("set", base-g, 2*g), acl.ErrInvalidParam)
	require.ErrorIs(t, tb.CheckSet("set", base.Add(3*g), 2*g), acl.ErrInvalidParam)
	require.ErrorIs(t, tb.CheckSet("set", acl.DevicePtr(^uintptr(0)-g), 2*g), acl.ErrInvalidParam, "wraps")

	a := acl.Mapping{Ptr: base, Size: g, Handle: 1}
	b := acl.Mapping{Ptr: base.Add(g), Size: 2 * g, Handle: 2}
	require.NoError(t, tb.CheckRegister("reg", b))
	tb.Register(b)
	require.NoError(t, tb.CheckRegister("reg", a), "adjacent below")
	tb.Register(a)
	require.NoError(t, tb.CheckRegister("reg", acl.Mapping{Ptr: base.Add(3 * g), Size: g, Handle: 3}), "adjacent above")
	require.ErrorIs(t, tb.CheckRegister("reg", acl.Mapping{Ptr: base.Add(2 * g), Size: g, Handle: 3}), acl.ErrInvalidParam)
	require.ErrorIs(t, tb.CheckRegister("reg", acl.Mapping{Ptr: base.Add(3 * g), Size: 2 * g, Handle: 3}), acl.ErrInvalidParam,
		"past the range's end")

	require.Equal(t, []acl.Mapping{a, b}, tb.All())
	require.Equal(t, []acl.Mapping{b}, tb.Covering(base.Add(2*g), g))
	require.Equal(t, []acl.Mapping{a, b}, tb.Covering(base, 4*g))
	require.Empty(t, tb.Covering(base.Add(3*g), g))
	n, bytes := tb.Mappings()
	require.Equal(t, 2, n)
	require.Equal(t, uintptr(3*g), bytes)

	_, err := tb.CheckUnset("unset", base)
	require.ErrorIs(t, err, acl.ErrInvalidParam, "two registrations inside")
	require.ErrorIs(t, tb.CheckDeregister("dereg", acl.Mapping{Ptr: base.Add(g), Size: g, Handle: 2}), acl.ErrInvalidParam)
	require.NoError(t, tb.CheckDeregister("dereg", b))
	tb.Deregister(b)
	tb.Deregister(a)
	size, err := tb.CheckUnset("unset", base)
	require.NoError(t, err)
	require.Equal(t, uintptr(4*g), size)
	tb.Unset(base)
	require.Zero(t, tb.Ranges())
	n, bytes = tb.Mappings()
	require.Zero(t, n)
	require.Zero(t, bytes)

	require.NoError(t, Aligned("op", "size", 4*g, g))
	require.ErrorIs(t, Aligned("op", "size", g+4096, g), acl.ErrInvalidParam)
	require.NoError(t, Aligned("op", "size", 4097, 0))
}
