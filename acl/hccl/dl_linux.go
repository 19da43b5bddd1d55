//go:build linux && (amd64 || arm64)

package hccl

import "github.com/ebitengine/purego"

// The dynamic loader, through purego: no cgo and no CANN headers at build
// time. Callers hold their OS thread locked around dlopen and dlsym, since
// dlerror is per thread.

// dlopen loads path with RTLD_NOW|RTLD_LOCAL, as the ACL binding does.
func dlopen(path string) (uintptr, error) {
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

func dlsym(h uintptr, name string) (uintptr, error) { return purego.Dlsym(h, name) }

func dlclose(h uintptr) error { return purego.Dlclose(h) }

// register makes the func that fptr points to call the C function at addr.
// It panics only if fptr's type is not one purego can call, a bug in the
// symbol table that every test finds.
func register(fptr any, addr uintptr) { purego.RegisterFunc(fptr, addr) }
