package book

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
)

func TestBook(t *testing.T) {
	var b Book[int, string]
	r1 := &Reservation[int, string]{Base: 0x1000, Size: 0x1000}
	r2 := &Reservation[int, string]{Base: 0x4000, Size: 0x2000}
	b.Add(r2)
	b.Add(r1)
	require.Equal(t, []*Reservation[int, string]{r1, r2}, b.All(), "kept sorted")

	_, _, err := b.Place("op", 0x3000, 0x1000)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "between reservations")
	_, _, err = b.Place("op", 0x5000, 0x2000)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "past the end")
	r, i, err := b.Place("op", 0x5000, 0x1000)
	require.NoError(t, err)
	require.Same(t, r2, r)
	r.Insert(i, &Mapping[string]{Addr: 0x5000, Size: 0x1000, H: "b"})
	r, i, err = b.Place("op", 0x4000, 0x1000)
	require.NoError(t, err)
	r.Insert(i, &Mapping[string]{Addr: 0x4000, Size: 0x1000, H: "a", Access: true})
	require.Equal(t, "a", r2.Maps[0].H, "inserted in address order")
	_, _, err = b.Place("op", 0x4800, 0x1000)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "overlap")

	_, _, m := b.Mapping(0x4800)
	require.Nil(t, m, "not a mapping's start")
	_, idx, m := b.Mapping(0x5000)
	require.Equal(t, "b", m.H)
	require.Equal(t, 1, idx)

	_, err = b.Accessible("op", 0x4800, 0x800)
	require.NoError(t, err)
	_, err = b.Accessible("op", 0x4800, 0x1000)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "runs into a mapping without access")
	m.Access = true
	_, err = b.Accessible("op", 0x4800, 0x1000)
	require.NoError(t, err, "spans two adjacent mappings")
	_, err = b.Accessible("op", 0x1000, 1)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "reserved, not mapped")

	_, err = b.Releasable("op", 0x4000)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "still mapped")
	_, err = b.Releasable("op", 0x1800)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "not a base")
	r, err = b.Releasable("op", 0x1000)
	require.NoError(t, err)
	b.Forget(r)
	require.Equal(t, []*Reservation[int, string]{r2}, b.All())
	r2.Remove(0)
	r2.Remove(0)
	require.Empty(t, r2.Maps)
	b.Reset()
	require.Empty(t, b.All())
}
