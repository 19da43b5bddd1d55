package acltest

import (
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/regtable"
)

// Registrations is the registration double: an [acl.Registrar] that keeps
// the table of set ranges and registered mappings and checks every call
// against the mappings of a driver, so that a test of code that drives a
// registrar (an arena) can assert, on any driver, what every real library
// needs:
//
//   - no registered range ever covers memory that is not mapped with access;
//   - once the caller is at rest, every mapping inside a set range is
//     registered, exactly once;
//   - nothing is left set or registered at the end (Live).
//
// It sees the driver's mappings by being in front of it: the caller makes
// them through [Registrations.Driver], a driver that forwards every call to
// the wrapped one and records the reservations, mappings and access grants
// that succeed. A registrar call that breaks the protocol (a Register of
// memory not mapped with access, outside a set range, or twice; a
// Deregister of what is not registered; an Unset of a range with
// registrations) is refused with 107000 and recorded as a violation. A
// driver call that breaks it (an UnmapMem of a registered mapping, a
// ReleaseMemAddress of a set range) is forwarded, since a device would do
// it, and recorded as a violation. [Registrations.Check] returns the
// violations and whatever the table and the mappings disagree on.
//
// Registrations may wrap another registrar, next (an adapter to a library
// or its test double): a call that passes the checks is forwarded to next,
// and recorded only when next accepts it, so the pair behaves as the library
// would, and the double watches the order. next must not call the wrapped
// driver through Driver.
//
// Registrations is safe for concurrent use. It serialises the calls that
// change mappings and registrations (never copies, streams or events).
type Registrations struct {
	next acl.Registrar // nil: accept every call that passes the checks
	drv  *regDriver

	mu         sync.Mutex
	table      regtable.Table
	seen       seen // the wrapped driver's reservations and mappings
	noAccess   bool // the driver lacks MemSetAccess: mappings are accessible as made
	violations []error
}

// RegistrationCounts is what a registrar holds: the set ranges and the
// registered mappings, with their bytes.
type RegistrationCounts struct {
	Ranges   int
	Mappings int
	Bytes    uintptr
}

// Zero reports whether nothing is held.
func (c RegistrationCounts) Zero() bool { return c == RegistrationCounts{} }

// NewRegistrations returns the double in front of d, forwarding accepted
// calls to next (nil: to nothing).
func NewRegistrations(d acl.Driver, next acl.Registrar) *Registrations {
	r := &Registrations{next: next}
	r.drv = &regDriver{Driver: d, r: r}
	return r
}

var _ acl.Registrar = (*Registrations)(nil)

// Driver returns the driver to make the mappings with: the wrapped driver,
// watched.
func (r *Registrations) Driver() acl.Driver { return r.drv }

// Live returns what the double holds as accepted.
func (r *Registrations) Live() RegistrationCounts {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, bytes := r.table.Mappings()
	return RegistrationCounts{Ranges: r.table.Ranges(), Mappings: n, Bytes: bytes}
}

// Registered returns the registered mappings, in address order.
func (r *Registrations) Registered() []acl.Mapping {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.table.All()
}

// Violations returns the breaches of the protocol seen so far, in order.
func (r *Registrations) Violations() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.violations...)
}

// Check returns nil when the protocol held: no violation was seen, and now
// every registered mapping is a mapping of the driver with access, and every
// mapping inside a set range is registered. Call it when the code under
// test is at rest (between a growth and the next), since a mapping is
// registered only after it is made.
func (r *Registrations) Check() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	errs := append([]error(nil), r.violations...)
	for _, m := range r.table.All() {
		if err := r.mappedLocked("Check", m); err != nil {
			errs = append(errs, err)
		}
	}
	for _, rg := range r.table.AllRanges() {
		for _, m := range r.seen.within(rg.Base, rg.Size) {
			if _, ok := r.table.Lookup(acl.DevicePtr(m.addr)); !ok {
				errs = append(errs, fmt.Errorf("the mapping [%#x, +%d) in the range set at %#x is not registered (access %v)",
					m.addr, m.size, rg.Base, m.access || r.noAccess))
			}
		}
	}
	return errors.Join(errs...)
}

// violate records a breach and returns it as the 107000 error of op.
func (r *Registrations) violate(op string, err error) error {
	r.violations = append(r.violations, fmt.Errorf("%s: %w", op, err))
	return err
}

// mappedLocked checks that m is exactly a mapping of the driver, with access.
func (r *Registrations) mappedLocked(op string, m acl.Mapping) error {
	_, bm := r.seen.at(uintptr(m.Ptr))
	switch {
	case bm == nil:
		return acl.Errorf(op, acl.ErrCodeRTParamInvalid, "%v is not the start of a mapping made through the driver", m)
	case bm.size != m.Size || bm.h != m.Handle:
		return acl.Errorf(op, acl.ErrCodeRTParamInvalid, "%v is not the mapping there, [%#x, +%d) handle %#x", m, bm.addr, bm.size, uintptr(bm.h))
	case !bm.access && !r.noAccess:
		return acl.Errorf(op, acl.ErrCodeRTParamInvalid, "%v has no access yet (MemSetAccess comes before Register)", m)
	}
	return nil
}

// SetMemoryRange accepts [base, base+size) when it is the start of a
// reservation made through Driver, no longer than it, and overlaps no set
// range.
func (r *Registrations) SetMemoryRange(base acl.DevicePtr, size uintptr) error {
	const op = "SetMemoryRange"
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.table.CheckSet(op, base, size); err != nil {
		return r.violate(op, err)
	}
	rsize, ok := r.seen.resv[uintptr(base)]
	switch {
	case !ok:
		return r.violate(op, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "%v is not the base of a reservation made through the driver", base))
	case size > rsize:
		return r.violate(op, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "size %d is larger than the reservation at %v (%d bytes)", size, base, rsize))
	}
	if r.next != nil {
		if err := r.next.SetMemoryRange(base, size); err != nil {
			return err
		}
	}
	r.table.Set(base, size)
	return nil
}

// UnsetMemoryRange accepts the base of a set range with no registered
// mapping.
func (r *Registrations) UnsetMemoryRange(base acl.DevicePtr) error {
	const op = "UnsetMemoryRange"
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.table.CheckUnset(op, base); err != nil {
		return r.violate(op, err)
	}
	if r.next != nil {
		if err := r.next.UnsetMemoryRange(base); err != nil {
			return err
		}
	}
	r.table.Unset(base)
	return nil
}

// Register accepts m when it is exactly a mapping of the driver, with
// access, inside a set range and not registered.
func (r *Registrations) Register(m acl.Mapping) error {
	const op = "Register"
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.table.CheckRegister(op, m); err != nil {
		return r.violate(op, err)
	}
	if err := r.mappedLocked(op, m); err != nil {
		return r.violate(op, err)
	}
	if r.next != nil {
		if err := r.next.Register(m); err != nil {
			return err
		}
	}
	r.table.Register(m)
	return nil
}

// Deregister accepts m when it is registered. A registered mapping that is
// no longer mapped was already recorded as a violation when it was
// unmapped; its deregistration is accepted, so that the books recover.
func (r *Registrations) Deregister(m acl.Mapping) error {
	const op = "Deregister"
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.table.CheckDeregister(op, m); err != nil {
		return r.violate(op, err)
	}
	if r.next != nil {
		if err := r.next.Deregister(m); err != nil {
			return err
		}
	}
	r.table.Deregister(m)
	return nil
}

var _ acl.BatchRegistrar = (*Registrations)(nil)

// RegisterBatch checks each of ms as Register does and, when all pass,
// forwards them to next in one call (acl.RegisterAll: one RegisterBatch
// where next is an acl.BatchRegistrar) and records them once it accepts.
func (r *Registrations) RegisterBatch(ms []acl.Mapping) error {
	const op = "Register"
	r.mu.Lock()
	defer r.mu.Unlock()
	var done []acl.Mapping
	defer func() { // the books take the batch only when next does
		for _, m := range done {
			r.table.Deregister(m)
		}
	}()
	for _, m := range ms {
		if err := r.table.CheckRegister(op, m); err != nil {
			return r.violate(op, err)
		}
		if err := r.mappedLocked(op, m); err != nil {
			return r.violate(op, err)
		}
		r.table.Register(m) // so that the next one is checked against it
		done = append(done, m)
	}
	if r.next != nil {
		if err := acl.RegisterAll(r.next, ms); err != nil {
			return err
		}
	}
	done = nil
	return nil
}

// DeregisterBatch checks each of ms as Deregister does and, when all pass,
// forwards them to next in one call (acl.DeregisterAll), and forgets them
// once it accepts.
func (r *Registrations) DeregisterBatch(ms []acl.Mapping) error {
	const op = "Deregister"
	r.mu.Lock()
	defer r.mu.Unlock()
	var done []acl.Mapping
	defer func() {
		for _, m := range done {
			r.table.Register(m)
		}
	}()
	for _, m := range ms {
		if err := r.table.CheckDeregister(op, m); err != nil {
			return r.violate(op, err)
		}
		r.table.Deregister(m)
		done = append(done, m)
	}
	if r.next != nil {
		if err := acl.DeregisterAll(r.next, ms); err != nil {
			return err
		}
	}
	done = nil
	return nil
}

// regDriver is the driver in front of the wrapped one: every call is
// forwarded (the embedded Driver), and the calls that change mappings are
// recorded in the double's books once they succeed.
type regDriver struct {
	acl.Driver
	r *Registrations
}

// Name returns "registered(" + the wrapped driver's name + ")".
func (d *regDriver) Name() string { return "registered(" + d.Driver.Name() + ")" }

// ReserveMemAddress forwards, and records the reservation.
func (d *regDriver) ReserveMemAddress(size, alignment uintptr, expect acl.DevicePtr, flags uint64) (acl.DevicePtr, error) {
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	p, err := d.Driver.ReserveMemAddress(size, alignment, expect, flags)
	if err == nil {
		d.r.seen.reserved(uintptr(p), size)
	}
	return p, err
}

// ReleaseMemAddress forwards; releasing a reservation with a range still set
// in it is a violation.
func (d *regDriver) ReleaseMemAddress(base acl.DevicePtr) error {
	const op = "ReleaseMemAddress"
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	rsize, known := d.r.seen.resv[uintptr(base)]
	if known {
		for _, rg := range d.r.table.AllRanges() {
			if rg.Base < uintptr(base)+rsize && uintptr(base) < rg.Base+rg.Size {
				d.r.violate(op, acl.Errorf(op, acl.ErrCodeRTParamInvalid,
					"the reservation at %v is released while the range [%#x, +%d) is set in it", base, rg.Base, rg.Size))
			}
		}
	}
	err := d.Driver.ReleaseMemAddress(base)
	if err == nil {
		delete(d.r.seen.resv, uintptr(base))
	}
	return err
}

// MapMem forwards, and records the mapping (without access).
func (d *regDriver) MapMem(ptr acl.DevicePtr, size, offset uintptr, h acl.PhysicalHandle, flags uint64) error {
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	if err := d.Driver.MapMem(ptr, size, offset, h, flags); err != nil {
		return err
	}
	d.r.seen.mapped(&seenMapping{addr: uintptr(ptr), size: size, h: h})
	return nil
}

// UnmapMem forwards; unmapping a registered mapping is a violation.
func (d *regDriver) UnmapMem(ptr acl.DevicePtr) error {
	const op = "UnmapMem"
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	i, bm := d.r.seen.at(uintptr(ptr))
	if bm != nil {
		for _, m := range d.r.table.Covering(ptr, bm.size) {
			d.r.violate(op, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "%v is unmapped while registered", m))
		}
	}
	if err := d.Driver.UnmapMem(ptr); err != nil {
		return err
	}
	if bm != nil {
		d.r.seen.unmapped(i)
	}
	return nil
}

// MemSetAccess forwards, and records the access of the mappings it covers.
// A driver without the call (ErrNotSupported) gives access at map time.
func (d *regDriver) MemSetAccess(ptr acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc) error {
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	err := d.Driver.MemSetAccess(ptr, size, desc)
	if errors.Is(err, acl.ErrNotSupported) {
		d.r.noAccess = true
	}
	if err != nil {
		return err
	}
	for _, m := range d.r.seen.within(uintptr(ptr), size) {
		m.access = true
	}
	return nil
}

// Live forwards to the wrapped driver's counts (zero when it keeps none).
func (d *regDriver) Live() acl.LiveCounts {
	if c, ok := d.Driver.(acl.Counter); ok {
		return c.Live()
	}
	return acl.LiveCounts{}
}

// Launch forwards to the wrapped driver when it can queue stand-in work.
func (d *regDriver) Launch(s acl.Stream, ptr acl.DevicePtr, n uintptr, done <-chan struct{}) error {
	if l, ok := d.Driver.(acl.Launcher); ok {
		return l.Launch(s, ptr, n, done)
	}
	return acl.Errorf("Launch", acl.ErrCodeRTFeatureNotSupport, "%s cannot queue stand-in work", d.Driver.Name())
}

// Faults forwards to the wrapped driver's count, or 0.
func (d *regDriver) Faults() int {
	if l, ok := d.Driver.(acl.Launcher); ok {
		return l.Faults()
	}
	return 0
}

// ExportDMABuf forwards to the wrapped driver when it exports dma-bufs.
func (d *regDriver) ExportDMABuf(ptr acl.DevicePtr, size uintptr) (int, error) {
	if x, ok := d.Driver.(acl.DMABufExporter); ok {
		return x.ExportDMABuf(ptr, size)
	}
	return -1, acl.Errorf("ExportDMABuf", acl.ErrCodeRTFeatureNotSupport, "%s cannot export dma-bufs", d.Driver.Name())
}

var (
	_ acl.Counter        = (*regDriver)(nil)
	_ acl.Launcher       = (*regDriver)(nil)
	_ acl.DMABufExporter = (*regDriver)(nil)
)

// seen is what the double saw the wrapped driver do: its reservations and
// its mappings, in address order.
type seen struct {
	resv map[uintptr]uintptr // base → size
	maps []*seenMapping
}

type seenMapping struct {
	addr, size uintptr
	h          acl.PhysicalHandle
	access     bool
}

func (s *seen) reserved(base, size uintptr) {
	if s.resv == nil {
		s.resv = map[uintptr]uintptr{}
	}
	s.resv[base] = size
}

// index returns the index of the first mapping ending after addr.
func (s *seen) index(addr uintptr) int {
	return sort.Search(len(s.maps), func(i int) bool { return s.maps[i].addr+s.maps[i].size > addr })
}

// at returns the mapping that starts at addr, and its index.
func (s *seen) at(addr uintptr) (int, *seenMapping) {
	i := s.index(addr)
	if i < len(s.maps) && s.maps[i].addr == addr {
		return i, s.maps[i]
	}
	return i, nil
}

func (s *seen) mapped(m *seenMapping) {
	i := s.index(m.addr)
	s.maps = append(s.maps, nil)
	copy(s.maps[i+1:], s.maps[i:])
	s.maps[i] = m
}

func (s *seen) unmapped(i int) { s.maps = append(s.maps[:i], s.maps[i+1:]...) }

// within returns the mappings that start inside [addr, addr+n).
func (s *seen) within(addr, n uintptr) []*seenMapping {
	var out []*seenMapping
	for i := s.index(addr); i < len(s.maps) && s.maps[i].addr < addr+n; i++ {
		if s.maps[i].addr >= addr {
			out = append(out, s.maps[i])
		}
	}
	return out
}
