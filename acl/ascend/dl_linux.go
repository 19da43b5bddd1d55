//go:build linux && (amd64 || arm64)

package ascend

import "github.com/ebitengine/purego"

// The dynamic loader, through purego: no cgo and no CANN headers at build
// time. dlerror is per thread, so callers hold their OS thread locked around
// dlopen and dlsym to get the right message.

// dlopen loads path. RTLD_LOCAL keeps the runtime's symbols out of the global
// namespace (so that two copies, such as a test double and a real runtime,
// never bind to each other); RTLD_NOW reports unresolved symbols now, like
// Python's ctypes, rather than at a later call.
func dlopen(path string) (uintptr, error) {
	return purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

func dlsym(h uintptr, name string) (uintptr, error) { return purego.Dlsym(h, name) }

func dlclose(h uintptr) error { return purego.Dlclose(h) }

// call1 calls the C function at addr with one integer argument and returns
// its int result. It skips RegisterFunc's reflection (about 3× cheaper), for
// the one call the binding adds to every driver call: aclrtSetCurrentContext.
func call1(addr, a uintptr) int32 {
	r1, _, _ := purego.SyscallN(addr, a)
	return int32(uint32(r1)) // an int is the low 32 bits of the return register
}

// register makes the func that fptr points to call the C function at addr.
// It panics only if fptr's type is not one purego can call, a bug in the
// symbol table that every test finds.
func register(fptr any, addr uintptr) { purego.RegisterFunc(fptr, addr) }
