//go:build linux && (amd64 || arm64)

// This file holds every use of package unsafe in acl/cuda.

package cuda

import "unsafe"

// The Go mirrors of the CUDA structs must have the C layout exactly, since
// purego hands their bytes to the driver unchanged (checked against cuda.h
// 12.6 on amd64 and arm64, where the layouts are the same). Each line fails to compile if a
// size or offset drifts: an array type of length n-want is only assignable
// to [0]byte when n == want.
var (
	_ [0]byte = [unsafe.Sizeof(memLocation{}) - 8]byte{}
	_ [0]byte = [unsafe.Sizeof(memAllocationProp{}) - 32]byte{}
	_ [0]byte = [unsafe.Offsetof(memAllocationProp{}.Location) - 8]byte{}
	_ [0]byte = [unsafe.Offsetof(memAllocationProp{}.Win32HandleMetaData) - 16]byte{}
	_ [0]byte = [unsafe.Offsetof(memAllocationProp{}.CompressionType) - 24]byte{}
	_ [0]byte = [unsafe.Offsetof(memAllocationProp{}.Usage) - 26]byte{}
	_ [0]byte = [unsafe.Offsetof(memAllocationProp{}.Reserved) - 28]byte{}
	_ [0]byte = [unsafe.Sizeof(memAccessDesc{}) - 12]byte{}
	_ [0]byte = [unsafe.Offsetof(memAccessDesc{}.Flags) - 8]byte{}
)

// goString copies the NUL-terminated C string at p, as written by
// cuGetErrorName and cuGetErrorString into a Go *byte. Sound because p points
// to a static string in the driver library, which is never unloaded, and the
// walk stops at its terminating NUL; the Go string is a copy.
func goString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// hostSlice views the n bytes of page-locked host memory cuMemHostAlloc
// returned at p as a slice. Sound because the driver owns those n bytes
// until cuMemFreeHost, which the binding calls only with a slice it made
// here; the garbage collector ignores a pointer outside the Go heap.
func hostSlice(p *byte, n uintptr) []byte { return unsafe.Slice(p, n) }
