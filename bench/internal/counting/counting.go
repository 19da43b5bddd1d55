// Package counting wraps an acl.Driver to count and time every call, and to
// keep the books the benchmark suite reports: physical bytes held, bytes
// mapped, bytes copied on the device, each with its high-water mark.
//
// Optionally it enforces a budget on physical bytes, so that strategies that
// have no budget of their own run under the same memory limit as an arena's
// chunk pool.
package counting

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmarena/vmarena/acl"
)

// Op is one kind of driver call.
type Op int

// The driver calls, in the order of acl.Driver.
const (
	Granularity Op = iota
	MallocPhysical
	FreePhysical
	Reserve
	Release
	Map
	Unmap
	SetAccess
	HtoD
	DtoH
	DtoD
	Memset
	MemInfo
	CreateStream
	DestroyStream
	SyncStream
	SyncDevice
	CreateEvent
	RecordEvent
	QueryEvent
	SyncEvent
	DestroyEvent
	MemsetAsync
	NumOps
)

var opNames = [NumOps]string{
	"granularity", "malloc", "free", "reserve", "release", "map", "unmap",
	"access", "htod", "dtoh", "dtod", "memset", "meminfo",
	"stream+", "stream-", "sync-stream", "sync-device", "event+", "record", "query", "sync-event", "event-",
	"memset-async",
}

// Memory ops are the calls that allocate, map or clear memory: what an
// allocator's speed is made of (not the data copies a workload makes, nor
// the stream and event calls).
var MemoryOps = []Op{MallocPhysical, FreePhysical, Reserve, Release, Map, Unmap, SetAccess, Memset, MemsetAsync, DtoD}

// String returns the short name of the call, e.g. "malloc".
func (o Op) String() string {
	if o < 0 || o >= NumOps {
		return fmt.Sprintf("op(%d)", int(o))
	}
	return opNames[o]
}

// Calls counts driver calls, and the time spent in them, by kind.
type Calls struct {
	N  [NumOps]int64 // calls of each kind
	NS [NumOps]int64 // nanoseconds inside the driver, by kind
}

// Sum returns the calls and nanoseconds of the given kinds.
func (c Calls) Sum(ops ...Op) (n, ns int64) {
	for _, o := range ops {
		n += c.N[o]
		ns += c.NS[o]
	}
	return n, ns
}

// Total returns the number of calls and nanoseconds over every kind.
func (c Calls) Total() (n, ns int64) {
	for i := range c.N {
		n += c.N[i]
		ns += c.NS[i]
	}
	return n, ns
}

// Map returns the non-zero counts by name, for JSON.
func (c Calls) Map() map[string][2]int64 {
	m := make(map[string][2]int64)
	for i := range c.N {
		if c.N[i] != 0 {
			m[Op(i).String()] = [2]int64{c.N[i], c.NS[i]}
		}
	}
	return m
}

// Memory is the bookkeeping of one moment.
type Memory struct {
	Physical     int64 // physical bytes held (allocated, not yet freed)
	PeakPhysical int64 // the most Physical ever was
	Mapped       int64 // bytes mapped
	PeakMapped   int64 // the most Mapped ever was
	Copied       int64 // bytes copied device to device
	Written      int64 // bytes copied host to device

	// The shape of what the strategy did with its mappings, over the run
	// (what -quick must exercise as the full run does):
	MaxMappings int64 // the most mappings one reservation held at once
	MaxMapBatch int64 // the most MapMem calls made in a row before a MemSetAccess granted access
	Remaps      int64 // MapMem calls at an address unmapped earlier in the same reservation: regrowth after a shrink
}

// Driver counts and times the calls it passes on to the wrapped driver.
// It is safe for concurrent use.
type Driver struct {
	acl.Driver

	n, ns  [NumOps]atomic.Int64
	total  atomic.Int64 // ns inside the driver over every call, for snapshots
	selfNS atomic.Int64 // ns the wrapper spends on its own books, outside the timed calls

	// Calls made while the workload is inside a strategy call (Window).
	// With the caller's thread known (ByThread, on Linux) they are the
	// calls made on that thread, the caller's critical path exactly, and
	// the others made meanwhile (the pool's worker's) are counted beside
	// it (BesideCalls); without it every call made inside the window
	// counts, an upper bound of the caller's own.
	window      atomic.Bool
	caller      atomic.Int64 // the OS thread the caller holds during a window (ByThread); 0: not known
	thread      func() int64 // the calling OS thread's id (ByThread); read only once caller is seen set
	byThread    bool         // ByThread was called (the caller's goroutine's alone, as held)
	held        bool         // the caller holds its thread: a window is open (ByThread)
	winN, winNS [NumOps]atomic.Int64
	besN, besNS [NumOps]atomic.Int64

	budget int64

	mu       sync.Mutex
	handles  map[acl.PhysicalHandle]*handle
	maps     map[acl.DevicePtr]mapping
	resv     map[acl.DevicePtr]*reservation // by base
	unmapped map[acl.DevicePtr]bool         // addresses unmapped in a live reservation
	batch    int64                          // MapMem calls since the last MemSetAccess
	mem      Memory
	claimed  int64 // bytes of MallocPhysical calls in flight
}

// reservation is a live reservation and how many mappings it holds.
type reservation struct {
	size uintptr
	maps int64
}

type handle struct {
	size  int64
	refs  int // owner + one per mapping
	freed bool
}

type mapping struct {
	size int64
	h    acl.PhysicalHandle
}

var _ acl.Driver = (*Driver)(nil)

// New wraps d. A budget above 0 makes MallocPhysical fail with ACL's
// out-of-memory code once the physical bytes held would pass it.
func New(d acl.Driver, budget int64) *Driver {
	return &Driver{
		Driver:   d,
		budget:   budget,
		handles:  make(map[acl.PhysicalHandle]*handle),
		maps:     make(map[acl.DevicePtr]mapping),
		resv:     make(map[acl.DevicePtr]*reservation),
		unmapped: make(map[acl.DevicePtr]bool),
	}
}

// reservationOfLocked returns the live reservation holding ptr, or nil.
func (d *Driver) reservationOfLocked(ptr acl.DevicePtr) *reservation {
	for base, r := range d.resv {
		if ptr >= base && uintptr(ptr-base) < r.size {
			return r
		}
	}
	return nil
}

// Unwrap returns the wrapped driver.
func (d *Driver) Unwrap() acl.Driver { return d.Driver }

// Calls returns the counts and times so far.
func (d *Driver) Calls() Calls { return load(&d.n, &d.ns) }

// DriverNS returns the nanoseconds spent inside the driver so far, over
// every call. The difference of two readings is the driver time of what ran
// between them.
func (d *Driver) DriverNS() int64 { return d.total.Load() }

// SelfNS returns the nanoseconds the wrapper spent on its own bookkeeping so
// far: time that is neither the caller's nor the driver's.
func (d *Driver) SelfNS() int64 { return d.selfNS.Load() }

// CallCount returns the number of calls so far, over every kind.
func (d *Driver) CallCount() int64 {
	var n int64
	for i := range d.n {
		n += d.n[i].Load()
	}
	return n
}

// Memory returns the bookkeeping now.
func (d *Driver) Memory() Memory {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mem
}

// ResetPeaks sets the high-water marks to the present values.
func (d *Driver) ResetPeaks() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mem.PeakPhysical = d.mem.Physical
	d.mem.PeakMapped = d.mem.Mapped
}

// done records a call of op that ran from start until now, and returns now.
func (d *Driver) done(op Op, start time.Time) time.Time {
	end := time.Now()
	ns := int64(end.Sub(start))
	d.n[op].Add(1)
	d.ns[op].Add(ns)
	d.total.Add(ns)
	if d.window.Load() {
		if t := d.caller.Load(); t == 0 || d.thread() == t {
			d.winN[op].Add(1)
			d.winNS[op].Add(ns)
		} else {
			d.besN[op].Add(1)
			d.besNS[op].Add(ns)
		}
	}
	return end
}

// Window marks whether the workload is inside a strategy call now: calls
// made meanwhile count as on the caller's path (WindowCalls). With
// ByThread, the goroutine that opens a window is the caller: it is held on
// its OS thread until it closes the window, and only the calls made on that
// thread count as its own.
func (d *Driver) Window(in bool) {
	if !in {
		d.window.Store(false)
		if d.held {
			d.held = false
			d.caller.Store(0)
			runtime.UnlockOSThread()
		}
		return
	}
	if d.byThread && !d.held {
		runtime.LockOSThread() // no other goroutine runs on it until the window closes
		d.held = true
		d.caller.Store(d.thread()) // after thread was set: whoever sees caller set may call it
	}
	d.window.Store(true)
}

// ByThread makes the windows tell the caller's calls (WindowCalls) from
// those other threads make meanwhile (BesideCalls), by the thread that
// makes them, as id names it (the calling OS thread's id; the bench's
// program asks the operating system, which this package does not), and
// reports whether it can: not when id is nil or returns 0, and then every
// call inside a window counts as the caller's. Call it before the first
// window, from the goroutine that opens them.
func (d *Driver) ByThread(id func() int64) bool {
	d.byThread = id != nil && id() != 0
	if d.byThread {
		d.thread = id
	}
	return d.byThread
}

// WindowCalls returns the calls made inside the workload's strategy calls
// so far: the caller's critical path (with ByThread), or that and
// whatever background call overlapped it (without).
func (d *Driver) WindowCalls() Calls { return load(&d.winN, &d.winNS) }

// BesideCalls returns the calls other threads made while the workload was
// inside a strategy call, with ByThread: the background work that ran
// beside the caller's path.
func (d *Driver) BesideCalls() Calls { return load(&d.besN, &d.besNS) }

func load(n, ns *[NumOps]atomic.Int64) Calls {
	var c Calls
	for i := range c.N {
		c.N[i] = n[i].Load()
		c.NS[i] = ns[i].Load()
	}
	return c
}

// timed runs a call of kind op and records it.
func (d *Driver) timed(op Op, call func() error) error {
	start := time.Now()
	err := call()
	d.self(d.done(op, start))
	return err
}

// self adds the wrapper's own time since end (its bookkeeping after a call).
func (d *Driver) self(end time.Time) { d.selfNS.Add(int64(time.Since(end))) }

// MemGetAllocationGranularity passes the call on.
func (d *Driver) MemGetAllocationGranularity(prop *acl.PhysicalMemProp, option acl.MemGranularityOptions) (uintptr, error) {
	defer func(start time.Time) { d.self(d.done(Granularity, start)) }(time.Now())
	return d.Driver.MemGetAllocationGranularity(prop, option)
}

// MallocPhysical passes the call on, unless it would pass the budget.
func (d *Driver) MallocPhysical(size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	pre := time.Now()
	d.mu.Lock()
	if d.budget > 0 && d.mem.Physical+d.claimed+int64(size) > d.budget {
		held := d.mem.Physical + d.claimed
		d.mu.Unlock()
		return 0, acl.Errorf("aclrtMallocPhysical", acl.ErrCodeRTMemoryAllocation,
			"bench budget: %d bytes asked, %d of %d held", size, held, d.budget)
	}
	d.claimed += int64(size) // so that concurrent calls see it
	d.mu.Unlock()

	start := time.Now()
	d.selfNS.Add(int64(start.Sub(pre)))
	h, err := d.Driver.MallocPhysical(size, prop, flags)
	end := d.done(MallocPhysical, start)
	defer d.self(end)

	d.mu.Lock()
	defer d.mu.Unlock()
	d.claimed -= int64(size)
	if err == nil {
		d.handles[h] = &handle{size: int64(size), refs: 1}
		d.mem.Physical += int64(size)
		d.mem.PeakPhysical = max(d.mem.PeakPhysical, d.mem.Physical)
	}
	return h, err
}

// unrefLocked drops a reference to h and forgets it, and its bytes, with the
// last one.
func (d *Driver) unrefLocked(id acl.PhysicalHandle, h *handle) {
	h.refs--
	if h.refs == 0 {
		delete(d.handles, id)
		d.mem.Physical -= h.size
	}
}

// FreePhysical passes the call on.
func (d *Driver) FreePhysical(h acl.PhysicalHandle) error {
	start := time.Now()
	err := d.Driver.FreePhysical(h)
	end := d.done(FreePhysical, start)
	defer d.self(end)
	if err == nil {
		d.mu.Lock()
		if x, ok := d.handles[h]; ok && !x.freed {
			x.freed = true
			d.unrefLocked(h, x)
		}
		d.mu.Unlock()
	}
	return err
}

// ReserveMemAddress passes the call on.
func (d *Driver) ReserveMemAddress(size, alignment uintptr, expect acl.DevicePtr, flags uint64) (acl.DevicePtr, error) {
	start := time.Now()
	base, err := d.Driver.ReserveMemAddress(size, alignment, expect, flags)
	end := d.done(Reserve, start)
	defer d.self(end)
	if err == nil {
		d.mu.Lock()
		d.resv[base] = &reservation{size: size}
		d.mu.Unlock()
	}
	return base, err
}

// ReleaseMemAddress passes the call on.
func (d *Driver) ReleaseMemAddress(base acl.DevicePtr) error {
	start := time.Now()
	err := d.Driver.ReleaseMemAddress(base)
	end := d.done(Release, start)
	defer d.self(end)
	if err == nil {
		d.mu.Lock()
		if r := d.resv[base]; r != nil {
			for p := range d.unmapped {
				if p >= base && uintptr(p-base) < r.size {
					delete(d.unmapped, p) // a later reservation may lie here
				}
			}
			delete(d.resv, base)
		}
		d.mu.Unlock()
	}
	return err
}

// MapMem passes the call on.
func (d *Driver) MapMem(ptr acl.DevicePtr, size, offset uintptr, h acl.PhysicalHandle, flags uint64) error {
	start := time.Now()
	err := d.Driver.MapMem(ptr, size, offset, h, flags)
	end := d.done(Map, start)
	defer d.self(end)
	if err == nil {
		d.mu.Lock()
		d.maps[ptr] = mapping{size: int64(size), h: h}
		if x, ok := d.handles[h]; ok {
			x.refs++
		}
		d.mem.Mapped += int64(size)
		d.mem.PeakMapped = max(d.mem.PeakMapped, d.mem.Mapped)
		if r := d.reservationOfLocked(ptr); r != nil {
			r.maps++
			d.mem.MaxMappings = max(d.mem.MaxMappings, r.maps)
		}
		if d.unmapped[ptr] {
			delete(d.unmapped, ptr)
			d.mem.Remaps++
		}
		d.batch++
		d.mem.MaxMapBatch = max(d.mem.MaxMapBatch, d.batch)
		d.mu.Unlock()
	}
	return err
}

// UnmapMem passes the call on.
func (d *Driver) UnmapMem(ptr acl.DevicePtr) error {
	start := time.Now()
	err := d.Driver.UnmapMem(ptr)
	end := d.done(Unmap, start)
	defer d.self(end)
	if err == nil {
		d.mu.Lock()
		if m, ok := d.maps[ptr]; ok {
			delete(d.maps, ptr)
			d.mem.Mapped -= m.size
			if x, ok := d.handles[m.h]; ok {
				d.unrefLocked(m.h, x)
			}
		}
		if r := d.reservationOfLocked(ptr); r != nil {
			r.maps--
			d.unmapped[ptr] = true
		}
		d.mu.Unlock()
	}
	return err
}

// MemSetAccess passes the call on.
func (d *Driver) MemSetAccess(ptr acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc) error {
	start := time.Now()
	err := d.Driver.MemSetAccess(ptr, size, desc)
	end := d.done(SetAccess, start)
	defer d.self(end)
	d.mu.Lock()
	d.batch = 0
	d.mu.Unlock()
	return err
}

// MemcpyHtoD passes the call on and counts the bytes written.
func (d *Driver) MemcpyHtoD(dst acl.DevicePtr, src []byte) error {
	start := time.Now()
	err := d.Driver.MemcpyHtoD(dst, src)
	end := d.done(HtoD, start)
	defer d.self(end)
	if err == nil {
		d.mu.Lock()
		d.mem.Written += int64(len(src))
		d.mu.Unlock()
	}
	return err
}

// MemcpyDtoH passes the call on.
func (d *Driver) MemcpyDtoH(dst []byte, src acl.DevicePtr) error {
	defer func(start time.Time) { d.self(d.done(DtoH, start)) }(time.Now())
	return d.Driver.MemcpyDtoH(dst, src)
}

// MemcpyDtoD passes the call on and counts the bytes copied.
func (d *Driver) MemcpyDtoD(dst, src acl.DevicePtr, n uintptr) error {
	start := time.Now()
	err := d.Driver.MemcpyDtoD(dst, src, n)
	end := d.done(DtoD, start)
	defer d.self(end)
	if err == nil {
		d.mu.Lock()
		d.mem.Copied += int64(n)
		d.mu.Unlock()
	}
	return err
}

// Memset passes the call on.
func (d *Driver) Memset(ptr acl.DevicePtr, value byte, n uintptr) error {
	defer func(start time.Time) { d.self(d.done(Memset, start)) }(time.Now())
	return d.Driver.Memset(ptr, value, n)
}

// GetMemInfo passes the call on.
func (d *Driver) GetMemInfo(attr acl.MemAttr) (free, total uintptr, err error) {
	defer func(start time.Time) { d.self(d.done(MemInfo, start)) }(time.Now())
	return d.Driver.GetMemInfo(attr)
}

// CreateStream passes the call on.
func (d *Driver) CreateStream() (s acl.Stream, err error) {
	err = d.timed(CreateStream, func() (e error) { s, e = d.Driver.CreateStream(); return e })
	return s, err
}

// DestroyStream passes the call on.
func (d *Driver) DestroyStream(s acl.Stream) error {
	return d.timed(DestroyStream, func() error { return d.Driver.DestroyStream(s) })
}

// SynchronizeStream passes the call on.
func (d *Driver) SynchronizeStream(s acl.Stream) error {
	return d.timed(SyncStream, func() error { return d.Driver.SynchronizeStream(s) })
}

// SynchronizeDevice passes the call on.
func (d *Driver) SynchronizeDevice() error {
	return d.timed(SyncDevice, func() error { return d.Driver.SynchronizeDevice() })
}

// CreateEvent passes the call on.
func (d *Driver) CreateEvent() (ev acl.Event, err error) {
	err = d.timed(CreateEvent, func() (e error) { ev, e = d.Driver.CreateEvent(); return e })
	return ev, err
}

// RecordEvent passes the call on.
func (d *Driver) RecordEvent(ev acl.Event, s acl.Stream) error {
	return d.timed(RecordEvent, func() error { return d.Driver.RecordEvent(ev, s) })
}

// QueryEvent passes the call on.
func (d *Driver) QueryEvent(ev acl.Event) (done bool, err error) {
	err = d.timed(QueryEvent, func() (e error) { done, e = d.Driver.QueryEvent(ev); return e })
	return done, err
}

// SynchronizeEvent passes the call on.
func (d *Driver) SynchronizeEvent(ev acl.Event) error {
	return d.timed(SyncEvent, func() error { return d.Driver.SynchronizeEvent(ev) })
}

// DestroyEvent passes the call on.
func (d *Driver) DestroyEvent(ev acl.Event) error {
	return d.timed(DestroyEvent, func() error { return d.Driver.DestroyEvent(ev) })
}

// MemsetAsync passes the call on.
func (d *Driver) MemsetAsync(ptr acl.DevicePtr, value byte, n uintptr, s acl.Stream) error {
	return d.timed(MemsetAsync, func() error { return d.Driver.MemsetAsync(ptr, value, n, s) })
}

// Close does not close the wrapped driver: the suite shares one driver
// between runs and closes it itself.
func (d *Driver) Close() error { return nil }
