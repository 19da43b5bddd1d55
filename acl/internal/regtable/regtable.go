// Package regtable keeps the books of a registrar (acl.Registrar): the set
// memory ranges and the mappings registered in them, with the checks every
// registrar makes before it calls its library, so that a library never sees
// a call the protocol forbids. A refusal is an *acl.Error with code 107000
// (ACL_ERROR_RT_PARAM_INVALID, acl.ErrInvalidParam) and the op the caller
// names.
//
// A Table is not safe for concurrent use; its owner holds a lock.
package regtable

import (
	"sort"

	"github.com/vmarena/vmarena/acl"
)

// Range is a set memory range.
type Range struct {
	Base, Size uintptr
	maps       int // registered mappings inside it
}

// Table is the set ranges, sorted by base and never overlapping, and the
// registered mappings, sorted by address and never overlapping.
type Table struct {
	ranges []*Range
	maps   []acl.Mapping
	bytes  uintptr
}

func bad(op, format string, args ...any) error {
	return acl.Errorf(op, acl.ErrCodeRTParamInvalid, format, args...)
}

// Ranges returns how many ranges are set.
func (t *Table) Ranges() int { return len(t.ranges) }

// Mappings returns how many mappings are registered, and their bytes.
func (t *Table) Mappings() (n int, bytes uintptr) { return len(t.maps), t.bytes }

// All returns the registered mappings, in address order. The slice is the
// caller's.
func (t *Table) All() []acl.Mapping { return append([]acl.Mapping(nil), t.maps...) }

// AllRanges returns the set ranges, in address order, as bases and sizes.
// The slice is the caller's.
func (t *Table) AllRanges() []Range {
	out := make([]Range, len(t.ranges))
	for i, r := range t.ranges {
		out[i] = Range{Base: r.Base, Size: r.Size}
	}
	return out
}

// rangeAt returns the index of the set range containing addr, or -1.
func (t *Table) rangeAt(addr uintptr) int {
	i := sort.Search(len(t.ranges), func(i int) bool { return t.ranges[i].Base > addr }) - 1
	if i < 0 || addr-t.ranges[i].Base >= t.ranges[i].Size {
		return -1
	}
	return i
}

// RangeOf returns the set range containing addr.
func (t *Table) RangeOf(addr acl.DevicePtr) (Range, bool) {
	i := t.rangeAt(uintptr(addr))
	if i < 0 {
		return Range{}, false
	}
	return Range{Base: t.ranges[i].Base, Size: t.ranges[i].Size}, true
}

// CheckSet checks that [base, base+size) may be set: not empty, not
// wrapping, overlapping no set range.
func (t *Table) CheckSet(op string, base acl.DevicePtr, size uintptr) error {
	b := uintptr(base)
	switch {
	case base == 0:
		return bad(op, "base is NULL")
	case size == 0:
		return bad(op, "size is 0")
	case b+size < b:
		return bad(op, "[%v, +%d) wraps around the address space", base, size)
	}
	i := sort.Search(len(t.ranges), func(i int) bool { return t.ranges[i].Base >= b+size })
	if i > 0 && t.ranges[i-1].Base+t.ranges[i-1].Size > b {
		r := t.ranges[i-1]
		return bad(op, "[%v, +%d) overlaps the range set at %#x (+%d)", base, size, r.Base, r.Size)
	}
	return nil
}

// Set records the range CheckSet accepted.
func (t *Table) Set(base acl.DevicePtr, size uintptr) {
	b := uintptr(base)
	i := sort.Search(len(t.ranges), func(i int) bool { return t.ranges[i].Base > b })
	t.ranges = append(t.ranges, nil)
	copy(t.ranges[i+1:], t.ranges[i:])
	t.ranges[i] = &Range{Base: b, Size: size}
}

// CheckUnset checks that base is the base of a set range in which no
// mapping is registered, and returns that range's size.
func (t *Table) CheckUnset(op string, base acl.DevicePtr) (uintptr, error) {
	i := t.rangeAt(uintptr(base))
	if i < 0 || t.ranges[i].Base != uintptr(base) {
		return 0, bad(op, "%v is not the base of a set memory range", base)
	}
	if n := t.ranges[i].maps; n > 0 {
		return 0, bad(op, "the range set at %v still has %d registered mappings: deregister them first", base, n)
	}
	return t.ranges[i].Size, nil
}

// Unset forgets the range CheckUnset accepted.
func (t *Table) Unset(base acl.DevicePtr) {
	if i := t.rangeAt(uintptr(base)); i >= 0 {
		t.ranges = append(t.ranges[:i], t.ranges[i+1:]...)
	}
}

// index returns the index of the first registered mapping ending after addr.
func (t *Table) index(addr uintptr) int {
	return sort.Search(len(t.maps), func(i int) bool { return uintptr(t.maps[i].End()) > addr })
}

// CheckRegister checks that m may be registered: a non-empty mapping with a
// handle, inside one set range, overlapping no registered mapping.
func (t *Table) CheckRegister(op string, m acl.Mapping) error {
	p := uintptr(m.Ptr)
	switch {
	case m.Ptr == 0:
		return bad(op, "ptr is NULL")
	case m.Size == 0:
		return bad(op, "size is 0")
	case m.Handle == 0:
		return bad(op, "handle is NULL")
	case p+m.Size < p:
		return bad(op, "%v wraps around the address space", m)
	}
	ri := t.rangeAt(p)
	if ri < 0 || m.Size > t.ranges[ri].Base+t.ranges[ri].Size-p {
		return bad(op, "%v is not inside one set memory range", m)
	}
	if i := t.index(p); i < len(t.maps) && uintptr(t.maps[i].Ptr) < p+m.Size {
		return bad(op, "%v overlaps the registered mapping %v", m, t.maps[i])
	}
	return nil
}

// Register records the mapping CheckRegister accepted.
func (t *Table) Register(m acl.Mapping) {
	i := t.index(uintptr(m.Ptr))
	t.maps = append(t.maps, acl.Mapping{})
	copy(t.maps[i+1:], t.maps[i:])
	t.maps[i] = m
	t.bytes += m.Size
	t.ranges[t.rangeAt(uintptr(m.Ptr))].maps++
}

// Lookup returns the registered mapping that starts at ptr.
func (t *Table) Lookup(ptr acl.DevicePtr) (acl.Mapping, bool) {
	i := t.index(uintptr(ptr))
	if i < len(t.maps) && t.maps[i].Ptr == ptr {
		return t.maps[i], true
	}
	return acl.Mapping{}, false
}

// Covering returns the registered mappings that overlap [ptr, ptr+n).
func (t *Table) Covering(ptr acl.DevicePtr, n uintptr) []acl.Mapping {
	var out []acl.Mapping
	for i := t.index(uintptr(ptr)); i < len(t.maps) && uintptr(t.maps[i].Ptr) < uintptr(ptr)+n; i++ {
		out = append(out, t.maps[i])
	}
	return out
}

// CheckDeregister checks that m is exactly a registered mapping: same
// start, size and handle.
func (t *Table) CheckDeregister(op string, m acl.Mapping) error {
	got, ok := t.Lookup(m.Ptr)
	switch {
	case !ok:
		return bad(op, "%v is not registered", m)
	case got != m:
		return bad(op, "%v is not the mapping registered there, %v", m, got)
	}
	return nil
}

// Deregister forgets the mapping CheckDeregister accepted.
func (t *Table) Deregister(m acl.Mapping) {
	i := t.index(uintptr(m.Ptr))
	if i == len(t.maps) || t.maps[i].Ptr != m.Ptr {
		return
	}
	t.maps = append(t.maps[:i], t.maps[i+1:]...)
	t.bytes -= m.Size
	if ri := t.rangeAt(uintptr(m.Ptr)); ri >= 0 {
		t.ranges[ri].maps--
	}
}

// Aligned checks that v is a multiple of align, naming what it is.
func Aligned(op, what string, v, align uintptr) error {
	if align != 0 && v%align != 0 {
		return bad(op, "%s %#x is not a multiple of %#x", what, v, align)
	}
	return nil
}
