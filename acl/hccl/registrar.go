package hccl

import (
	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/regtable"
)

// RemoteAlign is the alignment, in bytes, of the addresses and lengths HCCL
// can give its peers: they map activated memory into a mirror of the set
// range with aclrtMapMem, in whole 2 MiB pages. An arena's chunks meet it
// by construction (docs/distributed.md says why), so the registrar pads
// nothing, and refuses what does not meet it.
const RemoteAlign = acl.HugePageSize

// Registrar is the acl.Registrar of one HCCL communicator: it makes an
// arena's memory zero-copy memory of the communicator, one HCCL call per
// step of the protocol:
//
//	SetMemoryRange(base, size)   HcclCommSetMemoryRange(comm, base, size, 0, 0)
//	Register(m)                  HcclCommActivateCommMemory(comm, m.Ptr, m.Size, 0, m.Handle, 0)
//	Deregister(m)                HcclCommDeactivateCommMemory(comm, m.Ptr)
//	UnsetMemoryRange(base)       HcclCommUnsetMemoryRange(comm, base)
//
// It keeps the books of what it set and activated and refuses, before HCCL
// sees it, any call the protocol forbids (with 107000, acl.ErrInvalidParam):
// a range overlapping a set one, a mapping outside a set range or
// overlapping an activated one, a deregistration of what is not activated
// as given, an unset of a range with activated memory, and any address or
// length that is not a multiple of RemoteAlign. A call HCCL refuses returns
// its *Error and changes nothing.
//
// m.Handle must be the ACL runtime's aclrtDrvMemHandle, as the Ascend
// driver's physical handles are (package acl/ascend). HCCL works on the
// calling thread's device: give NewRegistrar the device's driver as its
// acl.Binder. HCCL's set ranges and activated memory belong to the process,
// not to one communicator: two Registrars of one process must not set
// overlapping ranges (HCCL refuses it).
//
// A Registrar is safe for concurrent use; it makes one HCCL call at a time.
type Registrar struct {
	lib   *Library
	zc    *zeroCopy
	comm  Comm
	books regtable.Books
}

var _ acl.Registrar = (*Registrar)(nil)

// NewRegistrar returns the registrar of communicator comm of lib, calling
// HCCL inside bind's Bind (nil: on the calling thread as it is). It fails
// with an error wrapping acl.ErrNotSupported when lib lacks the zero-copy
// calls.
func NewRegistrar(lib *Library, comm Comm, bind acl.Binder) (*Registrar, error) {
	if lib == nil || comm == 0 {
		return nil, acl.Errorf("hccl.NewRegistrar", acl.ErrCodeRTParamInvalid, "a library and a communicator are needed")
	}
	zc, err := lib.zeroCopyFuncs()
	if err != nil {
		return nil, err
	}
	r := &Registrar{lib: lib, zc: zc, comm: comm}
	r.books.Bind = bind
	return r, nil
}

// SetMemoryRange is HcclCommSetMemoryRange(comm, base, size, 0, 0).
func (r *Registrar) SetMemoryRange(base acl.DevicePtr, size uintptr) error {
	const op = "HcclCommSetMemoryRange"
	if err := r.books.Lock(op); err != nil {
		return err
	}
	defer r.books.Unlock()
	t := r.books.Table()
	if err := t.CheckSet(op, base, size); err != nil {
		return err
	}
	if err := aligned(op, uintptr(base), size); err != nil {
		return err
	}
	if err := r.books.Call(func() error { return r.setMemoryRange(base, size) }); err != nil {
		return err
	}
	t.Set(base, size)
	return nil
}

// UnsetMemoryRange is HcclCommUnsetMemoryRange(comm, base).
func (r *Registrar) UnsetMemoryRange(base acl.DevicePtr) error {
	const op = "HcclCommUnsetMemoryRange"
	if err := r.books.Lock(op); err != nil {
		return err
	}
	defer r.books.Unlock()
	t := r.books.Table()
	if _, err := t.CheckUnset(op, base); err != nil {
		return err
	}
	if err := r.books.Call(func() error { return r.unsetMemoryRange(base) }); err != nil {
		return err
	}
	t.Unset(base)
	return nil
}

// Register is HcclCommActivateCommMemory(comm, m.Ptr, m.Size, 0, m.Handle, 0).
func (r *Registrar) Register(m acl.Mapping) error {
	const op = "HcclCommActivateCommMemory"
	if err := r.books.Lock(op); err != nil {
		return err
	}
	defer r.books.Unlock()
	t := r.books.Table()
	if err := t.CheckRegister(op, m); err != nil {
		return err
	}
	if err := aligned(op, uintptr(m.Ptr), m.Size); err != nil {
		return err
	}
	if err := r.books.Call(func() error { return r.activate(m) }); err != nil {
		return err
	}
	t.Register(m)
	return nil
}

// Deregister is HcclCommDeactivateCommMemory(comm, m.Ptr), of the block
// Register activated as m.
func (r *Registrar) Deregister(m acl.Mapping) error {
	const op = "HcclCommDeactivateCommMemory"
	if err := r.books.Lock(op); err != nil {
		return err
	}
	defer r.books.Unlock()
	t := r.books.Table()
	if err := t.CheckDeregister(op, m); err != nil {
		return err
	}
	if err := r.books.Call(func() error { return r.deactivate(m) }); err != nil {
		return err
	}
	t.Deregister(m)
	return nil
}

// The HCCL calls, with the registrar's communicator.

func (r *Registrar) setMemoryRange(base acl.DevicePtr, size uintptr) error {
	return r.lib.fail("HcclCommSetMemoryRange", r.zc.setMemoryRange(uintptr(r.comm), base, size, 0, 0))
}

func (r *Registrar) unsetMemoryRange(base acl.DevicePtr) error {
	return r.lib.fail("HcclCommUnsetMemoryRange", r.zc.unsetMemoryRange(uintptr(r.comm), base))
}

func (r *Registrar) activate(m acl.Mapping) error {
	return r.lib.fail("HcclCommActivateCommMemory", r.zc.activate(uintptr(r.comm), m.Ptr, m.Size, 0, m.Handle, 0))
}

func (r *Registrar) deactivate(m acl.Mapping) error {
	return r.lib.fail("HcclCommDeactivateCommMemory", r.zc.deactivate(uintptr(r.comm), m.Ptr))
}

// Live returns how many ranges the registrar has set and how many mappings
// it has activated, with their bytes.
func (r *Registrar) Live() (ranges, mappings int, bytes uintptr) { return r.books.Live() }

// Close deactivates what is still activated and unsets what is still set
// (the caller leaked them: the error names them), and makes later calls
// fail with 107002. It does not destroy the communicator, which the caller
// owns. Close is safe to call more than once.
func (r *Registrar) Close() error { return r.books.Close("hccl", r.deactivate, r.unsetMemoryRange) }

// aligned checks that an address and a length are whole multiples of
// RemoteAlign.
func aligned(op string, addr, size uintptr) error {
	if err := regtable.Aligned(op, "address", addr, RemoteAlign); err != nil {
		return err
	}
	return regtable.Aligned(op, "length", size, RemoteAlign)
}
