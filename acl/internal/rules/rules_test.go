package rules

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
)

func TestMallocRounding(t *testing.T) {
	page := func(a acl.MemAttr) uintptr {
		if a.Huge1G() {
			return acl.Huge1GPageSize
		}
		return acl.HugePageSize
	}
	p := acl.DeviceProp(0, acl.HBMMemHuge1G)
	size, err := Malloc("op", 1, &p, 0, 0, "test", page)
	require.NoError(t, err)
	assert.Equal(t, uintptr(acl.Huge1GPageSize), size)
	_, err = Malloc("op", ^uintptr(0), &p, 0, 0, "test", page)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid, "no wrap-around")
	p = acl.DeviceProp(0, acl.HBMMemHuge)
	_, err = Malloc("op", 3<<20, &p, 0, 0, "test", page)
	acltest.RequireCode(t, err, acl.ErrCodeRTParamInvalid)
	p.Location.Type = acl.MemLocationTypeHost
	_, err = Malloc("op", 2<<20, &p, 0, 0, "test", page)
	acltest.RequireCode(t, err, acl.ErrCodeRTFeatureNotSupport)
}

func TestAccessHost(t *testing.T) {
	host := []acl.MemAccessDesc{{Flags: acl.MemAccessReadWrite, Location: acl.MemLocation{Type: acl.MemLocationTypeHost}}}
	require.NoError(t, Access("op", 1, 1, host, 0, true))
	acltest.RequireCode(t, Access("op", 1, 1, host, 0, false), acl.ErrCodeInvalidParam)
	host[0].Location.ID = 1
	acltest.RequireCode(t, Access("op", 1, 1, host, 0, true), acl.ErrCodeInvalidParam)
	acltest.RequireCode(t, Access("op", 1, 1, acl.ReadWrite(2), 0, true), acl.ErrCodeRTInvalidDeviceID)
}
