package arenatest

import (
	"sync"

	"github.com/vmarena/vmarena/acl"
)

// Capped returns d with its device memory limited to capacity bytes: a
// MallocPhysical that would take the live allocations past it fails with
// 207001, as a full device does, and GetMemInfo reports the capacity. It lets
// the suite's out-of-memory tests run on real hardware, whose memory cannot be
// shrunk. Close closes d.
func Capped(d acl.Driver, capacity uintptr) acl.Driver {
	c := &capped{Driver: d, capacity: capacity, sizes: make(map[acl.PhysicalHandle]uintptr)}
	if counter, ok := d.(acl.Counter); ok {
		return &cappedCounter{c, counter}
	}
	return c
}

type capped struct {
	acl.Driver
	capacity uintptr

	mu    sync.Mutex
	used  uintptr
	sizes map[acl.PhysicalHandle]uintptr
}

type cappedCounter struct {
	*capped
	acl.Counter
}

func (c *capped) MallocPhysical(size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	c.mu.Lock()
	if size > c.capacity-c.used {
		used := c.used
		c.mu.Unlock()
		return 0, acl.Errorf("aclrtMallocPhysical", acl.ErrCodeRTMemoryAllocation,
			"test capacity: %d of %d bytes in use, %d asked", used, c.capacity, size)
	}
	c.used += size
	c.mu.Unlock()
	h, err := c.Driver.MallocPhysical(size, prop, flags)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.used -= size
		return 0, err
	}
	c.sizes[h] = size
	return h, nil
}

func (c *capped) FreePhysical(h acl.PhysicalHandle) error {
	err := c.Driver.FreePhysical(h)
	if err == nil {
		c.mu.Lock()
		c.used -= c.sizes[h]
		delete(c.sizes, h)
		c.mu.Unlock()
	}
	return err
}

func (c *capped) GetMemInfo(attr acl.MemAttr) (free, total uintptr, err error) {
	if _, _, err := c.Driver.GetMemInfo(attr); err != nil {
		return 0, 0, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.capacity - c.used, c.capacity, nil
}
