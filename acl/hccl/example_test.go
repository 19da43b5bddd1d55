package hccl_test

import (
	"errors"
	"fmt"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/acl/hccl"
)

// Where no HCCL can be loaded, Open says so with acl.ErrNotSupported, and a
// program goes on without registering its memory.
func ExampleOpen() {
	_, err := hccl.Open(hccl.Config{Library: "/nonexistent/libhccl.so"})
	if errors.Is(err, acl.ErrNotSupported) {
		fmt.Println("no HCCL here: memory stays unregistered")
	}
	// Output: no HCCL here: memory stays unregistered
}

// On an Atlas A3 with CANN, every rank makes its communicator and a
// registrar of it, bound to its device; the registrar is then told each
// step of the memory's life (here by hand, in the order an arena keeps).
func ExampleNewRegistrar() {
	d, err := ascend.Open(ascend.Config{Device: 0})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer d.Close()
	lib, err := hccl.Open(hccl.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	var comm hccl.Comm
	err = d.Bind(func() error {
		root, err := lib.GetRootInfo() // on rank 0; the other ranks receive it
		if err != nil {
			return err
		}
		comm, err = lib.CommInitRootInfo(8, root, 0)
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	r, err := hccl.NewRegistrar(lib, comm, d)
	if err != nil {
		fmt.Println(err) // no zero-copy calls in this CANN
		return
	}
	defer r.Close()

	base, _ := d.ReserveMemAddress(1<<30, 0, 0, 0)
	_ = r.SetMemoryRange(base, 1<<30) // every rank at once, the first time
	prop := acl.DeviceProp(0, acl.HBMMemHuge)
	h, _ := d.MallocPhysical(acl.HugePageSize, &prop, 0)
	_ = d.MapMem(base, acl.HugePageSize, 0, h, 0)
	_ = d.MemSetAccess(base, acl.HugePageSize, acl.ReadWrite(0)) // ErrNotSupported before CANN 8.5: accessible anyway
	_ = r.Register(acl.Mapping{Ptr: base, Size: acl.HugePageSize, Handle: h})
	// … collectives read and write [base, base+2 MiB) without a copy …
	_ = r.Deregister(acl.Mapping{Ptr: base, Size: acl.HugePageSize, Handle: h})
	_ = d.UnmapMem(base)
	_ = d.FreePhysical(h)
	_ = r.UnsetMemoryRange(base)
	_ = d.ReleaseMemAddress(base)
}
