// Package book keeps the books of a driver that enforces ACL's address-space
// rules itself (the host driver, which simulates ACL, and the CUDA driver,
// which is laxer than ACL): its reservations, the mappings in each, and the
// checks ACL makes against them, with ACL's codes (docs/acl.md lists the
// rules, and which codes are documented and which are the simulator's choice).
//
// A Book is not safe for concurrent use; the driver holds its own lock.
package book

import (
	"sort"

	"github.com/vmarena/vmarena/acl"
)

// Mapping is one live mapping of a whole physical allocation H.
type Mapping[H any] struct {
	Addr, Size uintptr
	H          H
	Access     bool // MemSetAccess granted access
	ReadOnly   bool // and the access is read-only (MemAccessRead)
}

// Reservation is one reserved range and the mappings in it; X is whatever
// else the driver keeps per reservation.
type Reservation[X, H any] struct {
	Base, Size uintptr
	Maps       []*Mapping[H] // sorted by Addr, never overlapping
	X          X
}

// Index returns the index of the first mapping of r that ends after addr.
func (r *Reservation[X, H]) Index(addr uintptr) int {
	return sort.Search(len(r.Maps), func(i int) bool { return r.Maps[i].Addr+r.Maps[i].Size > addr })
}

// Insert puts m at index i, as Index or Book.Place found it.
func (r *Reservation[X, H]) Insert(i int, m *Mapping[H]) {
	r.Maps = append(r.Maps, nil)
	copy(r.Maps[i+1:], r.Maps[i:])
	r.Maps[i] = m
}

// Remove takes out the mapping at index i.
func (r *Reservation[X, H]) Remove(i int) {
	r.Maps = append(r.Maps[:i], r.Maps[i+1:]...)
}

// Book is a driver's reservations, sorted by base.
type Book[X, H any] struct {
	resv []*Reservation[X, H]
}

// All returns the reservations, in address order.
func (b *Book[X, H]) All() []*Reservation[X, H] { return b.resv }

// Reset forgets every reservation.
func (b *Book[X, H]) Reset() { b.resv = nil }

// Add records a new reservation, which overlaps no other.
func (b *Book[X, H]) Add(r *Reservation[X, H]) {
	i := sort.Search(len(b.resv), func(i int) bool { return b.resv[i].Base > r.Base })
	b.resv = append(b.resv, nil)
	copy(b.resv[i+1:], b.resv[i:])
	b.resv[i] = r
}

// find returns the reservation containing addr, and its index.
func (b *Book[X, H]) find(addr uintptr) (int, *Reservation[X, H]) {
	i := sort.Search(len(b.resv), func(i int) bool { return b.resv[i].Base > addr }) - 1
	if i < 0 || addr-b.resv[i].Base >= b.resv[i].Size {
		return -1, nil
	}
	return i, b.resv[i]
}

// Releasable returns the reservation whose base is base, if it has no
// mappings left: the checks of aclrtReleaseMemAddress. Remove it with
// Forget once the driver has released it.
func (b *Book[X, H]) Releasable(op string, base acl.DevicePtr) (*Reservation[X, H], error) {
	_, r := b.find(uintptr(base))
	switch {
	case r == nil || r.Base != uintptr(base):
		return nil, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "%v is not the base of a reservation", base)
	case len(r.Maps) > 0:
		return nil, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "reservation %v still has %d mappings: unmap them first", base, len(r.Maps))
	}
	return r, nil
}

// Forget removes the reservation r.
func (b *Book[X, H]) Forget(r *Reservation[X, H]) {
	if i, found := b.find(r.Base); found == r {
		b.resv = append(b.resv[:i], b.resv[i+1:]...)
	}
}

// Place checks that [ptr, ptr+size) lies inside one reservation and overlaps
// no mapping, the checks of aclrtMapMem against the books, and returns the
// reservation and the index to Insert the mapping at.
func (b *Book[X, H]) Place(op string, ptr acl.DevicePtr, size uintptr) (*Reservation[X, H], int, error) {
	addr := uintptr(ptr)
	_, r := b.find(addr)
	if r == nil || size > r.Base+r.Size-addr {
		return nil, 0, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) is not inside one reservation", ptr, size)
	}
	i := r.Index(addr)
	if i < len(r.Maps) && r.Maps[i].Addr < addr+size {
		return nil, 0, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) overlaps the mapping at %#x", ptr, size, r.Maps[i].Addr)
	}
	return r, i, nil
}

// Mapping returns the mapping that starts exactly at ptr, its reservation and
// its index there, or nils.
func (b *Book[X, H]) Mapping(ptr acl.DevicePtr) (*Reservation[X, H], int, *Mapping[H]) {
	addr := uintptr(ptr)
	_, r := b.find(addr)
	if r == nil {
		return nil, 0, nil
	}
	i := r.Index(addr)
	if i == len(r.Maps) || r.Maps[i].Addr != addr {
		return nil, 0, nil
	}
	return r, i, r.Maps[i]
}

// Accessible checks that [ptr, ptr+n) is mapped with access throughout,
// possibly across adjacent mappings of one reservation: the rule for copies
// and memsets. It returns the reservation.
func (b *Book[X, H]) Accessible(op string, ptr acl.DevicePtr, n uintptr) (*Reservation[X, H], error) {
	addr := uintptr(ptr)
	_, r := b.find(addr)
	if r == nil || n > r.Base+r.Size-addr {
		return nil, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) is not inside one reservation", ptr, n)
	}
	at := addr
	for i := r.Index(addr); at < addr+n; i++ {
		if i == len(r.Maps) || r.Maps[i].Addr > at {
			return nil, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) is not mapped at %#x", ptr, n, at)
		}
		if !r.Maps[i].Access {
			return nil, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "mapping at %#x has no access (call aclrtMemSetAccess)", r.Maps[i].Addr)
		}
		at = r.Maps[i].Addr + r.Maps[i].Size
	}
	return r, nil
}

// Writable is Accessible for a write: every mapping of the range must also
// be writable (a read-only mapping refuses the write with 107000, where a
// device would fault).
func (b *Book[X, H]) Writable(op string, ptr acl.DevicePtr, n uintptr) (*Reservation[X, H], error) {
	r, err := b.Accessible(op, ptr, n)
	if err != nil {
		return nil, err
	}
	addr := uintptr(ptr)
	for i := r.Index(addr); i < len(r.Maps) && r.Maps[i].Addr < addr+n; i++ {
		if r.Maps[i].ReadOnly {
			return nil, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "mapping at %#x is read-only", r.Maps[i].Addr)
		}
	}
	return r, nil
}
