package arena

import (
	"unsafe"

	"example.com/good/acl/host"
	"example.com/good/chunk"
)

var _ = chunk.Pool

func open() (*host.Driver, error) { return host.Default() }

func asBytes(s []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(s[0])))
}
