package arena

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/goid"
	"github.com/vmarena/vmarena/internal/sched"
)

// Backing changes: what a registration of the arena's memory with another
// library (acl.Registrar: HCCL, NCCL, an RDMA NIC) follows.
//
// The arena tells its callbacks (OnBackingChange) every change of the
// memory behind its addresses, one event at a time, in the order the
// changes happen: the reservation (Reserved, Releasing), and every chunk
// mapping, after it is mapped with access and before anything can use it
// (Mapped), and before it is unmapped (Unmapping). The events map one to one
// onto acl.Registrar's calls; RegisterWith makes a callback of a Registrar.
//
// The arena keeps, per mapping, which callbacks hold it (were told Mapped
// and not Unmapping since): a mapping some callback still holds is never
// unmapped. A callback that fails changes nothing: a failed Mapped undoes
// the change (the growth fails, and the callbacks before it are told
// Unmapping, cause BackingUndo); a failed Unmapping keeps the memory mapped
// (a Shrink, Sleep or Close fails; a chunk the pool was to unmap waits and
// is tried again).

// BackingPhase says where an event stands in a change of the arena's
// backing.
type BackingPhase int

const (
	// BackingReserved: the arena's address range [Base, Base+Size) is
	// reserved, and mappings will come and go in it
	// (acl.Registrar.SetMemoryRange).
	BackingReserved BackingPhase = iota + 1
	// BackingMapped: Mappings were just mapped, with access, and nothing has
	// used them yet: register them now (Registrar.Register, one per
	// mapping).
	BackingMapped
	// BackingUnmapping: Mappings are about to be unmapped, and the device's
	// work that used them is done: deregister them now
	// (Registrar.Deregister).
	BackingUnmapping
	// BackingReleasing: the address range is about to be released; nothing
	// in it is mapped (Registrar.UnsetMemoryRange).
	BackingReleasing
)

var phaseNames = [...]string{"", "reserved", "mapped", "unmapping", "releasing"}

// String returns the phase's name.
func (p BackingPhase) String() string {
	if p > 0 && int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("arena.BackingPhase(%d)", int(p))
}

// BackingCause says what changed an arena's backing.
type BackingCause int

const (
	// BackingGrow: a growth on the caller's path (Grow, Alloc's slow path,
	// GrowContext, AllocContext).
	BackingGrow BackingCause = iota + 1
	// BackingRefill: the pool's worker refilled the headroom (or a
	// Prefetch).
	BackingRefill
	// BackingShrink: Shrink gave back the chunks above Len (unmapped at
	// once, or, with Config.Streams, by the pool once the device is done).
	BackingShrink
	// BackingRelief: the pool took chunks the arena held mapped and unused,
	// for another growth under pressure.
	BackingRelief
	// BackingSleep: Sleep gave every chunk back.
	BackingSleep
	// BackingWake: Wake mapped memory at the same addresses again.
	BackingWake
	// BackingClose: Close unmapped everything and released the range.
	BackingClose
	// BackingImport: the mappings of another process's memory that an
	// Imported arena holds.
	BackingImport
	// BackingUndo: the undo of an operation that failed part-way (a driver
	// fault, or a callback that refused).
	BackingUndo
	// BackingTrapStale: Truncate or Reset in Config.TrapStale mode unmapped
	// the chunks above the new Len.
	BackingTrapStale
	// BackingAttach: what was there when the callback was registered.
	BackingAttach
)

var causeNames = [...]string{"", "grow", "refill", "shrink", "relief", "sleep", "wake", "close", "import", "undo",
	"trap-stale", "attach"}

// String returns the cause's name.
func (c BackingCause) String() string {
	if c > 0 && int(c) < len(causeNames) {
		return causeNames[c]
	}
	return fmt.Sprintf("arena.BackingCause(%d)", int(c))
}

// BackingChange tells an OnBackingChange callback what changed.
type BackingChange struct {
	Arena *Arena
	Phase BackingPhase
	Cause BackingCause
	// Generation is the arena's Generation after this change: every event
	// advances it, so a callback sees it strictly increase.
	Generation uint64
	// Base and Size are the arena's reserved address range.
	Base acl.DevicePtr
	Size int
	// Mappings are the chunk mappings the event is about (Mapped,
	// Unmapping), lowest address first: each one physical allocation
	// mapped whole, [Ptr, Ptr+Size) backed by Handle, as acl.Registrar
	// registers them. A callback gets only the mappings it holds
	// (Unmapping) or does not hold yet (Mapped).
	Mappings []acl.Mapping
	// Cap is the arena's Cap when the callback runs: a Mapped event's
	// mappings are not in it yet (nothing can allocate from them before
	// the callbacks accept them), an Unmapping event's may still be.
	Cap int
}

// maxCallbacks bounds an arena's callbacks: which callbacks hold a mapping
// is a bit each in a word.
const maxCallbacks = 64

// backing is an arena's callbacks and the books they follow.
type backing struct {
	mu    sync.Mutex   // held while callbacks run: one event at a time, in order
	owner atomic.Int64 // the goroutine running a callback (internal/goid); 0: none
	n     atomic.Int32 // callbacks registered: none costs nothing but the generation
	gen   atomic.Uint64
	cbs   []func(BackingChange) error // under mu
	// held maps the start of each mapping some callback holds to the
	// mapping and which callbacks hold it (bit i: cbs[i]). Under mu.
	held map[acl.DevicePtr]heldBy
	// leaving records why chunks the arena handed to the pool still mapped
	// (a Shrink with streams, a relief, an undo) go, for the pool's
	// Unmapping. Under mu.
	leaving map[acl.DevicePtr]BackingCause
}

type heldBy struct {
	m    acl.Mapping
	mask uint64
}

// Generation counts the changes of the arena's backing: every event an
// OnBackingChange callback is told (or would be told, with none registered)
// advances it by one — a growth, a refill, a shrink, a relief, a sleep, a
// wake, an undo. Whatever registered the arena's memory elsewhere (a
// collective-communication buffer, an RDMA registration, a cache of device
// pointers) may be stale when the generation moved.
func (a *Arena) Generation() uint64 {
	if a == nil {
		return 0
	}
	return a.ev.gen.Load()
}

// OnBackingChange registers fn to be told every change of the arena's
// backing from now on, in order, one event at a time (see BackingChange).
// It first tells fn what is there: the reserved range (BackingReserved),
// then every mapping the arena holds (BackingMapped, cause BackingAttach, or
// BackingImport for an Imported's arena, Buffer().Arena()), and registers fn
// only if fn accepts both; otherwise it tells fn that the
// range goes (BackingReleasing) and returns fn's error.
//
// fn runs on the goroutine that makes the change: a caller's (Grow, Shrink,
// Sleep, Wake, Close …), holding the arena's lock, or the pool's worker or a
// relief of another arena's growth, for chunks the pool unmaps (after a
// Shrink with streams, or a relief). So fn must not call the arena's
// methods, nor copy through its buffers: such a call fails with ErrCallback
// rather than wait for itself. fn should return soon: it holds up the
// arena, and, on the worker, the pool. fn returning an error refuses the
// change, which fn must not have made in part (as an acl.Registrar call
// changes nothing when it fails): a Mapped refused fails the operation that
// mapped, which undoes it (the callbacks before fn are told Unmapping,
// cause BackingUndo); an Unmapping refused keeps the memory mapped and
// held, and the operation fails (Shrink, Sleep, Close) or is tried again
// later (the pool's unmaps). An arena takes at most 64 callbacks.
func (a *Arena) OnBackingChange(fn func(BackingChange) error) error {
	if a == nil {
		return errClosed
	}
	if a.drv == nil {
		return errNotMade
	}
	if fn == nil {
		return fmt.Errorf("arena: on backing change: %w: nil callback", ErrInvalid)
	}
	if a.inCallback() {
		return errCallback
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lifeNow() == lifeClosed || a.lifeNow() == lifeClosing {
		return errClosed
	}
	a.ev.mu.Lock()
	defer a.ev.mu.Unlock()
	i := len(a.ev.cbs)
	if i == maxCallbacks {
		return fmt.Errorf("arena: on backing change: %w: %d callbacks already", ErrInvalid, maxCallbacks)
	}
	ch := BackingChange{Arena: a, Phase: BackingReserved, Cause: BackingAttach, Generation: a.ev.gen.Load(),
		Base: a.base, Size: int(a.reserved), Cap: int(a.cap.Load())}
	if err := a.call(fn, ch); err != nil {
		return fmt.Errorf("arena: on backing change: %w", err)
	}
	if ms := a.mappings(); len(ms) > 0 {
		ch.Phase, ch.Mappings = BackingMapped, ms
		if a.imp != nil {
			ch.Cause = BackingImport // another process's memory, mapped at Import
		}
		if err := a.call(fn, ch); err != nil {
			ch.Phase, ch.Mappings = BackingReleasing, nil
			return errors.Join(fmt.Errorf("arena: on backing change: %w", err), a.call(fn, ch))
		}
		a.hold(i, BackingMapped, ms)
	}
	a.ev.cbs = append(a.ev.cbs, fn)
	a.ev.n.Add(1)
	return nil
}

// mappings returns every mapping the arena holds, lowest address first: its
// chunks below Cap, its strays, a sleeping arena's slots still mapped, and
// its chunks the pool holds still mapped, waiting for the device. Call with
// mu and ev.mu held.
func (a *Arena) mappings() []acl.Mapping {
	var ms []acl.Mapping
	add := func(at acl.DevicePtr, size uint64, c chunk.Chunk) {
		ms = append(ms, acl.Mapping{Ptr: at, Size: uintptr(size), Handle: c.Handle})
	}
	for i, c := range a.geo.cs {
		add(a.at(i), a.geo.size(i), c)
	}
	// Strays and slots a failure left mapped are not trusted (their access
	// may never have been granted): only those a callback holds already
	// (had access when announced) are told.
	for _, s := range a.strays {
		if a.ev.held[s.at].mask != 0 {
			add(s.at, uint64(s.c.Size), s.c)
		}
	}
	if st := a.sl.st; st != nil {
		for i, sl := range st.slots {
			if at := st.at(a, i); sl.state == slotMapped || sl.state == slotLeft && a.ev.held[at].mask != 0 {
				add(at, st.size(i), sl.c)
			}
		}
	}
	if a.imp == nil {
		for _, m := range a.lend.PendingIn(a.base, uintptr(a.reserved)) {
			add(m.At, uint64(m.C.Size), m.C)
		}
	}
	slices.SortFunc(ms, byPtr)
	return ms
}

// byPtr orders mappings by address.
func byPtr(x, y acl.Mapping) int { return cmp.Compare(x.Ptr, y.Ptr) }

// inCallback reports whether the calling goroutine is running one of the
// arena's callbacks.
func (a *Arena) inCallback() bool {
	o := a.ev.owner.Load()
	return o != 0 && o == goid.ID()
}

// call runs fn with ch, as the arena's callback: the arena refuses calls
// from it (ErrCallback), and a panic in it is an error. Call with ev.mu held.
func (a *Arena) call(fn func(BackingChange) error, ch BackingChange) (err error) {
	a.ev.owner.Store(goid.ID())
	defer func() {
		a.ev.owner.Store(0)
		if r := recover(); r != nil {
			err = fmt.Errorf("backing-change callback panicked: %v", r)
		}
	}()
	if err := fn(ch); err != nil {
		return fmt.Errorf("backing-change callback (%v, %v): %w", ch.Phase, ch.Cause, err)
	}
	return nil
}

// hold records that callback i holds ms (Mapped) or no longer does
// (Unmapping). Call with ev.mu held.
func (a *Arena) hold(i int, phase BackingPhase, ms []acl.Mapping) {
	if a.ev.held == nil {
		a.ev.held = make(map[acl.DevicePtr]heldBy)
	}
	bit := uint64(1) << i
	for _, m := range ms {
		h := a.ev.held[m.Ptr]
		if phase == BackingMapped {
			h.m, h.mask = m, h.mask|bit
		} else {
			h.mask &^= bit
		}
		if h.mask == 0 {
			delete(a.ev.held, m.Ptr)
		} else {
			a.ev.held[m.Ptr] = h
		}
	}
}

// pick returns the mappings of ms that callback i is to be told about: those
// it does not hold (Mapped), or holds (Unmapping). Call with ev.mu held.
func (a *Arena) pick(i int, phase BackingPhase, ms []acl.Mapping) []acl.Mapping {
	bit := uint64(1) << i
	var out []acl.Mapping
	for _, m := range ms {
		held := a.ev.held[m.Ptr].mask&bit != 0
		if held == (phase == BackingUnmapping) {
			out = append(out, m)
		}
	}
	return out
}

// tell tells every callback, in order, of an event of phase (Mapped or
// Unmapping) about ms, each the mappings it does not hold yet or holds, and
// records its holdings when it accepts. When one refuses, those before it
// are told the opposite about what they took in this event (cause
// BackingUndo), so that, unless that fails too, no callback's holdings
// changed; it returns the error. The generation advances once per event
// told (or, with no callback, once). Call with mu held (or, for the pool's
// unmaps, without it) and ev.mu held.
func (a *Arena) tell(phase BackingPhase, cause BackingCause, ms []acl.Mapping) error {
	if len(ms) == 0 {
		return nil
	}
	if len(a.ev.cbs) == 0 {
		a.ev.gen.Add(1)
		return nil
	}
	took := make([][]acl.Mapping, len(a.ev.cbs))
	var gen uint64
	for i, fn := range a.ev.cbs {
		sub := a.pick(i, phase, ms)
		if len(sub) == 0 {
			continue
		}
		if gen == 0 {
			gen = a.ev.gen.Add(1)
		}
		err := a.call(fn, a.change(phase, cause, gen, sub))
		if err == nil {
			a.hold(i, phase, sub)
			took[i] = sub
			continue
		}
		undo := BackingUnmapping
		if phase == BackingUnmapping {
			undo = BackingMapped
		}
		for j := i - 1; j >= 0; j-- {
			if len(took[j]) == 0 {
				continue
			}
			if uerr := a.call(a.ev.cbs[j], a.change(undo, BackingUndo, a.ev.gen.Add(1), took[j])); uerr != nil {
				err = errors.Join(err, uerr) // it keeps what it took
				continue
			}
			a.hold(j, undo, took[j])
		}
		return err
	}
	return nil
}

func (a *Arena) change(phase BackingPhase, cause BackingCause, gen uint64, ms []acl.Mapping) BackingChange {
	return BackingChange{Arena: a, Phase: phase, Cause: cause, Generation: gen, Base: a.base,
		Size: int(a.reserved), Mappings: ms, Cap: int(a.cap.Load())}
}

// aclMappings returns the chunk mappings ms as acl.Mappings.
func (a *Arena) aclMappings(ms []chunk.Mapped) []acl.Mapping {
	out := make([]acl.Mapping, len(ms))
	for i, m := range ms {
		out[i] = acl.Mapping{Ptr: m.At, Size: m.C.Size, Handle: m.C.Handle}
	}
	slices.SortFunc(out, byPtr)
	return out
}

// announce tells the callbacks that ms were just mapped with access, for
// cause, before anything uses them. On error no callback holds them, unless
// an undo failed too: letGo then says which the caller must not unmap.
// Call with mu held.
func (a *Arena) announce(cause BackingCause, ms []chunk.Mapped) error {
	if len(ms) == 0 {
		return nil
	}
	if a.ev.n.Load() == 0 {
		a.ev.gen.Add(1)
		return nil
	}
	a.ev.mu.Lock()
	defer a.ev.mu.Unlock()
	return a.tell(BackingMapped, cause, a.aclMappings(ms))
}

// letGo tells the callbacks that ms are about to be unmapped, for cause, and
// returns which of them may be: those no callback holds afterwards (all,
// when it returns no error). Call with mu held.
func (a *Arena) letGo(cause BackingCause, ms []chunk.Mapped) (free []bool, err error) {
	free = make([]bool, len(ms))
	if len(ms) == 0 {
		return free, nil
	}
	if a.ev.n.Load() == 0 {
		a.ev.gen.Add(1)
		for i := range free {
			free[i] = true
		}
		return free, nil
	}
	a.ev.mu.Lock()
	defer a.ev.mu.Unlock()
	err = a.tell(BackingUnmapping, cause, a.aclMappings(ms))
	for i, m := range ms {
		free[i] = a.ev.held[m.At].mask == 0
	}
	return free, err
}

// letGoHeld is letGo for mappings that may never have been announced (the
// undo of a failure): without callbacks it counts no change.
func (a *Arena) letGoHeld(cause BackingCause, ms []chunk.Mapped) ([]bool, error) {
	if a.ev.n.Load() == 0 {
		free := make([]bool, len(ms))
		for i := range free {
			free[i] = true
		}
		return free, nil
	}
	return a.letGo(cause, ms)
}

// heldOf returns which of ms some callback holds now. Call with mu held.
func (a *Arena) heldOf(ms []chunk.Mapped) []bool {
	out := make([]bool, len(ms))
	if a.ev.n.Load() == 0 {
		return out
	}
	a.ev.mu.Lock()
	defer a.ev.mu.Unlock()
	for i, m := range ms {
		out[i] = a.ev.held[m.At].mask != 0
	}
	return out
}

// stillMapped tells the callbacks again about ms, mappings they were told
// were going whose unmaps failed: they stay mapped (cause BackingUndo).
// Call with mu held, or, for the pool's unmaps, without it: then, as in
// Unmapping, ev.n is read only under ev.mu, where an OnBackingChange that
// left these chunks out (they were being unmapped) has finished.
func (a *Arena) stillMapped(ms []chunk.Mapped) error {
	if len(ms) == 0 {
		return nil
	}
	a.ev.mu.Lock()
	defer a.ev.mu.Unlock()
	if a.ev.n.Load() == 0 {
		return nil // nothing changed, for no one
	}
	return a.tell(BackingMapped, BackingUndo, a.aclMappings(ms))
}

// leave records why chunks the arena hands to the pool still mapped go, for
// the pool's Unmapping. Call with mu held.
func (a *Arena) leave(cause BackingCause, ms []chunk.Mapped) {
	if a.ev.n.Load() == 0 {
		return
	}
	a.ev.mu.Lock()
	defer a.ev.mu.Unlock()
	if a.ev.leaving == nil {
		a.ev.leaving = make(map[acl.DevicePtr]BackingCause)
	}
	for _, m := range ms {
		a.ev.leaving[m.At] = cause
	}
}

// releasing tells the callbacks that the reservation is about to be
// released (Close), every mapping in it gone. Call with mu held.
func (a *Arena) releasing() error {
	if a.ev.n.Load() == 0 {
		return nil
	}
	a.ev.mu.Lock()
	defer a.ev.mu.Unlock()
	gen := a.ev.gen.Add(1)
	for i, fn := range a.ev.cbs {
		err := a.call(fn, a.change(BackingReleasing, BackingClose, gen, nil))
		if err == nil {
			continue
		}
		// The range stays: the callbacks that let go of it take it again.
		for j := i - 1; j >= 0; j-- {
			err = errors.Join(err, a.call(a.ev.cbs[j], a.change(BackingReserved, BackingUndo, a.ev.gen.Add(1), nil)))
		}
		return err
	}
	return nil
}

// unreleased tells the callbacks that the range they were told was going
// (releasing) stays, its release having failed: BackingReserved, cause
// BackingUndo, so that they take it again before its chunks are mapped
// back. Call with mu held.
func (a *Arena) unreleased() error {
	if a.ev.n.Load() == 0 {
		return nil
	}
	a.ev.mu.Lock()
	defer a.ev.mu.Unlock()
	gen := a.ev.gen.Add(1)
	var errs []error
	for _, fn := range a.ev.cbs {
		errs = append(errs, a.call(fn, a.change(BackingReserved, BackingUndo, gen, nil)))
	}
	return errors.Join(errs...)
}

// Unmapping is the arena's side of the pool's unmaps (chunk.Unmapper): the
// chunks it handed over still mapped are about to go. The pool calls it on
// the goroutine that unmaps, without the arena's lock.
func (c client) Unmapping(ms []chunk.Mapped) error {
	a := c.a
	sched.At(sched.BackingUnmap, a)
	// No look at ev.n before ev.mu: without the arena's mu, an
	// OnBackingChange may be telling a first callback about these very
	// chunks (ev.n still 0), and the callback must then hear that they go.
	a.ev.mu.Lock()
	defer a.ev.mu.Unlock()
	cause := BackingShrink
	if k, ok := a.ev.leaving[ms[0].At]; ok {
		cause = k
	}
	err := a.tell(BackingUnmapping, cause, a.aclMappings(ms))
	if err == nil {
		for _, m := range ms {
			delete(a.ev.leaving, m.At)
		}
	}
	return err
}

// StillMapped is told that the pool's unmaps of ms failed after Unmapping:
// they stay mapped, waiting, and are held again.
func (c client) StillMapped(ms []chunk.Mapped) { _ = c.a.stillMapped(ms) }

// RegisterWith returns a callback for OnBackingChange that keeps r, a
// registration with a library (acl/hccl, acl/nccl, or the caller's own),
// true to the arena's memory: it sets r's memory range to the reservation
// (SetMemoryRange), registers each mapping as it comes (Register) and
// deregisters it before it goes (Deregister), and unsets the range before it
// is released (UnsetMemoryRange). An event is all or nothing
// (acl.RegisterAll, acl.DeregisterAll): a BatchRegistrar takes the event's
// mappings in one call; for another, when a call fails, the calls the event
// made before it are undone; the error refuses the change (see
// OnBackingChange).
//
//	r := hccl.NewRegistrar(…)                // or nccl, or an RDMA NIC's
//	err := a.OnBackingChange(arena.RegisterWith(r))
func RegisterWith(r acl.Registrar) func(BackingChange) error {
	return func(ch BackingChange) error {
		switch ch.Phase {
		case BackingReserved:
			return r.SetMemoryRange(ch.Base, uintptr(ch.Size))
		case BackingReleasing:
			return r.UnsetMemoryRange(ch.Base)
		case BackingMapped:
			return acl.RegisterAll(r, ch.Mappings)
		case BackingUnmapping:
			return acl.DeregisterAll(r, ch.Mappings)
		}
		return nil
	}
}
