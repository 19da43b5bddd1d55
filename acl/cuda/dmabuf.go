package cuda

import (
	"os"

	"github.com/vmarena/vmarena/acl"
)

// Exporting mapped memory as a dma-buf, for RDMA.
//
// cuMemGetHandleForAddressRange with CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
// exports a range of device memory as a Linux dma-buf, which an RDMA NIC
// registers (ibv_reg_dmabuf_mr). For memory reserved with
// cuMemAddressReserve, CUDA documents that the range must be aligned to the
// host's page size, fully mapped, and backed by allocations of one device
// with identical allocation properties, and that the handle must be fetched
// again whenever the allocations behind the range change. The binding makes
// every allocation GPUDirect RDMA capable where the device allows it on VMM
// memory (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED), so
// that all of an arena's chunks share one set of properties, and it checks
// the rules above in its books before CUDA sees the call.

// props is what must be identical across the allocations behind an exported
// range: the CUmemAllocationProp fields a chunk can differ in.
type props struct {
	handleTypes int32       // requestedHandleTypes: an exportable chunk differs from another
	location    memLocation // the device
	rdma        uint8       // allocFlags.gpuDirectRDMACapable
	compression uint8       // allocFlags.compressionType
	usage       uint16      // allocFlags.usage
}

func propsOf(p *memAllocationProp) props {
	return props{
		handleTypes: p.RequestedHandleTypes,
		location:    p.Location,
		rdma:        p.GPUDirectRDMACapable,
		compression: p.CompressionType,
		usage:       p.Usage,
	}
}

// queryRDMA asks whether the device makes VMM allocations GPUDirect RDMA
// capable, and whether it exports dma-bufs. A driver too old to know an
// attribute answers no.
func (d *Driver) queryRDMA() (rdma, dmaBuf bool) {
	var v int32
	rdma = d.lib.cuDeviceGetAttribute(&v, cuDevAttrRDMAWithVMM, d.dev) == ResultSuccess && v != 0
	v = 0
	dmaBuf = d.lib.cuDeviceGetAttribute(&v, cuDevAttrDMABufSupported, d.dev) == ResultSuccess && v != 0
	return rdma, dmaBuf && d.lib.cuMemGetHandleForAddressRange != nil
}

// RDMACapable reports whether the driver makes its allocations GPUDirect
// RDMA capable (the device supports it on VMM memory), and whether it can
// export dma-bufs (ExportDMABuf).
func (d *Driver) RDMACapable() (rdma, dmaBuf bool) { return d.rdma, d.dmaBuf }

var (
	_ acl.DMABufExporter = (*Driver)(nil)
	_ acl.Binder         = (*Driver)(nil)
)

// ExportDMABuf is cuMemGetHandleForAddressRange(&fd, ptr, size,
// CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0): a new dma-buf descriptor for
// [ptr, ptr+size), which the caller closes. The range must be aligned to the
// host's page size and mapped with access throughout, by adjacent mappings
// of one reservation whose allocations have identical properties (an
// exportable chunk next to another, or an imported one made elsewhere with
// other flags, is refused with 107000 before CUDA is called). The descriptor
// describes the allocations behind the range now: after the range's backing
// changes, export it again. It fails with 207000 (ErrNotSupported) where
// the driver lacks the call (before CUDA 11.7) or the device does not
// export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0).
func (d *Driver) ExportDMABuf(ptr acl.DevicePtr, size uintptr) (int, error) {
	const op = "ExportDMABuf"
	page := uintptr(os.Getpagesize())
	switch {
	case ptr == 0 || size == 0:
		return -1, fail(op, acl.ErrCodeInvalidParam, "[%v, +%d): empty or NULL", ptr, size)
	case uintptr(ptr)%page != 0 || size%page != 0:
		return -1, fail(op, acl.ErrCodeRTParamInvalid, "[%v, +%d) is not aligned to the host page size %d", ptr, size, page)
	case d.lib.cuMemGetHandleForAddressRange == nil:
		return -1, fail(op, acl.ErrCodeRTFeatureNotSupport, "%s lacks cuMemGetHandleForAddressRange (CUDA 11.7 and later have it)", d.lib.path)
	case !d.dmaBuf:
		return -1, fail(op, acl.ErrCodeRTFeatureNotSupport, "device %d does not export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0)", d.cfg.Device)
	}
	if err := d.begin(op); err != nil {
		return -1, err
	}
	defer d.end()
	// Read-held: no mapping of the range changes during the call.
	d.mu.RLock()
	defer d.mu.RUnlock()
	r, err := d.book.Accessible(op, ptr, size)
	if err != nil {
		return -1, err
	}
	end := uintptr(ptr) + size
	first := r.Maps[r.Index(uintptr(ptr))]
	for i := r.Index(uintptr(ptr)); i < len(r.Maps) && r.Maps[i].Addr < end; i++ {
		if m := r.Maps[i]; m.H.props != first.H.props {
			return -1, fail(op, acl.ErrCodeRTParamInvalid,
				"the allocations behind [%v, +%d) differ in properties: %+v at %#x, %+v at %#x", ptr, size,
				first.H.props, first.Addr, m.H.props, m.Addr)
		}
	}
	b, err := d.bind()
	if err != nil {
		return -1, err
	}
	var fd int32 = -1
	res := d.lib.cuMemGetHandleForAddressRange(&fd, uint64(ptr), size, cuMemRangeHandleDMABufFD, 0)
	d.unbind(b)
	if res != ResultSuccess {
		return -1, d.lib.newError("cuMemGetHandleForAddressRange", res)
	}
	return int(fd), nil
}

// Bind runs fn on a locked OS thread with the device's primary context
// current (acl.Binder), for calls into other CUDA libraries (NCCL) that must
// see the driver's device. It fails with 107002 once the driver is closed,
// and Close waits for fn to return.
func (d *Driver) Bind(fn func() error) error {
	if err := d.begin("Bind"); err != nil {
		return err
	}
	defer d.end()
	b, err := d.bind()
	if err != nil {
		return err
	}
	defer d.unbind(b)
	return fn()
}
