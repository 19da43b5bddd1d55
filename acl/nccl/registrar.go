package nccl

import (
	"errors"
	"fmt"
	"sync"

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
	lib  *Library
	comm Comm
	bind acl.Binder

	mu      sync.Mutex
	table   regtable.Table
	handles map[acl.DevicePtr]uintptr // each registered mapping's handle (0 where NCCL registered nothing)
	closed  bool
}

var _ acl.Registrar = (*Registrar)(nil)

// NewRegistrar returns the registrar of communicator comm of lib, calling
// NCCL inside bind's Bind (nil: on the calling thread as it is).
func NewRegistrar(lib *Library, comm Comm, bind acl.Binder) (*Registrar, error) {
	if lib == nil || comm == 0 {
		return nil, acl.Errorf("nccl.NewRegistrar", acl.ErrCodeRTParamInvalid, "a library and a communicator are needed")
	}
	return &Registrar{lib: lib, comm: comm, bind: bind, handles: map[acl.DevicePtr]uintptr{}}, nil
}

func (r *Registrar) call(fn func() error) error {
	if r.bind == nil {
		return fn()
	}
	return r.bind.Bind(fn)
}

func (r *Registrar) begin(op string) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return acl.Errorf(op, acl.ErrCodeRTContextNull, "registrar closed")
	}
	return nil
}

// SetMemoryRange records the range; NCCL is not called.
func (r *Registrar) SetMemoryRange(base acl.DevicePtr, size uintptr) error {
	const op = "SetMemoryRange"
	if err := r.begin(op); err != nil {
		return err
	}
	defer r.mu.Unlock()
	if err := r.table.CheckSet(op, base, size); err != nil {
		return err
	}
	r.table.Set(base, size)
	return nil
}

// UnsetMemoryRange forgets the range, which must have no registrations.
func (r *Registrar) UnsetMemoryRange(base acl.DevicePtr) error {
	const op = "UnsetMemoryRange"
	if err := r.begin(op); err != nil {
		return err
	}
	defer r.mu.Unlock()
	if _, err := r.table.CheckUnset(op, base); err != nil {
		return err
	}
	r.table.Unset(base)
	return nil
}

// Register is ncclCommRegister(comm, m.Ptr, m.Size, &handle).
func (r *Registrar) Register(m acl.Mapping) error {
	const op = "ncclCommRegister"
	if err := r.begin(op); err != nil {
		return err
	}
	defer r.mu.Unlock()
	if err := r.table.CheckRegister(op, m); err != nil {
		return err
	}
	var h uintptr
	err := r.call(func() (err error) {
		h, err = r.lib.CommRegister(r.comm, m.Ptr, m.Size)
		return err
	})
	if err != nil {
		return err
	}
	r.table.Register(m)
	r.handles[m.Ptr] = h
	return nil
}

// Deregister is ncclCommDeregister(comm, handle) of m's registration.
func (r *Registrar) Deregister(m acl.Mapping) error {
	const op = "ncclCommDeregister"
	if err := r.begin(op); err != nil {
		return err
	}
	defer r.mu.Unlock()
	if err := r.table.CheckDeregister(op, m); err != nil {
		return err
	}
	if err := r.call(func() error { return r.lib.CommDeregister(r.comm, r.handles[m.Ptr]) }); err != nil {
		return err
	}
	r.table.Deregister(m)
	delete(r.handles, m.Ptr)
	return nil
}

// Live returns how many ranges the registrar has set and how many mappings
// it has registered, with their bytes.
func (r *Registrar) Live() (ranges, mappings int, bytes uintptr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	mappings, bytes = r.table.Mappings()
	return r.table.Ranges(), mappings, bytes
}

// Close deregisters what is still registered and forgets what is still set
// (the caller leaked them: the error names them), and makes later calls
// fail with 107002. It does not destroy the communicator, which the caller
// owns. Close is safe to call more than once.
func (r *Registrar) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	maps, ranges := r.table.All(), r.table.AllRanges()
	if len(maps) == 0 && len(ranges) == 0 {
		return nil
	}
	errs := []error{fmt.Errorf("nccl: registrar closed with %d registered mappings and %d set ranges", len(maps), len(ranges))}
	for _, m := range maps {
		if err := r.call(func() error { return r.lib.CommDeregister(r.comm, r.handles[m.Ptr]) }); err != nil {
			errs = append(errs, err)
			continue
		}
		r.table.Deregister(m)
		delete(r.handles, m.Ptr)
	}
	for _, rg := range ranges {
		if _, err := r.table.CheckUnset("UnsetMemoryRange", acl.DevicePtr(rg.Base)); err == nil {
			r.table.Unset(acl.DevicePtr(rg.Base))
		}
	}
	return errors.Join(errs...)
}
