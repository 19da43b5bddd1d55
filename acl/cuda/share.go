package cuda

import (
	"math"
	"os"
	"sync"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/rules"
	"github.com/vmarena/vmarena/acl/ipc"
)

// Sharing memory with other processes, on CUDA's POSIX file descriptors.
//
// An allocation made with PhysicalMemProp.HandleType = MemHandleTypePOSIX is
// cuMemCreate'd with requestedHandleTypes =
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; cuMemExportToShareableHandle
// writes a descriptor for it, which the driver keeps (and closes when the
// allocation goes) and the caller sends over a Unix socket; the importer's
// cuMemImportFromShareableHandle takes the descriptor as its void* and gives
// a handle to map, which cuMemRelease frees. The binding adds ACL's rules:
// one export per allocation, none of an imported one, and no import of this
// process's own export. CUDA's descriptors say nothing of what they refer to,
// so the last rule is kept for the descriptors this process's drivers
// exported and still hold (the common mistake: importing the export itself),
// and two imports of the same memory are two handles, as CUDA makes them,
// not one handle with two references as on ACL. CUDA does not tell an
// importer the size of the memory either: the first MapMem of an imported
// handle says it (and cuMemMap refuses a size larger than the allocation).
// What CUDA does say is checked before anything is mapped: the import must
// be pinned memory on this driver's device
// (cuMemGetAllocationPropertiesFromHandle), and its mappings must be sized
// and aligned to that memory's granularity (cuMemGetAllocationGranularity of
// those properties), not only to the device's default one.

// share is what a handle knows about sharing.
type share struct {
	exportable bool // made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	imported   bool
	fd         int // the exported descriptor, or -1
}

// exported is every descriptor this process's drivers exported and still
// hold.
var exported sync.Map // int → struct{}

// queryPosixFD asks whether the device exports POSIX descriptors. A driver
// too old to know the attribute cannot.
func (d *Driver) queryPosixFD() bool {
	var v int32
	return d.lib.cuDeviceGetAttribute(&v, cuDevAttrPosixFDSupported, d.dev) == ResultSuccess && v != 0
}

func (d *Driver) sharing() acl.Sharing {
	if d.posixFD {
		return acl.SharingFD
	}
	return acl.SharingNone
}

// exportableProp is rules.Prop for a property that may ask for an
// exportable allocation, which the device must support.
func (d *Driver) exportableProp(op string, prop *acl.PhysicalMemProp) (bool, error) {
	posix, err := rules.ExportableProp(op, prop, d.Device(), "CUDA")
	if err == nil && posix && !d.posixFD {
		err = acl.Errorf(op, acl.ErrCodeRTFeatureNotSupport,
			"device %d cannot export POSIX file descriptors (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0)", d.cfg.Device)
	}
	return posix, err
}

// learnSize records the size of an imported handle, from its first map.
// Call with mu held.
func (d *Driver) learnSize(h *handle, size uintptr) {
	h.size = size
	d.live.PhysicalBytes += size
	d.live.ImportedBytes += size
}

// closeExport closes h's exported descriptor. Call with mu held, once h is
// gone.
func (d *Driver) closeExport(h *handle) {
	if h.fd < 0 {
		return
	}
	exported.Delete(h.fd)
	_ = ipc.Close(h.fd)
	h.fd = -1
}

// MemExportToShareableHandle is cuMemExportToShareableHandle with
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: a descriptor for h, which must
// have been made exportable (107000 otherwise), not exported before and not
// imported (507899). handleType must be MemHandleTypePOSIX; both export
// flags are accepted (a descriptor has no allow-list; CUDA's flags are 0).
// The descriptor belongs to the driver until h is freed.
func (d *Driver) MemExportToShareableHandle(id acl.PhysicalHandle, handleType acl.MemHandleType, flags uint64) (acl.ShareableHandle, error) {
	const op = "aclrtMemExportToShareableHandle"
	if err := rules.Export(op, id, handleType, flags, d.sharing().HandleType()); err != nil {
		return acl.ShareableHandle{}, err
	}
	if !d.posixFD {
		return acl.ShareableHandle{}, acl.Errorf(op, acl.ErrCodeRTFeatureNotSupport, "device %d cannot export POSIX file descriptors", d.cfg.Device)
	}
	if err := d.begin(op); err != nil {
		return acl.ShareableHandle{}, err
	}
	defer d.end()
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.handles[id]
	switch {
	case !ok || h.freed:
		return acl.ShareableHandle{}, acl.Errorf(op, acl.ErrCodeRTInvalidHandle, "handle %#x is not a live physical allocation", uintptr(id))
	case h.imported:
		return acl.ShareableHandle{}, acl.Errorf(op, acl.ErrCodeRTDrvInternal, "handle %#x was imported: only its exporter's process may share it", uintptr(id))
	case h.fd >= 0:
		return acl.ShareableHandle{}, acl.Errorf(op, acl.ErrCodeRTDrvInternal, "handle %#x is exported already (once per allocation)", uintptr(id))
	case !h.exportable:
		return acl.ShareableHandle{}, acl.Errorf(op, acl.ErrCodeRTParamInvalid,
			"handle %#x was allocated without PhysicalMemProp.HandleType = ACL_MEM_HANDLE_TYPE_POSIX: not exportable", uintptr(id))
	}
	b, err := d.bind()
	if err != nil {
		return acl.ShareableHandle{}, err
	}
	var fd int32 = -1
	r := d.lib.cuMemExportToShareableHandle(&fd, h.cu, cuMemHandleTypePosixFD, 0)
	d.unbind(b)
	if r != ResultSuccess {
		return acl.ShareableHandle{}, d.lib.newError("cuMemExportToShareableHandle", r)
	}
	h.fd = int(fd)
	exported.Store(h.fd, struct{}{})
	return acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(fd)}, nil
}

// MemSetPidToShareableHandle fails with 207000: a descriptor carries no
// allow-list.
func (d *Driver) MemSetPidToShareableHandle(s acl.ShareableHandle, pids []int32) error {
	return rules.NoPidList("aclrtMemSetPidToShareableHandle", "CUDA")
}

// MemImportFromShareableHandle is cuMemImportFromShareableHandle of a POSIX
// descriptor another process exported. CUDA does not take the descriptor:
// the caller closes it when it likes. Each import is a handle of its own,
// freed with FreePhysical (cuMemRelease); its size is learned from its first
// MapMem, which must be a multiple of the allocation's own granularity. A
// descriptor that is not open is refused with 107017, one this process
// exported with 507899, and memory that is not pinned memory of this
// driver's device with 107017 (the import is released).
func (d *Driver) MemImportFromShareableHandle(s acl.ShareableHandle, device int32) (acl.PhysicalHandle, error) {
	const op = "aclrtMemImportFromShareableHandle"
	if err := rules.Import(op, s, device, d.Device(), d.sharing().HandleType()); err != nil {
		return 0, err
	}
	if !d.posixFD {
		return 0, acl.Errorf(op, acl.ErrCodeRTFeatureNotSupport, "device %d cannot import POSIX file descriptors", d.cfg.Device)
	}
	if s.Value > math.MaxInt32 {
		return 0, acl.Errorf(op, acl.ErrCodeRTInvalidHandle, "%v is not an open file descriptor", s)
	}
	fd := int(s.Value)
	if _, _, err := ipc.Stat(fd); err != nil {
		return 0, acl.Errorf(op, acl.ErrCodeRTInvalidHandle, "%v is not an open file descriptor: %v", s, err)
	}
	if _, mine := exported.Load(fd); mine {
		return 0, acl.Errorf(op, acl.ErrCodeRTDrvInternal, "%v was exported by this process: ACL imports only in another process", s)
	}
	if err := d.begin(op); err != nil {
		return 0, err
	}
	defer d.end()
	b, err := d.bind()
	if err != nil {
		return 0, err
	}
	var cu uint64
	r := d.lib.cuMemImportFromShareableHandle(&cu, uintptr(fd), cuMemHandleTypePosixFD)
	if r != ResultSuccess {
		d.unbind(b)
		return 0, d.lib.newError("cuMemImportFromShareableHandle", r)
	}
	page, pr, err := d.importedGranularity(op, cu)
	if err != nil {
		_ = d.lib.cuMemRelease(cu)
		d.unbind(b)
		return 0, err
	}
	d.unbind(b)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextID++
	h := &handle{id: d.nextID, cu: cu, page: page, refs: 1, share: share{imported: true, fd: -1}, props: pr}
	d.handles[h.id] = h
	d.live.Handles++
	d.live.Imported++
	return h.id, nil
}

// importedGranularity checks that the imported allocation cu is pinned
// memory of this driver's device, and returns its granularity and the
// properties it was made with. Call it bound.
func (d *Driver) importedGranularity(op string, cu uint64) (uintptr, props, error) {
	var prop memAllocationProp
	if r := d.lib.cuMemGetAllocationPropertiesFromHandle(&prop, cu); r != ResultSuccess {
		return 0, props{}, d.lib.newError("cuMemGetAllocationPropertiesFromHandle", r)
	}
	want := d.cuProp()
	if prop.Type != want.Type || prop.Location != want.Location {
		return 0, props{}, acl.Errorf(op, acl.ErrCodeRTInvalidHandle,
			"the imported memory is allocation type %d at location type %d, id %d: not pinned memory of device %d",
			prop.Type, prop.Location.Type, prop.Location.ID, d.cfg.Device)
	}
	var gran uintptr
	if r := d.lib.cuMemGetAllocationGranularity(&gran, &prop, cuGranularityMinimum); r != ResultSuccess {
		return 0, props{}, d.lib.newError("cuMemGetAllocationGranularity", r)
	}
	if gran == 0 || gran%d.gran != 0 {
		return 0, props{}, acl.Errorf(op, acl.ErrCodeRTInvalidHandle, "the imported memory's granularity %d is not a multiple of the device's %d", gran, d.gran)
	}
	return gran, propsOf(&prop), nil
}

// DeviceGetBareTgid returns os.Getpid(): CUDA has no other id for a process.
func (d *Driver) DeviceGetBareTgid() (int32, error) {
	if err := d.begin("aclrtDeviceGetBareTgid"); err != nil {
		return 0, err
	}
	defer d.end()
	return int32(os.Getpid()), nil
}
