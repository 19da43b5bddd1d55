package hccl

import (
	"errors"
	"fmt"
	"sync"

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
	lib  *Library
	zc   *zeroCopy
	comm Comm
	bind acl.Binder

	mu     sync.Mutex
	table  regtable.Table
	closed bool
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
	return &Registrar{lib: lib, zc: zc, comm: comm, bind: bind}, nil
}

// call runs fn as an HCCL call on a thread bound to the device.
func (r *Registrar) call(fn func() error) error {
	if r.bind == nil {
		return fn()
	}
	return r.bind.Bind(fn)
}

// begin locks r, and fails once it is closed.
func (r *Registrar) begin(op string) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return acl.Errorf(op, acl.ErrCodeRTContextNull, "registrar closed")
	}
	return nil
}

// SetMemoryRange is HcclCommSetMemoryRange(comm, base, size, 0, 0).
func (r *Registrar) SetMemoryRange(base acl.DevicePtr, size uintptr) error {
	const op = "HcclCommSetMemoryRange"
	if err := r.begin(op); err != nil {
		return err
	}
	defer r.mu.Unlock()
	if err := r.table.CheckSet(op, base, size); err != nil {
		return err
	}
	if err := aligned(op, uintptr(base), size); err != nil {
		return err
	}
	err := r.call(func() error {
		return r.lib.fail(op, r.zc.setMemoryRange(uintptr(r.comm), base, size, 0, 0))
	})
	if err != nil {
		return err
	}
	r.table.Set(base, size)
	return nil
}

// UnsetMemoryRange is HcclCommUnsetMemoryRange(comm, base).
func (r *Registrar) UnsetMemoryRange(base acl.DevicePtr) error {
	const op = "HcclCommUnsetMemoryRange"
	if err := r.begin(op); err != nil {
		return err
	}
	defer r.mu.Unlock()
	if _, err := r.table.CheckUnset(op, base); err != nil {
		return err
	}
	err := r.call(func() error {
		return r.lib.fail(op, r.zc.unsetMemoryRange(uintptr(r.comm), base))
	})
	if err != nil {
		return err
	}
	r.table.Unset(base)
	return nil
}

// Register is HcclCommActivateCommMemory(comm, m.Ptr, m.Size, 0, m.Handle, 0).
func (r *Registrar) Register(m acl.Mapping) error {
	const op = "HcclCommActivateCommMemory"
	if err := r.begin(op); err != nil {
		return err
	}
	defer r.mu.Unlock()
	if err := r.table.CheckRegister(op, m); err != nil {
		return err
	}
	if err := aligned(op, uintptr(m.Ptr), m.Size); err != nil {
		return err
	}
	err := r.call(func() error {
		return r.lib.fail(op, r.zc.activate(uintptr(r.comm), m.Ptr, m.Size, 0, m.Handle, 0))
	})
	if err != nil {
		return err
	}
	r.table.Register(m)
	return nil
}

// Deregister is HcclCommDeactivateCommMemory(comm, m.Ptr), of the block
// Register activated as m.
func (r *Registrar) Deregister(m acl.Mapping) error {
	const op = "HcclCommDeactivateCommMemory"
	if err := r.begin(op); err != nil {
		return err
	}
	defer r.mu.Unlock()
	if err := r.table.CheckDeregister(op, m); err != nil {
		return err
	}
	err := r.call(func() error {
		return r.lib.fail(op, r.zc.deactivate(uintptr(r.comm), m.Ptr))
	})
	if err != nil {
		return err
	}
	r.table.Deregister(m)
	return nil
}

// Live returns how many ranges the registrar has set and how many mappings
// it has activated, with their bytes.
func (r *Registrar) Live() (ranges, mappings int, bytes uintptr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	mappings, bytes = r.table.Mappings()
	return r.table.Ranges(), mappings, bytes
}

// Close deactivates what is still activated and unsets what is still set
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
	errs := []error{fmt.Errorf("hccl: registrar closed with %d activated mappings and %d set ranges", len(maps), len(ranges))}
	for _, m := range maps {
		err := r.call(func() error {
			return r.lib.fail("HcclCommDeactivateCommMemory", r.zc.deactivate(uintptr(r.comm), m.Ptr))
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.table.Deregister(m)
	}
	for _, rg := range ranges {
		err := r.call(func() error {
			return r.lib.fail("HcclCommUnsetMemoryRange", r.zc.unsetMemoryRange(uintptr(r.comm), acl.DevicePtr(rg.Base)))
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.table.Unset(acl.DevicePtr(rg.Base))
	}
	return errors.Join(errs...)
}

// aligned checks that an address and a length are whole multiples of
// RemoteAlign.
func aligned(op string, addr, size uintptr) error {
	if err := regtable.Aligned(op, "address", addr, RemoteAlign); err != nil {
		return err
	}
	return regtable.Aligned(op, "length", size, RemoteAlign)
}
