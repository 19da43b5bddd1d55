package ascend

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/hostmem"
)

// Config configures Open. The zero value opens NPU 0 through the runtime the
// default search finds.
type Config struct {
	// Device is the ACL device id to open. 0 is the first NPU the runtime
	// shows (after ASCEND_RT_VISIBLE_DEVICES).
	Device int32
	// Library is the ACL runtime to load: the path of libascendcl.so (or of
	// libacl_rt.so), or a directory holding it. "" means $VMARENA_ASCEND_LIBRARY,
	// and when that is empty too, the search described in the package doc.
	// An explicit library is the only one tried.
	Library string
	// ACLConfig is the path of the JSON configuration passed to aclInit.
	// "" passes NULL. It matters only to the Open that initialises ACL.
	ACLConfig string
}

// Driver is the acl.Driver of one Ascend NPU, calling the ACL runtime loaded
// at run time. It is safe for concurrent use: every call runs on a locked OS
// thread with the device's context made current (see the package doc).
//
// A Driver keeps books of what it holds for its callers (streams, events,
// reservations, mappings, physical memory): it implements acl.Counter, and
// refuses event handles it did not create, streams it has destroyed, and
// destroying a stream it did not create. Other streams are the caller's, and
// passed to the runtime as they are.
type Driver struct {
	lib  *library
	dev  *device
	cfg  Config
	name string

	mu     sync.RWMutex // shared by calls, exclusive in Close
	closed bool

	books books

	hostBufs hostmem.Table // MallocHost's buffers (pinned.go)
}

var (
	_ acl.Driver  = (*Driver)(nil)
	_ acl.Counter = (*Driver)(nil)
)

// Open loads the ACL runtime (once per process), initialises it (aclInit)
// unless that is done, sets the device (aclrtSetDevice, once per device and
// process) and checks that it supports virtual memory management.
//
// When no runtime can be loaded, it lacks a required function, it sees no
// NPU, or the NPU has no VMM support, the error wraps acl.ErrNotSupported and
// says what was looked for and where. Any other error (a runtime that loads
// but fails) is an *acl.Error with the failing call, or wraps one.
func Open(cfg Config) (*Driver, error) {
	name := fmt.Sprintf("ascend:%d", cfg.Device)
	if cfg.Device < 0 {
		return nil, fmt.Errorf("%s: %w: negative device id", name, acl.ErrInvalidParam)
	}
	lib, err := load(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	dev, err := lib.acquire(cfg.Device, cfg.ACLConfig)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	d := &Driver{lib: lib, dev: dev, cfg: cfg, name: name}
	d.books.init()
	// The probe ggml-cann uses: a device whose granularity query fails has no
	// VMM (310P on CANN 7.0, drivers without the hal* VMM calls: 207000).
	prop := acl.DeviceProp(cfg.Device, acl.HBMMemHuge)
	if _, err := d.MemGetAllocationGranularity(&prop, acl.GranularityMinimum); err != nil {
		if errors.Is(err, acl.ErrNotSupported) {
			err = fmt.Errorf("no virtual memory management on this NPU or driver: %w", err)
		}
		return nil, errors.Join(fmt.Errorf("%s: %w", name, err), d.Close())
	}
	return d, nil
}

// Name returns "ascend:N".
func (d *Driver) Name() string { return d.name }

// Device returns the ACL device id.
func (d *Driver) Device() int32 { return d.cfg.Device }

// Library returns the runtime library the driver calls, and libacl_rt.so
// after it when symbols came from there.
func (d *Driver) Library() string {
	d.lib.dlMu.Lock()
	defer d.lib.dlMu.Unlock()
	return strings.Join(d.lib.files, " + ")
}

// SocName returns the chip's name (aclrtGetSocName), such as "Ascend910B3",
// or "" when the runtime cannot tell.
func (d *Driver) SocName() string {
	fn, err := d.lib.socName.get(d.lib, "aclrtGetSocName")
	if err != nil {
		return ""
	}
	var s string
	_ = d.on("aclrtGetSocName", func() error { s = fn(); return nil })
	return s
}

// Bind runs fn on a locked OS thread with the device's context current
// (acl.Binder), for calls into other CANN libraries (HCCL) that must see the
// driver's device. It fails with 107002 once the driver is closed, and
// Close waits for fn to return.
func (d *Driver) Bind(fn func() error) error { return d.on("Bind", fn) }

var _ acl.Binder = (*Driver)(nil)

// Caps reports what the NPU allows beyond the rules every driver enforces:
// little, until an NPU shows otherwise. ACL documents one aclrtMemSetAccess
// per mapping and READWRITE access only, and no ACL document or driver path
// read so far promises what fresh physical memory holds (docs/ascend.md
// gives the evidence). Memory is shared as ACL tokens where the runtime has
// the sharing calls (looked up, not called).
func (d *Driver) Caps() acl.Caps {
	return acl.Caps{AccessSpan: false, Fresh: acl.FreshUnknown, Sharing: d.sharing(), MaxReserve: acl.MaxReserve}
}

// Live reports what the driver holds for its callers: the streams and events
// it created and has not destroyed, and the reservations, mappings and
// physical memory made through it. The driver's private copy stream is not
// counted.
func (d *Driver) Live() acl.LiveCounts {
	c := d.books.counts()
	c.HostBuffers, c.HostBytes = d.hostBufs.Live()
	return c
}

// on runs fn on a locked OS thread whose current context is the device's
// default context, and holds the driver open meanwhile. fn reads the error
// message of a failed call on that same thread (errors are per thread).
func (d *Driver) on(op string, fn func() error) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return acl.NewError(op, acl.ErrCodeRTContextNull, "driver closed")
	}
	return d.bound(op, fn)
}

// bound runs fn on a locked OS thread with the device's context current.
func (d *Driver) bound(op string, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if code := d.lib.setContext(d.dev.ctx); code != acl.Success {
		return fmt.Errorf("%s on %s: making the device's context current: %w", op, d.name, d.lib.fail("aclrtSetCurrentContext", code))
	}
	return fn()
}

// check turns the code of a call made inside on into an error.
func (d *Driver) check(op string, code int32) error { return d.lib.check(op, code) }

// MemGetAllocationGranularity is aclrtMemGetAllocationGranularity.
func (d *Driver) MemGetAllocationGranularity(prop *acl.PhysicalMemProp, option acl.MemGranularityOptions) (uintptr, error) {
	const op = "aclrtMemGetAllocationGranularity"
	var g uintptr
	err := d.on(op, func() error {
		return d.check(op, d.lib.fns.memGetAllocationGranularity(prop, option, &g))
	})
	if err != nil {
		return 0, err
	}
	return g, nil
}

// MallocPhysical is aclrtMallocPhysical. The driver does not promise what the
// memory holds (Caps().Fresh is acl.FreshUnknown), so a caller that needs
// zeros writes them (Memset, MemsetAsync).
func (d *Driver) MallocPhysical(size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	const op = "aclrtMallocPhysical"
	var h acl.PhysicalHandle
	err := d.on(op, func() error {
		d.dev.vmm.Lock()
		defer d.dev.vmm.Unlock()
		if err := d.check(op, d.lib.fns.mallocPhysical(&h, size, prop, flags)); err != nil {
			return err
		}
		var attr acl.MemAttr
		if prop != nil { // the runtime refuses NULL, but the books never rely on it
			attr = prop.MemAttr
		}
		d.books.allocated(h, size, attr)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return h, nil
}

// FreePhysical is aclrtFreePhysical. Memory still mapped stays held until its
// last mapping goes.
func (d *Driver) FreePhysical(h acl.PhysicalHandle) error {
	const op = "aclrtFreePhysical"
	return d.on(op, func() error {
		d.dev.vmm.Lock()
		defer d.dev.vmm.Unlock()
		if err := d.check(op, d.lib.fns.freePhysical(h)); err != nil {
			return err
		}
		d.books.freed(h)
		return nil
	})
}

// ReserveMemAddress is aclrtReserveMemAddress.
func (d *Driver) ReserveMemAddress(size, alignment uintptr, expect acl.DevicePtr, flags uint64) (acl.DevicePtr, error) {
	const op = "aclrtReserveMemAddress"
	var p acl.DevicePtr
	err := d.on(op, func() error {
		d.dev.vmm.Lock()
		defer d.dev.vmm.Unlock()
		if err := d.check(op, d.lib.fns.reserveMemAddress(&p, size, alignment, expect, flags)); err != nil {
			return err
		}
		d.books.reserved(p, size)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return p, nil
}

// ReleaseMemAddress is aclrtReleaseMemAddress.
func (d *Driver) ReleaseMemAddress(base acl.DevicePtr) error {
	const op = "aclrtReleaseMemAddress"
	return d.on(op, func() error {
		d.dev.vmm.Lock()
		defer d.dev.vmm.Unlock()
		if err := d.check(op, d.lib.fns.releaseMemAddress(base)); err != nil {
			return err
		}
		d.books.released(base)
		return nil
	})
}

// MapMem is aclrtMapMem. The owning device can use the mapping at once (the
// ACL documentation's VMM sequence has no access call for it); MemSetAccess
// is not needed for it.
func (d *Driver) MapMem(ptr acl.DevicePtr, size, offset uintptr, h acl.PhysicalHandle, flags uint64) error {
	const op = "aclrtMapMem"
	if err := d.books.checkImportMap(op, h, size); err != nil {
		return err
	}
	return d.on(op, func() error {
		d.dev.vmm.Lock()
		defer d.dev.vmm.Unlock()
		if err := d.check(op, d.lib.fns.mapMem(ptr, size, offset, h, flags)); err != nil {
			return err
		}
		d.books.mapped(ptr, size, h)
		return nil
	})
}

// UnmapMem is aclrtUnmapMem, and nothing more: it does not wait for device
// work. The caller makes sure that nothing queued on any stream still reads
// or writes the range, by synchronising an event recorded after that work
// (SynchronizeEvent, or QueryEvent until it reports true), or else the whole
// device (SynchronizeDevice). Work that touches the range after the unmap
// faults on the NPU and fails its stream.
func (d *Driver) UnmapMem(ptr acl.DevicePtr) error {
	const op = "aclrtUnmapMem"
	return d.on(op, func() error {
		d.dev.vmm.Lock()
		defer d.dev.vmm.Unlock()
		if err := d.check(op, d.lib.fns.unmapMem(ptr)); err != nil {
			return err
		}
		d.books.unmapped(ptr)
		return nil
	})
}

// MemSetAccess is aclrtMemSetAccess, for one mapping per call: ACL asks for
// the exact pointer and size of one aclrtMapMem, and whether a run of
// adjacent mappings is accepted is unknown until an NPU shows it (Caps
// reports AccessSpan false). The call is optional: the runtime has it from
// CANN 8.5 on. Without it the call fails with code 207000 (matching
// acl.ErrNotSupported), and mappings are usable by their device anyway.
func (d *Driver) MemSetAccess(ptr acl.DevicePtr, size uintptr, desc []acl.MemAccessDesc) error {
	const op = "aclrtMemSetAccess"
	return d.on(op, func() error {
		fn, err := d.lib.setAccess.get(d.lib, op)
		if err != nil {
			return acl.Errorf(op, acl.ErrCodeRTFeatureNotSupport,
				"the runtime has no aclrtMemSetAccess (%v); mappings are accessible to their device without it", err)
		}
		var p *acl.MemAccessDesc
		if len(desc) > 0 {
			p = &desc[0]
		}
		d.dev.vmm.Lock()
		defer d.dev.vmm.Unlock()
		return d.check(op, fn(ptr, size, p, uintptr(len(desc))))
	})
}

// MemcpyHtoD is aclrtMemcpy from host to device, synchronous. Like every
// synchronous call of the driver, it waits for nothing queued on a stream.
func (d *Driver) MemcpyHtoD(dst acl.DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	const op = "aclrtMemcpy"
	n := uintptr(len(src))
	return d.on(op, func() error {
		return d.check(op, d.lib.fns.memcpyHtoD(dst, n, &src[0], n, acl.MemcpyHostToDevice))
	})
}

// MemcpyDtoH is aclrtMemcpy from device to host, synchronous.
func (d *Driver) MemcpyDtoH(dst []byte, src acl.DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	const op = "aclrtMemcpy"
	n := uintptr(len(dst))
	return d.on(op, func() error {
		return d.check(op, d.lib.fns.memcpyDtoH(&dst[0], n, src, n, acl.MemcpyDeviceToHost))
	})
}

// bounceSize is the host buffer a device-to-device copy goes through when the
// device cannot copy it directly.
const bounceSize = 4 << 20

// MemcpyDtoD copies n bytes of device memory; the ranges may overlap. Inside
// one process, ACL copies reserved memory device to device only with
// aclrtMemcpyAsync, and only between 64-byte aligned addresses: an aligned,
// non-overlapping copy is aclrtMemcpyAsync on the driver's private copy
// stream followed by aclrtSynchronizeStream of that stream alone (never of
// the device); any other goes through host memory, bounceSize bytes at a
// time.
func (d *Driver) MemcpyDtoD(dst, src acl.DevicePtr, n uintptr) error {
	if n == 0 {
		return nil
	}
	if (dst|src)%64 != 0 || (dst < src+acl.DevicePtr(n) && src < dst+acl.DevicePtr(n)) {
		return d.bounce(dst, src, n)
	}
	const op = "aclrtMemcpyAsync"
	return d.on(op, func() error {
		s, err := d.copyStream()
		if err != nil {
			return err
		}
		if err := d.check(op, d.lib.fns.memcpyAsync(dst, n, src, n, acl.MemcpyDeviceToDevice, s)); err != nil {
			return err
		}
		return d.check("aclrtSynchronizeStream", d.lib.fns.synchronizeStream(s))
	})
}

// copyStream returns the device's private stream for copies, creating it on
// first use. It runs inside on.
func (d *Driver) copyStream() (acl.Stream, error) {
	d.dev.streamMu.Lock()
	defer d.dev.streamMu.Unlock()
	if d.dev.stream == 0 {
		var s acl.Stream
		if err := d.check("aclrtCreateStream", d.lib.fns.createStream(&s)); err != nil {
			return 0, err
		}
		d.dev.stream = s
	}
	return d.dev.stream, nil
}

// bounce copies device to device through host memory, in the direction that
// keeps overlapping ranges intact (like memmove).
func (d *Driver) bounce(dst, src acl.DevicePtr, n uintptr) error {
	buf := make([]byte, min(n, bounceSize))
	for done := uintptr(0); done < n; {
		k := min(n-done, bounceSize)
		off := done
		if dst > src {
			off = n - done - k // copy from the end
		}
		if err := d.MemcpyDtoH(buf[:k], src+acl.DevicePtr(off)); err != nil {
			return err
		}
		if err := d.MemcpyHtoD(dst+acl.DevicePtr(off), buf[:k]); err != nil {
			return err
		}
		done += k
	}
	return nil
}

// Memset is aclrtMemset(ptr, n, value, n), synchronous.
func (d *Driver) Memset(ptr acl.DevicePtr, value byte, n uintptr) error {
	if n == 0 {
		return nil
	}
	const op = "aclrtMemset"
	return d.on(op, func() error {
		return d.check(op, d.lib.fns.memset(ptr, n, int32(value), n))
	})
}

// GetMemInfo is aclrtGetMemInfo: free and total bytes of attr memory on the
// device, not counting what the system reserves. Other processes move free.
func (d *Driver) GetMemInfo(attr acl.MemAttr) (free, total uintptr, err error) {
	const op = "aclrtGetMemInfo"
	err = d.on(op, func() error {
		return d.check(op, d.lib.fns.getMemInfo(attr, &free, &total))
	})
	if err != nil {
		return 0, 0, err
	}
	return free, total, nil
}

// Close gives the device back. It first releases what the caller leaked:
// every stream it created and did not destroy is synchronised and destroyed,
// every event destroyed, and the error reports them. Memory still held
// (mappings, physical allocations, reservations) is reported and left to the
// runtime, since device work may still use it. The last Driver of a device
// then destroys its copy stream and resets it (aclrtResetDevice), which frees
// its default context. Close waits for calls in progress; calls after it
// fail with code 107002. Close is safe to call more than once and on a nil
// *Driver. It does not finalise ACL (see Finalize).
func (d *Driver) Close() error {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	var errs []error
	if err := d.releaseLeaks(); err != nil {
		errs = append(errs, err)
	}
	if err := d.lib.release(d.dev); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s: close: %w", d.name, err)
	}
	return nil
}

// releaseLeaks destroys the streams and events the caller left, and reports
// them and any memory still held. Close calls it with d.mu held.
func (d *Driver) releaseLeaks() error {
	streams, events := d.books.takeObjects()
	var errs []error
	if len(streams) > 0 || len(events) > 0 {
		errs = append(errs, fmt.Errorf("%d streams and %d events were still live: destroyed them", len(streams), len(events)))
		err := d.bound("Close", func() error {
			var errs []error
			for _, s := range streams { // let their work finish before their events go
				errs = append(errs, d.check("aclrtSynchronizeStream", d.lib.fns.synchronizeStream(s)))
			}
			if len(events) > 0 {
				ev, err := d.lib.events.get(d.lib)
				if err != nil {
					return err // cannot happen: the events were created through it
				}
				for _, e := range events {
					errs = append(errs, d.check("aclrtDestroyEvent", ev.destroy(e)))
				}
			}
			for _, s := range streams {
				errs = append(errs, d.check("aclrtDestroyStream", d.lib.fns.destroyStream(s)))
			}
			return errors.Join(errs...)
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	if mem := d.books.memoryString(); mem != "" {
		errs = append(errs, fmt.Errorf("memory still held, left to the runtime: %s", mem))
	}
	if n, bytes := d.hostBufs.Live(); n > 0 {
		errs = append(errs, fmt.Errorf("%d host buffers of aclrtMallocHost (%d bytes) still held, left to the runtime", n, bytes))
	}
	return errors.Join(errs...)
}
