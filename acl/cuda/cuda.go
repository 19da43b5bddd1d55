package cuda

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/book"
	"github.com/vmarena/vmarena/acl/internal/handles"
	"github.com/vmarena/vmarena/acl/internal/hostmem"
	"github.com/vmarena/vmarena/acl/internal/rules"
)

// Config configures a CUDA driver. The zero value opens GPU 0 through
// libcuda.so.1 (or $VMARENA_CUDA_LIBRARY).
type Config struct {
	// Library is the path of the CUDA driver library. "" means
	// $VMARENA_CUDA_LIBRARY when set, else "libcuda.so.1" through the dynamic
	// loader's search path. Only the first of these that is set is tried.
	Library string
	// Device is the CUDA device ordinal (as CUDA_VISIBLE_DEVICES numbers
	// them). It is also the driver's ACL device id. 0 is the first GPU.
	Device int
	// NoScrubOnFree says that the NVIDIA kernel driver on this machine does
	// not clear device memory between processes (it runs with the
	// RMDisableScrubOnFree registry key, as a vGPU guest without SR-IOV, or
	// in another configuration docs/cuda.md lists). Caps().Fresh is then
	// acl.FreshUnknown instead of acl.FreshProcess.
	NoScrubOnFree bool
	// MaxReserve is the largest ReserveMemAddress one call may make.
	// 0 means 128 GiB, the Ascend driver's limit, so that code which runs
	// here runs there too.
	MaxReserve uintptr
}

// Driver is the acl.Driver contract implemented on the CUDA driver API's
// virtual-memory management calls, for one GPU. See the package
// documentation for the mapping of each call, the ACL rules it enforces on
// top of CUDA and its thread discipline.
//
// Driver is safe for concurrent use.
type Driver struct {
	cfg     Config
	lib     *library
	name    string
	dev     int32   // CUdevice
	ctx     uintptr // the device's primary CUcontext
	version int32   // cuDriverGetVersion, e.g. 12060
	gran    uintptr // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	granRec uintptr // CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
	gran1G  uintptr // the granularity of the ACL HUGE1G attributes
	posixFD bool    // the device exports POSIX descriptors (share.go)
	rdma    bool    // allocations are made GPUDirect RDMA capable (dmabuf.go)
	dmaBuf  bool    // the device exports dma-bufs (dmabuf.go)

	// life is read-held by every call for its whole duration and
	// write-held by Close, so Close waits for calls in flight and no call
	// starts after it.
	life   sync.RWMutex
	closed bool // guarded by life

	// copyStream is the driver's own non-blocking stream, created at Open,
	// on which the synchronous MemcpyDtoD and Memset run and are waited for.
	copyStream uintptr

	// mu guards the tracking state below. It is write-held across the CUDA
	// calls that change mappings and reservations (so that Go's view and
	// CUDA's never disagree) and read-held across copies and memsets (so
	// that a range cannot be unmapped under them). Streams and events have
	// their own lock, omu, always taken after mu.
	mu      sync.RWMutex
	book    book.Book[resvX, *handle]
	handles map[acl.PhysicalHandle]*handle
	nextID  acl.PhysicalHandle
	live    acl.LiveCounts // every count but Streams, Events and host buffers

	hostBufs hostmem.Table // MallocHost's buffers (pinned.go)

	omu     sync.Mutex
	streams map[acl.Stream]*stream // the streams CreateStream made, by CUstream; guarded by omu
	gone    handles.Graveyard      // the streams DestroyStream destroyed; guarded by omu
	events  map[acl.Event]*event   // guarded by omu
	nextObj uintptr                // the last event id handed out; guarded by omu
}

// handle is a physical allocation: one cuMemCreate.
type handle struct {
	id    acl.PhysicalHandle
	cu    uint64 // CUmemGenericAllocationHandle
	size  uintptr
	page  uintptr // granularity its mappings must be aligned to
	refs  int     // the owner's reference plus one per mapping
	freed bool    // FreePhysical dropped the owner's reference (cuMemRelease done)
	share         // exportable, exported and imported allocations (share.go)
	props props   // what a dma-buf export needs identical across its chunks (dmabuf.go)
}

// resvX counts a reservation's mappings of imported memory: ACL lets a
// reservation hold imported or own memory, never both at once.
type resvX struct{ imported int }

// A reservation is one cuMemAddressReserve; a mapping is one cuMemMap of a
// whole allocation.
type (
	reservation = book.Reservation[resvX, *handle]
	mapping     = book.Mapping[*handle]
)

var (
	_ acl.Driver  = (*Driver)(nil)
	_ acl.Counter = (*Driver)(nil)
)

const errClosedMsg = "driver closed"

func fail(op string, code int32, format string, args ...any) error {
	return acl.Errorf(op, code, format, args...)
}

// Open loads the CUDA driver library, initialises CUDA and retains the
// primary context of device cfg.Device. It fails with an error matching
// acl.ErrNotSupported when the library or one of its symbols is missing, the
// library is the toolkit's stub, the driver predates CUDA 10.2 or the device
// lacks virtual memory management; and with one matching acl.ErrNoDevice when
// no such device exists.
func Open(cfg Config) (*Driver, error) {
	if cfg.Device < 0 || cfg.Device > math.MaxInt32 {
		return nil, fmt.Errorf("cuda: device %d: %w", cfg.Device, acl.ErrInvalidParam)
	}
	if cfg.MaxReserve == 0 {
		cfg.MaxReserve = acl.MaxReserve
	}
	path := libraryPath(cfg)
	lib, err := loadLibrary(path)
	if err != nil {
		return nil, err
	}
	d := &Driver{
		cfg:     cfg,
		lib:     lib,
		name:    fmt.Sprintf("cuda:%d", cfg.Device),
		handles: make(map[acl.PhysicalHandle]*handle),
		nextID:  0x1000,
		streams: make(map[acl.Stream]*stream),
		events:  make(map[acl.Event]*event),
		nextObj: 0x5000,
	}
	if err := d.open(); err != nil {
		return nil, fmt.Errorf("cuda: open device %d with %s: %w", cfg.Device, path, err)
	}
	return d, nil
}

// open initialises CUDA, takes the device's primary context and creates the
// driver's own stream.
func (d *Driver) open() error {
	l := d.lib
	if r := l.cuInit(0); r != ResultSuccess {
		return l.newError("cuInit", r)
	}
	if r := l.cuDriverGetVersion(&d.version); r != ResultSuccess {
		return l.newError("cuDriverGetVersion", r)
	}
	if d.version < minDriverVersion {
		return fmt.Errorf("driver supports CUDA %s; virtual memory management needs 10.2: %w",
			versionString(d.version), acl.ErrNotSupported)
	}
	var count int32
	if r := l.cuDeviceGetCount(&count); r != ResultSuccess {
		return l.newError("cuDeviceGetCount", r)
	}
	if d.cfg.Device >= int(count) {
		return acl.Errorf("cuDeviceGet", acl.ErrCodeRTInvalidDeviceID, "device %d: the driver sees %d devices", d.cfg.Device, count)
	}
	if r := l.cuDeviceGet(&d.dev, int32(d.cfg.Device)); r != ResultSuccess {
		return l.newError("cuDeviceGet", r)
	}
	var vmm int32
	if r := l.cuDeviceGetAttribute(&vmm, cuDevAttrVirtualMemorySupp, d.dev); r != ResultSuccess {
		return l.newError("cuDeviceGetAttribute", r)
	}
	if vmm == 0 {
		return fmt.Errorf("device %d lacks virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0): %w",
			d.cfg.Device, acl.ErrNotSupported)
	}
	d.posixFD = d.queryPosixFD()
	d.rdma, d.dmaBuf = d.queryRDMA()
	if r := l.cuDevicePrimaryCtxRetain(&d.ctx, d.dev); r != ResultSuccess {
		return l.newError("cuDevicePrimaryCtxRetain", r)
	}
	primaryContexts.Store(d.ctx, struct{}{})
	err := d.queryGranularity()
	if err == nil {
		err = d.createCopyStream()
	}
	if err != nil {
		if r := l.cuDevicePrimaryCtxRelease(d.dev); r != ResultSuccess {
			err = errors.Join(err, l.newError("cuDevicePrimaryCtxRelease_v2", r))
		}
		return err
	}
	return nil
}

// createCopyStream creates the non-blocking stream the synchronous device
// copies and memsets run on, so that waiting for them waits for nothing else.
func (d *Driver) createCopyStream() error {
	b, err := d.bind()
	if err != nil {
		return err
	}
	defer d.unbind(b)
	if r := d.lib.cuStreamCreate(&d.copyStream, cuStreamNonBlocking); r != ResultSuccess {
		return d.lib.newError("cuStreamCreate", r)
	}
	return nil
}

// queryGranularity asks the device for its minimum and recommended
// granularity of pinned device memory.
func (d *Driver) queryGranularity() error {
	b, err := d.bind()
	if err != nil {
		return err
	}
	defer d.unbind(b)
	prop := d.cuProp()
	if r := d.lib.cuMemGetAllocationGranularity(&d.gran, &prop, cuGranularityMinimum); r != ResultSuccess {
		return d.lib.newError("cuMemGetAllocationGranularity", r)
	}
	if r := d.lib.cuMemGetAllocationGranularity(&d.granRec, &prop, cuGranularityRecommended); r != ResultSuccess {
		return d.lib.newError("cuMemGetAllocationGranularity", r)
	}
	if d.gran == 0 || d.gran&(d.gran-1) != 0 || d.granRec < d.gran || d.granRec%d.gran != 0 {
		return fmt.Errorf("granularity %d, recommended %d: want a power of two and a multiple of it: %w", d.gran, d.granRec, acl.ErrNotSupported)
	}
	d.gran1G = roundUp(acl.Huge1GPageSize, d.gran)
	return nil
}

func versionString(v int32) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

func roundUp(n, to uintptr) uintptr { return (n + to - 1) / to * to }

// cuProp is the CUmemAllocationProp of every allocation: pinned memory on
// the driver's device, no shareable handle, GPUDirect RDMA capable where the
// device allows it on VMM memory (so that every chunk has the properties a
// dma-buf export of several of them needs, dmabuf.go).
func (d *Driver) cuProp() memAllocationProp {
	p := memAllocationProp{
		Type:     cuMemAllocationTypePinned,
		Location: memLocation{Type: cuMemLocationTypeDevice, ID: int32(d.cfg.Device)},
	}
	if d.rdma {
		p.GPUDirectRDMACapable = 1
	}
	return p
}

// Thread discipline. CUDA's current context belongs to the calling OS
// thread, and Go moves goroutines between threads. So every call into CUDA
// runs between bind and unbind: the goroutine is locked to its thread and
// the device's primary context is made current there, unless it already is
// (the usual case after the first call on a thread: then binding costs one
// cuCtxGetCurrent).

// primaryContexts holds every primary context a Driver has retained (a
// device's primary context is the same CUcontext for the life of the
// process). bind leaves one of them current on a thread rather than
// restoring it, like a thread with no context.
var primaryContexts sync.Map // uintptr → struct{}

// binding is what unbind must undo.
type binding struct {
	restore uintptr // a foreign context to make current again, or 0
}

// bind locks the calling goroutine to its OS thread and makes d's context
// current on it.
func (d *Driver) bind() (binding, error) {
	runtime.LockOSThread()
	var cur uintptr
	if r := d.lib.cuCtxGetCurrent(&cur); r != ResultSuccess {
		runtime.UnlockOSThread()
		return binding{}, d.lib.newError("cuCtxGetCurrent", r)
	}
	if cur == d.ctx {
		return binding{}, nil
	}
	if r := d.lib.cuCtxSetCurrent(d.ctx); r != ResultSuccess {
		runtime.UnlockOSThread()
		return binding{}, d.lib.newError("cuCtxSetCurrent", r)
	}
	// A thread with no context, or the primary context of another device
	// this package uses, keeps ours, which saves the next call on it a
	// cuCtxSetCurrent. A thread that had a context of someone else's (the
	// caller's own, on a thread it locked) gets it back in unbind.
	if cur == 0 {
		return binding{}, nil
	}
	if _, ok := primaryContexts.Load(cur); ok {
		return binding{}, nil
	}
	return binding{restore: cur}, nil
}

// unbind undoes bind.
func (d *Driver) unbind(b binding) {
	if b.restore != 0 {
		// The caller's context was valid a moment ago; if CUDA refuses it
		// now there is nothing better to leave current than ours.
		_ = d.lib.cuCtxSetCurrent(b.restore)
	}
	runtime.UnlockOSThread()
}

// begin starts a call: it holds off Close until end, and fails once the
// driver is closed.
func (d *Driver) begin(op string) error {
	d.life.RLock()
	if d.closed {
		d.life.RUnlock()
		return fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	return nil
}

func (d *Driver) end() { d.life.RUnlock() }

// Name returns "cuda:N".
func (d *Driver) Name() string { return d.name }

// Device returns the CUDA device ordinal, which is the ACL device id.
func (d *Driver) Device() int32 { return int32(d.cfg.Device) }

// DriverVersion returns the CUDA version the driver supports, as
// cuDriverGetVersion reports it (e.g. 12060 for 12.6).
func (d *Driver) DriverVersion() int { return int(d.version) }

// Live counts what the driver holds on its callers' behalf. The driver's own
// stream is not counted.
func (d *Driver) Live() acl.LiveCounts {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.liveLocked()
}

// liveLocked returns the live counts. Call with mu held.
func (d *Driver) liveLocked() acl.LiveCounts {
	l := d.live
	d.omu.Lock()
	l.Streams, l.Events = len(d.streams), len(d.events)
	d.omu.Unlock()
	l.HostBuffers, l.HostBytes = d.hostBufs.Live()
	return l
}

// Caps reports what CUDA allows beyond the strictest device: one
// MemSetAccess may cover a run of adjacent mappings (cuMemSetAccess takes any
// fully mapped range), and fresh memory holds no other process's bytes,
// because the NVIDIA kernel driver clears device memory when a process frees
// it (acl.FreshProcess; acl.FreshUnknown with Config.NoScrubOnFree). It
// shares memory as POSIX descriptors where the device says it can (asked at
// Open), and maps read-only (CU_MEM_ACCESS_FLAGS_PROT_READ). See docs/cuda.md
// for the evidence and its limits. It makes no driver call.
func (d *Driver) Caps() acl.Caps {
	c := acl.Caps{AccessSpan: true, Fresh: acl.FreshProcess, Sharing: d.sharing(), ReadOnly: true, MaxReserve: d.cfg.MaxReserve}
	if d.cfg.NoScrubOnFree {
		c.Fresh = acl.FreshUnknown
	}
	return c
}

// pageOf returns the granularity of memory with attr: the device's minimum,
// or for the HUGE1G attributes 1 GiB rounded up to a multiple of it.
func (d *Driver) pageOf(attr acl.MemAttr) uintptr {
	if attr.Huge1G() {
		return d.gran1G
	}
	return d.gran
}

// MemGetAllocationGranularity returns the granularity the device reported
// at Open (cuMemGetAllocationGranularity, minimum or recommended), or 1 GiB
// for the HUGE1G attributes.
func (d *Driver) MemGetAllocationGranularity(prop *acl.PhysicalMemProp, option acl.MemGranularityOptions) (uintptr, error) {
	const op = "aclrtMemGetAllocationGranularity"
	if _, err := d.exportableProp(op, prop); err != nil {
		return 0, err
	}
	if err := rules.GranularityOption(op, option); err != nil {
		return 0, err
	}
	if err := d.begin(op); err != nil {
		return 0, err
	}
	defer d.end()
	switch {
	case prop.MemAttr.Huge1G():
		return d.gran1G, nil
	case option == acl.GranularityRecommended:
		return d.granRec, nil
	}
	return d.gran, nil
}

// MallocPhysical is cuMemCreate of pinned device memory. Sizes must be
// multiples of the granularity (HUGE1G sizes are rounded up to 1 GiB).
func (d *Driver) MallocPhysical(size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	const op = "aclrtMallocPhysical"
	posix, prop := rules.Exportable(prop)
	size, err := rules.Malloc(op, size, prop, flags, d.Device(), "CUDA", d.pageOf)
	if err != nil {
		return 0, err
	}
	if posix && !d.posixFD {
		return 0, acl.Errorf(op, acl.ErrCodeRTFeatureNotSupport,
			"device %d cannot export POSIX file descriptors (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0)", d.cfg.Device)
	}
	if err := d.begin(op); err != nil {
		return 0, err
	}
	defer d.end()
	page := d.pageOf(prop.MemAttr)

	// cuMemCreate depends on no state of ours: it runs without the lock.
	b, err := d.bind()
	if err != nil {
		return 0, err
	}
	cuprop := d.cuProp()
	if posix {
		cuprop.RequestedHandleTypes = cuMemHandleTypePosixFD
	}
	var cu uint64
	r := d.lib.cuMemCreate(&cu, size, &cuprop, 0)
	d.unbind(b)
	if r != ResultSuccess {
		return 0, d.lib.newError("cuMemCreate", r)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	d.nextID++
	h := &handle{id: d.nextID, cu: cu, size: size, page: page, refs: 1, share: share{exportable: posix, fd: -1},
		props: propsOf(&cuprop)}
	d.handles[h.id] = h
	d.live.Handles++
	d.live.PhysicalBytes += size
	return h.id, nil
}

// FreePhysical is cuMemRelease: it drops the owner's reference. As in ACL
// (and CUDA), memory still mapped is freed when its last mapping goes.
// Freeing twice is an error.
func (d *Driver) FreePhysical(id acl.PhysicalHandle) error {
	const op = "aclrtFreePhysical"
	if id == 0 {
		return fail(op, acl.ErrCodeInvalidParam, "handle is NULL")
	}
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.handles[id]
	switch {
	case !ok:
		return fail(op, acl.ErrCodeRTInvalidHandle, "handle %#x is not a live physical allocation", uintptr(id))
	case h.freed:
		return fail(op, acl.ErrCodeRTParamInvalid, "handle %#x freed too many times (it is still mapped)", uintptr(id))
	}
	b, err := d.bind()
	if err != nil {
		return err
	}
	r := d.lib.cuMemRelease(h.cu)
	d.unbind(b)
	if r != ResultSuccess {
		return d.lib.newError("cuMemRelease", r)
	}
	h.freed = true
	d.live.Handles--
	if h.imported {
		d.live.Imported--
	}
	d.unrefLocked(h)
	return nil
}

// unrefLocked drops one reference to h; the last one forgets it (CUDA has
// freed the memory by then).
func (d *Driver) unrefLocked(h *handle) {
	h.refs--
	if h.refs > 0 {
		return
	}
	delete(d.handles, h.id)
	d.live.PhysicalBytes -= h.size
	if h.imported {
		d.live.ImportedBytes -= h.size
	}
	d.closeExport(h)
}

// ReserveMemAddress is cuMemAddressReserve of size bytes rounded up to the
// granularity, aligned to the granularity, or to 1 GiB when size is at least
// 1 GiB.
func (d *Driver) ReserveMemAddress(size, alignment uintptr, expect acl.DevicePtr, flags uint64) (acl.DevicePtr, error) {
	const op = "aclrtReserveMemAddress"
	if err := rules.Reserve(op, size, alignment, expect, flags, d.cfg.MaxReserve); err != nil {
		return 0, err
	}
	if err := d.begin(op); err != nil {
		return 0, err
	}
	defer d.end()
	size = roundUp(size, d.gran)
	align := d.gran
	if size >= d.gran1G {
		align = d.gran1G
	}
	b, err := d.bind()
	if err != nil {
		return 0, err
	}
	var p uint64
	r := d.lib.cuMemAddressReserve(&p, size, align, 0, 0)
	d.unbind(b)
	if r != ResultSuccess {
		return 0, d.lib.newError("cuMemAddressReserve", r)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	d.book.Add(&reservation{Base: uintptr(p), Size: size})
	d.live.Reservations++
	d.live.ReservedBytes += size
	return acl.DevicePtr(p), nil
}

// ReleaseMemAddress is cuMemAddressFree of the reservation at base (CUDA
// needs its size too; the driver remembers it). No mapping may remain.
func (d *Driver) ReleaseMemAddress(base acl.DevicePtr) error {
	const op = "aclrtReleaseMemAddress"
	if base == 0 {
		return fail(op, acl.ErrCodeInvalidParam, "virPtr is NULL")
	}
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	d.mu.Lock()
	defer d.mu.Unlock()
	r, err := d.book.Releasable(op, base)
	if err != nil {
		return err
	}
	b, err := d.bind()
	if err != nil {
		return err
	}
	res := d.lib.cuMemAddressFree(uint64(r.Base), r.Size)
	d.unbind(b)
	if res != ResultSuccess {
		return d.lib.newError("cuMemAddressFree", res)
	}
	d.book.Forget(r)
	d.live.Reservations--
	d.live.ReservedBytes -= r.Size
	return nil
}

// MapMem is cuMemMap of the whole allocation h at ptr, which must lie in one
// reservation, aligned to h's granularity, over no other mapping. The
// mapping has no access until MemSetAccess.
func (d *Driver) MapMem(ptr acl.DevicePtr, size, offset uintptr, id acl.PhysicalHandle, flags uint64) error {
	const op = "aclrtMapMem"
	if err := rules.Map(op, ptr, size, offset, id, flags); err != nil {
		return err
	}
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.handles[id]
	if !ok || h.freed {
		return fail(op, acl.ErrCodeRTInvalidHandle, "handle %#x is not a live physical allocation", uintptr(id))
	}
	hsize := h.size
	if hsize == 0 { // imported: CUDA does not say its size; the first map does
		if size%h.page != 0 {
			return fail(op, acl.ErrCodeRTParamInvalid, "size %d is not a multiple of the imported memory's granularity %d", size, h.page)
		}
		hsize = size
	}
	if err := rules.MapFits(op, ptr, size, hsize, h.page); err != nil {
		return err
	}
	r, i, err := d.book.Place(op, ptr, size)
	if err != nil {
		return err
	}
	if err := rules.MapSource(op, h.imported, r.X.imported, len(r.Maps)); err != nil {
		return err
	}
	b, err := d.bind()
	if err != nil {
		return err
	}
	res := d.lib.cuMemMap(uint64(ptr), size, 0, h.cu, 0)
	d.unbind(b)
	if res != ResultSuccess {
		return d.lib.newError("cuMemMap", res)
	}
	r.Insert(i, &mapping{Addr: uintptr(ptr), Size: size, H: h})
	if h.imported {
		r.X.imported++
	}
	if h.size == 0 {
		d.learnSize(h, size)
	}
	h.refs++
	d.live.Mappings++
	d.live.MappedBytes += size
	return nil
}

// UnmapMem is cuMemUnmap of the mapping that starts at ptr (CUDA needs its
// size too; the driver remembers it). Like CUDA it does not wait for device
// work: the caller makes sure no queued work still touches the range. If the
// allocation was freed, this last mapping frees its memory.
func (d *Driver) UnmapMem(ptr acl.DevicePtr) error {
	const op = "aclrtUnmapMem"
	if ptr == 0 {
		return fail(op, acl.ErrCodeInvalidParam, "virPtr is NULL")
	}
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	d.mu.Lock()
	defer d.mu.Unlock()
	r, i, m := d.book.Mapping(ptr)
	if m == nil {
		return fail(op, acl.ErrCodeRTDrvInternal, "%v is not the start of a mapping", ptr)
	}
	b, err := d.bind()
	if err != nil {
		return err
	}
	res := d.lib.cuMemUnmap(uint64(m.Addr), m.Size)
	d.unbind(b)
	if res != ResultSuccess {
		return d.lib.newError("cuMemUnmap", res)
	}
	r.Remove(i)
	if m.H.imported {
		r.X.imported--
	}
	d.live.Mappings--
	d.live.MappedBytes -= m.Size
	d.unrefLocked(m.H)
	return nil
}

// MemSetAccess is cuMemSetAccess of [ptr, ptr+size), granting its device
// read-write access. The range must be exactly one mapping or, since CUDA
// allows it (Caps().AccessSpan), a run of adjacent mappings of one
// reservation, covered by one cuMemSetAccess call; a gap, or an end inside a
// mapping, is refused with 107000. desc must name this device with
// MemAccessReadWrite; CUDA cannot grant the host access to device memory, so
// a host location is refused (with 100000, not with ErrNotSupported, which
// would tell the caller access is not needed). Granting access again is a
// no-op.
func (d *Driver) MemSetAccess(ptr acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc) error {
	const op = "aclrtMemSetAccess"
	if err := rules.AccessFlags(op, ptr, size, desc, d.Device(), false, true); err != nil {
		return err
	}
	ro := rules.ReadOnly(desc)
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	d.mu.Lock()
	defer d.mu.Unlock()
	r, i, m := d.book.Mapping(ptr)
	if m == nil || m.Size > size {
		return fail(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) does not start with a whole mapping", ptr, size)
	}
	// The run of mappings that covers the range, which must end exactly at
	// its end, with no gap.
	j, end, granted := i, m.Addr, true
	for end < uintptr(ptr)+size {
		if j == len(r.Maps) || r.Maps[j].Addr != end {
			return fail(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) is not a run of adjacent mappings: nothing is mapped at %#x", ptr, size, end)
		}
		granted = granted && r.Maps[j].Access && r.Maps[j].ReadOnly == ro
		end += r.Maps[j].Size
		j++
	}
	if end != uintptr(ptr)+size {
		return fail(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) ends inside the mapping at %#x", ptr, size, r.Maps[j-1].Addr)
	}
	if granted {
		return nil
	}
	cudesc := memAccessDesc{
		Location: memLocation{Type: cuMemLocationTypeDevice, ID: int32(d.cfg.Device)},
		Flags:    cuMemAccessProtReadWrite,
	}
	if ro {
		cudesc.Flags = cuMemAccessProtRead
	}
	b, err := d.bind()
	if err != nil {
		return err
	}
	res := d.lib.cuMemSetAccess(uint64(ptr), size, &cudesc, 1)
	d.unbind(b)
	if res != ResultSuccess {
		return d.lib.newError("cuMemSetAccess", res)
	}
	for _, m := range r.Maps[i:j] {
		m.Access, m.ReadOnly = true, ro
	}
	return nil
}

// copyCall runs one copy or memset: with the state read-locked (so the
// ranges stay mapped) after checking every range [p, p+n), on a bound thread.
// With onStream set, call queues the work on the driver's own stream and
// copyCall waits for that stream (cuStreamSynchronize), since the ACL calls
// they stand for are synchronous; nothing else on the device is waited for.
func (d *Driver) copyCall(op, fn string, n uintptr, onStream bool, call func() Result, dst acl.DevicePtr, src ...acl.DevicePtr) error {
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	d.mu.RLock()
	defer d.mu.RUnlock()
	// Checking here keeps a bad copy from reaching the GPU, where it would
	// fault and poison the context. dst (0 for none) is written: a read-only
	// mapping refuses it.
	if dst != 0 {
		if _, err := d.book.Writable(op, dst, n); err != nil {
			return err
		}
	}
	for _, p := range src {
		if _, err := d.book.Accessible(op, p, n); err != nil {
			return err
		}
	}
	b, err := d.bind()
	if err != nil {
		return err
	}
	defer d.unbind(b)
	if r := call(); r != ResultSuccess {
		return d.lib.newError(fn, r)
	}
	if onStream {
		return d.lib.newError("cuStreamSynchronize", d.lib.cuStreamSynchronize(d.copyStream))
	}
	return nil
}

// MemcpyHtoD is cuMemcpyHtoD_v2 (synchronous; on the legacy default
// stream).
func (d *Driver) MemcpyHtoD(dst acl.DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	n := uintptr(len(src))
	return d.copyCall("aclrtMemcpy", "cuMemcpyHtoD_v2", n, false, func() Result {
		return d.lib.cuMemcpyHtoD(uint64(dst), src, n)
	}, dst)
}

// MemcpyDtoH is cuMemcpyDtoH_v2 (synchronous; on the legacy default
// stream).
func (d *Driver) MemcpyDtoH(dst []byte, src acl.DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	n := uintptr(len(dst))
	return d.copyCall("aclrtMemcpy", "cuMemcpyDtoH_v2", n, false, func() Result {
		return d.lib.cuMemcpyDtoH(dst, uint64(src), n)
	}, 0, src)
}

// MemcpyDtoD is cuMemcpyDtoDAsync_v2 on the driver's own stream, then
// cuStreamSynchronize of that stream: it returns when the copy is done.
func (d *Driver) MemcpyDtoD(dst, src acl.DevicePtr, n uintptr) error {
	if n == 0 {
		return nil
	}
	return d.copyCall("aclrtMemcpy", "cuMemcpyDtoDAsync_v2", n, true, func() Result {
		return d.lib.cuMemcpyDtoDAsync(uint64(dst), uint64(src), n, d.copyStream)
	}, dst, src)
}

// Memset is cuMemsetD8Async on the driver's own stream, then
// cuStreamSynchronize of that stream: it returns when the memory is set.
func (d *Driver) Memset(ptr acl.DevicePtr, value byte, n uintptr) error {
	if n == 0 {
		return nil
	}
	return d.copyCall("aclrtMemset", "cuMemsetD8Async", n, true, func() Result {
		return d.lib.cuMemsetD8Async(uint64(ptr), value, n, d.copyStream)
	}, ptr)
}

// GetMemInfo is cuMemGetInfo_v2: the device's free and total memory, for
// every attr (a GPU has one kind of device memory). Other users of the GPU
// move free too.
func (d *Driver) GetMemInfo(attr acl.MemAttr) (free, total uintptr, err error) {
	const op = "aclrtGetMemInfo"
	if err := rules.MemInfo(op, attr); err != nil {
		return 0, 0, err
	}
	if err := d.begin(op); err != nil {
		return 0, 0, err
	}
	defer d.end()
	b, err := d.bind()
	if err != nil {
		return 0, 0, err
	}
	r := d.lib.cuMemGetInfo(&free, &total)
	d.unbind(b)
	if r != ResultSuccess {
		return 0, 0, d.lib.newError("cuMemGetInfo_v2", r)
	}
	return free, total, nil
}

// Close gives everything back: it destroys the events and streams still
// live, unmaps what is still mapped (after cuCtxSynchronize, so that no work
// in flight faults on it), releases the allocations and reservations,
// destroys the driver's own stream, then releases the primary context
// (cuDevicePrimaryCtxRelease_v2). Anything the caller left live is a leak and
// is reported in the error. Close waits for calls in flight; calls after it
// fail with 107002. It is safe to call more than once and on a nil *Driver.
func (d *Driver) Close() error {
	if d == nil {
		return nil
	}
	d.life.Lock()
	defer d.life.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	live := d.liveLocked()
	if !live.Zero() {
		errs = append(errs, fmt.Errorf("cuda driver %s: closed with objects still live: %+v", d.name, live))
	}
	b, err := d.bind()
	if err != nil {
		errs = append(errs, err)
	} else {
		if !live.Zero() {
			errs = append(errs, d.releaseAllLocked(live)...)
		}
		if r := d.lib.cuStreamDestroy(d.copyStream); r != ResultSuccess {
			errs = append(errs, d.lib.newError("cuStreamDestroy_v2", r))
		}
		d.unbind(b)
	}
	d.book.Reset()
	d.handles, d.live = nil, acl.LiveCounts{}
	d.omu.Lock()
	d.streams, d.events, d.gone = nil, nil, handles.Graveyard{}
	d.omu.Unlock()
	if r := d.lib.cuDevicePrimaryCtxRelease(d.dev); r != ResultSuccess {
		errs = append(errs, d.lib.newError("cuDevicePrimaryCtxRelease_v2", r))
	}
	return errors.Join(errs...)
}

// releaseAllLocked destroys every event and stream, unmaps every mapping and
// releases every allocation and reservation still held, on a bound thread.
func (d *Driver) releaseAllLocked(live acl.LiveCounts) []error {
	var errs []error
	check := func(fn string, r Result) {
		if r != ResultSuccess {
			errs = append(errs, d.lib.newError(fn, r))
		}
	}
	if live.Mappings > 0 || live.Streams > 0 {
		// Work still queued must not run on memory about to go. This is the
		// one device-wide wait left in the driver, and only for leaks.
		check("cuCtxSynchronize", d.lib.cuCtxSynchronize())
	}
	d.omu.Lock()
	for _, ev := range d.events {
		check("cuEventDestroy_v2", d.lib.cuEventDestroy(ev.cu))
	}
	for s := range d.streams {
		check("cuStreamDestroy_v2", d.lib.cuStreamDestroy(uintptr(s)))
	}
	d.omu.Unlock()
	for _, r := range d.book.All() {
		for _, m := range r.Maps {
			check("cuMemUnmap", d.lib.cuMemUnmap(uint64(m.Addr), m.Size))
		}
	}
	for _, h := range d.handles {
		if !h.freed {
			check("cuMemRelease", d.lib.cuMemRelease(h.cu))
		}
		d.closeExport(h)
	}
	for _, r := range d.book.All() {
		check("cuMemAddressFree", d.lib.cuMemAddressFree(uint64(r.Base), r.Size))
	}
	for p, n := range d.hostBufs.All() {
		check("cuMemFreeHost", d.lib.cuMemFreeHost(p))
		d.hostBufs.Remove(hostSlice(p, uintptr(n)))
	}
	return errs
}
