package rules

import "github.com/vmarena/vmarena/acl"

// ExportableProp runs Prop on a PhysicalMemProp that may ask for an
// exportable allocation (HandleType MemHandleTypePOSIX, for a driver that
// shares file descriptors), and reports whether it does.
func ExportableProp(op string, prop *acl.PhysicalMemProp, device int32, who string) (posix bool, err error) {
	posix, p := Exportable(prop)
	return posix, Prop(op, p, device, who)
}

// Exportable reports whether prop asks for an exportable allocation
// (HandleType POSIX, this module's extension), and returns the property as
// ACL's MallocPhysical knows it: prop, or a copy with HandleType NONE. A
// driver's MallocPhysical runs Malloc on that, so that its checks keep ACL's
// order whatever the handle type.
func Exportable(prop *acl.PhysicalMemProp) (posix bool, p *acl.PhysicalMemProp) {
	if prop == nil || prop.HandleType != acl.MemHandleTypePOSIX {
		return false, prop
	}
	c := *prop
	c.HandleType = acl.MemHandleTypeNone
	return true, &c
}

// Export checks the arguments of aclrtMemExportToShareableHandle that need
// no state, for a driver whose shareable form is want: a known handle type
// (100000), want itself (207000 otherwise), and flags 0 or 1 (107000), with
// or without vmarena's acl.ExportReadOnly.
func Export(op string, h acl.PhysicalHandle, handleType acl.MemHandleType, flags uint64, want acl.MemHandleType) error {
	switch {
	case h == 0:
		return fail(op, acl.ErrCodeInvalidParam, "handle is NULL")
	case handleType != acl.MemHandleTypeNone && handleType != acl.MemHandleTypePOSIX:
		return fail(op, acl.ErrCodeInvalidParam, "handleType %d", handleType)
	case handleType != want:
		return fail(op, acl.ErrCodeRTFeatureNotSupport, "handleType %d: this driver shares memory as handle type %d", handleType, want)
	case flags&^acl.ExportReadOnly > acl.ExportDisablePIDValidation:
		return fail(op, acl.ErrCodeRTParamInvalid, "flags %#x: must be 0 or 1", flags)
	}
	return nil
}

// Import checks the arguments of aclrtMemImportFromShareableHandle that need
// no state: the form (want), and the device, which must be the driver's.
func Import(op string, s acl.ShareableHandle, device, own int32, want acl.MemHandleType) error {
	switch {
	case s.Type != acl.MemHandleTypeNone && s.Type != acl.MemHandleTypePOSIX:
		return fail(op, acl.ErrCodeInvalidParam, "shareable handle type %d", s.Type)
	case s.Type != want:
		return fail(op, acl.ErrCodeRTFeatureNotSupport, "shareable handle type %d: this driver shares memory as handle type %d", s.Type, want)
	case device != own:
		return fail(op, acl.ErrCodeRTInvalidDeviceID, "device %d: this driver is device %d", device, own)
	}
	return nil
}

// NoPidList is the error of aclrtMemSetPidToShareableHandle on a driver that
// shares file descriptors, which carry no allow-list.
func NoPidList(op, who string) error {
	return fail(op, acl.ErrCodeRTFeatureNotSupport,
		"the %s driver shares file descriptors, which carry no allow-list: send the descriptor to the process you mean", who)
}

// AccessFlags is Access, also accepting MemAccessRead when readOK (the
// driver can map read-only).
func AccessFlags(op string, ptr acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc, device int32, hostOK, readOK bool) error {
	if !readOK {
		return Access(op, ptr, size, desc, device, hostOK)
	}
	d := make([]acl.MemAccessDesc, len(desc))
	for i, ds := range desc {
		if ds.Flags == acl.MemAccessRead {
			ds.Flags = acl.MemAccessReadWrite
		}
		d[i] = ds
	}
	return Access(op, ptr, size, d, device, hostOK)
}

// ReadOnly reports whether desc grants read access only.
func ReadOnly(desc []acl.MemAccessDesc) bool {
	for _, ds := range desc {
		if ds.Flags != acl.MemAccessRead {
			return false
		}
	}
	return len(desc) > 0
}
