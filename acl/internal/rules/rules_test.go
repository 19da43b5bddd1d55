package rules

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

func code(t *testing.T, err error) int32 {
	t.Helper()
	c, ok := acl.CodeOf(err)
	require.True(t, ok, "%v", err)
	return c
}

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
	assert.Equal(t, acl.ErrCodeRTParamInvalid, code(t, err), "no wrap-around")
	p = acl.DeviceProp(0, acl.HBMMemHuge)
	_, err = Malloc("op", 3<<20, &p, 0, 0, "test", page)
	assert.Equal(t, acl.ErrCodeRTParamInvalid, code(t, err))
	p.Location.Type = acl.MemLocationTypeHost
	_, err = Malloc("op", 2<<20, &p, 0, 0, "test", page)
	assert.Equal(t, acl.ErrCodeRTFeatureNotSupport, code(t, err))
}

func TestAccessHost(t *testing.T) {
	host := []acl.MemAccessDesc{{Flags: acl.MemAccessReadWrite, Location: acl.MemLocation{Type: acl.MemLocationTypeHost}}}
	require.NoError(t, Access("op", 1, 1, host, 0, true))
	assert.Equal(t, acl.ErrCodeInvalidParam, code(t, Access("op", 1, 1, host, 0, false)))
	host[0].Location.ID = 1
	assert.Equal(t, acl.ErrCodeInvalidParam, code(t, Access("op", 1, 1, host, 0, true)))
	assert.Equal(t, acl.ErrCodeRTInvalidDeviceID, code(t, Access("op", 1, 1, acl.ReadWrite(2), 0, true)))
}
