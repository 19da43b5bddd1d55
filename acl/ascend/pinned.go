package ascend

import (
	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/sched"
)

// MallocHost is aclrtMallocHost: size bytes of page-locked host memory,
// which the NPU copies to and from at the link's full speed. Size 0 fails
// with 100000, as ACL does.
func (d *Driver) MallocHost(size uintptr) ([]byte, error) {
	const op = "aclrtMallocHost"
	if size == 0 {
		return nil, acl.NewError(op, acl.ErrCodeInvalidParam, "size is 0")
	}
	var p *byte
	if err := d.on(op, func() error { return d.check(op, d.lib.fns.mallocHost(&p, size)) }); err != nil {
		return nil, err
	}
	b := hostSlice(p, size)
	d.hostBufs.Add(b)
	return b, nil
}

// FreeHost is aclrtFreeHost of a buffer MallocHost returned, given by its
// first byte. Anything else fails with 107000 before the runtime sees it,
// and frees nothing.
func (d *Driver) FreeHost(b []byte) error {
	const op = "aclrtFreeHost"
	if _, ok := d.hostBufs.Size(b); !ok {
		return acl.NewError(op, acl.ErrCodeRTParamInvalid, "not host memory from aclrtMallocHost")
	}
	return d.on(op, func() error {
		// Out of the books before the runtime frees it: once freed, the
		// address may be another MallocHost's.
		n, ok := d.hostBufs.Remove(b)
		if !ok {
			return acl.NewError(op, acl.ErrCodeRTParamInvalid, "not host memory from aclrtMallocHost")
		}
		if err := d.check(op, d.lib.fns.freeHost(&b[0])); err != nil {
			d.hostBufs.Add(hostSlice(&b[0], uintptr(n)))
			return err
		}
		sched.At(sched.HostFreed, d) // a MallocHost here may get the same address
		return nil
	})
}
