package host

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/book"
	"github.com/vmarena/vmarena/acl/internal/handles"
	"github.com/vmarena/vmarena/acl/internal/hostmem"
	"github.com/vmarena/vmarena/acl/internal/rules"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/internal/units"
)

// Config configures a host driver. The zero value is a strict device with a
// capacity of half the machine's available memory.
type Config struct {
	// Capacity is the simulated device memory in bytes: MallocPhysical fails
	// with 207001 once the live physical allocations would exceed it.
	// 0 means half of MemAvailable at New (at least 256 MiB).
	Capacity uintptr
	// MaxReserve is the largest ReserveMemAddress one call may make.
	// 0 means 128 GiB, the Ascend driver's limit; at most 64 TiB.
	MaxReserve uintptr
	// MapLimit caps the kernel memory areas (VMAs) the driver's reservations
	// may use, so the process stays far below vm.max_map_count. A MapMem that
	// would pass it fails with 207005. 0 means a quarter of vm.max_map_count.
	MapLimit int
	// Device is the device id the driver answers to. 0 is device 0.
	Device int32
	// NoSetAccess makes the driver behave like an ACL runtime without
	// aclrtMemSetAccess: mappings are accessible as soon as they are made and
	// MemSetAccess fails with 207000. By default a mapping has no access until
	// MemSetAccess grants it, as on CUDA, the stricter device.
	NoSetAccess bool
	// AccessSpan lets one MemSetAccess grant access to a run of adjacent
	// mappings of one reservation, as CUDA allows (acl.Caps.AccessSpan). By
	// default, as documented for ACL, a call covers exactly one mapping.
	AccessSpan bool
}

// offsetSpace is the size of the sparse memory file's offset space. It costs
// nothing (the file is sparse) and is so much larger than any capacity that
// it never fragments into failure.
const offsetSpace = 1 << 46

// Driver is the host driver: the ACL virtual-memory contract implemented on
// Linux virtual memory. A device pointer is a host virtual address, so mapped
// memory is real and a Go program can read it through [Driver.Bytes].
//
// A reservation is an inaccessible PROT_NONE/MAP_NORESERVE range. Physical
// memory is committed up front (fallocate) from one sparse memfd, cut at
// offsets that keep chunks of one arena contiguous, so that the kernel merges
// their mappings. Map is mmap MAP_FIXED|MAP_SHARED of that file into the
// range; unmap maps inaccessible anonymous memory back over it, so the range
// stays reserved. MemSetAccess is mprotect.
//
// Driver is safe for concurrent use.
type Driver struct {
	cfg    Config
	shared bool // the process default: Close is a no-op

	mu      sync.RWMutex // copies and queries share it; changes take it alone
	fdUse   sync.RWMutex // held shared while fd is used outside mu (a commit, a punch), and alone by Close before it closes fd; taken before mu
	closed  bool
	fd      int
	space   offsets
	handles map[acl.PhysicalHandle]*handle
	imports map[ipc.FileID]*handle // imported memory, by its file, so that a second import finds the first
	ids     handles.IDs            // handle values, freed ones handed out again as a runtime does
	book    book.Book[resvX, *handle]
	phys    uintptr // committed physical bytes, or being committed
	vmas    int     // kernel VMAs our reservations occupy
	live    acl.LiveCounts
	maxVMAs int // high-water mark of vmas

	hostBufs hostmem.Table // MallocHost's buffers (pinned.go)

	ss queues // device work in flight (streams.go); its lock is taken after mu, never before
}

type handle struct {
	id    acl.PhysicalHandle
	fd    int     // the memory file: the driver's, or the allocation's own (share.go)
	off   uintptr // offset in the memory file
	size  uintptr
	page  uintptr // 2 MiB or 1 GiB
	refs  int     // the owners' references plus one per mapping
	freed bool    // FreePhysical dropped the last owner's reference
	share         // exportable and imported allocations (share.go)
}

type (
	reservation = book.Reservation[resvX, *handle]
	mapping     = book.Mapping[*handle]
)

// resvX is what the host driver keeps per reservation beyond the books.
type resvX struct {
	mem      unsafe.Pointer // == Base; kept as a pointer to derive addresses from
	vmas     int            // kernel VMAs this range occupies
	imported int            // its mappings of imported memory: a reservation holds imported or local memory, never both at once
}

// at returns the host memory at addr, inside r.
// unsafe: addr lies inside r, whose memory starts at r.X.mem.
func at(r *reservation, addr uintptr) unsafe.Pointer { return unsafe.Add(r.X.mem, addr-r.Base) }

var (
	_ acl.Driver   = (*Driver)(nil)
	_ acl.Counter  = (*Driver)(nil)
	_ acl.Launcher = (*Driver)(nil)
)

// New returns a host driver. It fails with an error wrapping
// acl.ErrNotSupported on systems other than Linux.
func New(cfg Config) (*Driver, error) {
	if !supported {
		return nil, fmt.Errorf("host driver: %w: needs Linux virtual memory", acl.ErrNotSupported)
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = memAvailable() / 2
		if cfg.Capacity < 256<<20 {
			cfg.Capacity = 256 << 20
		}
	}
	if cfg.MaxReserve == 0 {
		cfg.MaxReserve = acl.MaxReserve
	}
	if cfg.MaxReserve > rules.ReserveCeiling {
		return nil, fmt.Errorf("host driver: %w: MaxReserve %d is above %d", acl.ErrInvalidParam, cfg.MaxReserve, uintptr(rules.ReserveCeiling))
	}
	if cfg.MapLimit == 0 {
		cfg.MapLimit = maxMapCount() / 4
	}
	if cfg.Capacity > offsetSpace/2 || cfg.MapLimit < 0 || cfg.Device < 0 {
		return nil, fmt.Errorf("host driver: %w: capacity %d, map limit %d, device %d", acl.ErrInvalidParam,
			cfg.Capacity, cfg.MapLimit, cfg.Device)
	}
	fd, err := sysMemfile(offsetSpace)
	if err != nil {
		return nil, fmt.Errorf("host driver: memory file: %w", err)
	}
	d := &Driver{
		cfg:     cfg,
		fd:      fd,
		space:   newOffsets(offsetSpace),
		handles: make(map[acl.PhysicalHandle]*handle),
		imports: make(map[ipc.FileID]*handle),
		ids:     handles.NewIDs(0x1000),
	}
	d.ss.Start = d.startStream
	d.ss.Init()
	return d, nil
}

var defaultDriver struct {
	once sync.Once
	d    *Driver
	err  error
}

// Default returns the process-wide host driver with the zero Config, creating
// it on first use. Its Close does nothing, since every user shares it.
func Default() (*Driver, error) {
	defaultDriver.once.Do(func() {
		defaultDriver.d, defaultDriver.err = New(Config{})
		if defaultDriver.d != nil {
			defaultDriver.d.shared = true
		}
	})
	return defaultDriver.d, defaultDriver.err
}

// Name returns "host".
func (d *Driver) Name() string { return "host" }

// Device returns the configured device id.
func (d *Driver) Device() int32 { return d.cfg.Device }

// Caps reports fresh memory as zeroed (fallocate hands out zeroed pages, so
// a chunk pool need not clear fresh chunks), AccessSpan as configured,
// sharing as file descriptors (on Linux), and read-only mappings
// (mprotect PROT_READ).
func (d *Driver) Caps() acl.Caps {
	return acl.Caps{AccessSpan: d.cfg.AccessSpan, Fresh: acl.FreshZeroed, Sharing: sharing, ReadOnly: true, MaxReserve: d.cfg.MaxReserve}
}

// Capacity returns the simulated device memory in bytes.
func (d *Driver) Capacity() uintptr { return d.cfg.Capacity }

// Live counts the reservations, mappings and physical allocations the driver
// holds.
func (d *Driver) Live() acl.LiveCounts {
	d.mu.RLock()
	c := d.live
	d.mu.RUnlock()
	c.HostBuffers, c.HostBytes = d.hostBufs.Live()
	return c
}

// VMAs returns the kernel memory areas the driver's reservations occupy now,
// and the most they ever occupied.
func (d *Driver) VMAs() (now, peak int) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.vmas, d.maxVMAs
}

const errClosedMsg = "driver closed"

func fail(op string, code int32, format string, args ...any) error {
	return acl.Errorf(op, code, format, args...)
}

func pageOf(attr acl.MemAttr) uintptr {
	if attr.Huge1G() {
		return acl.Huge1GPageSize
	}
	return acl.HugePageSize
}

// MemGetAllocationGranularity returns 2 MiB, or 1 GiB for the HUGE1G
// attributes, for both options.
func (d *Driver) MemGetAllocationGranularity(prop *acl.PhysicalMemProp, option acl.MemGranularityOptions) (uintptr, error) {
	const op = "aclrtMemGetAllocationGranularity"
	if _, err := rules.ExportableProp(op, prop, d.cfg.Device, "host"); err != nil {
		return 0, err
	}
	if err := rules.GranularityOption(op, option); err != nil {
		return 0, err
	}
	d.mu.RLock()
	closed := d.closed
	d.mu.RUnlock()
	if closed {
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	return pageOf(prop.MemAttr), nil
}

// MallocPhysical commits size bytes of the memory file. It fails with 207001
// when the capacity would be exceeded or the kernel has no memory left.
func (d *Driver) MallocPhysical(size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	const op = "aclrtMallocPhysical"
	posix, prop := rules.Exportable(prop)
	size, err := rules.Malloc(op, size, prop, flags, d.cfg.Device, "host", pageOf)
	if err != nil {
		return 0, err
	}
	page := pageOf(prop.MemAttr)
	if posix {
		return d.mallocOwn(size, page)
	}

	d.fdUse.RLock() // Close does not close the memory file under the commit
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		d.fdUse.RUnlock()
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	if size > d.cfg.Capacity || d.phys > d.cfg.Capacity-size {
		free := d.cfg.Capacity - d.phys
		d.mu.Unlock()
		d.fdUse.RUnlock()
		return 0, fail(op, acl.ErrCodeRTMemoryAllocation, "out of memory: %s asked, %s of %s free", units.Bytes(int64(size)),
			units.IEC(int64(free)), units.IEC(int64(d.cfg.Capacity)))
	}
	off, ok := d.space.take(size, page)
	if !ok {
		d.mu.Unlock()
		d.fdUse.RUnlock()
		return 0, fail(op, acl.ErrCodeRTMemoryAllocation, "memory file offset space exhausted")
	}
	d.phys += size
	d.mu.Unlock()

	// Commit outside the lock: it zeroes every page and takes ~0.2 ms per MiB.
	stop(pointCommit)
	err = sysCommit(d.fd, off, size)
	d.fdUse.RUnlock()
	stop(pointCommitted)

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		// Closed meanwhile: the memory file, and the pages just committed
		// in it, are gone.
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	if err != nil {
		d.phys -= size
		d.space.give(off, size)
		if errors.Is(err, errNoMemory) {
			return 0, fail(op, acl.ErrCodeRTMemoryAllocation, "host has no memory for %s", units.Bytes(int64(size)))
		}
		return 0, fail(op, acl.ErrCodeRTFailure, "fallocate: %v", err)
	}
	h := &handle{id: d.ids.New(), fd: d.fd, off: off, size: size, page: page, refs: 1, share: share{owners: 1}}
	d.handles[h.id] = h
	d.live.Handles++
	d.live.PhysicalBytes += size
	return h.id, nil
}

var errNoMemory = errors.New("no memory")

// The points where a test may stop MallocPhysical (export_test.go): with the
// commit about to run outside the driver's lock, and once it ran and the
// memory file is let go of, before the lock is taken again. In production
// stopAt is nil.
const (
	pointCommit = iota
	pointCommitted
)

var stopAt func(point int)

func stop(point int) {
	if stopAt != nil {
		stopAt(point)
	}
}

// FreePhysical drops the owner's reference to h; the memory goes back when
// no mapping of it remains.
func (d *Driver) FreePhysical(id acl.PhysicalHandle) error {
	const op = "aclrtFreePhysical"
	if id == 0 {
		return fail(op, acl.ErrCodeInvalidParam, "handle is NULL")
	}
	d.mu.Lock()
	h, ok := d.handles[id]
	switch {
	case d.closed:
		d.mu.Unlock()
		return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	case !ok:
		d.mu.Unlock()
		return fail(op, acl.ErrCodeRTInvalidHandle, "handle %#x is not a live physical allocation", uintptr(id))
	case h.freed:
		d.mu.Unlock()
		return fail(op, acl.ErrCodeRTParamInvalid, "handle %#x freed too many times (it is still mapped)", uintptr(id))
	}
	if h.owners--; h.owners == 0 {
		h.freed = true
		d.live.Handles--
		if h.imported {
			d.live.Imported--
		}
	}
	release := d.unrefLocked(h)
	d.mu.Unlock()
	return d.decommit(op, release)
}

// unrefLocked drops one reference to h and returns it if the memory must now
// be given back.
func (d *Driver) unrefLocked(h *handle) *handle {
	h.refs--
	if h.refs > 0 {
		return nil
	}
	delete(d.handles, h.id)
	d.ids.Free(h.id)
	if h.imported && d.imports[h.file] == h {
		delete(d.imports, h.file)
	}
	return h
}

// decommit gives h's pages back to the kernel and then its offsets to the
// free list (in that order, so nobody commits the range before it is punched).
func (d *Driver) decommit(op string, h *handle) error {
	if h == nil {
		return nil
	}
	if h.fd != d.fd {
		return d.closeOwn(op, h)
	}
	d.fdUse.RLock() // Close does not close the memory file under the punch
	d.mu.RLock()
	closed := d.closed
	d.mu.RUnlock()
	var err error
	if !closed { // else the file is closed, its pages with it (or about to be)
		err = sysDecommit(d.fd, h.off, h.size)
	}
	d.fdUse.RUnlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.phys -= h.size
	d.live.PhysicalBytes -= h.size
	if err != nil {
		// The pages could not be punched: keep their offsets out of use so a
		// later allocation is never handed memory we could not scrub.
		return fail(op, acl.ErrCodeRTFailure, "punch hole: %v", err)
	}
	d.space.give(h.off, h.size)
	return nil
}

// ReserveMemAddress reserves size bytes (rounded up to 2 MiB) of inaccessible
// address space, 2 MiB-aligned, or 1 GiB-aligned when size is at least 1 GiB.
func (d *Driver) ReserveMemAddress(size, alignment uintptr, expect acl.DevicePtr, flags uint64) (acl.DevicePtr, error) {
	const op = "aclrtReserveMemAddress"
	if err := rules.Reserve(op, size, alignment, expect, flags, d.cfg.MaxReserve); err != nil {
		return 0, err
	}
	size = (size + acl.HugePageSize - 1) &^ (acl.HugePageSize - 1)
	align := uintptr(acl.HugePageSize)
	if size >= acl.Huge1GPageSize {
		align = acl.Huge1GPageSize
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	if d.vmas+1 > d.cfg.MapLimit {
		return 0, fail(op, acl.ErrCodeRTResourceAllocFail, "%d memory areas in use, limit %d (vm.max_map_count)", d.vmas, d.cfg.MapLimit)
	}
	p, err := sysReserve(size, align)
	if err != nil {
		return 0, fail(op, acl.ErrCodeRTMemoryAllocation, "no address space for %s: %v", units.Bytes(int64(size)), err)
	}
	d.book.Add(&reservation{Base: uintptr(p), Size: size, X: resvX{mem: p, vmas: 1}})
	d.addVMAs(1)
	d.live.Reservations++
	d.live.ReservedBytes += size
	return acl.DevicePtr(p), nil
}

func (d *Driver) addVMAs(n int) {
	d.vmas += n
	if d.vmas > d.maxVMAs {
		d.maxVMAs = d.vmas
	}
}

// ReleaseMemAddress gives back the reservation at base, which must have no
// mappings left.
func (d *Driver) ReleaseMemAddress(base acl.DevicePtr) error {
	const op = "aclrtReleaseMemAddress"
	if base == 0 {
		return fail(op, acl.ErrCodeInvalidParam, "virPtr is NULL")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	r, err := d.book.Releasable(op, base)
	if err != nil {
		return err
	}
	if err := sysRelease(r.X.mem, r.Size); err != nil {
		return fail(op, acl.ErrCodeRTFailure, "munmap: %v", err)
	}
	d.book.Forget(r)
	d.addVMAs(-r.X.vmas)
	d.live.Reservations--
	d.live.ReservedBytes -= r.Size
	return nil
}

// seam counts the kernel VMAs contributed by the boundary between p and q,
// neighbours in r's address order (nil p: the reservation's start; nil q: its
// end): one for a reserved gap between them, one if q starts a new mapped VMA
// rather than extending p's. The sum over all seams is r's VMA count.
func seam(r *reservation, p, q *mapping) int {
	lo, hi := r.Base, r.Base+r.Size
	if p != nil {
		lo = p.Addr + p.Size
	}
	if q != nil {
		hi = q.Addr
	}
	n := 0
	if lo < hi {
		n++
	}
	if q != nil && !(p != nil && lo == hi && p.Access == q.Access && p.ReadOnly == q.ReadOnly && p.H.fd == q.H.fd && p.H.off+p.H.size == q.H.off) {
		n++
	}
	return n
}

// neighbours returns the mappings before and after index i (skipping i itself
// when skip is set).
func neighbours(r *reservation, i int, skip bool) (p, q *mapping) {
	if i > 0 {
		p = r.Maps[i-1]
	}
	j := i
	if skip {
		j++
	}
	if j < len(r.Maps) {
		q = r.Maps[j]
	}
	return p, q
}

// MapMem maps the whole physical allocation h at ptr.
func (d *Driver) MapMem(ptr acl.DevicePtr, size, offset uintptr, id acl.PhysicalHandle, flags uint64) error {
	const op = "aclrtMapMem"
	if err := rules.Map(op, ptr, size, offset, id, flags); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	h, ok := d.handles[id]
	if !ok || h.freed {
		return fail(op, acl.ErrCodeRTInvalidHandle, "handle %#x is not a live physical allocation", uintptr(id))
	}
	if err := rules.MapFits(op, ptr, size, h.size, h.page); err != nil {
		return err
	}
	r, i, err := d.book.Place(op, ptr, size)
	if err != nil {
		return err
	}
	if err := rules.MapSource(op, h.imported, r.X.imported, len(r.Maps)); err != nil {
		return err
	}
	// Memory imported read-only is mapped readable, never writable.
	m := &mapping{Addr: uintptr(ptr), Size: size, H: h, Access: d.cfg.NoSetAccess, ReadOnly: d.cfg.NoSetAccess && h.readOnly}
	p, q := neighbours(r, i, false)
	delta := seam(r, p, m) + seam(r, m, q) - seam(r, p, q)
	if d.vmas+delta > d.cfg.MapLimit {
		return fail(op, acl.ErrCodeRTResourceAllocFail, "%d memory areas in use, limit %d (vm.max_map_count)", d.vmas, d.cfg.MapLimit)
	}
	if err := sysMap(at(r, uintptr(ptr)), size, h.fd, h.off, m.Access, m.ReadOnly); err != nil {
		return fail(op, acl.ErrCodeRTResourceAllocFail, "mmap: %v", err)
	}
	r.Insert(i, m)
	r.X.vmas += delta
	if h.imported {
		r.X.imported++
	}
	d.addVMAs(delta)
	h.refs++
	d.live.Mappings++
	d.live.MappedBytes += size
	return nil
}

// UnmapMem removes the mapping that starts at ptr, leaving the range reserved
// and inaccessible.
func (d *Driver) UnmapMem(ptr acl.DevicePtr) error {
	const op = "aclrtUnmapMem"
	if ptr == 0 {
		return fail(op, acl.ErrCodeInvalidParam, "virPtr is NULL")
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	r, i, m := d.book.Mapping(ptr)
	if m == nil {
		d.mu.Unlock()
		return fail(op, acl.ErrCodeRTDrvInternal, "%v is not the start of a mapping", ptr)
	}
	if err := sysUnmap(at(r, m.Addr), m.Size); err != nil {
		d.mu.Unlock()
		return fail(op, acl.ErrCodeRTFailure, "mmap PROT_NONE: %v", err)
	}
	// As on a device the unmap succeeds; work still touching the range faults.
	d.ss.FaultUnmap(m.Addr, m.Addr+m.Size)
	p, q := neighbours(r, i, true)
	delta := seam(r, p, q) - seam(r, p, m) - seam(r, m, q)
	r.Remove(i)
	r.X.vmas += delta
	if m.H.imported {
		r.X.imported--
	}
	d.addVMAs(delta)
	d.live.Mappings--
	d.live.MappedBytes -= m.Size
	release := d.unrefLocked(m.H)
	d.mu.Unlock()
	return d.decommit(op, release)
}

// MemSetAccess grants read-write access (or, with MemAccessRead, read-only
// access) to the mapping at [ptr, ptr+size), or with Config.AccessSpan to the
// run of adjacent mappings that covers it exactly.
func (d *Driver) MemSetAccess(ptr acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc) error {
	const op = "aclrtMemSetAccess"
	if d.cfg.NoSetAccess {
		return fail(op, acl.ErrCodeRTFeatureNotSupport, "this runtime has no aclrtMemSetAccess")
	}
	if err := rules.AccessFlags(op, ptr, size, desc, d.cfg.Device, true, true); err != nil {
		return err
	}
	ro := rules.ReadOnly(desc)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	r, i, m := d.book.Mapping(ptr)
	if m == nil || m.Size > size || (m.Size != size && !d.cfg.AccessSpan) {
		return fail(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) is not exactly one mapping", ptr, size)
	}
	// The run of mappings that covers the range, which must end exactly at
	// its end with no gap.
	j, end := i, m.Addr
	for end < uintptr(ptr)+size {
		if j == len(r.Maps) || r.Maps[j].Addr != end {
			return fail(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) is not a run of adjacent mappings: nothing is mapped at %#x", ptr, size, end)
		}
		end += r.Maps[j].Size
		j++
	}
	if end != uintptr(ptr)+size {
		return fail(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) ends inside the mapping at %#x", ptr, size, r.Maps[j-1].Addr)
	}
	for k := i; k < j; k++ {
		if m := r.Maps[k]; m.H.readOnly && !ro {
			return fail(op, acl.ErrCodeRTParamInvalid, "the mapping at %#x is of memory imported read-only: it cannot be made writable", m.Addr)
		}
	}
	for k := i; k < j; k++ {
		m := r.Maps[k]
		if m.Access && m.ReadOnly == ro {
			continue
		}
		if err := sysProtect(at(r, m.Addr), m.Size, ro); err != nil {
			return fail(op, acl.ErrCodeRTFailure, "mprotect: %v", err)
		}
		p, q := neighbours(r, k, true)
		before := seam(r, p, m) + seam(r, m, q)
		m.Access, m.ReadOnly = true, ro
		delta := seam(r, p, m) + seam(r, m, q) - before
		r.X.vmas += delta
		d.addVMAs(delta)
	}
	return nil
}

// hostRange returns the host memory behind [ptr, ptr+n), which must be mapped
// with access throughout.
func (d *Driver) hostRangeLocked(op string, ptr acl.DevicePtr, n uintptr) ([]byte, error) {
	return d.rangeLocked(op, ptr, n, false)
}

// rangeLocked is hostRangeLocked, for a write when write is set: a
// read-only mapping is refused, where a device would fault.
func (d *Driver) rangeLocked(op string, ptr acl.DevicePtr, n uintptr, write bool) ([]byte, error) {
	if d.closed {
		return nil, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	check := d.book.Accessible
	if write {
		check = d.book.Writable
	}
	r, err := check(op, ptr, n)
	if err != nil {
		return nil, err
	}
	// unsafe: the range was just checked to be mapped read-write inside r.
	return unsafe.Slice((*byte)(at(r, uintptr(ptr))), n), nil
}

// Bytes returns the host memory behind the device range [ptr, ptr+n), which
// must be mapped with access. The slice aliases device memory: it is valid
// only until the range is unmapped, after which touching it faults.
func (d *Driver) Bytes(ptr acl.DevicePtr, n uintptr) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.hostRangeLocked("Bytes", ptr, n)
}

// The copies hold the driver lock shared, so that the range cannot be
// unmapped under them while other copies and queries go on.

// MemcpyHtoD copies src to device memory at dst.
func (d *Driver) MemcpyHtoD(dst acl.DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	b, err := d.rangeLocked("aclrtMemcpy", dst, uintptr(len(src)), true)
	if err != nil {
		return err
	}
	d.faultRace(uintptr(dst), uintptr(dst)+uintptr(len(src)))
	copy(b, src)
	return nil
}

// MemcpyDtoH copies device memory at src into dst.
func (d *Driver) MemcpyDtoH(dst []byte, src acl.DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	b, err := d.hostRangeLocked("aclrtMemcpy", src, uintptr(len(dst)))
	if err != nil {
		return err
	}
	d.faultRace(uintptr(src), uintptr(src)+uintptr(len(dst)))
	copy(dst, b)
	return nil
}

// MemcpyDtoD copies n bytes of device memory from src to dst. (Overlapping
// ranges copy as memmove would; the contract leaves them undefined.)
func (d *Driver) MemcpyDtoD(dst, src acl.DevicePtr, n uintptr) error {
	if n == 0 {
		return nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	s, err := d.hostRangeLocked("aclrtMemcpy", src, n)
	if err != nil {
		return err
	}
	t, err := d.rangeLocked("aclrtMemcpy", dst, n, true)
	if err != nil {
		return err
	}
	d.faultRace(uintptr(src), uintptr(src)+n)
	d.faultRace(uintptr(dst), uintptr(dst)+n)
	copy(t, s)
	return nil
}

// Memset sets n bytes of device memory at ptr to value.
func (d *Driver) Memset(ptr acl.DevicePtr, value byte, n uintptr) error {
	if n == 0 {
		return nil
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	b, err := d.rangeLocked("aclrtMemset", ptr, n, true)
	if err != nil {
		return err
	}
	d.faultRace(uintptr(ptr), uintptr(ptr)+n)
	fill(b, value)
	return nil
}

// GetMemInfo reports the capacity and what is not allocated of it.
func (d *Driver) GetMemInfo(attr acl.MemAttr) (free, total uintptr, err error) {
	const op = "aclrtGetMemInfo"
	if err := rules.MemInfo(op, attr); err != nil {
		return 0, 0, err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return 0, 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	return d.cfg.Capacity - d.phys, d.cfg.Capacity, nil
}

// Close releases everything the driver still holds and closes its memory
// file. It reports what was still live, since that is a leak in the caller.
// Close on the process default driver does nothing.
func (d *Driver) Close() error {
	if d == nil || d.shared {
		return nil
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	var errs []error
	// A running memset takes mu shared: stop the streams before taking it.
	if n := d.ss.Stop(); n > 0 {
		errs = append(errs, fmt.Errorf("host driver: closed with %d pieces of device work still queued", n))
	}
	// A commit or a punch under way finishes before the memory file closes
	// (its number could otherwise name another file by the time it runs).
	d.fdUse.Lock()
	defer d.fdUse.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if n, _ := d.hostBufs.Live(); !d.live.Zero() || n > 0 {
		c := d.live
		c.HostBuffers, c.HostBytes = d.hostBufs.Live()
		errs = append(errs, fmt.Errorf("host driver: closed with objects still live: %+v", c))
	}
	for p, n := range d.hostBufs.All() {
		b := unsafe.Slice(p, n)
		d.hostBufs.Remove(b)
		if err := sysHostFree(b); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range d.book.All() {
		if err := sysRelease(r.X.mem, r.Size); err != nil {
			errs = append(errs, err)
		}
	}
	d.book.Reset()
	for _, h := range d.handles {
		if h.fd != d.fd {
			errs = append(errs, d.forgetOwnLocked(h))
		}
	}
	d.handles = nil
	if err := sysClose(d.fd); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
