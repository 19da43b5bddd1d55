package arena_test

import (
	"fmt"

	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// An arena registered with a library for its whole life: RegisterWith makes
// an OnBackingChange callback of an acl.Registrar (hccl.NewRegistrar,
// nccl.NewRegistrar, or, here, the registration double, which checks the
// order against the driver's mappings). The registrar is given the
// reservation at once, each chunk as it is mapped and before it is
// unmapped, and the end of the reservation at Close.
func ExampleRegisterWith() {
	d, _ := host.New(host.Config{Capacity: 64 << 20})
	defer d.Close()
	reg := acltest.NewRegistrations(d, nil) // in production: the library's registrar
	pool, _ := chunk.New(reg.Driver(), chunk.Config{})
	defer pool.Close()
	a, _ := arena.New(arena.Config{Pool: pool, Reserve: 32 << 20})
	if err := a.OnBackingChange(arena.RegisterWith(reg)); err != nil {
		fmt.Println(err)
		return
	}
	_ = a.Grow(6 << 20) // three 2 MiB chunks mapped, then registered
	fmt.Printf("grown: %+v\n", reg.Live())
	_ = a.Truncate(0)
	_ = a.Shrink() // deregistered, then unmapped
	fmt.Printf("shrunk: %+v\n", reg.Live())
	_ = a.Close()
	fmt.Printf("closed: %+v, protocol kept: %v\n", reg.Live(), reg.Check() == nil)
	// Output:
	// grown: {Ranges:1 Mappings:3 Bytes:6291456}
	// shrunk: {Ranges:1 Mappings:0 Bytes:0}
	// closed: {Ranges:0 Mappings:0 Bytes:0}, protocol kept: true
}

// An RDMA engine exports an arena's mapped prefix as a dma-buf where the
// driver can (the CUDA binding), and exports again whenever the arena's
// generation moves; elsewhere ExportDMABuf says it cannot.
func ExampleArena_ExportDMABuf() {
	d, _ := host.New(host.Config{Capacity: 64 << 20})
	defer d.Close()
	a, _ := arena.New(arena.Config{Driver: d, Reserve: 32 << 20})
	defer a.Close()
	_ = a.Grow(4 << 20)
	buf, err := a.ExportDMABuf()
	if err != nil {
		fmt.Println("no dma-buf export on this driver")
		return
	}
	defer buf.Close()
	// … ibv_reg_dmabuf_mr(pd, 0, buf.Size, uint64(buf.Ptr), buf.FD, access) …
	// and, before each use, when buf.Stale(a): export again, register the
	// new descriptor, drop the old registration and buf.Close().
	// Output: no dma-buf export on this driver
}
