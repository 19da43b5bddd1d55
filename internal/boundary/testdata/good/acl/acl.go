package acl

import "unsafe"

// Ptr may do anything: acl/ holds the bindings.
func Ptr(p unsafe.Pointer) uintptr { return uintptr(p) }
