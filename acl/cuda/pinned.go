package cuda

import (
	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/sched"
)

// MallocHost is cuMemHostAlloc with flags 0 (the contract's
// aclrtMallocHost): size bytes of page-locked host memory, which the device
// copies to and from at the link's full speed. Size 0 fails with 100000,
// before any CUDA call.
func (d *Driver) MallocHost(size uintptr) ([]byte, error) {
	const op = "aclrtMallocHost"
	if size == 0 {
		return nil, fail(op, acl.ErrCodeInvalidParam, "size is 0")
	}
	if err := d.begin(op); err != nil {
		return nil, err
	}
	defer d.end()
	b, err := d.bind()
	if err != nil {
		return nil, err
	}
	var p *byte
	r := d.lib.cuMemHostAlloc(&p, size, 0)
	d.unbind(b)
	if r != ResultSuccess {
		return nil, d.lib.newError("cuMemHostAlloc", r)
	}
	buf := hostSlice(p, size)
	d.hostBufs.Add(buf)
	return buf, nil
}

// FreeHost is cuMemFreeHost (the contract's aclrtFreeHost) of a buffer
// MallocHost returned, given by its first byte. Anything else fails with
// 107000 before any CUDA call, and frees nothing.
func (d *Driver) FreeHost(buf []byte) error {
	const op = "aclrtFreeHost"
	if _, ok := d.hostBufs.Size(buf); !ok {
		return fail(op, acl.ErrCodeRTParamInvalid, "not host memory from aclrtMallocHost")
	}
	if err := d.begin(op); err != nil {
		return err
	}
	defer d.end()
	// Out of the books before CUDA frees it: once freed, the address may be
	// another MallocHost's, whose entry a later Remove would take.
	n, ok := d.hostBufs.Remove(buf)
	if !ok {
		return fail(op, acl.ErrCodeRTParamInvalid, "not host memory from aclrtMallocHost")
	}
	b, err := d.bind()
	if err != nil {
		d.hostBufs.Add(hostSlice(&buf[0], uintptr(n)))
		return err
	}
	r := d.lib.cuMemFreeHost(&buf[0])
	d.unbind(b)
	if r != ResultSuccess {
		d.hostBufs.Add(hostSlice(&buf[0], uintptr(n)))
		return d.lib.newError("cuMemFreeHost", r)
	}
	sched.At(sched.HostFreed, d) // a MallocHost here may get the same address
	return nil
}
