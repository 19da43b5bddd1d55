package model

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/book"
	"github.com/vmarena/vmarena/acl/internal/handles"
	"github.com/vmarena/vmarena/acl/internal/hostmem"
	"github.com/vmarena/vmarena/acl/internal/queue"
	"github.com/vmarena/vmarena/acl/internal/rules"
	"github.com/vmarena/vmarena/acl/ipc"
)

// Config configures a model driver. The zero value models the h200 profile
// with its capacity, keeping the bytes written.
type Config struct {
	// Profile is the device to model; nil means the shipped "h200". The
	// driver keeps its own copy.
	Profile *Profile
	// Capacity overrides the profile's device memory in bytes; 0 keeps it.
	Capacity uintptr
	// MaxReserve is the largest ReserveMemAddress one call may make.
	// 0 means 128 GiB, the Ascend driver's limit, as on every driver; at
	// most 64 TiB.
	MaxReserve uintptr
	// Device is the device id the driver answers to.
	Device int32
	// NoData drops the device's bytes: writes, memsets and device-side
	// copies move nothing, and MemcpyDtoH fails with acl.ErrNotSupported
	// (207000) instead of returning bytes nobody wrote. The model's memory
	// is then proportional to its books alone, whatever is written: for
	// measuring at server sizes. By default the model keeps every byte
	// written, on host memory made lazily per physical allocation (see the
	// package documentation), and a read returns what was written.
	NoData bool
	// Untimed charges nothing: the books, the rules and the order of
	// stream work without the modelled time, for tests of logic alone.
	Untimed bool
	// Pessimistic replaces two unmeasured readings of the profile with
	// their pessimistic bounds (the selector's model:NAME,pessimistic): a
	// MemSetAccess over a run of k adjacent mappings costs k one-mapping
	// calls (no saving from the span), and kernel launches are serialised
	// with the calls the profile marks serial, so that a launch waits while
	// another thread maps, sets access or unmaps. Until a device settles
	// them, a figure that holds under both readings does not rest on them.
	Pessimistic bool

	// virtualTime spends no wall time: calls move a virtual clock, which
	// Driver.now reads (spin.go). For tests that measure the model's
	// charges exactly, from one goroutine.
	virtualTime bool
}

// Driver is the device model: the acl.Driver contract with the books and
// rules of the host driver, the device's bytes on host memory (unless
// Config.NoData), and every call charged the time the profile's device takes
// for it. See the package documentation.
//
// Driver is safe for concurrent use.
type Driver struct {
	cfg  Config
	prof *Profile
	cost costs
	caps acl.Caps
	capa uintptr // capacity

	// dev is the device-wide lock that the calls the profile marks serial
	// hold while they spend their host time. It is taken before mu.
	dev        sync.Mutex
	launchWait atomic.Int64 // ns launches waited for dev (LaunchWaitNS)
	charged    atomic.Int64 // modelled ns charged to the calls (ChargedNS)
	virt       *vclock      // the clock of Config.virtualTime; nil for the monotonic clock

	mu      sync.RWMutex // the books; copies and queries share it
	closed  bool
	handles map[acl.PhysicalHandle]*handle
	ids     handles.IDs // handle values, freed ones handed out again as a runtime does
	book    book.Book[resvX, *handle]
	nextVA  uintptr // where the next reservation may start
	phys    uintptr // bytes of live physical allocations
	live    acl.LiveCounts
	imports map[ipc.FileID]*handle // imported memory, by file (share.go)

	data sync.Mutex // the pages of every handle; taken after ss's lock

	ss queues // device work in flight (streams.go); its lock is taken after mu and before data

	hostBufs hostmem.Table // MallocHost's buffers (pinned.go)
}

type handle struct {
	id    acl.PhysicalHandle
	size  uintptr
	page  uintptr // 2 MiB or 1 GiB
	refs  int     // the owners' references plus one per mapping
	freed bool    // FreePhysical dropped the last owner's reference
	pages pages   // written bytes (data.go); nil with Config.NoData, or when shm holds them
	share         // an exportable or imported allocation's memory file (share.go)
}

// resvX is what the model keeps per reservation beyond the books.
type resvX struct {
	imported int // its mappings of imported memory: a reservation holds imported or local memory, never both at once
}

type (
	reservation = book.Reservation[resvX, *handle]
	mapping     = book.Mapping[*handle]
)

// The model's device addresses: reservations are placed upwards from vaBase,
// never reusing an address, so a stale pointer never aliases new memory. At
// 128 GiB per reservation the space lasts for millions of them.
const (
	vaBase  = 0x10_0000_0000_0000
	vaLimit = 0x7f00_0000_0000_0000
)

var (
	_ acl.Driver   = (*Driver)(nil)
	_ acl.Counter  = (*Driver)(nil)
	_ acl.Launcher = (*Driver)(nil)
)

// New returns a model of the device cfg.Profile describes.
func New(cfg Config) (*Driver, error) {
	p := cfg.Profile
	if p == nil {
		var err error
		if p, err = LoadProfile("h200"); err != nil {
			return nil, err
		}
	} else {
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("model: profile %s: %w", p.Name, err)
		}
		p = p.Clone()
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = uintptr(p.Capacity.Value)
	}
	if cfg.MaxReserve == 0 {
		cfg.MaxReserve = acl.MaxReserve
	}
	if cfg.MaxReserve > rules.ReserveCeiling {
		return nil, fmt.Errorf("model: %w: MaxReserve %d is above %d", acl.ErrInvalidParam, cfg.MaxReserve, uintptr(rules.ReserveCeiling))
	}
	if cfg.Device < 0 || cfg.Capacity >= 1<<62 {
		return nil, fmt.Errorf("model: %w: device %d, capacity %d", acl.ErrInvalidParam, cfg.Device, cfg.Capacity)
	}
	fresh, _ := freshness(p.Caps.Fresh.Value)
	d := &Driver{
		cfg:  cfg,
		prof: p,
		capa: cfg.Capacity,
		caps: acl.Caps{AccessSpan: p.Caps.AccessSpan.Value, Fresh: fresh, MaxReserve: cfg.MaxReserve,
			Sharing: sharing, ReadOnly: true},
		handles: make(map[acl.PhysicalHandle]*handle),
		ids:     handles.NewIDs(0x1000),
		nextVA:  vaBase,
	}
	if !cfg.Untimed {
		d.cost = compile(p)
		if cfg.Pessimistic {
			d.cost.pessimistic()
		}
	} else {
		d.cost.gran = uintptr(p.Granularity.Value)
	}
	if cfg.virtualTime {
		d.virt = new(vclock)
	}
	d.ss.Advance = d.advanceLocked
	d.ss.Init()
	return d, nil
}

// Name returns "model:" and the profile's name.
func (d *Driver) Name() string { return "model:" + d.prof.Name }

// Modelled says in one line that the driver's times are modelled, not
// measured, and from which profile. Programs that report times from the
// model print it.
func (d *Driver) Modelled() string {
	s := d.prof.Summary()
	if d.cfg.Untimed {
		s += "; untimed: every call charged nothing"
	}
	if d.cfg.NoData {
		s += "; nodata: keeps no device bytes, reads fail"
	}
	if d.cfg.Pessimistic {
		s += "; pessimistic: an access span costs one call per mapping, launches wait for serial calls"
	}
	return s
}

// Profile returns a copy of the profile the driver models.
func (d *Driver) Profile() *Profile { return d.prof.Clone() }

// Device returns the configured device id.
func (d *Driver) Device() int32 { return d.cfg.Device }

// Caps returns the profile's capabilities.
func (d *Driver) Caps() acl.Caps { return d.caps }

// Capacity returns the modelled device memory in bytes.
func (d *Driver) Capacity() uintptr { return d.capa }

// Live counts the reservations, mappings, physical allocations, streams and
// events the driver holds.
func (d *Driver) Live() acl.LiveCounts {
	d.mu.RLock()
	c := d.live
	d.mu.RUnlock()
	c.HostBuffers, c.HostBytes = d.hostBufs.Live()
	return c
}

const errClosedMsg = "driver closed"

func fail(op string, code int32, format string, args ...any) error {
	return acl.Errorf(op, code, format, args...)
}

// begin starts the modelled time of a call of kind k: it takes the device
// lock if the profile says the device serialises such calls, and returns
// the start of the call's time.
func (d *Driver) begin(k call) int64 {
	if d.cost.serial[k] {
		if k == cLaunch {
			// A serial launch (the pessimistic reading): count what it
			// waits for other threads' serial calls.
			t := d.now()
			d.dev.Lock()
			t0 := d.now()
			d.launchWait.Add(t0 - t)
			return t0
		}
		d.dev.Lock()
	}
	return d.now()
}

// LaunchWaitNS returns the time kernel launches have spent waiting for the
// device lock that serial calls hold: always 0 unless Config.Pessimistic
// makes launches serial. It is how a caller tells the delay the pessimistic
// reading adds to its launches from its host's own jitter.
func (d *Driver) LaunchWaitNS() int64 { return d.launchWait.Load() }

// ChargedNS returns the modelled time charged to the calls made so far, on
// every goroutine: the sum of each call's host time and the transfer or
// device work that follows it, as the profile prices them. Unlike the wall
// time a caller measures around the calls, it does not depend on how the
// host ran them (another process's load, the scheduler), so two sequences
// of calls compare exactly; the time a synchronising call spends waiting for
// queued work is not in it (that work's own cost is not charged to a call).
func (d *Driver) ChargedNS() int64 { return d.charged.Load() }

// end spends the call's host time, until t0+host, releases the device lock,
// and then waits out the device time or transfer that follows (never under
// the lock).
func (d *Driver) end(k call, t0, host, after int64) {
	d.charged.Add(host + max(after, 0))
	d.waitUntil(t0 + host)
	if d.cost.serial[k] {
		d.dev.Unlock()
	}
	if after > 0 {
		d.waitUntil(t0 + host + after)
	}
}

// charge spends the base cost of a call of kind k that starts now.
func (d *Driver) charge(k call) {
	d.end(k, d.begin(k), d.cost.base[k], 0)
}

// timed runs fn as the work of a call of kind k that costs its base.
func (d *Driver) timed(k call, fn func()) {
	t0 := d.begin(k)
	fn()
	d.end(k, t0, d.cost.base[k], 0)
}

func (d *Driver) pageOf(attr acl.MemAttr) uintptr {
	if attr.Huge1G() {
		return acl.Huge1GPageSize
	}
	return d.cost.gran
}

// MemGetAllocationGranularity returns the profile's granularity, or 1 GiB
// for the HUGE1G attributes, for both options.
func (d *Driver) MemGetAllocationGranularity(prop *acl.PhysicalMemProp, option acl.MemGranularityOptions) (uintptr, error) {
	const op = "aclrtMemGetAllocationGranularity"
	t0 := d.begin(cGranularity)
	g, err := d.granularity(op, prop, option)
	d.end(cGranularity, t0, d.cost.base[cGranularity], 0)
	return g, err
}

func (d *Driver) granularity(op string, prop *acl.PhysicalMemProp, option acl.MemGranularityOptions) (uintptr, error) {
	if _, err := rules.ExportableProp(op, prop, d.cfg.Device, "model"); err != nil {
		return 0, err
	}
	if err := rules.GranularityOption(op, option); err != nil {
		return 0, err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	return d.pageOf(prop.MemAttr), nil
}

// MallocPhysical books size bytes of the modelled capacity; it fails with
// 207001 past it.
func (d *Driver) MallocPhysical(size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	const op = "aclrtMallocPhysical"
	t0 := d.begin(cMalloc)
	h, n, err := d.malloc(op, size, prop, flags)
	d.end(cMalloc, t0, d.cost.host(cMalloc, n), 0)
	return h, err
}

func (d *Driver) malloc(op string, size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, uintptr, error) {
	posix, prop := rules.Exportable(prop)
	size, err := rules.Malloc(op, size, prop, flags, d.cfg.Device, "model", d.pageOf)
	if err != nil {
		return 0, 0, err
	}
	if posix && sharing == acl.SharingNone {
		return 0, 0, fail(op, acl.ErrCodeRTFeatureNotSupport, "the device model shares memory only on Linux")
	}
	h := &handle{size: size, page: d.pageOf(prop.MemAttr), refs: 1, share: share{owners: 1}}
	if posix {
		if err := d.mallocOwn(h); err != nil {
			return 0, 0, fail(op, acl.ErrCodeRTResourceAllocFail, "memory file for an exportable allocation: %v", err)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		d.closeOwnLocked(h)
		return 0, 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	if size > d.capa || d.phys > d.capa-size {
		d.closeOwnLocked(h)
		return 0, 0, fail(op, acl.ErrCodeRTMemoryAllocation, "out of memory: %d bytes asked, %d of %d free", size, d.capa-d.phys, d.capa)
	}
	h.id = d.ids.New()
	d.handles[h.id] = h
	d.phys += size
	d.live.Handles++
	d.live.PhysicalBytes += size
	return h.id, size, nil
}

// FreePhysical drops the owner's reference to h; the memory goes back when
// no mapping of it remains.
func (d *Driver) FreePhysical(id acl.PhysicalHandle) error {
	const op = "aclrtFreePhysical"
	t0 := d.begin(cFree)
	n, err := d.free(op, id)
	d.end(cFree, t0, d.cost.host(cFree, n), 0)
	return err
}

func (d *Driver) free(op string, id acl.PhysicalHandle) (uintptr, error) {
	if id == 0 {
		return 0, fail(op, acl.ErrCodeInvalidParam, "handle is NULL")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	h, ok := d.handles[id]
	switch {
	case d.closed:
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	case !ok:
		return 0, fail(op, acl.ErrCodeRTInvalidHandle, "handle %#x is not a live physical allocation", uintptr(id))
	case h.freed:
		return 0, fail(op, acl.ErrCodeRTParamInvalid, "handle %#x freed too many times (it is still mapped)", uintptr(id))
	}
	if h.owners--; h.owners == 0 {
		h.freed = true
		d.live.Handles--
		if h.imported {
			d.live.Imported--
		}
	}
	d.unrefLocked(h)
	return h.size, nil
}

// unrefLocked drops one reference to h, giving its memory back at the last.
func (d *Driver) unrefLocked(h *handle) {
	h.refs--
	if h.refs > 0 {
		return
	}
	delete(d.handles, h.id)
	d.ids.Free(h.id)
	h.pages = nil // the host memory behind its bytes goes with it
	d.closeOwnLocked(h)
	d.phys -= h.size
	d.live.PhysicalBytes -= h.size
	if h.imported {
		d.live.ImportedBytes -= h.size
	}
}

// ReserveMemAddress reserves size bytes (rounded up to the granularity) of
// modelled address space, aligned to the granularity, or to 1 GiB when size
// is at least 1 GiB.
func (d *Driver) ReserveMemAddress(size, alignment uintptr, expect acl.DevicePtr, flags uint64) (acl.DevicePtr, error) {
	const op = "aclrtReserveMemAddress"
	t0 := d.begin(cReserve)
	p, n, err := d.reserve(op, size, alignment, expect, flags)
	d.end(cReserve, t0, d.cost.host(cReserve, n), 0)
	return p, err
}

func (d *Driver) reserve(op string, size, alignment uintptr, expect acl.DevicePtr, flags uint64) (acl.DevicePtr, uintptr, error) {
	if err := rules.Reserve(op, size, alignment, expect, flags, d.cfg.MaxReserve); err != nil {
		return 0, 0, err
	}
	g := d.cost.gran
	size = (size + g - 1) &^ (g - 1)
	align := g
	if size >= acl.Huge1GPageSize {
		align = acl.Huge1GPageSize
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	base := (d.nextVA + align - 1) &^ (align - 1)
	if size > vaLimit || base > vaLimit-size {
		return 0, 0, fail(op, acl.ErrCodeRTMemoryAllocation, "modelled address space exhausted")
	}
	d.nextVA = base + size
	d.book.Add(&reservation{Base: base, Size: size})
	d.live.Reservations++
	d.live.ReservedBytes += size
	return acl.DevicePtr(base), size, nil
}

// ReleaseMemAddress gives back the reservation at base, which must have no
// mappings left.
func (d *Driver) ReleaseMemAddress(base acl.DevicePtr) error {
	const op = "aclrtReleaseMemAddress"
	t0 := d.begin(cRelease)
	n, err := d.release(op, base)
	d.end(cRelease, t0, d.cost.host(cRelease, n), 0)
	return err
}

func (d *Driver) release(op string, base acl.DevicePtr) (uintptr, error) {
	if base == 0 {
		return 0, fail(op, acl.ErrCodeInvalidParam, "virPtr is NULL")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	r, err := d.book.Releasable(op, base)
	if err != nil {
		return 0, err
	}
	d.book.Forget(r)
	d.live.Reservations--
	d.live.ReservedBytes -= r.Size
	return r.Size, nil
}

// MapMem maps the whole physical allocation h at ptr, without access until
// MemSetAccess.
func (d *Driver) MapMem(ptr acl.DevicePtr, size, offset uintptr, id acl.PhysicalHandle, flags uint64) error {
	const op = "aclrtMapMem"
	t0 := d.begin(cMap)
	n, err := d.mapMem(op, ptr, size, offset, id, flags)
	d.end(cMap, t0, d.cost.host(cMap, n), 0)
	return err
}

func (d *Driver) mapMem(op string, ptr acl.DevicePtr, size, offset uintptr, id acl.PhysicalHandle, flags uint64) (uintptr, error) {
	if err := rules.Map(op, ptr, size, offset, id, flags); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	h, ok := d.handles[id]
	if !ok || h.freed {
		return 0, fail(op, acl.ErrCodeRTInvalidHandle, "handle %#x is not a live physical allocation", uintptr(id))
	}
	if err := rules.MapFits(op, ptr, size, h.size, h.page); err != nil {
		return 0, err
	}
	r, i, err := d.book.Place(op, ptr, size)
	if err != nil {
		return 0, err
	}
	if err := rules.MapSource(op, h.imported, r.X.imported, len(r.Maps)); err != nil {
		return 0, err
	}
	r.Insert(i, &mapping{Addr: uintptr(ptr), Size: size, H: h})
	if h.imported {
		r.X.imported++
	}
	h.refs++
	d.live.Mappings++
	d.live.MappedBytes += size
	return size, nil
}

// UnmapMem removes the mapping that starts at ptr. Like a device it does not
// wait for work in flight: work still touching the range faults.
func (d *Driver) UnmapMem(ptr acl.DevicePtr) error {
	const op = "aclrtUnmapMem"
	t0 := d.begin(cUnmap)
	n, err := d.unmap(op, ptr)
	d.end(cUnmap, t0, d.cost.host(cUnmap, n), 0)
	return err
}

func (d *Driver) unmap(op string, ptr acl.DevicePtr) (uintptr, error) {
	if ptr == 0 {
		return 0, fail(op, acl.ErrCodeInvalidParam, "virPtr is NULL")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	r, i, m := d.book.Mapping(ptr)
	if m == nil {
		return 0, fail(op, acl.ErrCodeRTDrvInternal, "%v is not the start of a mapping", ptr)
	}
	d.ss.FaultUnmap(m.Addr, m.Addr+m.Size)
	r.Remove(i)
	if m.H.imported {
		r.X.imported--
	}
	d.live.Mappings--
	d.live.MappedBytes -= m.Size
	d.unrefLocked(m.H)
	return m.Size, nil
}

// MemSetAccess grants read-write access (or, with MemAccessRead, read-only
// access: writes to the mapping are then refused) to the mapping at
// [ptr, ptr+size), or, where the profile allows spans, to the run of
// adjacent mappings that covers it exactly.
func (d *Driver) MemSetAccess(ptr acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc) error {
	const op = "aclrtMemSetAccess"
	t0 := d.begin(cAccess)
	n, maps, err := d.access(op, ptr, size, desc)
	host := d.cost.host(cAccess, n)
	if maps > 1 {
		host += int64(maps-1) * d.cost.perMapping
	}
	d.end(cAccess, t0, host, 0)
	return err
}

func (d *Driver) access(op string, ptr acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc) (uintptr, int, error) {
	if err := rules.AccessFlags(op, ptr, size, desc, d.cfg.Device, true, true); err != nil {
		return 0, 0, err
	}
	ro := rules.ReadOnly(desc)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	r, i, m := d.book.Mapping(ptr)
	if m == nil || m.Size > size || (m.Size != size && !d.caps.AccessSpan) {
		return 0, 0, fail(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) is not exactly one mapping", ptr, size)
	}
	j, end := i, m.Addr
	for end < uintptr(ptr)+size {
		if j == len(r.Maps) || r.Maps[j].Addr != end {
			return 0, 0, fail(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) is not a run of adjacent mappings: nothing is mapped at %#x", ptr, size, end)
		}
		end += r.Maps[j].Size
		j++
	}
	if end != uintptr(ptr)+size {
		return 0, 0, fail(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) ends inside the mapping at %#x", ptr, size, r.Maps[j-1].Addr)
	}
	for k := i; k < j; k++ {
		if m := r.Maps[k]; m.H.readOnly && !ro {
			return 0, 0, fail(op, acl.ErrCodeRTParamInvalid, "the mapping at %#x is of memory imported read-only: it cannot be made writable", m.Addr)
		}
	}
	for k := i; k < j; k++ {
		r.Maps[k].Access, r.Maps[k].ReadOnly = true, ro
	}
	return size, j - i, nil
}

// accessibleLocked checks that [ptr, ptr+n) is mapped with access
// throughout, and returns its reservation. Call with mu held.
func (d *Driver) accessibleLocked(op string, ptr acl.DevicePtr, n uintptr) (*reservation, error) {
	if d.closed {
		return nil, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	return d.book.Accessible(op, ptr, n)
}

// The copies check the books and the work in flight, move the bytes (in
// unless Config.NoData), and then spend their time: the call's base cost, under the
// device lock if the profile says so, and the transfer at the profile's
// bandwidth, or the device work for the device-side copy and memset.

// MemcpyHtoD copies src to device memory at dst, at the pinned bandwidth
// when src lies in a MallocHost buffer. With Config.NoData the bytes go
// nowhere.
func (d *Driver) MemcpyHtoD(dst acl.DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	const op = "aclrtMemcpy"
	n := uintptr(len(src))
	perByte := d.cost.htod
	if d.hostBufs.Holds(src) {
		perByte = d.cost.pinnedHtoD
	}
	t0 := d.begin(cHtoD)
	err := d.syncAccess(op, dst, n, true, 0, 0, func(r *reservation) { d.writeData(r, uintptr(dst), src) })
	d.end(cHtoD, t0, d.cost.base[cHtoD], ok(err, nanos(perByte*float64(n))))
	return err
}

// MemcpyDtoH copies device memory at src into dst, at the pinned bandwidth
// when dst lies in a MallocHost buffer. With Config.NoData the
// model holds no bytes to read: after checking the range and spending the
// copy's modelled time it fails with 207000 (acl.ErrNotSupported) and leaves
// dst as it was.
func (d *Driver) MemcpyDtoH(dst []byte, src acl.DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	const op = "aclrtMemcpy"
	n := uintptr(len(dst))
	perByte := d.cost.dtoh
	if d.hostBufs.Holds(dst) {
		perByte = d.cost.pinnedDtoH
	}
	t0 := d.begin(cDtoH)
	err := d.syncAccess(op, src, n, false, 0, 0, func(r *reservation) { d.readData(r, uintptr(src), dst) })
	// Without data the modelled device still copies (the call costs its
	// transfer, so that timings match), but there is nothing to return.
	d.end(cDtoH, t0, d.cost.base[cDtoH], ok(err, nanos(perByte*float64(n))))
	if err == nil && d.cfg.NoData {
		err = fail(op, acl.ErrCodeRTFeatureNotSupport, "%s", errNoData)
	}
	return err
}

// MemcpyDtoD copies n bytes of device memory from src to dst, as device
// work that moves 2n bytes.
func (d *Driver) MemcpyDtoD(dst, src acl.DevicePtr, n uintptr) error {
	if n == 0 {
		return nil
	}
	const op = "aclrtMemcpy"
	t0 := d.begin(cDtoD)
	err := d.syncAccess(op, src, n, false, dst, n, func(r *reservation) { d.copyData(dst, src, n) })
	d.end(cDtoD, t0, d.cost.base[cDtoD], ok(err, d.cost.device(2*n)))
	return err
}

// Memset sets n bytes of device memory at ptr to value, as device work that
// moves n bytes.
func (d *Driver) Memset(ptr acl.DevicePtr, value byte, n uintptr) error {
	if n == 0 {
		return nil
	}
	const op = "aclrtMemset"
	t0 := d.begin(cMemset)
	err := d.syncAccess(op, ptr, n, true, 0, 0, func(r *reservation) { d.fillData(r, uintptr(ptr), n, value) })
	d.end(cMemset, t0, d.cost.base[cMemset], ok(err, d.cost.device(n)))
	return err
}

// ok returns t if err is nil, else 0: a failed copy moves nothing.
func ok(err error, t int64) int64 {
	if err != nil {
		return 0
	}
	return t
}

// syncAccess checks a synchronous call's device ranges ([a, a+an), written
// when wa is set, and, when bn > 0, [b, b+bn), written), records a fault if
// queued work will still write them, and, unless Config.NoData, runs move
// with the first range's reservation under the data lock. A write to a
// read-only mapping is refused with 107000, where a device would fault.
func (d *Driver) syncAccess(op string, a acl.DevicePtr, an uintptr, wa bool, b acl.DevicePtr, bn uintptr, move func(*reservation)) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	r, err := d.accessibleLocked(op, a, an)
	if err == nil && wa {
		r, err = d.book.Writable(op, a, an)
	}
	if err != nil {
		return err
	}
	if bn > 0 {
		if _, err := d.accessibleLocked(op, b, bn); err != nil {
			return err
		}
		if _, err := d.book.Writable(op, b, bn); err != nil {
			return err
		}
	}
	d.ss.FaultRace(queue.Range{Lo: uintptr(a), Hi: uintptr(a) + an})
	if bn > 0 { // one fault per range, as the host driver counts them
		d.ss.FaultRace(queue.Range{Lo: uintptr(b), Hi: uintptr(b) + bn})
	}
	if d.cfg.NoData {
		return nil
	}
	d.data.Lock()
	defer d.data.Unlock()
	move(r)
	return nil
}

// GetMemInfo reports the capacity and what is not allocated of it, for
// every attribute.
func (d *Driver) GetMemInfo(attr acl.MemAttr) (free, total uintptr, err error) {
	const op = "aclrtGetMemInfo"
	t0 := d.begin(cMemInfo)
	free, total, err = d.memInfo(op, attr)
	d.end(cMemInfo, t0, d.cost.base[cMemInfo], 0)
	return free, total, err
}

func (d *Driver) memInfo(op string, attr acl.MemAttr) (free, total uintptr, err error) {
	if err := rules.MemInfo(op, attr); err != nil {
		return 0, 0, err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return 0, 0, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	return d.capa - d.phys, d.capa, nil
}

// Close gives the modelled device back. It reports what was still live, and
// device work still queued, since those are leaks in the caller. It charges
// nothing and is safe to call more than once.
func (d *Driver) Close() error {
	if d == nil {
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
	if n := d.ss.Stop(); n > 0 {
		errs = append(errs, fmt.Errorf("model driver: closed with %d pieces of device work still queued", n))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.live
	c.HostBuffers, c.HostBytes = d.hostBufs.Live()
	if !c.Zero() {
		errs = append(errs, fmt.Errorf("model driver: closed with objects still live: %+v", c))
	}
	for _, h := range d.handles {
		d.closeOwnLocked(h) // leaked, and reported above: the files at least go
	}
	d.book.Reset()
	d.handles = nil
	return errors.Join(errs...)
}
