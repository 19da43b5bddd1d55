package host_test

import (
	"fmt"
	"log"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
)

// The ACL virtual-memory sample on the host driver: the device pointer is a
// host address, so Bytes shows the memory behind it.
func ExampleDriver() {
	d, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	prop := acl.DeviceProp(0, acl.HBMMemHuge)
	gran, _ := d.MemGetAllocationGranularity(&prop, acl.GranularityMinimum)
	h, _ := d.MallocPhysical(gran, &prop, 0)
	ptr, _ := d.ReserveMemAddress(4*gran, 0, 0, 0)
	_ = d.MapMem(ptr, gran, 0, h, 0)
	_ = d.MemSetAccess(ptr, gran, acl.ReadWrite(0))
	_ = d.MemcpyHtoD(ptr, []byte("device bytes"))
	b, _ := d.Bytes(ptr, 12)
	fmt.Printf("%s, %d MiB mapped\n", b, d.Live().MappedBytes>>20)

	// Touching ptr now would fault: unmapping leaves the range inaccessible.
	_ = d.UnmapMem(ptr)
	_ = d.ReleaseMemAddress(ptr)
	_ = d.FreePhysical(h)
	fmt.Printf("%+v\n", d.Live())
	// Output:
	// device bytes, 2 MiB mapped
	// {Reservations:0 ReservedBytes:0 Mappings:0 MappedBytes:0 Handles:0 PhysicalBytes:0 Imported:0 ImportedBytes:0 Streams:0 Events:0 HostBuffers:0 HostBytes:0}
}
