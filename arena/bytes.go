package arena

import "unsafe"

// asBytes returns the memory of s as bytes. Element types hold no pointers,
// so the driver may copy them as raw memory; the slice does not outlive the
// copy it is made for.
func asBytes[T Element](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var zero T
	// unsafe: s's backing array is len(s)*sizeof(T) bytes of pointer-free data.
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero)))
}
