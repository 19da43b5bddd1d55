// Command basic is the ACL virtual-memory sample translated step by step onto
// acl.Driver: query the granularity, allocate physical memory, reserve an
// address range, map, grant access, copy through the mapped pointer, then
// unmap, release and free. It runs on the driver VMARENA_DEVICE names (the
// host driver when no device answers; -v says why auto passed over each
// device it tried) and prints each step.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/device"
)

var detail = flag.Bool("v", false, "say why auto passed over each device it tried")

func main() {
	flag.Parse()
	if err := run(); err != nil {
		log.SetFlags(0)
		log.Fatal("basic: ", err)
	}
}

func step(format string, args ...any) { fmt.Printf("  "+format+"\n", args...) }

func run() error {
	choice, err := device.FromEnv()
	if err != nil {
		return err
	}
	drv := choice.Driver
	defer drv.Close()
	fmt.Printf("driver %s — %s\n", drv.Name(), choice.Reason)
	if *detail && choice.Detail != nil {
		fmt.Printf("passed over:\n%v\n", choice.Detail)
	}

	// aclrtPhysicalMemProp prop = {NONE, PINNED, ACL_HBM_MEM_HUGE, {dev, DEVICE}, 0};
	prop := acl.DeviceProp(drv.Device(), acl.HBMMemHuge)

	// aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &granularity);
	gran, err := drv.MemGetAllocationGranularity(&prop, acl.GranularityMinimum)
	if err != nil {
		return err
	}
	step("1 aclrtMemGetAllocationGranularity: %d bytes", gran)
	size := 2 * gran

	// aclrtMallocPhysical(&handle, size, &prop, 0);
	h, err := drv.MallocPhysical(size, &prop, 0)
	if err != nil {
		return err
	}
	step("2 aclrtMallocPhysical: %d bytes, handle %#x", size, uintptr(h))

	// aclrtReserveMemAddress(&virPtr, size, 0, NULL, 0);
	ptr, err := drv.ReserveMemAddress(size, 0, 0, 0)
	if err != nil {
		return err
	}
	step("3 aclrtReserveMemAddress: %d bytes at %v", size, ptr)

	// aclrtMapMem(virPtr, size, 0, handle, 0);
	if err := drv.MapMem(ptr, size, 0, h, 0); err != nil {
		return err
	}
	step("4 aclrtMapMem: %v ← handle %#x", ptr, uintptr(h))

	// aclrtMemSetAccess(virPtr, size, &desc, 1);
	switch err := drv.MemSetAccess(ptr, size, acl.ReadWrite(drv.Device())); {
	case err == nil:
		step("5 aclrtMemSetAccess: read-write for device %d", drv.Device())
	case errors.Is(err, acl.ErrNotSupported):
		step("5 aclrtMemSetAccess: not in this runtime; the mapping is accessible already")
	default:
		return err
	}

	// aclrtMemcpy(virPtr, size, host, n, ACL_MEMCPY_HOST_TO_DEVICE) and back.
	msg := []byte("hello from the reserved range")
	if err := drv.MemcpyHtoD(ptr.Add(gran-8), msg); err != nil { // straddles the 2 MiB boundary
		return err
	}
	got := make([]byte, len(msg))
	if err := drv.MemcpyDtoH(got, ptr.Add(gran-8)); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("read back %q, wrote %q", got, msg)
	}
	step("6 aclrtMemcpy H2D + D2H at %v: %q", ptr.Add(gran-8), got)

	// aclrtUnmapMem(virPtr);
	if err := drv.UnmapMem(ptr); err != nil {
		return err
	}
	step("7 aclrtUnmapMem: %v (the range stays reserved, inaccessible)", ptr)

	// aclrtReleaseMemAddress(virPtr);
	if err := drv.ReleaseMemAddress(ptr); err != nil {
		return err
	}
	step("8 aclrtReleaseMemAddress: %v", ptr)

	// aclrtFreePhysical(handle);
	if err := drv.FreePhysical(h); err != nil {
		return err
	}
	step("9 aclrtFreePhysical: handle %#x", uintptr(h))

	if c, ok := drv.(acl.Counter); ok {
		fmt.Printf("live objects left: %+v\n", c.Live())
		if !c.Live().Zero() {
			os.Exit(1)
		}
	}
	return nil
}
