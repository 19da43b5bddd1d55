package model

import (
	"math"
	"os"
	"sync"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/memfile"
	"github.com/vmarena/vmarena/acl/internal/rules"
	"github.com/vmarena/vmarena/acl/ipc"
)

// Sharing memory with other processes (Linux).
//
// The model shares memory as the host driver does, as file descriptors
// (acl.SharingFD). An exportable allocation (PhysicalMemProp.HandleType =
// MemHandleTypePOSIX) keeps its bytes in a memory file of its own, made
// without committing a page, instead of in the model's pages; its descriptor
// is the shareable handle. A model in another process imports it by
// duplicating the descriptor and mapping the file, so both processes read and
// write the same bytes, and the kernel keeps them while either holds the
// file. Each process models a device of its own: an import counts against
// the importer's capacity, and the importer's books and times are its own.
//
// The files are sealed as the host driver's are (acl/internal/memfile):
// their size when made, their seals at export, and their contents against
// new writable mappings for an export with acl.ExportReadOnly; an import
// checks the seals, not the file's name, so that neither side can shrink the
// file under the other's mapping (which would kill that process with SIGBUS
// on its next copy). Memory imported read-only is mapped readable only, and
// MemSetAccess refuses to make it writable (107000).
//
// ACL's rules are kept: one export per allocation, no export of imported
// memory, no import in the exporting process (exports knows which files this
// process exported), and a second import of the same memory returns the same
// handle with one more reference. With Config.NoData the file holds nothing
// but identifies the memory.
//
// Elsewhere than Linux the model does not share (Caps().Sharing is
// acl.SharingNone) and these calls fail with 207000.

// memfileName names the model's shareable memory files (in /proc/PID/fd).
const memfileName = "vmarena-model"

// sharing is what Caps reports.
var sharing = func() acl.Sharing {
	if canShare {
		return acl.SharingFD
	}
	return acl.SharingNone
}()

// exports is the memory files exported by this process, by any model in it,
// while they live.
var exports sync.Map // ipc.FileID → struct{}

// share is what a handle knows about sharing.
type share struct {
	own      bool       // fd is the allocation's own memory file
	fd       int        // the memory file, when own
	shm      []byte     // the file mapped, holding the bytes (nil with NoData)
	file     ipc.FileID // the file's identity
	owners   int        // references FreePhysical must drop: one, plus one per further import
	imported bool       // made by MemImportFromShareableHandle
	exported bool       // MemExportToShareableHandle handed out fd
	readOnly bool       // imported memory that can only be read: mapped readable
}

// mallocOwn makes h's memory file, for an exportable allocation. Call
// without d.mu held.
func (d *Driver) mallocOwn(h *handle) error {
	fd, err := memfile.Create(memfileName, h.size, nil)
	if err != nil {
		return err
	}
	return d.attach(h, fd)
}

// attach makes fd h's memory: its identity and, unless NoData, its bytes.
// On failure fd is closed.
func (d *Driver) attach(h *handle, fd int) error {
	id, _, err := ipc.Stat(fd)
	if err == nil && !d.cfg.NoData {
		h.shm, err = sysMap(fd, h.size, h.readOnly)
	}
	if err != nil {
		_ = sysClose(fd)
		return err
	}
	h.own, h.fd, h.file = true, fd, id
	return nil
}

// closeOwnLocked gives back h's memory file, whose last reference is gone.
// Call with d.mu held.
func (d *Driver) closeOwnLocked(h *handle) {
	if !h.own {
		return
	}
	if h.exported {
		exports.Delete(h.file)
	}
	if h.imported && d.imports[h.file] == h {
		delete(d.imports, h.file)
	}
	if h.shm != nil {
		_ = sysUnmap(h.shm)
		h.shm = nil
	}
	_ = sysClose(h.fd)
	h.own = false
}

// MemExportToShareableHandle returns the descriptor of h's memory file, for
// another process to import. h must have been allocated with HandleType
// MemHandleTypePOSIX (107000 otherwise), and not exported before or imported
// (507899). The descriptor belongs to the driver: it stays open until h is
// freed, and the caller must not close it.
func (d *Driver) MemExportToShareableHandle(id acl.PhysicalHandle, handleType acl.MemHandleType, flags uint64) (acl.ShareableHandle, error) {
	const op = "aclrtMemExportToShareableHandle"
	if err := rules.Export(op, id, handleType, flags, sharing.HandleType()); err != nil {
		return acl.ShareableHandle{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return acl.ShareableHandle{}, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	h, ok := d.handles[id]
	switch {
	case !ok || h.freed:
		return acl.ShareableHandle{}, fail(op, acl.ErrCodeRTInvalidHandle, "handle %#x is not a live physical allocation", uintptr(id))
	case h.imported:
		return acl.ShareableHandle{}, fail(op, acl.ErrCodeRTDrvInternal, "handle %#x was imported: only its exporter's process may share it", uintptr(id))
	case h.exported:
		return acl.ShareableHandle{}, fail(op, acl.ErrCodeRTDrvInternal, "handle %#x is exported already (once per allocation)", uintptr(id))
	case !h.own:
		return acl.ShareableHandle{}, fail(op, acl.ErrCodeRTParamInvalid,
			"handle %#x was allocated without PhysicalMemProp.HandleType = ACL_MEM_HANDLE_TYPE_POSIX: not exportable", uintptr(id))
	}
	if err := memfile.SealExport(h.fd, flags&acl.ExportReadOnly != 0); err != nil {
		return acl.ShareableHandle{}, fail(op, acl.ErrCodeRTFailure, "seal the memory file of handle %#x: %v", uintptr(id), err)
	}
	h.exported = true
	exports.Store(h.file, struct{}{})
	return acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(h.fd)}, nil
}

// MemSetPidToShareableHandle fails with 207000: a descriptor carries no
// allow-list.
func (d *Driver) MemSetPidToShareableHandle(s acl.ShareableHandle, pids []int32) error {
	return rules.NoPidList("aclrtMemSetPidToShareableHandle", "model")
}

// MemImportFromShareableHandle keeps a duplicate of the descriptor (the
// caller may close its own) and returns a handle to map. The descriptor must
// be a memory file a model in another process exported (107017 for anything
// else; 507899 for one this process exported). A second import of the same
// memory returns the same handle with one more reference. The memory counts
// against the capacity (207001 past it).
func (d *Driver) MemImportFromShareableHandle(s acl.ShareableHandle, device int32) (acl.PhysicalHandle, error) {
	const op = "aclrtMemImportFromShareableHandle"
	t0 := d.begin(cMalloc)
	id, n, err := d.importFD(op, s, device)
	d.end(cMalloc, t0, d.cost.host(cMalloc, n), 0)
	return id, err
}

func (d *Driver) importFD(op string, s acl.ShareableHandle, device int32) (acl.PhysicalHandle, uintptr, error) {
	if err := rules.Import(op, s, device, d.cfg.Device, sharing.HandleType()); err != nil {
		return 0, 0, err
	}
	if s.Value > math.MaxInt32 {
		return 0, 0, fail(op, acl.ErrCodeRTInvalidHandle, "%v is not an open file descriptor", s)
	}
	fd := int(s.Value)
	readOnly, err := memfile.Importable(fd)
	if err != nil {
		return 0, 0, fail(op, acl.ErrCodeRTInvalidHandle, "%v: %v", s, err)
	}
	file, size, err := ipc.Stat(fd)
	if err != nil {
		return 0, 0, fail(op, acl.ErrCodeRTInvalidHandle, "%v is not an open file descriptor: %v", s, err)
	}
	if _, mine := exports.Load(file); mine {
		return 0, 0, fail(op, acl.ErrCodeRTDrvInternal, "%v was exported by this process: ACL imports only in another process", s)
	}
	g := d.cost.gran
	if size <= 0 || uintptr(size)%g != 0 {
		return 0, 0, fail(op, acl.ErrCodeRTInvalidHandle, "%v holds %d bytes: not a whole physical allocation", s, size)
	}
	n := uintptr(size)

	d.mu.Lock()
	if h := d.importedLocked(file); h != nil || d.closed {
		d.mu.Unlock()
		if h == nil {
			return 0, 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
		}
		return h.id, 0, nil
	}
	if n > d.capa || d.phys > d.capa-n {
		free := d.capa - d.phys
		d.mu.Unlock()
		return 0, 0, fail(op, acl.ErrCodeRTMemoryAllocation, "out of memory: importing %d bytes, %d of %d free", n, free, d.capa)
	}
	d.phys += n
	d.mu.Unlock()

	h := &handle{size: n, page: g, refs: 1, share: share{owners: 1, imported: true, readOnly: readOnly}}
	dup, err := ipc.Dup(fd)
	if err == nil {
		err = d.attach(h, dup)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil || d.closed {
		d.phys -= n
		if err == nil {
			d.closeOwnLocked(h)
			return 0, 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
		}
		return 0, 0, fail(op, acl.ErrCodeRTResourceAllocFail, "%v: %v", s, err)
	}
	if old := d.importedLocked(file); old != nil { // imported meanwhile
		d.phys -= n
		d.closeOwnLocked(h)
		return old.id, 0, nil
	}
	h.id = d.ids.New()
	d.handles[h.id] = h
	if d.imports == nil {
		d.imports = make(map[ipc.FileID]*handle)
	}
	d.imports[file] = h
	d.live.Handles++
	d.live.Imported++
	d.live.PhysicalBytes += n
	d.live.ImportedBytes += n
	return h.id, n, nil
}

// importedLocked returns the live handle already imported for file, with one
// more reference taken, or nil.
func (d *Driver) importedLocked(file ipc.FileID) *handle {
	h := d.imports[file]
	if h == nil || h.freed {
		return nil
	}
	h.owners++
	h.refs++
	return h
}

// DeviceGetBareTgid returns os.Getpid(), or 107002 once the driver is closed.
func (d *Driver) DeviceGetBareTgid() (int32, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return 0, acl.NewError("aclrtDeviceGetBareTgid", acl.ErrCodeRTContextNull, "driver closed")
	}
	return int32(os.Getpid()), nil
}
