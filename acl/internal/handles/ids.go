package handles

import "github.com/vmarena/vmarena/acl"

// IDs hands out the values of physical handles as a device runtime does.
// A runtime's handle is a pointer to its own record of the allocation, and
// the record of a freed allocation goes back to the runtime's heap, which
// hands the same address out again for the next allocation: a freed handle's
// value comes back, often at once. Code that keeps books by handle value
// must therefore change them before the call that makes a value free (the
// free), never after it. IDs reuses a freed value at the next New, the
// value freed last first, so that a driver that uses it (the host driver,
// the device model) exposes books kept in the wrong order to every test.
//
// The zero value is not usable: make one with NewIDs. IDs is not safe for
// concurrent use; the driver holds its own lock.
type IDs struct {
	next acl.PhysicalHandle
	free []acl.PhysicalHandle
}

// NewIDs returns IDs whose fresh values start after first.
func NewIDs(first acl.PhysicalHandle) IDs { return IDs{next: first} }

// New returns a value no live handle has: the one freed last, or a fresh one.
func (ids *IDs) New() acl.PhysicalHandle {
	if n := len(ids.free); n > 0 {
		h := ids.free[n-1]
		ids.free = ids.free[:n-1]
		return h
	}
	ids.next++
	return ids.next
}

// Free gives h back, to be handed out again. Call it once h names nothing
// the driver still books.
func (ids *IDs) Free(h acl.PhysicalHandle) { ids.free = append(ids.free, h) }
