package nccl_test

import (
	"errors"
	"fmt"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/cuda"
	"github.com/vmarena/vmarena/acl/nccl"
)

// Where NCCL cannot be loaded, Open says so with acl.ErrNotSupported, and a
// program goes on without registering its memory.
func ExampleOpen() {
	_, err := nccl.Open(nccl.Config{Library: "/nonexistent/libnccl.so.2"})
	if errors.Is(err, acl.ErrNotSupported) {
		fmt.Println("no NCCL here: memory stays unregistered")
	}
	// Output: no NCCL here: memory stays unregistered
}

// On a GPU with NCCL 2.19 or later: a communicator, and a registrar of it
// bound to the device, told each step of the memory's life (here by hand,
// in the order an arena keeps).
func ExampleNewRegistrar() {
	d, err := cuda.Open(cuda.Config{Device: 0})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	lib, err := nccl.Open(nccl.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	var comms []nccl.Comm
	err = d.Bind(func() (err error) {
		comms, err = lib.CommInitAll([]int32{0})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Bind(func() error { return lib.CommDestroy(comms[0]) })
	r, _ := nccl.NewRegistrar(lib, comms[0], d)
	defer r.Close()

	base, _ := d.ReserveMemAddress(1<<30, 0, 0, 0)
	_ = r.SetMemoryRange(base, 1<<30)
	prop := acl.DeviceProp(0, acl.HBMMemHuge)
	h, _ := d.MallocPhysical(acl.HugePageSize, &prop, 0)
	_ = d.MapMem(base, acl.HugePageSize, 0, h, 0)
	_ = d.MemSetAccess(base, acl.HugePageSize, acl.ReadWrite(0))
	m := acl.Mapping{Ptr: base, Size: acl.HugePageSize, Handle: h}
	_ = r.Register(m)
	// … NCCL collectives on [base, base+2 MiB) use the registration …
	_ = r.Deregister(m)
	_ = d.UnmapMem(base)
	_ = d.FreePhysical(h)
	_ = r.UnsetMemoryRange(base)
	_ = d.ReleaseMemAddress(base)
}
