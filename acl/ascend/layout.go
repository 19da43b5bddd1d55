//go:build linux && (amd64 || arm64)

package ascend

import (
	"unsafe"

	"github.com/vmarena/vmarena/acl"
)

// The uses of unsafe in the package: hostSlice, below, and compile-time
// proof that the acl
// types the driver hands to the runtime by pointer have the C layouts of
// acl_rt.h's structs on LP64 (purego copies no struct and inserts no padding; C
// reads the Go memory as it lies). Each pair of array lengths is negative,
// and the build fails, unless the size or offset is exactly the C one. The
// tests check the same numbers against the C compiler's, through the double.
var (
	_ [unsafe.Sizeof(acl.MemLocation{}) - 8]byte
	_ [8 - unsafe.Sizeof(acl.MemLocation{})]byte
	_ [unsafe.Offsetof(acl.MemLocation{}.Type) - 4]byte
	_ [4 - unsafe.Offsetof(acl.MemLocation{}.Type)]byte

	_ [unsafe.Sizeof(acl.PhysicalMemProp{}) - 32]byte
	_ [32 - unsafe.Sizeof(acl.PhysicalMemProp{})]byte
	_ [unsafe.Offsetof(acl.PhysicalMemProp{}.MemAttr) - 8]byte
	_ [8 - unsafe.Offsetof(acl.PhysicalMemProp{}.MemAttr)]byte
	_ [unsafe.Offsetof(acl.PhysicalMemProp{}.Location) - 12]byte
	_ [12 - unsafe.Offsetof(acl.PhysicalMemProp{}.Location)]byte
	_ [unsafe.Offsetof(acl.PhysicalMemProp{}.Reserve) - 24]byte
	_ [24 - unsafe.Offsetof(acl.PhysicalMemProp{}.Reserve)]byte

	_ [unsafe.Sizeof(acl.MemAccessDesc{}) - 24]byte
	_ [24 - unsafe.Sizeof(acl.MemAccessDesc{})]byte
	_ [unsafe.Offsetof(acl.MemAccessDesc{}.Location) - 4]byte
	_ [4 - unsafe.Offsetof(acl.MemAccessDesc{}.Location)]byte
	_ [unsafe.Offsetof(acl.MemAccessDesc{}.Rsv) - 12]byte
	_ [12 - unsafe.Offsetof(acl.MemAccessDesc{}.Rsv)]byte

	// Enums and aclError are C ints; handles and addresses are pointers.
	_ [unsafe.Sizeof(acl.MemAttr(0)) - 4]byte
	_ [4 - unsafe.Sizeof(acl.MemAttr(0))]byte
	_ [unsafe.Sizeof(acl.PhysicalHandle(0)) - 8]byte
	_ [8 - unsafe.Sizeof(acl.PhysicalHandle(0))]byte
)

// hostSlice views the n bytes of page-locked host memory aclrtMallocHost
// returned at p as a slice. Sound because the runtime owns those n bytes
// until aclrtFreeHost, which the driver calls only with a slice it made here;
// the garbage collector ignores a pointer outside the Go heap.
func hostSlice(p *byte, n uintptr) []byte { return unsafe.Slice(p, n) }
