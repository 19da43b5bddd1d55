// Package faultdriver wraps an [acl.Driver] so that chosen calls fail, for
// testing how code above the driver copes with a device that runs out of
// memory or fails half-way through a multi-call operation.
//
// A [Driver] forwards every call to the driver it wraps unless a rule says
// the call fails; a failed call is not forwarded, so it has no effect, and
// returns an [*acl.Error] with the rule's ACL code and the message
// "injected fault". Rules pick calls by kind ([Op]) and position:
//
//	FailNth(op, n, code)         the nth call of op after the rule is added
//	FailAfter(op, n, code)       every call of op after the first n
//	FailRandom(op, p, seed, code) each call of op with probability p,
//	                              from a generator seeded with seed
//
// [Any] matches every kind. Positions count from the moment the rule is
// added, one counter per rule. The Driver counts the calls it saw and the
// faults it injected, per kind, and forwards [acl.Counter] so that leak
// checks see through it:
//
//	fd := faultdriver.New(hostDriver)
//	fd.FailNth(faultdriver.MapMem, 3, acl.ErrCodeRTMemoryAllocation)
//	a, _ := arena.New(arena.Config{Driver: fd})
//	err := a.Grow(8 << 20) // the third chunk's map fails; Grow rolls back
//
// Injecting ErrNotSupported (207000) into MemSetAccess tells the chunk pool
// the runtime lacks that call, which it remembers; inject other codes there.
//
// A Driver is safe for concurrent use. Close is forwarded and never fails by
// injection. New and the Fail methods panic on arguments no test can mean (a
// nil driver, an unknown Op, n < 1 for FailNth, p outside [0, 1]): like
// regexp.MustCompile, they report a mistake in the test itself, not a
// condition to handle.
package faultdriver

import (
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/vmarena/vmarena/acl"
)

// Op is a kind of driver call.
type Op int

// The kinds of call a rule can match: one per acl.Driver method that returns
// an error, and Any.
const (
	Any Op = iota
	MemGetAllocationGranularity
	MallocPhysical
	FreePhysical
	ReserveMemAddress
	ReleaseMemAddress
	MapMem
	UnmapMem
	MemSetAccess
	MemcpyHtoD
	MemcpyDtoH
	MemcpyDtoD
	Memset
	GetMemInfo
	CreateStream
	DestroyStream
	SynchronizeStream
	SynchronizeDevice
	CreateEvent
	RecordEvent
	QueryEvent
	SynchronizeEvent
	DestroyEvent
	MemsetAsync
	MemExportToShareableHandle
	MemSetPidToShareableHandle
	MemImportFromShareableHandle
	DeviceGetBareTgid
	MallocHost
	FreeHost
	numOps
)

// Ops lists every kind of call, Any excluded.
var Ops = []Op{
	MemGetAllocationGranularity, MallocPhysical, FreePhysical, ReserveMemAddress, ReleaseMemAddress,
	MapMem, UnmapMem, MemSetAccess, MemcpyHtoD, MemcpyDtoH, MemcpyDtoD, Memset, GetMemInfo,
	CreateStream, DestroyStream, SynchronizeStream, SynchronizeDevice,
	CreateEvent, RecordEvent, QueryEvent, SynchronizeEvent, DestroyEvent, MemsetAsync,
	MemExportToShareableHandle, MemSetPidToShareableHandle, MemImportFromShareableHandle, DeviceGetBareTgid,
	MallocHost, FreeHost,
}

var opNames = [numOps]string{
	Any:                         "any",
	MemGetAllocationGranularity: "aclrtMemGetAllocationGranularity",
	MallocPhysical:              "aclrtMallocPhysical",
	FreePhysical:                "aclrtFreePhysical",
	ReserveMemAddress:           "aclrtReserveMemAddress",
	ReleaseMemAddress:           "aclrtReleaseMemAddress",
	MapMem:                      "aclrtMapMem",
	UnmapMem:                    "aclrtUnmapMem",
	MemSetAccess:                "aclrtMemSetAccess",
	MemcpyHtoD:                  "aclrtMemcpy",
	MemcpyDtoH:                  "aclrtMemcpy",
	MemcpyDtoD:                  "aclrtMemcpy",
	Memset:                      "aclrtMemset",
	GetMemInfo:                  "aclrtGetMemInfo",
	CreateStream:                "aclrtCreateStream",
	DestroyStream:               "aclrtDestroyStream",
	SynchronizeStream:           "aclrtSynchronizeStream",
	SynchronizeDevice:           "aclrtSynchronizeDevice",
	CreateEvent:                 "aclrtCreateEvent",
	RecordEvent:                 "aclrtRecordEvent",
	QueryEvent:                  "aclrtQueryEventStatus",
	SynchronizeEvent:            "aclrtSynchronizeEvent",
	DestroyEvent:                "aclrtDestroyEvent",
	MemsetAsync:                 "aclrtMemsetAsync",

	MemExportToShareableHandle:   "aclrtMemExportToShareableHandle",
	MemSetPidToShareableHandle:   "aclrtMemSetPidToShareableHandle",
	MemImportFromShareableHandle: "aclrtMemImportFromShareableHandle",
	DeviceGetBareTgid:            "aclrtDeviceGetBareTgid",

	MallocHost: "aclrtMallocHost",
	FreeHost:   "aclrtFreeHost",
}

// String returns the ACL function the kind stands for, or "any".
func (o Op) String() string {
	if o < 0 || o >= numOps {
		return fmt.Sprintf("faultdriver.Op(%d)", int(o))
	}
	s := opNames[o]
	switch o {
	case MemcpyHtoD:
		s += "(HtoD)"
	case MemcpyDtoH:
		s += "(DtoH)"
	case MemcpyDtoD:
		s += "(DtoD)"
	}
	return s
}

// DefaultCode is the ACL code a rule added with code 0 injects into op: out
// of memory (207001) for the calls that allocate memory, out of resources
// (207005) for those that create streams and events, an internal driver
// error (507899) for the rest.
func DefaultCode(op Op) int32 {
	switch op {
	case MallocPhysical, ReserveMemAddress, MallocHost:
		return acl.ErrCodeRTMemoryAllocation
	case CreateStream, CreateEvent:
		return acl.ErrCodeRTResourceAllocFail
	}
	return acl.ErrCodeRTDrvInternal
}

// InjectedMsg is the message of every injected error.
const InjectedMsg = "injected fault"

type ruleKind int

const (
	nth ruleKind = iota
	after
	random
)

type rule struct {
	kind ruleKind
	op   Op
	n    int64 // nth: the position; after: calls that still succeed
	p    float64
	rng  *rand.Rand
	code int32 // 0: DefaultCode of the call's kind
	seen int64 // calls of op seen by this rule
}

// Driver is an acl.Driver that fails the calls its rules pick and forwards
// the rest.
type Driver struct {
	inner acl.Driver

	mu       sync.Mutex
	rules    []*rule
	calls    [numOps]int64
	injected [numOps]int64
}

var (
	_ acl.Driver  = (*Driver)(nil)
	_ acl.Counter = (*Driver)(nil)
)

// New wraps inner. With no rules the Driver only forwards and counts.
func New(inner acl.Driver) *Driver {
	if inner == nil {
		panic("faultdriver: New(nil)")
	}
	return &Driver{inner: inner}
}

// Unwrap returns the wrapped driver.
func (d *Driver) Unwrap() acl.Driver { return d.inner }

func (d *Driver) add(r *rule) {
	if r.op < 0 || r.op >= numOps {
		panic(fmt.Sprintf("faultdriver: unknown op %d", int(r.op)))
	}
	d.mu.Lock()
	d.rules = append(d.rules, r)
	d.mu.Unlock()
}

// FailNth makes the nth call (1-based) of op after now fail with code (0
// means DefaultCode(op)). It fails once; later calls pass.
func (d *Driver) FailNth(op Op, n int, code int32) {
	if n < 1 {
		panic(fmt.Sprintf("faultdriver: FailNth(%v, %d): n must be at least 1", op, n))
	}
	d.add(&rule{kind: nth, op: op, n: int64(n), code: code})
}

// FailAfter lets the next n calls of op pass and fails every later one with
// code (0 means DefaultCode(op)). FailAfter(op, 0, code) fails them all.
func (d *Driver) FailAfter(op Op, n int, code int32) {
	if n < 0 {
		panic(fmt.Sprintf("faultdriver: FailAfter(%v, %d): n must not be negative", op, n))
	}
	d.add(&rule{kind: after, op: op, n: int64(n), code: code})
}

// FailRandom fails each call of op with probability p (0 ≤ p ≤ 1), drawn from
// a generator seeded with seed, so a run is reproducible when the calls come
// in the same order. code 0 means DefaultCode(op).
func (d *Driver) FailRandom(op Op, p float64, seed uint64, code int32) {
	if !(p >= 0 && p <= 1) {
		panic(fmt.Sprintf("faultdriver: FailRandom(%v, %v): p must be in [0, 1]", op, p))
	}
	d.add(&rule{kind: random, op: op, p: p, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), code: code})
}

// Clear removes every rule. The counts stay.
func (d *Driver) Clear() {
	d.mu.Lock()
	d.rules = nil
	d.mu.Unlock()
}

// Calls returns how many calls of op the Driver has seen (Any: of every
// kind), injected faults included.
func (d *Driver) Calls(op Op) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[op]
}

// Injected returns how many calls of op failed by injection (Any: of every
// kind).
func (d *Driver) Injected(op Op) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.injected[op]
}

// check counts a call of op and returns the injected error, if a rule fails it.
func (d *Driver) check(op Op) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls[op]++
	d.calls[Any]++
	var code int32
	for _, r := range d.rules {
		if r.op != Any && r.op != op {
			continue
		}
		r.seen++
		var fire bool
		switch r.kind {
		case nth:
			fire = r.seen == r.n
		case after:
			fire = r.seen > r.n
		case random:
			fire = r.rng.Float64() < r.p
		}
		if fire && code == acl.Success {
			code = r.code
			if code == acl.Success {
				code = DefaultCode(op)
			}
		}
	}
	if code == acl.Success {
		return nil
	}
	d.injected[op]++
	d.injected[Any]++
	return acl.NewError(opNames[op], code, InjectedMsg)
}

// Live returns the wrapped driver's live counts, or zero counts when it does
// not keep them.
func (d *Driver) Live() acl.LiveCounts {
	if c, ok := d.inner.(acl.Counter); ok {
		return c.Live()
	}
	return acl.LiveCounts{}
}

// Name returns "fault(" + the wrapped driver's name + ")".
func (d *Driver) Name() string { return "fault(" + d.inner.Name() + ")" }

// Device returns the wrapped driver's device.
func (d *Driver) Device() int32 { return d.inner.Device() }

// MemGetAllocationGranularity forwards, or fails by injection.
func (d *Driver) MemGetAllocationGranularity(prop *acl.PhysicalMemProp, option acl.MemGranularityOptions) (uintptr, error) {
	if err := d.check(MemGetAllocationGranularity); err != nil {
		return 0, err
	}
	return d.inner.MemGetAllocationGranularity(prop, option)
}

// MallocPhysical forwards, or fails by injection.
func (d *Driver) MallocPhysical(size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	if err := d.check(MallocPhysical); err != nil {
		return 0, err
	}
	return d.inner.MallocPhysical(size, prop, flags)
}

// FreePhysical forwards, or fails by injection (and the memory stays held).
func (d *Driver) FreePhysical(h acl.PhysicalHandle) error {
	if err := d.check(FreePhysical); err != nil {
		return err
	}
	return d.inner.FreePhysical(h)
}

// ReserveMemAddress forwards, or fails by injection.
func (d *Driver) ReserveMemAddress(size, alignment uintptr, expect acl.DevicePtr, flags uint64) (acl.DevicePtr, error) {
	if err := d.check(ReserveMemAddress); err != nil {
		return 0, err
	}
	return d.inner.ReserveMemAddress(size, alignment, expect, flags)
}

// ReleaseMemAddress forwards, or fails by injection.
func (d *Driver) ReleaseMemAddress(base acl.DevicePtr) error {
	if err := d.check(ReleaseMemAddress); err != nil {
		return err
	}
	return d.inner.ReleaseMemAddress(base)
}

// MapMem forwards, or fails by injection.
func (d *Driver) MapMem(ptr acl.DevicePtr, size, offset uintptr, h acl.PhysicalHandle, flags uint64) error {
	if err := d.check(MapMem); err != nil {
		return err
	}
	return d.inner.MapMem(ptr, size, offset, h, flags)
}

// UnmapMem forwards, or fails by injection (and the mapping stays).
func (d *Driver) UnmapMem(ptr acl.DevicePtr) error {
	if err := d.check(UnmapMem); err != nil {
		return err
	}
	return d.inner.UnmapMem(ptr)
}

// MemSetAccess forwards, or fails by injection.
func (d *Driver) MemSetAccess(ptr acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc) error {
	if err := d.check(MemSetAccess); err != nil {
		return err
	}
	return d.inner.MemSetAccess(ptr, size, desc)
}

// MemcpyHtoD forwards, or fails by injection (and nothing is copied).
func (d *Driver) MemcpyHtoD(dst acl.DevicePtr, src []byte) error {
	if err := d.check(MemcpyHtoD); err != nil {
		return err
	}
	return d.inner.MemcpyHtoD(dst, src)
}

// MemcpyDtoH forwards, or fails by injection (and nothing is copied).
func (d *Driver) MemcpyDtoH(dst []byte, src acl.DevicePtr) error {
	if err := d.check(MemcpyDtoH); err != nil {
		return err
	}
	return d.inner.MemcpyDtoH(dst, src)
}

// MemcpyDtoD forwards, or fails by injection (and nothing is copied).
func (d *Driver) MemcpyDtoD(dst, src acl.DevicePtr, n uintptr) error {
	if err := d.check(MemcpyDtoD); err != nil {
		return err
	}
	return d.inner.MemcpyDtoD(dst, src, n)
}

// Memset forwards, or fails by injection (and nothing is written).
func (d *Driver) Memset(ptr acl.DevicePtr, value byte, n uintptr) error {
	if err := d.check(Memset); err != nil {
		return err
	}
	return d.inner.Memset(ptr, value, n)
}

// GetMemInfo forwards, or fails by injection.
func (d *Driver) GetMemInfo(attr acl.MemAttr) (free, total uintptr, err error) {
	if err := d.check(GetMemInfo); err != nil {
		return 0, 0, err
	}
	return d.inner.GetMemInfo(attr)
}

// CreateStream forwards, or fails by injection.
func (d *Driver) CreateStream() (acl.Stream, error) {
	if err := d.check(CreateStream); err != nil {
		return 0, err
	}
	return d.inner.CreateStream()
}

// DestroyStream forwards, or fails by injection (and the stream stays).
func (d *Driver) DestroyStream(s acl.Stream) error {
	if err := d.check(DestroyStream); err != nil {
		return err
	}
	return d.inner.DestroyStream(s)
}

// SynchronizeStream forwards, or fails by injection without waiting.
func (d *Driver) SynchronizeStream(s acl.Stream) error {
	if err := d.check(SynchronizeStream); err != nil {
		return err
	}
	return d.inner.SynchronizeStream(s)
}

// SynchronizeDevice forwards, or fails by injection without waiting.
func (d *Driver) SynchronizeDevice() error {
	if err := d.check(SynchronizeDevice); err != nil {
		return err
	}
	return d.inner.SynchronizeDevice()
}

// CreateEvent forwards, or fails by injection.
func (d *Driver) CreateEvent() (acl.Event, error) {
	if err := d.check(CreateEvent); err != nil {
		return 0, err
	}
	return d.inner.CreateEvent()
}

// RecordEvent forwards, or fails by injection (and the event keeps its
// previous mark).
func (d *Driver) RecordEvent(ev acl.Event, s acl.Stream) error {
	if err := d.check(RecordEvent); err != nil {
		return err
	}
	return d.inner.RecordEvent(ev, s)
}

// QueryEvent forwards, or fails by injection.
func (d *Driver) QueryEvent(ev acl.Event) (bool, error) {
	if err := d.check(QueryEvent); err != nil {
		return false, err
	}
	return d.inner.QueryEvent(ev)
}

// SynchronizeEvent forwards, or fails by injection without waiting.
func (d *Driver) SynchronizeEvent(ev acl.Event) error {
	if err := d.check(SynchronizeEvent); err != nil {
		return err
	}
	return d.inner.SynchronizeEvent(ev)
}

// DestroyEvent forwards, or fails by injection (and the event stays).
func (d *Driver) DestroyEvent(ev acl.Event) error {
	if err := d.check(DestroyEvent); err != nil {
		return err
	}
	return d.inner.DestroyEvent(ev)
}

// MemsetAsync forwards, or fails by injection (and nothing is queued).
func (d *Driver) MemsetAsync(ptr acl.DevicePtr, value byte, n uintptr, s acl.Stream) error {
	if err := d.check(MemsetAsync); err != nil {
		return err
	}
	return d.inner.MemsetAsync(ptr, value, n, s)
}

// MemExportToShareableHandle forwards, or fails by injection.
func (d *Driver) MemExportToShareableHandle(h acl.PhysicalHandle, handleType acl.MemHandleType, flags uint64) (acl.ShareableHandle, error) {
	if err := d.check(MemExportToShareableHandle); err != nil {
		return acl.ShareableHandle{}, err
	}
	return d.inner.MemExportToShareableHandle(h, handleType, flags)
}

// MemSetPidToShareableHandle forwards, or fails by injection.
func (d *Driver) MemSetPidToShareableHandle(s acl.ShareableHandle, pids []int32) error {
	if err := d.check(MemSetPidToShareableHandle); err != nil {
		return err
	}
	return d.inner.MemSetPidToShareableHandle(s, pids)
}

// MemImportFromShareableHandle forwards, or fails by injection (and nothing
// is imported).
func (d *Driver) MemImportFromShareableHandle(s acl.ShareableHandle, device int32) (acl.PhysicalHandle, error) {
	if err := d.check(MemImportFromShareableHandle); err != nil {
		return 0, err
	}
	return d.inner.MemImportFromShareableHandle(s, device)
}

// DeviceGetBareTgid forwards, or fails by injection.
func (d *Driver) DeviceGetBareTgid() (int32, error) {
	if err := d.check(DeviceGetBareTgid); err != nil {
		return 0, err
	}
	return d.inner.DeviceGetBareTgid()
}

// MallocHost forwards, or fails by injection (and nothing is allocated).
func (d *Driver) MallocHost(size uintptr) ([]byte, error) {
	if err := d.check(MallocHost); err != nil {
		return nil, err
	}
	return d.inner.MallocHost(size)
}

// FreeHost forwards, or fails by injection (and the buffer stays).
func (d *Driver) FreeHost(b []byte) error {
	if err := d.check(FreeHost); err != nil {
		return err
	}
	return d.inner.FreeHost(b)
}

// Caps returns the wrapped driver's.
func (d *Driver) Caps() acl.Caps { return d.inner.Caps() }

// Launch forwards to the wrapped driver when it can queue stand-in work
// (acl.Launcher), so that tests can run work in flight through the wrapper.
func (d *Driver) Launch(s acl.Stream, ptr acl.DevicePtr, n uintptr, done <-chan struct{}) error {
	l, ok := d.inner.(acl.Launcher)
	if !ok {
		return acl.Errorf("Launch", acl.ErrCodeRTFeatureNotSupport, "%s cannot queue stand-in work", d.inner.Name())
	}
	return l.Launch(s, ptr, n, done)
}

// Faults forwards to the wrapped driver when it is an acl.Launcher, and is 0
// otherwise.
func (d *Driver) Faults() int {
	if l, ok := d.inner.(acl.Launcher); ok {
		return l.Faults()
	}
	return 0
}

// Close closes the wrapped driver.
func (d *Driver) Close() error { return d.inner.Close() }
