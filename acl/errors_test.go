package acl

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
)

func TestSentinels(t *testing.T) {
	cases := map[int32]error{
		207001: ErrOutOfMemory, 207018: ErrOutOfMemory,
		100000: ErrInvalidParam, 107000: ErrInvalidParam,
		107017: ErrInvalidHandle,
		207000: ErrNotSupported,
		107002: ErrNoContext,
		107001: ErrNoDevice,
	}
	all := []error{ErrOutOfMemory, ErrInvalidParam, ErrInvalidHandle, ErrNotSupported, ErrNoContext, ErrNoDevice}
	for code, want := range cases {
		err := NewError("op", code, "")
		for _, s := range all {
			assert.Equal(t, s == want, errors.Is(err, s), "code %d vs %v", code, s)
		}
	}
	assert.NoError(t, NewError("op", Success, "ignored"))
	assert.False(t, errors.Is(NewError("op", 507899, ""), ErrOutOfMemory))
	assert.Equal(t, "aclError(42)", CodeName(42))
	code, ok := CodeOf(errors.Join(errors.New("x"), NewError("op", 107000, "")))
	assert.True(t, ok)
	assert.Equal(t, int32(107000), code)
}

// The Go structs have the C layouts (docs/acl.md, "Structure layouts").
func TestLayouts(t *testing.T) {
	var p PhysicalMemProp
	assert.Equal(t, uintptr(32), unsafe.Sizeof(p))
	assert.Equal(t, uintptr(8), unsafe.Offsetof(p.MemAttr))
	assert.Equal(t, uintptr(12), unsafe.Offsetof(p.Location))
	assert.Equal(t, uintptr(24), unsafe.Offsetof(p.Reserve))
	var d MemAccessDesc
	assert.Equal(t, uintptr(24), unsafe.Sizeof(d))
	assert.Equal(t, uintptr(4), unsafe.Offsetof(d.Location))
	assert.Equal(t, uintptr(12), unsafe.Offsetof(d.Rsv))
	assert.Equal(t, uintptr(8), unsafe.Sizeof(MemLocation{}))
}

func TestMemAttr(t *testing.T) {
	for _, a := range []MemAttr{DDRMem, HBMMem, HBMMemP2PHuge, HBMMemP2PNormal, HBMMemP2PHuge1G} {
		assert.False(t, a.PhysicalSupported(), "%d", a)
	}
	for _, a := range []MemAttr{HBMMemHuge, HBMMemNormal, HBMMemHuge1G, MemHuge, MemP2PHuge1G} {
		assert.True(t, a.PhysicalSupported(), "%d", a)
	}
	assert.True(t, MemHuge1G.Huge1G())
	assert.False(t, MemHuge.Huge1G())
	assert.Equal(t, HBMMemHuge, DeviceProp(3, 0).MemAttr)
	assert.Equal(t, uint32(3), DeviceProp(3, 0).Location.ID)
}
