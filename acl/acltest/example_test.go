package acltest_test

import (
	"fmt"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/host"
)

// The registration double watches the protocol of an acl.Registrar against
// the mappings of a driver: here one chunk goes through its whole life, and
// then a mistake (unmapping memory that is still registered) is caught.
func ExampleRegistrations() {
	hd, err := host.New(host.Config{Capacity: 16 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer hd.Close()
	r := acltest.NewRegistrations(hd, nil) // nil: no library behind it
	d := r.Driver()                        // make the mappings through it

	const g = acl.HugePageSize
	base, _ := d.ReserveMemAddress(2*g, 0, 0, 0)
	_ = r.SetMemoryRange(base, 2*g)
	prop := acl.DeviceProp(0, acl.HBMMemHuge)
	h, _ := d.MallocPhysical(g, &prop, 0)
	_ = d.MapMem(base, g, 0, h, 0)
	_ = d.MemSetAccess(base, g, acl.ReadWrite(0))
	m := acl.Mapping{Ptr: base, Size: g, Handle: h}
	fmt.Println("register:", r.Register(m))
	fmt.Printf("at rest: %v, holding %+v\n", r.Check(), r.Live())

	_ = d.UnmapMem(base) // wrong: Deregister must come first
	fmt.Println("violations:", len(r.Violations()))
	_ = r.Deregister(m)
	_ = d.FreePhysical(h)
	_ = r.UnsetMemoryRange(base)
	_ = d.ReleaseMemAddress(base)
	fmt.Printf("left: %+v\n", r.Live())
	// Output:
	// register: <nil>
	// at rest: <nil>, holding {Ranges:1 Mappings:1 Bytes:2097152}
	// violations: 1
	// left: {Ranges:0 Mappings:0 Bytes:0}
}
