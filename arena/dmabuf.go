package arena

import (
	"errors"
	"fmt"
	"os"

	"github.com/vmarena/vmarena/acl"
)

// DMABuf is an export of an arena's mapped memory as a Linux dma-buf, the
// form in which an RDMA NIC registers device memory (ibv_reg_dmabuf_mr):
// [Ptr, Ptr+Size), the chunks below the arena's Cap when it was exported.
type DMABuf struct {
	// FD is the dma-buf's descriptor, the caller's to close.
	FD int
	// Ptr is the arena's base, where the exported memory starts.
	Ptr acl.DevicePtr
	// Size is the bytes exported: the arena's Cap when it was exported.
	Size uintptr
	// Generation is the arena's Generation when it was exported. The
	// descriptor describes the backing the memory had then: once
	// Generation has moved (a growth, a shrink, a relief, a sleep, a
	// wake), export again, register the new descriptor with the NIC and
	// drop the old registration and descriptor.
	Generation uint64
}

// Stale reports whether the arena's backing changed since d was exported
// (its Generation moved), so that d no longer describes the memory.
func (d DMABuf) Stale(a *Arena) bool { return a.Generation() != d.Generation }

// Close closes the descriptor (once its NIC registration is gone).
func (d DMABuf) Close() error {
	if d.FD < 0 {
		return fmt.Errorf("arena: close dma-buf: %w: descriptor %d", ErrInvalid, d.FD)
	}
	return os.NewFile(uintptr(d.FD), "dma-buf").Close()
}

// ExportDMABuf exports the arena's mapped prefix, [Base, Base+Cap), as a
// dma-buf, on a driver that can (acl.DMABufExporter: the CUDA binding, with
// every chunk created RDMA-capable, so that all have identical properties).
// The arena holds its lock while it exports, so the descriptor and the
// Generation returned agree. The descriptor is the caller's to close.
//
// An RDMA engine keeps a registration of the arena true by exporting again
// whenever the generation has moved (DMABuf.Stale), and by dropping its NIC
// registration of memory before the arena unmaps it: an OnBackingChange
// callback is told, at BackingUnmapping, which mappings are about to go,
// with the device's work on them done; it must deregister what covers them
// then (it cannot export from the callback: the arena refuses its own
// methods there, ErrCallback), and the engine exports again once the change
// is over. docs/distributed.md describes the whole protocol.
//
// It fails with an error matching acl.ErrNotSupported where the driver
// cannot export dma-bufs, ErrInvalid when nothing is mapped (Cap 0; an
// asleep arena has nothing mapped), ErrClosed on a closed arena, and with
// the driver's error where it refuses the range.
func (a *Arena) ExportDMABuf() (DMABuf, error) {
	const op = "arena: export dma-buf"
	if a == nil {
		return DMABuf{}, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	if a.drv == nil {
		return DMABuf{}, errNotMade
	}
	if a.ev.owner.Load() != 0 && a.inCallback() {
		return DMABuf{}, errCallback
	}
	exp, ok := a.drv.(acl.DMABufExporter)
	if !ok {
		return DMABuf{}, fmt.Errorf("%s: %w: the driver cannot export dma-bufs", op, acl.ErrNotSupported)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	switch l := a.lifeNow(); l {
	case lifeOpen, lifeImported, lifeAsleep:
	default:
		if err := l.err(); err != nil {
			return DMABuf{}, fmt.Errorf("%s: %w", op, err)
		}
	}
	size := uintptr(a.cap.Load())
	if size == 0 {
		return DMABuf{}, fmt.Errorf("%s: %w: nothing is mapped (Cap 0)", op, ErrInvalid)
	}
	fd, err := exp.ExportDMABuf(a.base, size)
	if err != nil {
		return DMABuf{}, fmt.Errorf("%s: %w", op, err)
	}
	if fd < 0 {
		return DMABuf{}, fmt.Errorf("%s: %w", op, errors.New("the driver returned no descriptor"))
	}
	return DMABuf{FD: fd, Ptr: a.base, Size: size, Generation: a.ev.gen.Load()}, nil
}
