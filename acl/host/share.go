package host

import (
	"errors"
	"math"
	"os"
	"sync"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/memfile"
	"github.com/vmarena/vmarena/acl/internal/rules"
	"github.com/vmarena/vmarena/acl/ipc"
)

// Sharing memory with other processes.
//
// The driver cuts ordinary allocations from one big memory file, whose
// ranges cannot be handed to another process alone. An exportable
// allocation (PhysicalMemProp.HandleType = MemHandleTypePOSIX) gets a memory
// file of its own instead, committed with fallocate like the rest; its
// descriptor is the shareable handle, and another process's driver imports
// it by duplicating the descriptor and mapping the file. The kernel counts
// the file's references (descriptors and mappings, in any process), so the
// memory lives while any process holds it, as on a device: a producer that
// frees or dies does not pull it from under a consumer, and a consumer that
// dies frees nothing of the producer's.
//
// Each exportable or imported allocation costs the process one descriptor
// (RLIMIT_NOFILE) and one kernel memory area per mapping (they do not merge
// as the big file's ranges do).
//
// ACL's rules are kept: one export per allocation, no export of imported
// memory, no import in the exporting process (exports, below, knows which
// files this process exported), and a second import of the same memory
// returns the same handle with one more reference. An import counts against
// the importer's Capacity too: each process simulates its own device, and
// the host cannot see when the other process lets go.

// memfileName names the driver's memory files (in /proc/PID/fd and maps).
const memfileName = "vmarena-host"

// sharing is what Caps reports: file descriptors, where the driver works.
var sharing = func() acl.Sharing {
	if supported {
		return acl.SharingFD
	}
	return acl.SharingNone
}()

// exports is the memory files exported by this process, by any host driver
// in it, while they live.
var exports sync.Map // ipc.FileID → struct{}

// share is what a handle knows about sharing.
type share struct {
	owners   int        // references FreePhysical must drop: one, plus one per further import of the same memory
	own      bool       // fd is the allocation's own memory file
	imported bool       // made by MemImportFromShareableHandle
	exported bool       // MemExportToShareableHandle handed out fd
	readOnly bool       // imported memory that can only be read: mapped readable
	file     ipc.FileID // the identity of the own memory file
}

// mallocOwn allocates size bytes in a memory file of their own, so that the
// allocation can be exported.
func (d *Driver) mallocOwn(size, page uintptr) (acl.PhysicalHandle, error) {
	const op = "aclrtMallocPhysical"
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	if size > d.cfg.Capacity || d.phys > d.cfg.Capacity-size {
		free := d.cfg.Capacity - d.phys
		d.mu.Unlock()
		return 0, fail(op, acl.ErrCodeRTMemoryAllocation, "out of memory: %d bytes asked, %d of %d free", size, free, d.cfg.Capacity)
	}
	d.phys += size
	d.mu.Unlock()

	fd, err := memfile.Create(memfileName, size, func(fd int) error { return sysCommit(fd, 0, size) })
	var id ipc.FileID
	if err == nil {
		if id, _, err = ipc.Stat(fd); err != nil {
			_ = sysClose(fd)
		}
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if err == nil && d.closed {
		_ = sysClose(fd)
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	if err != nil {
		d.phys -= size
		switch {
		case errors.Is(err, errNoMemory):
			return 0, fail(op, acl.ErrCodeRTMemoryAllocation, "host has no memory for %d bytes", size)
		case isFDLimit(err):
			return 0, fail(op, acl.ErrCodeRTResourceAllocFail, "no descriptor for an exportable allocation: %v (raise RLIMIT_NOFILE, or use larger chunks)", err)
		}
		return 0, fail(op, acl.ErrCodeRTFailure, "memory file: %v", err)
	}
	h := &handle{id: d.ids.New(), fd: fd, size: size, page: page, refs: 1, share: share{owners: 1, own: true, file: id}}
	d.handles[h.id] = h
	d.live.Handles++
	d.live.PhysicalBytes += size
	return h.id, nil
}

// closeOwn closes the memory file of h, whose last reference is gone: the
// kernel frees the memory once no other process holds it.
func (d *Driver) closeOwn(op string, h *handle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.phys -= h.size
	d.live.PhysicalBytes -= h.size
	if h.imported {
		d.live.ImportedBytes -= h.size
	}
	if err := d.forgetOwnLocked(h); err != nil {
		return fail(op, acl.ErrCodeRTFailure, "close memory file: %v", err)
	}
	return nil
}

// forgetOwnLocked closes h's own memory file and forgets its export.
func (d *Driver) forgetOwnLocked(h *handle) error {
	if h.exported {
		exports.Delete(h.file)
	}
	if h.imported && d.imports[h.file] == h {
		delete(d.imports, h.file)
	}
	return sysClose(h.fd)
}

// MemExportToShareableHandle returns the descriptor of h's memory file, for
// another process to import. h must have been allocated with HandleType
// MemHandleTypePOSIX (107000 otherwise), and not exported before or imported
// (507899). The file's size is sealed since its allocation, and the export
// seals its seals (so that no process holding it can resize it under
// another's mapping); with acl.ExportReadOnly it is sealed against writes
// through any new mapping or descriptor too, so that the importer can only
// read it (this process's own mappings, made before, stay writable; map h
// no more once it is exported read-only). The descriptor belongs to the
// driver: it stays open until h is freed, and the caller must not close it.
// Both ACL flags are accepted; a descriptor carries no allow-list (whoever
// holds it may import), so send it only to the process you mean.
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
	return rules.NoPidList("aclrtMemSetPidToShareableHandle", "host")
}

// MemImportFromShareableHandle maps nothing yet: it keeps a duplicate of the
// descriptor (the caller may close its own) and returns a handle to map. The
// descriptor must be a memory file of whole 2 MiB pages sealed as the host
// driver's exports are: its size and its seals sealed (F_SEAL_SHRINK,
// F_SEAL_GROW, F_SEAL_SEAL), so that the exporter cannot cut the memory
// under this process's mappings (107017 for anything else, naming the
// check that failed; 507899 for one this process exported). Its name is
// not trusted: who sent it is the caller's to check. Memory sealed against
// writes, or a descriptor open read-only, is imported read-only: MapMem
// maps it readable, and MemSetAccess refuses write access to it (107000).
// A second import of the same memory returns the same handle with one more
// reference. The memory counts against Capacity (207001 past it).
func (d *Driver) MemImportFromShareableHandle(s acl.ShareableHandle, device int32) (acl.PhysicalHandle, error) {
	const op = "aclrtMemImportFromShareableHandle"
	if err := rules.Import(op, s, device, d.cfg.Device, sharing.HandleType()); err != nil {
		return 0, err
	}
	if s.Value > math.MaxInt32 {
		return 0, fail(op, acl.ErrCodeRTInvalidHandle, "%v is not an open file descriptor", s)
	}
	fd := int(s.Value)
	readOnly, err := memfile.Importable(fd)
	if err != nil {
		return 0, fail(op, acl.ErrCodeRTInvalidHandle, "%v: %v", s, err)
	}
	file, size, err := ipc.Stat(fd)
	if err != nil {
		return 0, fail(op, acl.ErrCodeRTInvalidHandle, "%v is not an open file descriptor: %v", s, err)
	}
	if _, mine := exports.Load(file); mine {
		return 0, fail(op, acl.ErrCodeRTDrvInternal, "%v was exported by this process: ACL imports only in another process", s)
	}
	if size <= 0 || uintptr(size)%acl.HugePageSize != 0 {
		return 0, fail(op, acl.ErrCodeRTInvalidHandle, "%v holds %d bytes: not a whole physical allocation", s, size)
	}
	n := uintptr(size)

	d.mu.Lock()
	if h := d.importedLocked(op, file); h != nil || d.closed {
		d.mu.Unlock()
		if h == nil {
			return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
		}
		return h.id, nil
	}
	if n > d.cfg.Capacity || d.phys > d.cfg.Capacity-n {
		free := d.cfg.Capacity - d.phys
		d.mu.Unlock()
		return 0, fail(op, acl.ErrCodeRTMemoryAllocation, "out of memory: importing %d bytes, %d of %d free", n, free, d.cfg.Capacity)
	}
	d.phys += n
	d.mu.Unlock()

	dup, err := ipc.Dup(fd)

	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil || d.closed {
		d.phys -= n
		switch {
		case err == nil:
			_ = sysClose(dup)
			return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
		case isFDLimit(err):
			return 0, fail(op, acl.ErrCodeRTResourceAllocFail, "no descriptor for the import: %v (raise RLIMIT_NOFILE)", err)
		}
		return 0, fail(op, acl.ErrCodeRTInvalidHandle, "%v: %v", s, err)
	}
	if h := d.importedLocked(op, file); h != nil { // imported meanwhile
		d.phys -= n
		_ = sysClose(dup)
		return h.id, nil
	}
	h := &handle{id: d.ids.New(), fd: dup, size: n, page: acl.HugePageSize, refs: 1,
		share: share{owners: 1, own: true, imported: true, readOnly: readOnly, file: file}}
	d.handles[h.id] = h
	d.imports[file] = h
	d.live.Handles++
	d.live.Imported++
	d.live.PhysicalBytes += n
	d.live.ImportedBytes += n
	return h.id, nil
}

// importedLocked returns the live handle already imported for file, with one
// more reference taken, or nil.
func (d *Driver) importedLocked(op string, file ipc.FileID) *handle {
	h := d.imports[file]
	if h == nil || h.freed {
		return nil
	}
	h.owners++
	h.refs++
	return h
}

// DeviceGetBareTgid returns os.Getpid(): the host has no other id for a
// process.
func (d *Driver) DeviceGetBareTgid() (int32, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return 0, fail("aclrtDeviceGetBareTgid", acl.ErrCodeRTContextNull, errClosedMsg)
	}
	return int32(os.Getpid()), nil
}
