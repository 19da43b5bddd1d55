package ascend

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/handles"
)

// books is what a Driver holds on behalf of its callers: the streams and
// events it created, and the reservations, mappings and physical allocations
// made through it. The runtime does not check a stream or event handle: it
// dereferences it, so a destroyed one is a use after free. The books let the
// driver refuse a destroyed stream, and a stale, unknown or NULL event,
// before the runtime sees it, with the codes ACL gives for a bad argument,
// and let Live and Close say exactly what is still held. A stream that is
// neither in the books nor destroyed is foreign: the caller made it (with its
// own CANN code) and vouches for it, and it is passed to the runtime as it
// is. The books change only when the runtime call succeeded, so a failed call
// leaves them as they were.
type books struct {
	mu      sync.Mutex
	streams map[acl.Stream]*object // created by this driver and not destroyed
	gone    handles.Graveyard      // destroyed by this driver
	events  map[acl.Event]*object
	resv    map[acl.DevicePtr]uintptr      // base → bytes reserved
	maps    map[acl.DevicePtr]mapping      // start → mapping
	handles map[acl.PhysicalHandle]*handle // physical allocations holding memory
	live    acl.LiveCounts
}

// object is a stream or event in the books. A call that passes it to the
// runtime holds it (users), so that destroying it waits for no call and
// never pulls it from under one: DestroyStream and DestroyEvent refuse an
// object in use, and every other call refuses one being destroyed.
type object struct {
	users int
	dying bool // a Destroy call is in progress
}

type mapping struct {
	size uintptr
	h    acl.PhysicalHandle
}

// handle is a physical allocation. Its memory is held until it is freed and
// its last mapping is gone (the runtime counts references the same way).
type handle struct {
	size     uintptr
	maps     int
	freed    bool
	owners   int     // references to free: one, plus one per further import of the same memory
	imported bool    // its size is learned from its first map (share.go)
	page     uintptr // imported: its page size, where the runtime says
}

func (b *books) init() {
	b.streams = map[acl.Stream]*object{}
	b.events = map[acl.Event]*object{}
	b.resv = map[acl.DevicePtr]uintptr{}
	b.maps = map[acl.DevicePtr]mapping{}
	b.handles = map[acl.PhysicalHandle]*handle{}
}

func (b *books) counts() acl.LiveCounts {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live
}

// Memory.

func (b *books) reserved(base acl.DevicePtr, size uintptr) {
	size = roundUp(size, acl.HugePageSize) // the runtime reserves whole 2 MiB pages
	b.mu.Lock()
	defer b.mu.Unlock()
	b.resv[base] = size
	b.live.Reservations++
	b.live.ReservedBytes += size
}

func (b *books) released(base acl.DevicePtr) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if size, ok := b.resv[base]; ok {
		delete(b.resv, base)
		b.live.Reservations--
		b.live.ReservedBytes -= size
	}
}

func (b *books) allocated(h acl.PhysicalHandle, size uintptr, attr acl.MemAttr) {
	if attr.Huge1G() {
		size = roundUp(size, acl.Huge1GPageSize) // the driver rounds 1 GiB allocations up
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.handles[h] = &handle{size: size, owners: 1}
	b.live.Handles++
	b.live.PhysicalBytes += size
}

func (b *books) freed(h acl.PhysicalHandle) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.handles[h]
	if !ok || r.freed {
		return // not allocated through this driver
	}
	if r.owners--; r.owners > 0 {
		return // another import of the same memory still holds it
	}
	r.freed = true
	b.live.Handles--
	if r.imported {
		b.live.Imported--
	}
	b.dropLocked(h, r)
}

func (b *books) mapped(ptr acl.DevicePtr, size uintptr, h acl.PhysicalHandle) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.maps[ptr] = mapping{size, h}
	b.live.Mappings++
	b.live.MappedBytes += size
	if r, ok := b.handles[h]; ok {
		r.maps++
		if r.size == 0 { // imported: ACL does not say its size; the first map does
			r.size = size
			b.live.PhysicalBytes += size
			b.live.ImportedBytes += size
		}
	}
}

func (b *books) unmapped(ptr acl.DevicePtr) {
	b.mu.Lock()
	defer b.mu.Unlock()
	m, ok := b.maps[ptr]
	if !ok {
		return
	}
	delete(b.maps, ptr)
	b.live.Mappings--
	b.live.MappedBytes -= m.size
	if r, ok := b.handles[m.h]; ok {
		r.maps--
		b.dropLocked(m.h, r)
	}
}

// dropLocked forgets r once its memory has gone back to the device.
func (b *books) dropLocked(h acl.PhysicalHandle, r *handle) {
	if r.freed && r.maps == 0 {
		delete(b.handles, h)
		b.live.PhysicalBytes -= r.size
		if r.imported {
			b.live.ImportedBytes -= r.size
		}
	}
}

// Streams and events.

// addStream enters a stream the runtime just created. If the runtime handed
// out the pointer of a stream this driver destroyed, it is simply the new
// stream.
func (b *books) addStream(s acl.Stream) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gone.Revive(s)
	b.streams[s] = &object{}
	b.live.Streams++
}

func (b *books) addEvent(ev acl.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events[ev] = &object{}
	b.live.Events++
}

// useStream holds s for a call. The default stream (0) and a foreign stream
// need no holding: they are passed as they are. A stream this driver
// destroyed, or is destroying, is refused with 107000.
func (b *books) useStream(op string, s acl.Stream) (release func(), err error) {
	if s == 0 {
		return func() {}, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o, ok := b.streams[s]
	switch {
	case ok && o.dying:
		return nil, notLive(op, "stream", uintptr(s), true)
	case ok:
		o.users++
		return func() { b.mu.Lock(); o.users--; b.mu.Unlock() }, nil
	case b.gone.Holds(s):
		return nil, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "stream %#x was destroyed", uintptr(s))
	}
	return func() {}, nil // foreign: its owner vouches for it
}

// useEvent holds ev for a call. NULL is 100000, as ACL's own check gives; an
// event this driver did not create, or destroyed, is 107000.
func (b *books) useEvent(op string, ev acl.Event) (release func(), err error) {
	if ev == 0 {
		return nil, acl.Errorf(op, acl.ErrCodeInvalidParam, "event is NULL")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o, ok := b.events[ev]
	if !ok || o.dying {
		return nil, notLive(op, "event", uintptr(ev), ok)
	}
	o.users++
	return func() { b.mu.Lock(); o.users--; b.mu.Unlock() }, nil
}

// claimStream marks s as being destroyed. It refuses a stream another call
// is using, one this driver destroyed, and a foreign one, which its owner
// destroys. done(true) forgets s and remembers it as destroyed; done(false)
// gives it back.
func (b *books) claimStream(op string, s acl.Stream) (done func(destroyed bool), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	o, ok := b.streams[s]
	switch {
	case !ok && b.gone.Holds(s):
		return nil, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "stream %#x was destroyed", uintptr(s))
	case !ok:
		return nil, acl.Errorf(op, acl.ErrCodeRTParamInvalid, "stream %#x was not created by this driver: its owner destroys it", uintptr(s))
	}
	if err := claim(op, "stream", uintptr(s), o, ok); err != nil {
		return nil, err
	}
	return func(destroyed bool) {
		b.mu.Lock()
		defer b.mu.Unlock()
		o.dying = false
		if destroyed {
			delete(b.streams, s)
			b.gone.Bury(s)
			b.live.Streams--
		}
	}, nil
}

// claimEvent is claimStream for an event.
func (b *books) claimEvent(op string, ev acl.Event) (done func(destroyed bool), err error) {
	if ev == 0 {
		return nil, acl.Errorf(op, acl.ErrCodeInvalidParam, "event is NULL")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	o, ok := b.events[ev]
	if err := claim(op, "event", uintptr(ev), o, ok); err != nil {
		return nil, err
	}
	return func(destroyed bool) {
		b.mu.Lock()
		defer b.mu.Unlock()
		o.dying = false
		if destroyed {
			delete(b.events, ev)
			b.live.Events--
		}
	}, nil
}

func claim(op, what string, h uintptr, o *object, ok bool) error {
	switch {
	case !ok || o.dying:
		return notLive(op, what, h, ok)
	case o.users > 0:
		return acl.Errorf(op, acl.ErrCodeRTParamInvalid, "%s %#x is in use by %d calls in progress", what, h, o.users)
	}
	o.dying = true
	return nil
}

// notLive is the error for a handle that is not in the books (found false)
// or is being destroyed (found true). Only events and streams being destroyed
// get it: a stream not in the books is a destroyed or a foreign one.
func notLive(op, what string, h uintptr, found bool) error {
	if found {
		return acl.Errorf(op, acl.ErrCodeRTParamInvalid, "%s %#x is being destroyed", what, h)
	}
	return acl.Errorf(op, acl.ErrCodeRTParamInvalid, "%s %#x was not created by this driver, or was destroyed", what, h)
}

// takeObjects forgets every stream and event and returns them, for Close.
func (b *books) takeObjects() (streams []acl.Stream, events []acl.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.streams {
		streams = append(streams, s)
	}
	for ev := range b.events {
		events = append(events, ev)
	}
	sort.Slice(streams, func(i, j int) bool { return streams[i] < streams[j] })
	sort.Slice(events, func(i, j int) bool { return events[i] < events[j] })
	clear(b.streams)
	clear(b.events)
	b.gone = handles.Graveyard{}
	b.live.Streams, b.live.Events = 0, 0
	return streams, events
}

// memoryString describes the memory still held, or returns "".
func (b *books) memoryString() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.live
	var parts []string
	if c.Mappings > 0 {
		parts = append(parts, fmt.Sprintf("%d mappings (%d bytes)", c.Mappings, c.MappedBytes))
	}
	if c.Handles > 0 || c.PhysicalBytes > 0 {
		parts = append(parts, fmt.Sprintf("%d physical allocations not freed (%d bytes of physical memory held)", c.Handles, c.PhysicalBytes))
	}
	if c.Reservations > 0 {
		parts = append(parts, fmt.Sprintf("%d reservations (%d bytes)", c.Reservations, c.ReservedBytes))
	}
	return strings.Join(parts, ", ")
}

func roundUp(n, to uintptr) uintptr { return (n + to - 1) &^ (to - 1) }
