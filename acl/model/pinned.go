package model

import (
	"github.com/vmarena/vmarena/acl"
)

// MallocHost is aclrtMallocHost: size bytes of host memory for copies to
// and from the device. The model returns ordinary Go memory and charges the
// call nothing (no profile prices page-locking yet); copies to and from the
// buffer (or any part of it) are charged the profile's pinned bandwidths
// (DeviceCost.PinnedHtoDGBps, PinnedDtoHGBps). The buffer is counted in Live
// until FreeHost.
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
	if size > d.capa {
		// More than the device holds is surely a mistake, and would take the
		// Go heap with it.
		return nil, fail(op, acl.ErrCodeRTMemoryAllocation, "%d bytes of host memory: more than the modelled device's %d", size, d.capa)
	}
	b := make([]byte, size)
	d.hostBufs.Add(b)
	return b, nil
}

// FreeHost is aclrtFreeHost: it frees a buffer MallocHost returned, given by
// its first byte. Anything else fails with 107000 and frees nothing.
func (d *Driver) FreeHost(b []byte) error {
	if _, ok := d.hostBufs.Remove(b); !ok {
		return fail("aclrtFreeHost", acl.ErrCodeRTParamInvalid, "not host memory from aclrtMallocHost")
	}
	return nil
}
