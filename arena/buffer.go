package arena

import (
	"errors"
	"fmt"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/sched"
)

// Buffer is a range of an arena's memory in use: a tensor's storage. It is a
// small value (no Go heap allocation) and stays valid, at the same device
// address, however the arena grows, shrinks (above Len), sleeps in Offload
// mode or is reclaimed from, until its allocation is dropped: a Truncate or
// Reset below its end, Sleep in Discard mode, or Close. From then on it is
// stale: every copy through it, Slice of it, View of it and Share of it
// fails with an error matching ErrStale, even once new allocations cover its
// range again. A view made by Slice is the allocation it was cut from, and
// goes stale with it.
//
// What cannot be checked is the device address: a Ptr handed to a kernel,
// or to another library, outlives the check. Config.TrapStale makes such a
// pointer into dropped memory fault, or read poison, instead.
type Buffer struct {
	a   *Arena
	off uintptr
	n   uintptr
	gen uint64 // the epoch of the allocator word it was cut in (stale.go)
}

// Ptr returns the device address of the buffer's first byte.
func (b Buffer) Ptr() acl.DevicePtr {
	if b.a == nil {
		return 0
	}
	return b.a.base.Add(b.off)
}

// Offset returns the buffer's offset from the arena's base.
func (b Buffer) Offset() int { return int(b.off) }

// Len returns the buffer's length in bytes.
func (b Buffer) Len() int { return int(b.n) }

// Arena returns the arena the buffer belongs to (nil for the zero Buffer).
func (b Buffer) Arena() *Arena { return b.a }

// Slice returns the view b[i:j] of the buffer, with 0 ≤ i ≤ j ≤ b.Len().
func (b Buffer) Slice(i, j int) (Buffer, error) {
	if i < 0 || j < i || uintptr(j) > b.n {
		return Buffer{}, fmt.Errorf("arena: buffer[%d:%d]: %w: length %d", i, j, ErrRange, b.n)
	}
	if b.stale() {
		return Buffer{}, fmt.Errorf("arena: buffer[%d:%d] of %v: %w", i, j, b, ErrStale)
	}
	return Buffer{a: b.a, off: b.off + uintptr(i), n: uintptr(j - i), gen: b.gen}, nil
}

// String describes the buffer, e.g. "arena.Buffer{ptr=0x7f0000200000 off=0 len=4096}".
func (b Buffer) String() string {
	return fmt.Sprintf("arena.Buffer{ptr=%v off=%d len=%d}", b.Ptr(), b.off, b.n)
}

// Slice returns a buffer for the bytes in use a[i:j], the range [i, j) of
// offsets from Base, with 0 ≤ i ≤ j ≤ Len (the convention of Buffer.Slice and
// of Go's slices). It is a new view of what lies there now: it goes stale
// with the next drop below its end, whatever buffers of that range were
// dropped before.
func (a *Arena) Slice(i, j int) (Buffer, error) {
	if a == nil {
		return Buffer{}, errClosed
	}
	if i < 0 || j < i {
		return Buffer{}, fmt.Errorf("arena: slice [%d:%d]: %w", i, j, ErrRange)
	}
	b := Buffer{a: a, off: uintptr(i), n: uintptr(j - i), gen: a.viewGen()}
	if err := b.check("slice"); err != nil {
		return Buffer{}, err
	}
	return b, nil
}

// viewGen returns the epoch a new view of the bytes in use carries: that of
// the state word its range is then checked against (check reads the word
// again, no older). Not the newest drop's: a drop is recorded before the
// word that lowers Len is stored (thaw), and a view stamped with it but
// checked against the word before would never count it, and write into
// what is cut there next. A frozen word may be in the middle of that (its
// next epoch, and at a wrap its era, not yet stored): the view then waits
// for the arena's lock, which every freeze holds until its thaw, unless it
// is cut by a backing-change callback running under that lock, whose
// operation thaws only after it.
func (a *Arena) viewGen() uint64 {
	for {
		s := a.state.Load()
		if s&frozen == 0 {
			w := a.lowWater.Load()
			if a.state.Load() == s { // no freeze between: the era goes with s
				return epochOf(s, w)
			}
			continue
		}
		if a.ev.owner.Load() != 0 && a.inCallback() {
			return epochOf(s, a.lowWater.Load())
		}
		sched.At(sched.ViewWaits, a)
		a.mu.Lock()
		s, w := a.state.Load(), a.lowWater.Load()
		a.mu.Unlock()
		return epochOf(s, w)
	}
}

// check reports whether b is still an allocation of the arena's: not
// stale, and inside the bytes in use.
func (b Buffer) check(op string) error {
	if b.a == nil {
		return fmt.Errorf("arena: %s: %w: zero Buffer", op, ErrInvalid)
	}
	if b.a.drv == nil {
		return errNotMade
	}
	s := b.a.state.Load()
	switch b.a.lifeNow() {
	case lifeClosed:
		return errClosedBuffer
	case lifeSleeping, lifeAsleep, lifeWaking:
		return fmt.Errorf("arena: %s: %w", op, errAsleep)
	}
	// dropLog.dropped, by hand: the two loads settle most copies without a
	// call (stale.go).
	if end := uint64(b.off) + uint64(b.n); b.gen < b.a.drops.last.Load() && end > b.a.drops.low.Load() && b.a.drops.stale(b.gen, end) {
		return fmt.Errorf("arena: %s %v: %w", op, b, ErrStale)
	}
	if l := uintptr(s & lenMask); b.off > l || b.n > l-b.off {
		return fmt.Errorf("arena: %s [%d, +%d): %w: %d bytes in use", op, b.off, b.n, ErrRange, l)
	}
	return nil
}

// hold keeps the arenas of a copy from closing until the copy ends, so that
// a copy that races Close either completes or fails with ErrClosed: it holds
// their users locks for reading, the lower base first (two copies in
// opposite directions between two closing arenas cannot deadlock). Call
// release when the copy is over. Arenas New did not make hold nothing.
func hold(x, y *Arena) held {
	if x == nil || x.drv == nil {
		x = nil
	}
	if y == nil || y.drv == nil || y == x {
		y = nil
	}
	if x == nil {
		x, y = y, nil
	}
	if y != nil && y.base < x.base {
		x, y = y, x
	}
	h := held{x, y}
	if x != nil {
		x.users.RLock()
	}
	if y != nil {
		y.users.RLock()
	}
	return h
}

// callbackErr refuses a copy made from one of the arenas' own
// backing-change callbacks: the callback may run while the arena holds
// its users lock (Close, Sleep), and the copy would wait for itself.
func callbackErr(x, y *Arena) error {
	for _, a := range [2]*Arena{x, y} {
		if a != nil && a.ev.owner.Load() != 0 && a.inCallback() {
			return errCallback
		}
	}
	return nil
}

// held is what hold holds.
type held struct{ x, y *Arena }

func (h held) release() {
	if h.y != nil {
		h.y.users.RUnlock()
	}
	if h.x != nil {
		h.x.users.RUnlock()
	}
}

// Element is a type whose Go memory can be copied to a device as it is: the
// numeric types (bfloat16 and float16 travel as uint16).
type Element interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~uint8 | ~uint16 | ~uint32 | ~uint64 |
		~float32 | ~float64 | ~complex64 | ~complex128
}

// CopyIn copies src into the start of dst through the driver
// (aclrtMemcpy HOST_TO_DEVICE). src must fit: len(src)×size ≤ dst.Len().
func CopyIn[T Element](dst Buffer, src []T) error {
	defer region(RegionCopy).End()
	b := asBytes(src)
	if err := callbackErr(dst.a, nil); err != nil {
		return err
	}
	defer hold(dst.a, nil).release()
	if err := dst.checkWrite("copy in"); err != nil {
		return err
	}
	if uintptr(len(b)) > dst.n {
		return fmt.Errorf("arena: copy in %d bytes: %w: buffer holds %d", len(b), ErrRange, dst.n)
	}
	if err := dst.a.fence.wait(dst.a.drv); err != nil {
		return err
	}
	if err := dst.a.drv.MemcpyHtoD(dst.Ptr(), b); err != nil {
		return fmt.Errorf("arena: copy in: %w", err)
	}
	return nil
}

// CopyOut fills dst from the start of src through the driver
// (aclrtMemcpy DEVICE_TO_HOST). dst must fit: len(dst)×size ≤ src.Len().
func CopyOut[T Element](dst []T, src Buffer) error {
	defer region(RegionCopy).End()
	b := asBytes(dst)
	if err := callbackErr(src.a, nil); err != nil {
		return err
	}
	defer hold(src.a, nil).release()
	if err := src.check("copy out"); err != nil {
		return err
	}
	if uintptr(len(b)) > src.n {
		return fmt.Errorf("arena: copy out %d bytes: %w: buffer holds %d", len(b), ErrRange, src.n)
	}
	if err := src.a.fence.wait(src.a.drv); err != nil {
		return err
	}
	if err := src.a.drv.MemcpyDtoH(b, src.Ptr()); err != nil {
		return fmt.Errorf("arena: copy out: %w", err)
	}
	return nil
}

// Copy copies src into the start of dst on the device
// (aclrtMemcpy DEVICE_TO_DEVICE). The buffers may belong to different arenas
// of the same driver; src.Len() ≤ dst.Len(). The bytes copied must not
// overlap (ErrInvalid): device copies do not promise memmove's semantics.
func Copy(dst, src Buffer) error {
	defer region(RegionCopy).End()
	if err := callbackErr(dst.a, src.a); err != nil {
		return err
	}
	defer hold(dst.a, src.a).release()
	if err := dst.checkWrite("copy"); err != nil {
		return err
	}
	if err := src.check("copy"); err != nil {
		return err
	}
	if src.n > dst.n {
		return fmt.Errorf("arena: copy %d bytes: %w: destination holds %d", src.n, ErrRange, dst.n)
	}
	if src.a.drv != dst.a.drv {
		return fmt.Errorf("arena: copy: %w: buffers on different drivers", ErrInvalid)
	}
	if d, s := dst.Ptr(), src.Ptr(); src.n > 0 && d < s.Add(src.n) && s < d.Add(src.n) {
		return fmt.Errorf("arena: copy %v to %v: %w: %d bytes overlap", src, dst, ErrInvalid, src.n)
	}
	if err := errors.Join(dst.a.fence.wait(dst.a.drv), src.a.fence.wait(src.a.drv)); err != nil {
		return err
	}
	if err := dst.a.drv.MemcpyDtoD(dst.Ptr(), src.Ptr(), src.n); err != nil {
		return fmt.Errorf("arena: copy: %w", err)
	}
	return nil
}

// Fill sets every byte of b to v on the device (aclrtMemset).
func Fill(b Buffer, v byte) error {
	defer region(RegionCopy).End()
	if err := callbackErr(b.a, nil); err != nil {
		return err
	}
	defer hold(b.a, nil).release()
	if err := b.checkWrite("fill"); err != nil {
		return err
	}
	if err := b.a.fence.wait(b.a.drv); err != nil {
		return err
	}
	if err := b.a.drv.Memset(b.Ptr(), v, b.n); err != nil {
		return fmt.Errorf("arena: fill: %w", err)
	}
	return nil
}
