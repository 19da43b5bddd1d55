package regtable

import (
	"errors"
	"fmt"
	"sync"

	"github.com/vmarena/vmarena/acl"
)

// Books is what a registrar adapter keeps around its library: the Table,
// under a lock held across each whole call (checks, the library call and
// the update), so that the library sees one call at a time and never a call
// the books would refuse; a closed flag; and the binder its library calls
// run in.
type Books struct {
	Bind acl.Binder // nil: library calls run on the calling thread as it is

	mu     sync.Mutex
	table  Table
	closed bool
}

// Lock takes the books for one call of op, and fails with 107002 once they
// are closed. Table and Call are for the holder; Unlock releases.
func (b *Books) Lock(op string) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return acl.Errorf(op, acl.ErrCodeRTContextNull, "registrar closed")
	}
	return nil
}

// Unlock releases what Lock took.
func (b *Books) Unlock() { b.mu.Unlock() }

// With runs fn holding the books, closed or not (to read them).
func (b *Books) With(fn func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fn()
}

// Table returns the table. Call it holding the books.
func (b *Books) Table() *Table { return &b.table }

// Call runs fn, a library call, inside Bind's Bind (or as it is, without a
// binder).
func (b *Books) Call(fn func() error) error {
	if b.Bind == nil {
		return fn()
	}
	return b.Bind.Bind(fn)
}

// Live returns how many ranges are set and how many mappings registered,
// with their bytes.
func (b *Books) Live() (ranges, mappings int, bytes uintptr) {
	b.mu.Lock()
	defer b.mu.Unlock()
	mappings, bytes = b.table.Mappings()
	return b.table.Ranges(), mappings, bytes
}

// Close closes the books, and undoes what they still hold: it deregisters
// each registered mapping with deregister and unsets each set range with
// unset (nil: the library has no range call), both run through Call, and
// forgets what was undone. Anything left is a leak of the caller's: the
// error names it, and joins the library's failures. Later calls fail with
// 107002; a second Close does nothing.
func (b *Books) Close(name string, deregister func(acl.Mapping) error, unset func(acl.DevicePtr) error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	maps, ranges := b.table.All(), b.table.AllRanges()
	if len(maps) == 0 && len(ranges) == 0 {
		return nil
	}
	errs := []error{fmt.Errorf("%s: registrar closed with %d registered mappings and %d set ranges", name, len(maps), len(ranges))}
	for _, m := range maps {
		if err := b.Call(func() error { return deregister(m) }); err != nil {
			errs = append(errs, err)
			continue
		}
		b.table.Deregister(m)
	}
	for _, rg := range ranges {
		base := acl.DevicePtr(rg.Base)
		if _, err := b.table.CheckUnset("UnsetMemoryRange", base); err != nil {
			continue // a mapping in it could not be deregistered
		}
		if unset != nil {
			if err := b.Call(func() error { return unset(base) }); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		b.table.Unset(base)
	}
	return errors.Join(errs...)
}
