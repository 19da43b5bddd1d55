package ascend

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/cannpath"
)

const (
	// LibraryEnv names the environment variable that gives the ACL runtime's
	// path (a file or a directory) when Config.Library is empty.
	LibraryEnv = "VMARENA_ASCEND_LIBRARY"
	// DefaultInstall is where the CANN toolkit installs by default; the
	// search looks in its lib64.
	DefaultInstall = cannpath.DefaultInstall

	libName   = "libascendcl.so" // the library CANN users link
	rtLibName = "libacl_rt.so"   // where the open-source 9.x runtime puts aclrt*
)

// candidate is one place the search looks for the runtime.
type candidate struct {
	path  string // what to dlopen: a path, or a bare name for the dynamic loader
	where string // why the search looks there, for messages
}

// searchPath lists where to look for the runtime, in order. An explicit
// library (Config.Library or $VMARENA_ASCEND_LIBRARY) is the only candidate.
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

// registry holds every library this process loaded, by the path it was
// loaded from. Libraries are never unloaded: the ACL runtime starts threads
// of its own, and a process needs one copy of it for its whole life.
var registry struct {
	mu   sync.Mutex
	libs map[string]*library
}

// initState says whether aclInit is in effect, and who called it.
type initState int

const (
	initNone    initState = iota // aclInit not called, or finalised
	initOwn                      // this package's aclInit returned 0: Finalize undoes it
	initForeign                  // aclInit returned 100002: someone else in the process owns it
)

// library is one loaded ACL runtime and the process-wide state kept for it:
// whether aclInit is in effect and which devices are set.
type library struct {
	path string // the library loaded
	fns  symbols

	dlMu     sync.Mutex // guards handles, files, fallback
	handles  []uintptr  // dlopen handles, searched in order
	files    []string   // their paths
	fallback string     // why libacl_rt.so could not be opened, once tried

	setAccess   lazy[memSetAccessFunc]
	finalize    lazy[finalizeFunc]
	socName     lazy[socNameFunc]
	memsetAsync lazy[memsetAsyncFunc]
	streamQuery lazy[streamQueryFunc]
	events      lazySet[eventFuncs, *eventFuncs]
	share       lazySet[shareFuncs, *shareFuncs]
	bareTgid    lazy[bareTgidFunc]
	props       lazy[propsFromHandleFunc]

	mu      sync.Mutex // guards init and devices
	init    initState
	devices map[int32]*device
}

// device is one device set (aclrtSetDevice) in this process, shared by every
// Driver open on it.
type device struct {
	id   int32
	ctx  uintptr // the device's default context, made current on every call
	refs int     // Drivers open on it; guarded by library.mu

	// vmm serialises the calls that change the VMM state: no ACL document
	// says they are thread-safe, and their best-known users (torch_npu's
	// caching allocator, ggml-cann's pool) call them under a lock of their own.
	vmm sync.Mutex

	streamMu sync.Mutex
	stream   acl.Stream // private, for device-to-device copies, created on first use
}

// lazy is a symbol resolved on first use.
type lazy[F any] struct {
	once sync.Once
	fn   F
	err  error
}

func (z *lazy[F]) get(l *library, name string) (F, error) {
	z.once.Do(func() {
		addr, err := l.lookup(name)
		if err != nil {
			z.err = err
			return
		}
		register(&z.fn, addr)
	})
	return z.fn, z.err
}

// lazySet is a group of symbols resolved together on first use: all of them,
// or, when any is missing, none.
type lazySet[T any, PT interface {
	*T
	table() []symbol
}] struct {
	once sync.Once
	fns  T
	err  error
}

// get returns the group, or an error naming every symbol missing from it.
func (z *lazySet[T, PT]) get(l *library) (*T, error) {
	z.once.Do(func() {
		syms := PT(&z.fns).table()
		addrs := make([]uintptr, len(syms))
		var missing []string
		for i, s := range syms {
			addr, err := l.lookup(s.name)
			if err != nil {
				missing = append(missing, s.name)
				continue
			}
			addrs[i] = addr
		}
		if len(missing) > 0 {
			l.dlMu.Lock()
			where := strings.Join(l.files, " and ")
			l.dlMu.Unlock()
			z.err = fmt.Errorf("the runtime lacks %s (looked in %s)", strings.Join(missing, ", "), where)
			return
		}
		for i, s := range syms {
			register(s.fn, addrs[i])
		}
	})
	if z.err != nil {
		return nil, z.err
	}
	return &z.fns, nil
}

// load returns the runtime the search finds, loading it on first use.
func load(cfg Config) (*library, error) {
	cands, explicit := searchPath(cfg)
	registry.mu.Lock()
	defer registry.mu.Unlock()
	// dlerror is per thread: keep dlopen and dlerror on one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var tried []string
	for _, c := range cands {
		if l := registry.libs[c.path]; l != nil {
			return l, nil
		}
		if strings.ContainsRune(c.path, '/') && !exists(c.path) {
			// An install of the open-source runtime alone has libacl_rt.so
			// and no libascendcl.so.
			alt := filepath.Join(filepath.Dir(c.path), rtLibName)
			if filepath.Base(c.path) == rtLibName || !exists(alt) {
				tried = append(tried, fmt.Sprintf("%s (%s): no such file", c.path, c.where))
				continue
			}
			c.path = alt
			if l := registry.libs[c.path]; l != nil {
				return l, nil
			}
		}
		h, err := dlopen(c.path)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s (%s): %v", c.path, c.where, err))
			continue
		}
		l := &library{path: c.path, handles: []uintptr{h}, files: []string{c.path}, devices: map[int32]*device{}}
		if err := l.resolve(); err != nil {
			l.unload()
			return nil, err
		}
		if registry.libs == nil {
			registry.libs = map[string]*library{}
		}
		registry.libs[c.path] = l
		return l, nil
	}
	what := "searched"
	if explicit {
		what = "asked for"
	}
	return nil, fmt.Errorf("%w: no ACL runtime (%s) could be loaded; %s %s", acl.ErrNotSupported, libName, what,
		strings.Join(tried, "; "))
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// resolve fills the symbol table; a missing required symbol is an error
// wrapping acl.ErrNotSupported that names it and the files searched.
func (l *library) resolve() error {
	var missing []string
	for _, s := range l.fns.table() {
		addr, err := l.lookup(s.name)
		if err != nil {
			if s.required {
				missing = append(missing, s.name)
			}
			continue
		}
		if p, ok := s.fn.(*uintptr); ok {
			*p = addr
		} else {
			register(s.fn, addr)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	l.dlMu.Lock()
	defer l.dlMu.Unlock()
	where := strings.Join(l.files, " and ")
	if l.fallback != "" {
		where += "; " + l.fallback
	}
	return fmt.Errorf("%w: %s is not a usable ACL runtime: it lacks %s (looked in %s); the VMM calls need CANN 7.0 or later",
		acl.ErrNotSupported, l.path, strings.Join(missing, ", "), where)
}

// lookup finds a symbol in the library, and then in libacl_rt.so beside it,
// which is opened the first time the library itself lacks a symbol (the
// open-source 9.x runtime builds the aclrt* functions into libacl_rt.so).
func (l *library) lookup(name string) (uintptr, error) {
	l.dlMu.Lock()
	defer l.dlMu.Unlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for i := 0; ; i++ {
		if i == len(l.handles) {
			if !l.openFallback() {
				break
			}
		}
		if addr, err := dlsym(l.handles[i], name); err == nil {
			return addr, nil
		}
	}
	return 0, fmt.Errorf("%s not found in %s", name, strings.Join(l.files, " or "))
}

// openFallback opens libacl_rt.so once, and reports whether it added a
// handle. Caller holds dlMu and the OS thread.
func (l *library) openFallback() bool {
	if len(l.handles) > 1 || l.fallback != "" || filepath.Base(l.path) == rtLibName {
		return false
	}
	path := rtLibName
	if strings.ContainsRune(l.path, '/') {
		path = filepath.Join(filepath.Dir(l.path), rtLibName)
	}
	h, err := dlopen(path)
	if err != nil {
		l.fallback = fmt.Sprintf("fallback %s: %v", path, err)
		return false
	}
	l.handles = append(l.handles, h)
	l.files = append(l.files, path)
	return true
}

// unload closes the handles of a library that failed to resolve.
func (l *library) unload() {
	l.dlMu.Lock()
	defer l.dlMu.Unlock()
	for _, h := range l.handles {
		_ = dlclose(h) // nothing was called in it; a failure leaves it mapped, harmlessly
	}
	l.handles = nil
}

// setContext makes ctx current on the calling thread: aclrtSetCurrentContext,
// called without purego's reflection since every driver call makes it.
func (l *library) setContext(ctx uintptr) int32 { return call1(l.fns.setCurrentContext, ctx) }

// errMsg reads (and so clears) the calling thread's last ACL error message.
// The caller holds its OS thread since the failed call.
func (l *library) errMsg() string {
	if l.fns.getRecentErrMsg == nil {
		return ""
	}
	return l.fns.getRecentErrMsg()
}

// fail is the error of a call of op that returned code, with the message
// the runtime left on this thread.
func (l *library) fail(op string, code int32) error {
	return acl.NewError(op, code, l.errMsg())
}

// check is fail for a code that may be ACL_SUCCESS.
func (l *library) check(op string, code int32) error {
	if code == acl.Success {
		return nil
	}
	return l.fail(op, code)
}

// acquire initialises the runtime if needed and sets device id, or takes one
// more reference to it when it is already set.
func (l *library) acquire(id int32, aclConfig string) (*device, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	runtime.LockOSThread() // the error messages are per thread
	defer runtime.UnlockOSThread()
	if l.init == initNone {
		switch code := l.fns.aclInit(cString(aclConfig)); code {
		case acl.Success:
			l.init = initOwn
		case acl.ErrCodeRepeatInitialize:
			// Someone else in the process initialised ACL: use it, and leave
			// finalising to them.
			l.errMsg()
			l.init = initForeign
		default:
			return nil, l.fail("aclInit", code)
		}
	}
	if dv := l.devices[id]; dv != nil {
		dv.refs++
		return dv, nil
	}
	var n uint32
	if code := l.fns.getDeviceCount(&n); code != acl.Success {
		err := l.fail("aclrtGetDeviceCount", code)
		if code == acl.ErrCodeRTNoDevice {
			return nil, fmt.Errorf("%w: the ACL runtime sees no NPU: %w", acl.ErrNotSupported, err)
		}
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: the ACL runtime sees no NPU (aclrtGetDeviceCount reports 0)", acl.ErrNotSupported)
	}
	if code := l.fns.setDevice(id); code != acl.Success {
		return nil, fmt.Errorf("%w (%d NPUs visible)", l.fail("aclrtSetDevice", code), n)
	}
	var ctx uintptr
	if code := l.fns.getCurrentContext(&ctx); code != acl.Success {
		err := l.fail("aclrtGetCurrentContext", code)
		if code := l.fns.resetDevice(id); code != acl.Success {
			err = errors.Join(err, l.fail("aclrtResetDevice", code))
		}
		return nil, err
	}
	dv := &device{id: id, ctx: ctx, refs: 1}
	l.devices[id] = dv
	return dv, nil
}

// release drops a reference to dv; the last one destroys its stream and
// resets the device (aclrtResetDevice), which frees the default context.
func (l *library) release(dv *device) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if dv.refs--; dv.refs > 0 {
		return nil
	}
	delete(l.devices, dv.id)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var errs []error
	dv.streamMu.Lock()
	if dv.stream != 0 {
		if err := l.check("aclrtSetCurrentContext", l.setContext(dv.ctx)); err != nil {
			errs = append(errs, err)
		} else if err := l.check("aclrtDestroyStream", l.fns.destroyStream(dv.stream)); err != nil {
			errs = append(errs, err)
		}
		dv.stream = 0
	}
	dv.streamMu.Unlock()
	if err := l.check("aclrtResetDevice", l.fns.resetDevice(dv.id)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Finalize calls aclFinalize on every ACL runtime this package initialised,
// once no Driver of it is open; later Opens call aclInit again. A runtime
// that someone else in the process initialised (aclInit returned 100002) is
// left alone. Finalize fails if a Driver is still open.
//
// Call it, if at all, once before the process exits, and not from a
// destructor or finaliser: aclFinalize may take up to two seconds to flush
// device logs (set ASCEND_LOG_DEVICE_FLUSH_TIMEOUT=0 to skip that). Not
// calling it is harmless: the process's exit releases the device.
func Finalize() error {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	var errs []error
	for _, l := range registry.libs {
		if err := l.finalizeRuntime(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (l *library) finalizeRuntime() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.init != initOwn {
		return nil
	}
	if len(l.devices) > 0 {
		return fmt.Errorf("ascend: Finalize %s: %d devices still open: close every Driver first", l.path, len(l.devices))
	}
	fn, err := l.finalize.get(l, "aclFinalize")
	if err != nil {
		return fmt.Errorf("ascend: Finalize: %w: %w", acl.ErrNotSupported, err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := l.check("aclFinalize", fn()); err != nil {
		return fmt.Errorf("ascend: Finalize %s: %w", l.path, err)
	}
	l.init = initNone
	return nil
}
