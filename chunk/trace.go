package chunk

import (
	"context"
	"runtime/trace"

	"github.com/vmarena/vmarena/acl"
)

// Tracing.
//
// Every driver call the pool makes runs inside a runtime/trace region named
// after the driver method ("acl.MapMem", "acl.SynchronizeDevice", …), and the
// pool's slow paths inside regions of their own (see the Region constants),
// so that `go tool trace` shows where a goroutine waited on the allocator.
// While no trace is being recorded a region costs one atomic load
// (trace.IsEnabled), on paths that call the driver anyway.

// Names of the regions the pool's slow paths run in.
const (
	RegionRelieve = "vmarena.relieve" // a growth that found no room reclaims from members, waits for the device, trims peers
	RegionScrub   = "vmarena.scrub"   // a chunk cleared so that no tenant reads another's bytes
	RegionRelease = "vmarena.release" // chunks unmapped and given back (after a device wait, or once their events completed)
	RegionWorker  = "vmarena.worker"  // one round of the pool's background worker
)

// region starts a trace region with no task; End it.
func region(name string) *trace.Region { return trace.StartRegion(context.Background(), name) }

// traced wraps the pool's driver: each call that can take time runs in a
// trace region named after it. Unwrap lets root find the device's driver.
// A free is recorded in the device's history first (see history.freed).
type traced struct {
	acl.Driver
	hist *history // nil until the pool has joined its device
}

// Unwrap returns the wrapped driver.
func (t traced) Unwrap() acl.Driver { return t.Driver }

func (t traced) MallocPhysical(size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	defer region("acl.MallocPhysical").End()
	return t.Driver.MallocPhysical(size, prop, flags)
}

func (t traced) FreePhysical(h acl.PhysicalHandle) error {
	defer region("acl.FreePhysical").End()
	if t.hist != nil {
		t.hist.freed.Store(true) // before the memory can go to anyone else
	}
	return t.Driver.FreePhysical(h)
}

func (t traced) MapMem(ptr acl.DevicePtr, size, offset uintptr, h acl.PhysicalHandle, flags uint64) error {
	defer region("acl.MapMem").End()
	return t.Driver.MapMem(ptr, size, offset, h, flags)
}

func (t traced) UnmapMem(ptr acl.DevicePtr) error {
	defer region("acl.UnmapMem").End()
	return t.Driver.UnmapMem(ptr)
}

func (t traced) MemSetAccess(ptr acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc) error {
	defer region("acl.MemSetAccess").End()
	return t.Driver.MemSetAccess(ptr, size, desc)
}

func (t traced) Memset(ptr acl.DevicePtr, value byte, n uintptr) error {
	defer region("acl.Memset").End()
	return t.Driver.Memset(ptr, value, n)
}

func (t traced) MemsetAsync(ptr acl.DevicePtr, value byte, n uintptr, s acl.Stream) error {
	defer region("acl.MemsetAsync").End()
	return t.Driver.MemsetAsync(ptr, value, n, s)
}

func (t traced) SynchronizeStream(s acl.Stream) error {
	defer region("acl.SynchronizeStream").End()
	return t.Driver.SynchronizeStream(s)
}

func (t traced) SynchronizeDevice() error {
	defer region("acl.SynchronizeDevice").End()
	return t.Driver.SynchronizeDevice()
}

func (t traced) CreateEvent() (acl.Event, error) {
	defer region("acl.CreateEvent").End()
	return t.Driver.CreateEvent()
}

func (t traced) RecordEvent(ev acl.Event, s acl.Stream) error {
	defer region("acl.RecordEvent").End()
	return t.Driver.RecordEvent(ev, s)
}

func (t traced) QueryEvent(ev acl.Event) (bool, error) {
	defer region("acl.QueryEvent").End()
	return t.Driver.QueryEvent(ev)
}

func (t traced) SynchronizeEvent(ev acl.Event) error {
	defer region("acl.SynchronizeEvent").End()
	return t.Driver.SynchronizeEvent(ev)
}

func (t traced) DestroyEvent(ev acl.Event) error {
	defer region("acl.DestroyEvent").End()
	return t.Driver.DestroyEvent(ev)
}
