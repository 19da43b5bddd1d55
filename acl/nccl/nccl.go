package nccl

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/vmarena/vmarena/acl"
)

const (
	// LibraryEnv names the environment variable that gives NCCL's path when
	// Config.Library is empty.
	LibraryEnv = "VMARENA_NCCL_LIBRARY"
	// DefaultLibrary is NCCL's soname, found by the dynamic loader's search
	// path.
	DefaultLibrary = "libnccl.so.2"
)

// Config says which NCCL to load.
type Config struct {
	// Library is the NCCL library to load. "" means $VMARENA_NCCL_LIBRARY
	// when set, else DefaultLibrary through the dynamic loader. Only the
	// first of these that is set is tried.
	Library string
}

// Comm is an ncclComm_t: a communicator, an opaque pointer NCCL made.
type Comm uintptr

// Library is a loaded NCCL. It is safe for concurrent use, and never
// unloaded (NCCL starts threads of its own).
type Library struct {
	path    string
	version int32
	fns     symbols
}

// symbols are the NCCL functions the binding calls, with Go signatures that
// match nccl.h on LP64 Linux: ncclResult_t is int32 (a C enum); a
// communicator, a buffer (void*) and a registration handle are integers;
// out-parameters are Go pointers, which NCCL uses only during the call.
type symbols struct {
	getVersion     func(version *int32) int32
	commInitAll    func(comms *uintptr, ndev int32, devlist *int32) int32
	commDestroy    func(comm uintptr) int32
	getErrorString func(r int32) string
	getLastError   func(comm uintptr) string // optional (NCCL 2.13 on)
	commRegister   func(comm uintptr, buff acl.DevicePtr, size uintptr, handle *uintptr) int32
	commDeregister func(comm uintptr, handle uintptr) int32
}

type symbol struct {
	name     string
	fn       any  // pointer to the func field to fill
	required bool // Open fails without it
}

func (s *symbols) table() []symbol {
	return []symbol{
		{"ncclGetVersion", &s.getVersion, true},
		{"ncclCommInitAll", &s.commInitAll, true},
		{"ncclCommDestroy", &s.commDestroy, true},
		{"ncclGetErrorString", &s.getErrorString, true},
		{"ncclGetLastError", &s.getLastError, false},
		{"ncclCommRegister", &s.commRegister, true},
		{"ncclCommDeregister", &s.commDeregister, true},
	}
}

// libraryPath returns the library Open loads: Config.Library, else
// $VMARENA_NCCL_LIBRARY, else DefaultLibrary.
func libraryPath(cfg Config) string {
	if cfg.Library != "" {
		return cfg.Library
	}
	if p := os.Getenv(LibraryEnv); p != "" {
		return p
	}
	return DefaultLibrary
}

var registry struct {
	mu   sync.Mutex
	libs map[string]*Library
}

// Open loads NCCL (the library Config, $VMARENA_NCCL_LIBRARY or the dynamic
// loader gives). It fails with an error wrapping acl.ErrNotSupported when
// the library does not load, or lacks a call the binding needs: user-buffer
// registration (ncclCommRegister, ncclCommDeregister) came with NCCL 2.19.
func Open(cfg Config) (*Library, error) {
	path := libraryPath(cfg)
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if l := registry.libs[path]; l != nil {
		return l, nil
	}
	runtime.LockOSThread() // dlerror is per thread
	defer runtime.UnlockOSThread()
	h, err := dlopen(path)
	if err != nil {
		return nil, fmt.Errorf("nccl: load %s: %w: %w", path, acl.ErrNotSupported, err)
	}
	l := &Library{path: path}
	var missing []string
	for _, s := range l.fns.table() {
		addr, err := dlsym(h, s.name)
		if err != nil {
			if s.required {
				missing = append(missing, s.name)
			}
			continue
		}
		register(s.fn, addr)
	}
	if len(missing) > 0 {
		_ = dlclose(h)
		return nil, fmt.Errorf("nccl: %w: %s lacks %s (user-buffer registration needs NCCL 2.19 or later)",
			acl.ErrNotSupported, path, strings.Join(missing, ", "))
	}
	if err := l.fail("ncclGetVersion", 0, l.fns.getVersion(&l.version)); err != nil {
		_ = dlclose(h)
		return nil, err
	}
	if registry.libs == nil {
		registry.libs = map[string]*Library{}
	}
	registry.libs[path] = l
	return l, nil
}

// Path returns the library's path, as loaded.
func (l *Library) Path() string { return l.path }

// Version returns NCCL's version, as ncclGetVersion reports it (e.g. 22807
// for 2.28.7).
func (l *Library) Version() int { return int(l.version) }

// fail returns the error of fn on comm returning r, or nil for ncclSuccess.
func (l *Library) fail(fn string, comm Comm, r int32) error {
	if r == int32(Success) {
		return nil
	}
	e := &Error{Func: fn, Result: Result(r), Desc: l.fns.getErrorString(r)}
	if comm != 0 && l.fns.getLastError != nil {
		e.Last = l.fns.getLastError(uintptr(comm))
	}
	return e
}

// The calls below are NCCL's, one method per function, with the same
// arguments in the same order and the ncclResult_t turned into an error (an
// *Error). Call them inside the Bind of the device's CUDA driver
// (acl.Binder), so that the CUDA context NCCL finds current is the device's.

// CommInitAll is ncclCommInitAll: one communicator per device of devs (the
// CUDA ordinals), all in this process, in the order of devs.
func (l *Library) CommInitAll(devs []int32) ([]Comm, error) {
	if len(devs) == 0 {
		return nil, acl.Errorf("ncclCommInitAll", acl.ErrCodeRTParamInvalid, "no device")
	}
	raw := make([]uintptr, len(devs))
	if err := l.fail("ncclCommInitAll", 0, l.fns.commInitAll(&raw[0], int32(len(devs)), &devs[0])); err != nil {
		return nil, err
	}
	out := make([]Comm, len(raw))
	for i, c := range raw {
		out[i] = Comm(c)
	}
	return out, nil
}

// CommDestroy is ncclCommDestroy.
func (l *Library) CommDestroy(c Comm) error {
	return l.fail("ncclCommDestroy", 0, l.fns.commDestroy(uintptr(c)))
}

// CommRegister is ncclCommRegister: register [buff, buff+size) with c for
// its collectives and transfers, and return the registration's handle,
// which may be 0 (NCCL_LOCAL_REGISTER=0: nothing registered, successfully).
func (l *Library) CommRegister(c Comm, buff acl.DevicePtr, size uintptr) (uintptr, error) {
	var h uintptr
	if err := l.fail("ncclCommRegister", c, l.fns.commRegister(uintptr(c), buff, size, &h)); err != nil {
		return 0, err
	}
	return h, nil
}

// CommDeregister is ncclCommDeregister of a handle CommRegister returned
// (0 is accepted and does nothing).
func (l *Library) CommDeregister(c Comm, handle uintptr) error {
	return l.fail("ncclCommDeregister", c, l.fns.commDeregister(uintptr(c), handle))
}
