package acl

import (
	"errors"
	"fmt"
	"slices"
)

// Registering device memory with the libraries that move it between devices
// and machines (HCCL on Ascend, NCCL on NVIDIA, RDMA engines).
//
// Those libraries must be told which device memory they may read and write,
// and they must be told again whenever its backing changes: a registration
// outlives neither an unmap nor a remap of what it covers. Memory that is
// reserved once and mapped chunk by chunk changes its backing at every grow
// and shrink, so its owner, who makes each change, is the one place that can
// keep the libraries' view true. It does so through a [Registrar], in this
// order, for each reservation:
//
//	ReserveMemAddress → SetMemoryRange
//	MapMem → MemSetAccess → Register          (each mapping, before any use of it)
//	Deregister → UnmapMem                     (each mapping, after the last use of it)
//	UnsetMemoryRange → ReleaseMemAddress      (once no mapping in it is registered)
//
// so that at every moment no registered range covers memory that is not
// mapped with access, and, once a growth or shrink has finished, every
// mapping in a set range is registered exactly once. The calls map one to one
// onto HCCL's zero-copy calls (HcclCommSetMemoryRange, HcclCommActivateCommMemory,
// HcclCommDeactivateCommMemory, HcclCommUnsetMemoryRange) and onto a
// registration per mapping with NCCL (ncclCommRegister, ncclCommDeregister),
// or per run of adjacent mappings (package acl/nccl's Coalesce, which takes
// each change's mappings at once: BatchRegistrar).

// Registrar is told the life of a reservation's memory by its owner, in the
// order above, and registers that memory with a library. Implementations:
// package acl/hccl (HCCL zero-copy memory of a communicator), package
// acl/nccl (NCCL user-buffer registration of a communicator), and the
// registration double of package acl/acltest, which checks the order
// against a driver's mappings.
//
// A call that fails changes nothing: the library's state and the
// registrar's are as they were, so the caller can undo its own step (unmap
// the chunk it could not register) or keep it (a mapping whose deregistration
// failed stays mapped and registered, since unmapping it would leave the
// library a registration over unmapped memory). A Registrar is safe for
// concurrent use; calls about one reservation come from its owner, in order.
type Registrar interface {
	// SetMemoryRange is told, once per reservation and before any Register
	// inside it, that [base, base+size) was reserved (ReserveMemAddress)
	// and will be mapped chunk by chunk. base is the reservation's base and
	// size at most its size; set ranges never overlap.
	SetMemoryRange(base DevicePtr, size uintptr) error
	// UnsetMemoryRange is told, before ReleaseMemAddress, that the
	// reservation at base goes. Every mapping in it has been deregistered.
	UnsetMemoryRange(base DevicePtr) error
	// Register is told that m was just mapped (MapMem of the whole
	// physical allocation m.Handle at m.Ptr) and given access, before any
	// of its bytes are used. m lies inside one set range and overlaps no
	// registered mapping.
	Register(m Mapping) error
	// Deregister is told that m, registered before, is about to be unmapped:
	// no work of the library's that uses m is pending, and UnmapMem follows
	// once Deregister has succeeded. m is the Mapping that was registered.
	Deregister(m Mapping) error
}

// BatchRegistrar is a Registrar that can take several mappings in one call,
// all or nothing: the mappings one change of an owner's backing maps or
// unmaps together (a growth of several chunks, a shrink). A registrar whose
// library registers a run of adjacent mappings as one buffer (NCCL, with
// package acl/nccl's Coalesce) implements it, so that a growth of k chunks
// costs it one re-registration of the run rather than k. Use RegisterAll
// and DeregisterAll to call any Registrar this way.
type BatchRegistrar interface {
	Registrar
	// RegisterBatch is Register of each of ms (each mapped with access,
	// none overlapping another or a registered mapping), as one call: when
	// it fails, none of ms is registered and the library is as it was.
	RegisterBatch(ms []Mapping) error
	// DeregisterBatch is Deregister of each of ms, as one call: when it
	// fails, every one of ms is still registered.
	DeregisterBatch(ms []Mapping) error
}

// RegisterAll registers ms with r, all or nothing: in one call where r is a
// BatchRegistrar, else one Register each, the ones made before a failure
// deregistered again (when that fails too, both errors are returned, and
// what could not be undone stays registered with r).
func RegisterAll(r Registrar, ms []Mapping) error {
	if len(ms) == 0 {
		return nil
	}
	if b, ok := r.(BatchRegistrar); ok {
		return b.RegisterBatch(ms)
	}
	return each(ms, r.Register, r.Deregister)
}

// DeregisterAll deregisters ms from r, all or nothing, as RegisterAll
// registers them: when it fails, the ones deregistered before the failure
// are registered again.
func DeregisterAll(r Registrar, ms []Mapping) error {
	if len(ms) == 0 {
		return nil
	}
	if b, ok := r.(BatchRegistrar); ok {
		return b.DeregisterBatch(ms)
	}
	return each(ms, r.Deregister, r.Register)
}

// each calls do on every mapping of ms in order, and, when one fails, undo
// on those before it, last first.
func each(ms []Mapping, do, undo func(Mapping) error) error {
	for i, m := range ms {
		if err := do(m); err != nil {
			var errs []error
			for _, done := range slices.Backward(ms[:i]) {
				errs = append(errs, undo(done))
			}
			return errors.Join(err, errors.Join(errs...))
		}
	}
	return nil
}

// Mapping is one mapping of a whole physical allocation: [Ptr, Ptr+Size)
// backed by Handle (MapMem(Ptr, Size, 0, Handle, 0)).
type Mapping struct {
	Ptr    DevicePtr      // where the mapping starts
	Size   uintptr        // its length: the whole allocation's size
	Handle PhysicalHandle // the allocation behind it (an aclrtDrvMemHandle on ACL)
}

// End returns the address just past m.
func (m Mapping) End() DevicePtr { return m.Ptr.Add(m.Size) }

// String formats m as "[ptr, +size) handle".
func (m Mapping) String() string {
	return fmt.Sprintf("[%v, +%d) handle %#x", m.Ptr, m.Size, uintptr(m.Handle))
}

// Binder is implemented by drivers that bind a device context to the calling
// OS thread, as ACL and CUDA do (packages acl/ascend and acl/cuda). Another
// library of the platform that works on the driver's device (HCCL, NCCL)
// must be called on a thread where that context is current: Bind runs fn on
// a locked OS thread with the driver's device context current, and returns
// fn's error. fn must not call the driver itself (its calls bind on their
// own) nor keep the thread after it returns.
type Binder interface {
	Bind(fn func() error) error
}

// DMABufExporter is implemented by drivers that can export mapped device
// memory as a Linux dma-buf, the form in which an RDMA NIC registers device
// memory (ibv_reg_dmabuf_mr). The CUDA binding does, with
// cuMemGetHandleForAddressRange; see docs/distributed.md.
type DMABufExporter interface {
	// ExportDMABuf returns a new dma-buf file descriptor for [ptr, ptr+size),
	// which must be aligned to the host's page size and fully mapped with
	// access, by adjacent mappings of one reservation whose allocations were
	// made with identical properties. The descriptor is the caller's to
	// close. It describes the backing the range has when it is exported:
	// after any change of that backing (an unmap, a map) the old descriptor
	// no longer describes the range, and the range must be exported again.
	// An error matching ErrNotSupported means the driver, its device or its
	// library cannot export dma-bufs.
	ExportDMABuf(ptr DevicePtr, size uintptr) (fd int, err error)
}
