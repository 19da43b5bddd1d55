package ascend

import (
	"os"

	"github.com/vmarena/vmarena/acl"
)

// Sharing memory with other processes, on ACL's shareable handles.
//
// aclrtMemExportToShareableHandle(handle, ACL_MEM_HANDLE_TYPE_NONE, flags,
// &token) turns any physical allocation into a uint64 token; with
// ACL_RT_VMM_EXPORT_FLAG_DEFAULT only the processes whose ids were set with
// aclrtMemSetPidToShareableHandle (the ids aclrtDeviceGetBareTgid gives in
// them) may import it with aclrtMemImportFromShareableHandle(token,
// deviceId, &handle), and map the handle like one of their own. The runtime
// enforces the rules (one export per allocation, none of an import, no import
// in the exporting process, the allow-list) with its own codes; the driver
// passes the calls through and keeps its books. Importing the same token
// twice returns the same handle with one more reference, which the books
// count. ACL does not tell an importer the size of the memory: the books
// learn it from the handle's first map. The calls are resolved on first use;
// a runtime without them shares nothing (Caps().Sharing is SharingNone and
// the calls fail with 207000).

// sharing reports whether the runtime has the sharing calls.
func (d *Driver) sharing() acl.Sharing {
	if _, err := d.lib.share.get(d.lib); err != nil {
		return acl.SharingNone
	}
	return acl.SharingToken
}

// shareFns returns the sharing calls, or the 207000 error of op.
func (d *Driver) shareFns(op string) (*shareFuncs, error) {
	fns, err := d.lib.share.get(d.lib)
	if err != nil {
		return nil, acl.Errorf(op, acl.ErrCodeRTFeatureNotSupport, "this runtime cannot share memory between processes: %v", err)
	}
	return fns, nil
}

// MemExportToShareableHandle is aclrtMemExportToShareableHandle: the token
// of h (handleType MemHandleTypeNone), for the processes set with
// MemSetPidToShareableHandle (flags ExportDefault) or for any process
// (ExportDisablePIDValidation). acl.ExportReadOnly is vmarena's, not ACL's:
// a token cannot refuse its importer write access, so it is not passed on.
func (d *Driver) MemExportToShareableHandle(h acl.PhysicalHandle, handleType acl.MemHandleType, flags uint64) (acl.ShareableHandle, error) {
	const op = "aclrtMemExportToShareableHandle"
	fns, err := d.shareFns(op)
	if err != nil {
		return acl.ShareableHandle{}, err
	}
	var token uint64
	err = d.on(op, func() error {
		d.dev.vmm.Lock()
		defer d.dev.vmm.Unlock()
		return d.check(op, fns.export(h, handleType, flags&^acl.ExportReadOnly, &token))
	})
	if err != nil {
		return acl.ShareableHandle{}, err
	}
	return acl.ShareableHandle{Type: acl.MemHandleTypeNone, Value: token}, nil
}

// MemSetPidToShareableHandle is aclrtMemSetPidToShareableHandle: the
// processes that may import the token s. Only the exporter may call it; the
// list replaces the one set before (pass every process each time).
func (d *Driver) MemSetPidToShareableHandle(s acl.ShareableHandle, pids []int32) error {
	const op = "aclrtMemSetPidToShareableHandle"
	fns, err := d.shareFns(op)
	if err != nil {
		return err
	}
	if s.Type != acl.MemHandleTypeNone {
		return acl.Errorf(op, acl.ErrCodeInvalidParam, "%v: ACL shares tokens", s)
	}
	var p *int32
	if len(pids) > 0 {
		p = &pids[0]
	}
	return d.on(op, func() error {
		d.dev.vmm.Lock()
		defer d.dev.vmm.Unlock()
		return d.check(op, fns.setPid(s.Value, p, uintptr(len(pids))))
	})
}

// MemImportFromShareableHandle is aclrtMemImportFromShareableHandle of the
// token s on this driver's device (device must be it): a handle for another
// process's memory, freed with FreePhysical. Where the runtime has
// aclrtMemGetAllocationPropertiesFromHandle, the memory is checked before
// anything maps it: pinned memory of this device (107017 otherwise, and the
// import's reference is dropped), whose page size every MapMem of it must be
// a multiple of. ACL does not say an import's size: its first MapMem does,
// and the runtime refuses one larger than the memory.
func (d *Driver) MemImportFromShareableHandle(s acl.ShareableHandle, device int32) (acl.PhysicalHandle, error) {
	const op = "aclrtMemImportFromShareableHandle"
	fns, err := d.shareFns(op)
	if err != nil {
		return 0, err
	}
	switch {
	case s.Type != acl.MemHandleTypeNone:
		return 0, acl.Errorf(op, acl.ErrCodeRTFeatureNotSupport, "%v: ACL shares tokens, not file descriptors", s)
	case device != d.cfg.Device:
		return 0, acl.Errorf(op, acl.ErrCodeRTInvalidDeviceID, "device %d: this driver is device %d", device, d.cfg.Device)
	}
	var h acl.PhysicalHandle
	err = d.on(op, func() error {
		d.dev.vmm.Lock()
		defer d.dev.vmm.Unlock()
		if err := d.check(op, fns.imp(s.Value, device, &h)); err != nil {
			return err
		}
		page, err := d.importedPage(op, h)
		if err != nil {
			_ = d.lib.fns.freePhysical(h) // this import's reference
			return err
		}
		d.books.imported(h, page)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return h, nil
}

// DeviceGetBareTgid is aclrtDeviceGetBareTgid: this process's id as the
// device knows it (inside a container it differs from os.Getpid). A runtime
// without the call gives os.Getpid().
func (d *Driver) DeviceGetBareTgid() (int32, error) {
	const op = "aclrtDeviceGetBareTgid"
	fn, err := d.lib.bareTgid.get(d.lib, op)
	if err != nil {
		d.mu.RLock()
		defer d.mu.RUnlock()
		if d.closed {
			return 0, acl.NewError(op, acl.ErrCodeRTContextNull, "driver closed")
		}
		return int32(os.Getpid()), nil
	}
	var pid int32
	if err := d.on(op, func() error { return d.check(op, fn(&pid)) }); err != nil {
		return 0, err
	}
	return pid, nil
}

// importedPage checks that the imported memory h lives on this driver's
// device, and returns its page size, where the runtime says
// (aclrtMemGetAllocationPropertiesFromHandle, CANN 9); 0 where it does not.
func (d *Driver) importedPage(op string, h acl.PhysicalHandle) (uintptr, error) {
	fn, err := d.lib.props.get(d.lib, "aclrtMemGetAllocationPropertiesFromHandle")
	if err != nil {
		return 0, nil // an older runtime: the map checks the size alone
	}
	var prop acl.PhysicalMemProp
	if err := d.check(op, fn(h, &prop)); err != nil {
		return 0, err
	}
	if prop.Location.Type != acl.MemLocationTypeDevice || int32(prop.Location.ID) != d.cfg.Device ||
		prop.AllocationType != acl.MemAllocationTypePinned {
		return 0, acl.Errorf(op, acl.ErrCodeRTInvalidHandle,
			"the imported memory is allocation type %d at location type %d, id %d: not pinned memory of device %d",
			prop.AllocationType, prop.Location.Type, prop.Location.ID, d.cfg.Device)
	}
	var page uintptr
	if err := d.check(op, d.lib.fns.memGetAllocationGranularity(&prop, acl.GranularityMinimum, &page)); err != nil {
		return 0, err
	}
	return page, nil
}

// checkImportMap checks a map of size bytes of h against what the runtime
// said of it, if h is imported memory not mapped yet: a multiple of its page.
func (b *books) checkImportMap(op string, h acl.PhysicalHandle, size uintptr) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.handles[h]; ok && r.imported && r.size == 0 && r.page != 0 && size%r.page != 0 {
		return acl.Errorf(op, acl.ErrCodeRTParamInvalid, "size %d is not a multiple of the imported memory's page size %d", size, r.page)
	}
	return nil
}

// imported enters a handle the runtime just imported, whose pages are page
// bytes (0: unknown): a new one, or one more reference to memory this
// process imported already.
func (b *books) imported(h acl.PhysicalHandle, page uintptr) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if r, ok := b.handles[h]; ok && !r.freed {
		r.owners++
		return
	}
	b.handles[h] = &handle{owners: 1, imported: true, page: page}
	b.live.Handles++
	b.live.Imported++
}
