package nccl

import (
	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/regtable"
)

// Registrar is the acl.Registrar of one NCCL communicator: it registers
// each of an arena's mappings with the communicator on its own, so that no
// registration spans two physical allocations:
//
//	SetMemoryRange(base, size)   (books only: NCCL has no range call)
//	Register(m)                  ncclCommRegister(comm, m.Ptr, m.Size, &handle)
//	Deregister(m)                ncclCommDeregister(comm, handle)
//	UnsetMemoryRange(base)       (books only)
//
// It keeps the books of the set ranges and of each mapping's registration
// handle, and refuses, before NCCL sees it, any call the protocol forbids
// (with 107000, acl.ErrInvalidParam): a mapping outside a set range or
// overlapping a registered one, a deregistration of what is not registered
// as given, an unset of a range with registrations. A call NCCL refuses
// returns its *Error and changes nothing. NCCL needs no alignment: the
// registrations are the mappings, with no padding.
//
// NCCL works on the calling thread's CUDA context: give NewRegistrar the
// device's driver (package acl/cuda) as its acl.Binder.
//
// A Registrar is safe for concurrent use; it makes one NCCL call at a time.
type Registrar struct {
	lib     *Library
	comm    Comm
	books   regtable.Books
	handles map[acl.DevicePtr]uintptr // each registered mapping's handle (0 where NCCL registered nothing); guarded by books
}

var _ acl.Registrar = (*Registrar)(nil)

// NewRegistrar returns the registrar of communicator comm of lib, calling
// NCCL inside bind's Bind (nil: on the calling thread as it is).
func NewRegistrar(lib *Library, comm Comm, bind acl.Binder) (*Registrar, error) {
	if lib == nil || comm == 0 {
		return nil, acl.Errorf("nccl.NewRegistrar", acl.ErrCodeRTParamInvalid, "a library and a communicator are needed")
	}
	r := &Registrar{lib: lib, comm: comm, handles: map[acl.DevicePtr]uintptr{}}
	r.books.Bind = bind
	return r, nil
}

// SetMemoryRange records the range; NCCL is not called.
func (r *Registrar) SetMemoryRange(base acl.DevicePtr, size uintptr) error {
	const op = "SetMemoryRange"
	if err := r.books.Lock(op); err != nil {
		return err
	}
	defer r.books.Unlock()
	t := r.books.Table()
	if err := t.CheckSet(op, base, size); err != nil {
		return err
	}
	t.Set(base, size)
	return nil
}

// UnsetMemoryRange forgets the range, which must have no registrations.
func (r *Registrar) UnsetMemoryRange(base acl.DevicePtr) error {
	const op = "UnsetMemoryRange"
	if err := r.books.Lock(op); err != nil {
		return err
	}
	defer r.books.Unlock()
	t := r.books.Table()
	if _, err := t.CheckUnset(op, base); err != nil {
		return err
	}
	t.Unset(base)
	return nil
}

// Register is ncclCommRegister(comm, m.Ptr, m.Size, &handle).
func (r *Registrar) Register(m acl.Mapping) error {
	const op = "ncclCommRegister"
	if err := r.books.Lock(op); err != nil {
		return err
	}
	defer r.books.Unlock()
	t := r.books.Table()
	if err := t.CheckRegister(op, m); err != nil {
		return err
	}
	var h uintptr
	err := r.books.Call(func() (err error) {
		h, err = r.lib.CommRegister(r.comm, m.Ptr, m.Size)
		return err
	})
	if err != nil {
		return err
	}
	t.Register(m)
	r.handles[m.Ptr] = h
	return nil
}

// Deregister is ncclCommDeregister(comm, handle) of m's registration.
func (r *Registrar) Deregister(m acl.Mapping) error {
	const op = "ncclCommDeregister"
	if err := r.books.Lock(op); err != nil {
		return err
	}
	defer r.books.Unlock()
	t := r.books.Table()
	if err := t.CheckDeregister(op, m); err != nil {
		return err
	}
	if err := r.books.Call(func() error { return r.deregister(m) }); err != nil {
		return err
	}
	t.Deregister(m)
	return nil
}

// deregister is ncclCommDeregister of m's handle, which it forgets once NCCL
// has accepted. Call it holding the books.
func (r *Registrar) deregister(m acl.Mapping) error {
	if err := r.lib.CommDeregister(r.comm, r.handles[m.Ptr]); err != nil {
		return err
	}
	delete(r.handles, m.Ptr)
	return nil
}

// Live returns how many ranges the registrar has set and how many mappings
// it has registered, with their bytes.
func (r *Registrar) Live() (ranges, mappings int, bytes uintptr) { return r.books.Live() }

// Close deregisters what is still registered and forgets what is still set
// (the caller leaked them: the error names them), and makes later calls
// fail with 107002. It does not destroy the communicator, which the caller
// owns. Close is safe to call more than once.
func (r *Registrar) Close() error { return r.books.Close("nccl", r.deregister, nil) }
