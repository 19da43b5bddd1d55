package host

import (
	"github.com/vmarena/vmarena/acl"
)

// MallocHost is aclrtMallocHost: size bytes of host memory for copies to
// and from the device. The host driver's device memory is host memory, so
// nothing is pinned: the buffer is an anonymous mapping of its own,
// populated up front as page-locking would (so that the first copy into it
// takes no page faults), outside the Go heap, and counted in Live until
// FreeHost.
func (d *Driver) MallocHost(size uintptr) ([]byte, error) {
	const op = "aclrtMallocHost"
	if size == 0 {
		return nil, fail(op, acl.ErrCodeInvalidParam, "size is 0")
	}
	d.mu.RLock()
	closed := d.closed
	d.mu.RUnlock()
	if closed {
		return nil, fail(op, acl.ErrCodeRTContextNull, errClosedMsg)
	}
	b, err := sysHostAlloc(size)
	if err != nil {
		return nil, fail(op, acl.ErrCodeRTMemoryAllocation, "%d bytes of host memory: %v", size, err)
	}
	d.hostBufs.Add(b)
	return b, nil
}

// FreeHost is aclrtFreeHost: it frees a buffer MallocHost returned, given by
// its first byte. Anything else fails with 107000 and frees nothing.
func (d *Driver) FreeHost(b []byte) error {
	const op = "aclrtFreeHost"
	n, ok := d.hostBufs.Size(b)
	if !ok {
		return fail(op, acl.ErrCodeRTParamInvalid, "not host memory from aclrtMallocHost")
	}
	if _, ok := d.hostBufs.Remove(b); !ok {
		return fail(op, acl.ErrCodeRTParamInvalid, "freed twice at once")
	}
	if err := sysHostFree(b[:n:n]); err != nil {
		return fail(op, acl.ErrCodeRTFailure, "%v", err)
	}
	return nil
}
