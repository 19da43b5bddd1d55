package hccl

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/cannpath"
)

const (
	// LibraryEnv names the environment variable that gives HCCL's path (a
	// file, or a directory holding libhccl.so) when Config.Library is empty.
	LibraryEnv = "VMARENA_HCCL_LIBRARY"

	libName = "libhccl.so"
)

// Config says which HCCL to load.
type Config struct {
	// Library is the HCCL library to load: a file, or a directory holding
	// libhccl.so. "" means $VMARENA_HCCL_LIBRARY, else the search the
	// package documentation describes. An explicit library is the only
	// candidate.
	Library string
}

// Comm is an HcclComm: a communicator, an opaque pointer HCCL made.
type Comm uintptr

// RootInfoBytes is the size of an HcclRootInfo.
const RootInfoBytes = 4108

// RootInfo is an HcclRootInfo: what rank 0 gets from HcclGetRootInfo and
// every rank passes to HcclCommInitRootInfo. It is plain bytes, to send to
// the other ranks however the program likes.
type RootInfo struct {
	Internal [RootInfoBytes]byte
}

// Library is a loaded HCCL. It is safe for concurrent use, and never
// unloaded (HCCL starts threads of its own).
type Library struct {
	path string
	h    uintptr
	fns  symbols
	zc   struct {
		once sync.Once
		fns  zeroCopy
		err  error
	}
}

// candidate is one place the search looks.
type candidate struct {
	path  string // what to dlopen: a path, or a bare name for the dynamic loader
	where string // why the search looks there
}

// searchPath lists where to look for HCCL, in order. An explicit library
// (Config.Library or $VMARENA_HCCL_LIBRARY) is the only candidate.
func searchPath(cfg Config) (cands []candidate, explicit bool) {
	lib, where := cfg.Library, "Config.Library"
	if lib == "" {
		lib, where = os.Getenv(LibraryEnv), "$"+LibraryEnv
	}
	found, explicit := cannpath.Search(lib, where, libName)
	for _, c := range found {
		cands = append(cands, candidate{c.Path, c.Where})
	}
	return cands, explicit
}

var registry struct {
	mu   sync.Mutex
	libs map[string]*Library
}

// Open loads HCCL: the first library of the search that loads, or the one
// Config names. It fails with an error wrapping acl.ErrNotSupported when no
// library loads (listing every place tried and why) or the one that loads
// lacks a required call. The zero-copy calls are resolved by NewRegistrar.
func Open(cfg Config) (*Library, error) {
	cands, explicit := searchPath(cfg)
	registry.mu.Lock()
	defer registry.mu.Unlock()
	runtime.LockOSThread() // dlerror is per thread
	defer runtime.UnlockOSThread()
	var tried []string
	for _, c := range cands {
		if l := registry.libs[c.path]; l != nil {
			return l, nil
		}
		if strings.ContainsRune(c.path, '/') {
			if _, err := os.Stat(c.path); err != nil {
				tried = append(tried, fmt.Sprintf("%s (%s): no such file", c.path, c.where))
				continue
			}
		}
		h, err := dlopen(c.path)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s (%s): %v", c.path, c.where, err))
			continue
		}
		l := &Library{path: c.path, h: h}
		if err := l.resolve(); err != nil {
			_ = dlclose(h)
			return nil, err
		}
		if registry.libs == nil {
			registry.libs = map[string]*Library{}
		}
		registry.libs[c.path] = l
		return l, nil
	}
	what := "searched"
	if explicit {
		what = "asked for"
	}
	return nil, fmt.Errorf("hccl: %w: no HCCL (%s) could be loaded; %s %s", acl.ErrNotSupported, libName, what,
		strings.Join(tried, "; "))
}

// resolve fills the required and optional symbols; a missing required one
// is an error wrapping acl.ErrNotSupported that names it.
func (l *Library) resolve() error {
	var missing []string
	for _, s := range l.fns.table() {
		addr, err := dlsym(l.h, s.name)
		if err != nil {
			if s.required {
				missing = append(missing, s.name)
			}
			continue
		}
		register(s.fn, addr)
	}
	if len(missing) > 0 {
		return fmt.Errorf("hccl: %w: %s is not a usable HCCL: it lacks %s", acl.ErrNotSupported, l.path, strings.Join(missing, ", "))
	}
	return nil
}

// zeroCopyFuncs resolves the zero-copy calls, all or none, on first use.
func (l *Library) zeroCopyFuncs() (*zeroCopy, error) {
	l.zc.once.Do(func() {
		syms := l.zc.fns.table()
		addrs := make([]uintptr, len(syms))
		var missing []string
		for i, s := range syms {
			addr, err := dlsym(l.h, s.name)
			if err != nil {
				missing = append(missing, s.name)
				continue
			}
			addrs[i] = addr
		}
		if len(missing) > 0 {
			l.zc.err = fmt.Errorf("hccl: %w: %s lacks the zero-copy calls %s (CANN 8.1 and later have them)",
				acl.ErrNotSupported, l.path, strings.Join(missing, ", "))
			return
		}
		for i, s := range syms {
			register(s.fn, addrs[i])
		}
	})
	if l.zc.err != nil {
		return nil, l.zc.err
	}
	return &l.zc.fns, nil
}

// Path returns the file the library was loaded from.
func (l *Library) Path() string { return l.path }

// ZeroCopy reports whether the library has the zero-copy calls (and if not,
// why): HcclCommSetMemoryRange, HcclCommUnsetMemoryRange,
// HcclCommActivateCommMemory and HcclCommDeactivateCommMemory.
func (l *Library) ZeroCopy() error {
	_, err := l.zeroCopyFuncs()
	return err
}

// fail returns the error of fn returning r, or nil for HCCL_SUCCESS.
func (l *Library) fail(fn string, r int32) error {
	if r == int32(Success) {
		return nil
	}
	e := &Error{Func: fn, Result: Result(r)}
	if l.fns.getErrorString != nil {
		e.Desc = l.fns.getErrorString(r)
	}
	return e
}

// The calls below are HCCL's, one method per function, with the same
// arguments in the same order and the HcclResult turned into an error (an
// *Error). HCCL works on the calling thread's current device: call them
// inside the Bind of the device's driver (acl.Binder), or on a thread where
// the caller set the device itself.

// GetRootInfo is HcclGetRootInfo: the root info rank 0 hands every rank.
func (l *Library) GetRootInfo() (*RootInfo, error) {
	ri := new(RootInfo)
	if err := l.fail("HcclGetRootInfo", l.fns.getRootInfo(ri)); err != nil {
		return nil, err
	}
	return ri, nil
}

// CommInitRootInfo is HcclCommInitRootInfo: this process's communicator of
// nRanks ranks, as rank rank. Every rank calls it with the same root info;
// it returns when all have.
func (l *Library) CommInitRootInfo(nRanks uint32, root *RootInfo, rank uint32) (Comm, error) {
	if root == nil {
		return 0, acl.Errorf("HcclCommInitRootInfo", acl.ErrCodeRTParamInvalid, "root info is nil")
	}
	var c uintptr
	if err := l.fail("HcclCommInitRootInfo", l.fns.commInitRootInfo(nRanks, root, rank, &c)); err != nil {
		return 0, err
	}
	return Comm(c), nil
}

// CommDestroy is HcclCommDestroy.
func (l *Library) CommDestroy(c Comm) error {
	return l.fail("HcclCommDestroy", l.fns.commDestroy(uintptr(c)))
}

// SetMemoryRange is HcclCommSetMemoryRange: tell c's zero-copy that
// [base, base+size), reserved with aclrtReserveMemAddress, will hold
// activated memory. alignment and flags must be 0. Every rank of c must
// call it at the same time the first time (HCCL links the ranks then).
func (l *Library) SetMemoryRange(c Comm, base acl.DevicePtr, size, alignment uintptr, flags uint64) error {
	zc, err := l.zeroCopyFuncs()
	if err != nil {
		return err
	}
	return l.fail("HcclCommSetMemoryRange", zc.setMemoryRange(uintptr(c), base, size, alignment, flags))
}

// UnsetMemoryRange is HcclCommUnsetMemoryRange: the range set at base goes.
// No memory in it may be activated.
func (l *Library) UnsetMemoryRange(c Comm, base acl.DevicePtr) error {
	zc, err := l.zeroCopyFuncs()
	if err != nil {
		return err
	}
	return l.fail("HcclCommUnsetMemoryRange", zc.unsetMemoryRange(uintptr(c), base))
}

// ActivateCommMemory is HcclCommActivateCommMemory: [ptr, ptr+size), mapped
// (aclrtMapMem) with the physical allocation h, may be used by c's
// collectives without a copy. offset and flags must be 0. HCCL exports h
// (aclrtMemExportToShareableHandle) and the peers map it.
func (l *Library) ActivateCommMemory(c Comm, ptr acl.DevicePtr, size, offset uintptr, h acl.PhysicalHandle, flags uint64) error {
	zc, err := l.zeroCopyFuncs()
	if err != nil {
		return err
	}
	return l.fail("HcclCommActivateCommMemory", zc.activate(uintptr(c), ptr, size, offset, h, flags))
}

// DeactivateCommMemory is HcclCommDeactivateCommMemory: the block activated
// at ptr (whole blocks only) is no longer used without a copy.
func (l *Library) DeactivateCommMemory(c Comm, ptr acl.DevicePtr) error {
	zc, err := l.zeroCopyFuncs()
	if err != nil {
		return err
	}
	return l.fail("HcclCommDeactivateCommMemory", zc.deactivate(uintptr(c), ptr))
}
