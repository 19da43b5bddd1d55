// Package rules holds the argument checks of the ACL layer that a driver makes
// itself when nothing below it does: the host driver, which simulates ACL, and
// the CUDA driver, which is laxer than ACL. Each check returns the *acl.Error
// ACL would, with ACL's code where a source settles it and the simulator's
// choice where none does (docs/acl.md: "Semantics, call by call" and "The
// rules the host driver enforces").
package rules

import "github.com/vmarena/vmarena/acl"

func fail(op string, code int32, format string, args ...any) error {
	return acl.Errorf(op, code, format, args...)
}

// Prop runs the ACL layer's checks of a PhysicalMemProp in ACL's order
// (docs/acl.md, "aclrtMallocPhysical"), then requires device memory on
// device; who names the driver in the message.
func Prop(op string, prop *acl.PhysicalMemProp, device int32, who string) error {
	switch {
	case prop == nil:
		return fail(op, acl.ErrCodeInvalidParam, "prop is NULL")
	case prop.HandleType != acl.MemHandleTypeNone:
		return fail(op, acl.ErrCodeInvalidParam, "handleType %d: only ACL_MEM_HANDLE_TYPE_NONE is supported", prop.HandleType)
	case prop.AllocationType != acl.MemAllocationTypePinned:
		return fail(op, acl.ErrCodeInvalidParam, "allocationType %d: only ACL_MEM_ALLOCATION_TYPE_PINNED is supported", prop.AllocationType)
	case prop.Location.Type == acl.MemLocationTypeUnregistered || prop.Location.Type == acl.MemLocationTypeManaged:
		return fail(op, acl.ErrCodeInvalidParam, "location type %d is not allowed", prop.Location.Type)
	case prop.Location.Type == acl.MemLocationTypeDevice && prop.MemAttr.DDR():
		return fail(op, acl.ErrCodeInvalidParam, "memAttr %d is DDR memory, not allowed on a device location", prop.MemAttr)
	case !prop.MemAttr.PhysicalSupported():
		return fail(op, acl.ErrCodeInvalidParam, "memAttr %d is not supported for physical allocation", prop.MemAttr)
	case prop.Location.Type != acl.MemLocationTypeDevice:
		return fail(op, acl.ErrCodeRTFeatureNotSupport, "location type %d: the %s driver allocates device memory only", prop.Location.Type, who)
	case int64(prop.Location.ID) != int64(device):
		return fail(op, acl.ErrCodeRTInvalidDeviceID, "device %d: this driver is device %d", prop.Location.ID, device)
	}
	return nil
}

// GranularityOption checks the option of aclrtMemGetAllocationGranularity.
func GranularityOption(op string, option acl.MemGranularityOptions) error {
	if option != acl.GranularityMinimum && option != acl.GranularityRecommended {
		return fail(op, acl.ErrCodeRTFeatureNotSupport, "granularity option %d", option)
	}
	return nil
}

// Malloc checks the arguments of aclrtMallocPhysical and returns the size to
// allocate: size itself, a multiple of page, or for the HUGE1G attributes size
// rounded up to page. page gives the granularity of an attribute.
func Malloc(op string, size uintptr, prop *acl.PhysicalMemProp, flags uint64, device int32, who string,
	page func(acl.MemAttr) uintptr) (uintptr, error) {
	switch {
	case prop == nil:
		return 0, fail(op, acl.ErrCodeInvalidParam, "prop is NULL")
	case size == 0:
		return 0, fail(op, acl.ErrCodeInvalidParam, "size is 0")
	case flags != 0:
		return 0, fail(op, acl.ErrCodeInvalidParam, "flags %#x: must be 0", flags)
	}
	if err := Prop(op, prop, device, who); err != nil {
		return 0, err
	}
	if prop.Reserve != 0 {
		return 0, fail(op, acl.ErrCodeRTParamInvalid, "prop reserve should be zero")
	}
	p := page(prop.MemAttr)
	switch {
	case prop.MemAttr.Huge1G():
		if size > ^uintptr(0)-(p-1) {
			return 0, fail(op, acl.ErrCodeRTParamInvalid, "size %d is too large", size)
		}
		return (size + p - 1) / p * p, nil
	case size%p != 0:
		return 0, fail(op, acl.ErrCodeRTParamInvalid, "size %d is not a multiple of the granularity %d", size, p)
	}
	return size, nil
}

// ReserveCeiling bounds a simulator's Config.MaxReserve (64 TiB, half of a
// 47-bit user address space): a size up to it, rounded up to a page or
// aligned to 1 GiB, cannot wrap.
const ReserveCeiling = 1 << 46

// Reserve checks the arguments of aclrtReserveMemAddress; max is the largest
// reservation one call may make.
func Reserve(op string, size, alignment uintptr, expect acl.DevicePtr, flags uint64, max uintptr) error {
	switch {
	case size == 0:
		return fail(op, acl.ErrCodeInvalidParam, "size is 0")
	case flags > 1:
		return fail(op, acl.ErrCodeInvalidParam, "flags %#x: must be 0 or 1", flags)
	case alignment != 0:
		return fail(op, acl.ErrCodeRTParamInvalid, "alignment %d: must be 0", alignment)
	case expect != 0:
		return fail(op, acl.ErrCodeRTFeatureNotSupport, "expectPtr %v: a chosen address is not supported", expect)
	case size > max:
		return fail(op, acl.ErrCodeRTParamInvalid, "size %d exceeds the per-call limit of %d bytes", size, max)
	}
	return nil
}

// Map checks the arguments of aclrtMapMem that need no state.
func Map(op string, ptr acl.DevicePtr, size, offset uintptr, h acl.PhysicalHandle, flags uint64) error {
	switch {
	case ptr == 0:
		return fail(op, acl.ErrCodeInvalidParam, "virPtr is NULL")
	case h == 0:
		return fail(op, acl.ErrCodeInvalidParam, "handle is NULL")
	case size == 0:
		return fail(op, acl.ErrCodeInvalidParam, "size is 0")
	case flags != 0:
		return fail(op, acl.ErrCodeInvalidParam, "flags %#x: must be 0", flags)
	case offset != 0:
		return fail(op, acl.ErrCodeRTParamInvalid, "offset %d: must be 0", offset)
	}
	return nil
}

// Access checks the arguments of aclrtMemSetAccess that need no state. Only
// READWRITE is supported; hostOK says whether a HOST location may be granted
// access (ACL: yes; CUDA: device memory is for devices only).
func Access(op string, ptr acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc, device int32, hostOK bool) error {
	switch {
	case ptr == 0:
		return fail(op, acl.ErrCodeInvalidParam, "virPtr is NULL")
	case size == 0:
		return fail(op, acl.ErrCodeInvalidParam, "size is 0")
	case len(desc) == 0:
		return fail(op, acl.ErrCodeInvalidParam, "no access descriptor")
	}
	for _, ds := range desc {
		switch {
		case ds.Flags != acl.MemAccessReadWrite:
			return fail(op, acl.ErrCodeInvalidParam, "access flags %#x: only READWRITE is supported", ds.Flags)
		case ds.Rsv != [12]byte{}:
			return fail(op, acl.ErrCodeInvalidParam, "reserved bytes of the descriptor must be 0")
		case ds.Location.Type == acl.MemLocationTypeHost && !hostOK:
			return fail(op, acl.ErrCodeInvalidParam, "host location: device memory is granted to devices only")
		case ds.Location.Type == acl.MemLocationTypeHost && ds.Location.ID != 0:
			return fail(op, acl.ErrCodeInvalidParam, "host location id %d: must be 0", ds.Location.ID)
		case ds.Location.Type == acl.MemLocationTypeDevice && int64(ds.Location.ID) != int64(device):
			return fail(op, acl.ErrCodeRTInvalidDeviceID, "device %d: this driver is device %d", ds.Location.ID, device)
		case ds.Location.Type != acl.MemLocationTypeHost && ds.Location.Type != acl.MemLocationTypeDevice:
			return fail(op, acl.ErrCodeInvalidParam, "location type %d", ds.Location.Type)
		}
	}
	return nil
}

// MemInfo checks the attr of aclrtGetMemInfo: one of ACL's memory attributes.
func MemInfo(op string, attr acl.MemAttr) error {
	if attr < acl.DDRMem || attr > acl.MemP2PHuge1G {
		return fail(op, acl.ErrCodeInvalidParam, "attr %d", attr)
	}
	return nil
}

// MapSource checks that a mapping of imported memory (imported) or of this
// process's own goes into a reservation whose maps mappings are all of the
// same source, imports of them: ACL does not let one reservation hold memory
// from MallocPhysical and from an import at once (107000, a code chosen:
// the runtime's is not settled).
func MapSource(op string, imported bool, imports, maps int) error {
	switch {
	case imported && imports != maps:
		return fail(op, acl.ErrCodeRTParamInvalid, "the reservation holds memory of this process's own: imported memory may not be mapped beside it")
	case !imported && imports > 0:
		return fail(op, acl.ErrCodeRTParamInvalid, "the reservation holds imported memory: memory of this process's own may not be mapped beside it")
	}
	return nil
}

// MapFits checks that a mapping at ptr of size bytes fits the physical
// allocation it maps (hsize bytes in pages of page bytes): the whole
// allocation, at an address aligned to its page.
func MapFits(op string, ptr acl.DevicePtr, size, hsize, page uintptr) error {
	switch {
	case size != hsize:
		return fail(op, acl.ErrCodeRTParamInvalid, "size %d differs from the physical allocation's %d", size, hsize)
	case uintptr(ptr)%page != 0:
		return fail(op, acl.ErrCodeRTParamInvalid, "virPtr %v is not aligned to the page size %d", ptr, page)
	}
	return nil
}
