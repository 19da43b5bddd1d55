package nccl

import (
	"errors"
	"fmt"
	"sort"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/internal/regtable"
)

// Registrar is the acl.Registrar of one NCCL communicator. By default it
// registers each of an arena's mappings on its own, so that no registration
// spans two physical allocations:
//
//	SetMemoryRange(base, size)   (books only: NCCL has no range call)
//	Register(m)                  ncclCommRegister(comm, m.Ptr, m.Size, &handle)
//	Deregister(m)                ncclCommDeregister(comm, handle)
//	UnsetMemoryRange(base)       (books only)
//
// With the Coalesce option it registers runs instead: each run of adjacent
// registered mappings inside one set range is one NCCL registration, so that
// a buffer crossing a chunk boundary lies inside one registration (NCCL uses
// a registration only for a buffer it covers whole). A change to a run
// deregisters the run first and registers what it becomes afterwards: a
// mapping is never unmapped inside a live registration, since Deregister
// (of one mapping or a batch) drops the whole run before it returns.
//
// It keeps the books of the set ranges, of the registered mappings and of
// NCCL's registrations, and refuses, before NCCL sees it, any call the
// protocol forbids (with 107000, acl.ErrInvalidParam): a mapping outside a
// set range or overlapping a registered one, a deregistration of what is
// not registered as given, an unset of a range with registrations. A call
// NCCL refuses returns its *Error and changes nothing (with Coalesce, the
// registrations a failed change dropped are made again; if NCCL refuses
// that too, both errors are returned and the mappings stay registered in
// the books but not with NCCL, which then moves buffers over them through
// its own: never a registration over unmapped memory). NCCL needs no
// alignment: the registrations are the mappings, or runs of them, with no
// padding.
//
// NCCL works on the calling thread's CUDA context: give NewRegistrar the
// device's driver (package acl/cuda) as its acl.Binder.
//
// A Registrar is safe for concurrent use; it makes one NCCL call at a time.
type Registrar struct {
	lib      *Library
	comm     Comm
	coalesce bool
	books    regtable.Books
	regs     []registration // NCCL's registrations, by address, never overlapping; guarded by books
	calls    int64          // ncclCommRegister and ncclCommDeregister calls made; guarded by books
}

// registration is one ncclCommRegister: a mapping, or a run of them.
type registration struct {
	ptr    acl.DevicePtr
	size   uintptr
	handle uintptr // 0 where NCCL registered nothing (NCCL_LOCAL_REGISTER=0)
}

func (g registration) end() acl.DevicePtr { return g.ptr.Add(g.size) }

var (
	_ acl.Registrar      = (*Registrar)(nil)
	_ acl.BatchRegistrar = (*Registrar)(nil)
)

// Option configures a Registrar.
type Option func(*Registrar)

// Coalesce makes the registrar register each run of adjacent mappings of
// one set range as one NCCL registration (see Registrar). It costs a
// deregistration and a registration of the whole run at every change of the
// run (one of each per batch: acl.BatchRegistrar), and NCCL maps a run for
// its peers again the first time a collective uses it after a change; it
// saves the copy NCCL makes of every buffer that crosses a chunk boundary.
func Coalesce() Option { return func(r *Registrar) { r.coalesce = true } }

// NewRegistrar returns the registrar of communicator comm of lib, calling
// NCCL inside bind's Bind (nil: on the calling thread as it is).
func NewRegistrar(lib *Library, comm Comm, bind acl.Binder, opts ...Option) (*Registrar, error) {
	if lib == nil || comm == 0 {
		return nil, acl.Errorf("nccl.NewRegistrar", acl.ErrCodeRTParamInvalid, "a library and a communicator are needed")
	}
	r := &Registrar{lib: lib, comm: comm}
	for _, o := range opts {
		if o != nil {
			o(r)
		}
	}
	r.books.Bind = bind
	return r, nil
}

// SetMemoryRange records the range; NCCL is not called.
func (r *Registrar) SetMemoryRange(base acl.DevicePtr, size uintptr) error {
	const op = "SetMemoryRange"
	if err := r.books.Lock(op); err != nil {
		return err
	}
	defer r.books.Unlock()
	t := r.books.Table()
	if err := t.CheckSet(op, base, size); err != nil {
		return err
	}
	t.Set(base, size)
	return nil
}

// UnsetMemoryRange forgets the range, which must have no registrations.
func (r *Registrar) UnsetMemoryRange(base acl.DevicePtr) error {
	const op = "UnsetMemoryRange"
	if err := r.books.Lock(op); err != nil {
		return err
	}
	defer r.books.Unlock()
	t := r.books.Table()
	if _, err := t.CheckUnset(op, base); err != nil {
		return err
	}
	t.Unset(base)
	return nil
}

// Register is ncclCommRegister(comm, m.Ptr, m.Size, &handle); with
// Coalesce, of the run m joins (after ncclCommDeregister of the runs it
// joins).
func (r *Registrar) Register(m acl.Mapping) error { return r.RegisterBatch([]acl.Mapping{m}) }

// Deregister is ncclCommDeregister(comm, handle) of m's registration; with
// Coalesce, of the run m is in, and ncclCommRegister of what is left of it.
func (r *Registrar) Deregister(m acl.Mapping) error { return r.DeregisterBatch([]acl.Mapping{m}) }

// RegisterBatch registers ms, all or nothing: one NCCL registration each,
// or, with Coalesce, one per run they make with what is registered already.
func (r *Registrar) RegisterBatch(ms []acl.Mapping) error {
	return r.batch("ncclCommRegister", ms, true)
}

// DeregisterBatch deregisters ms, all or nothing: their registrations go
// (with Coalesce, their runs go, and what is left of each run is registered
// again).
func (r *Registrar) DeregisterBatch(ms []acl.Mapping) error {
	return r.batch("ncclCommDeregister", ms, false)
}

func (r *Registrar) batch(op string, ms []acl.Mapping, add bool) error {
	if err := r.books.Lock(op); err != nil {
		return err
	}
	defer r.books.Unlock()
	t := r.books.Table()
	var done []acl.Mapping
	undoBooks := func() {
		for _, m := range done {
			if add {
				t.Deregister(m)
			} else {
				t.Register(m)
			}
		}
	}
	for _, m := range ms {
		var err error
		if add {
			err = t.CheckRegister(op, m)
		} else {
			err = t.CheckDeregister(op, m)
		}
		if err != nil {
			undoBooks()
			return err
		}
		if add {
			t.Register(m)
		} else {
			t.Deregister(m)
		}
		done = append(done, m)
	}
	drop, fresh := r.plan(t, ms, add)
	if err := r.books.Call(func() error { return r.replace(drop, fresh) }); err != nil {
		undoBooks()
		return err
	}
	return nil
}

// plan returns which of NCCL's registrations go and which are made so that
// they match the books t, which already hold the change (ms registered, or
// deregistered). Call it holding the books.
func (r *Registrar) plan(t *regtable.Table, ms []acl.Mapping, add bool) (drop, fresh []registration) {
	if !r.coalesce {
		for _, m := range ms {
			g := registration{ptr: m.Ptr, size: m.Size}
			if add {
				fresh = append(fresh, g)
			} else if i := r.find(m.Ptr, 1); i < len(r.regs) && r.regs[i].ptr == m.Ptr {
				drop = append(drop, r.regs[i])
			}
		}
		return drop, fresh
	}
	// The registrations that overlap or touch ms go; the runs of the books
	// around ms (adding) or inside what went (deregistering) are made.
	seen := map[acl.DevicePtr]bool{}
	for _, m := range ms {
		rg, _ := t.RangeOf(m.Ptr)
		lo, hi := m.Ptr, m.End()
		if add {
			lo, hi = lo-1, hi+1 // the runs m touches join it (in its range)
		}
		for i := r.find(lo, uintptr(hi-lo)); i < len(r.regs) && r.regs[i].ptr < hi; i++ {
			if g := r.regs[i]; !seen[g.ptr] && uintptr(g.ptr) >= rg.Base && uintptr(g.ptr)-rg.Base < rg.Size {
				seen[g.ptr] = true
				drop = append(drop, g)
			}
		}
	}
	sort.Slice(drop, func(i, j int) bool { return drop[i].ptr < drop[j].ptr })
	run := func(m acl.Mapping) {
		for _, g := range fresh {
			if m.Ptr >= g.ptr && m.Ptr < g.end() {
				return // in a run already made
			}
		}
		fresh = append(fresh, r.runOf(t, m))
	}
	if add {
		for _, m := range ms {
			run(m)
		}
	} else {
		for _, g := range drop {
			for _, m := range t.Covering(g.ptr, g.size) {
				run(m)
			}
		}
	}
	sort.Slice(fresh, func(i, j int) bool { return fresh[i].ptr < fresh[j].ptr })
	return drop, fresh
}

// runOf returns the run of registered mappings of t around m, which t
// holds: adjacent mappings inside m's set range. Call it holding the books.
func (r *Registrar) runOf(t *regtable.Table, m acl.Mapping) registration {
	rg, _ := t.RangeOf(m.Ptr)
	lo, hi := m.Ptr, m.End()
	for uintptr(lo) > rg.Base {
		c := t.Covering(lo-1, 1)
		if len(c) == 0 || c[0].End() != lo {
			break
		}
		lo = c[0].Ptr
	}
	for uintptr(hi) < rg.Base+rg.Size {
		n, ok := t.Lookup(hi)
		if !ok {
			break
		}
		hi = n.End()
	}
	return registration{ptr: lo, size: uintptr(hi - lo)}
}

// find returns the index of the first registration that ends after ptr
// (and so may overlap [ptr, ptr+n)).
func (r *Registrar) find(ptr acl.DevicePtr, _ uintptr) int {
	return sort.Search(len(r.regs), func(i int) bool { return r.regs[i].end() > ptr })
}

// replace deregisters drop and registers fresh, all or nothing: on a failure
// it deregisters what it made and registers again what it dropped. What it
// cannot undo is left as NCCL holds it, in r.regs (see Registrar). Call it
// holding the books, inside Bind.
func (r *Registrar) replace(drop, fresh []registration) error {
	for i, g := range drop {
		if err := r.deregisterNCCL(g); err != nil {
			return errors.Join(err, r.undo(nil, drop[:i]))
		}
	}
	for i, g := range fresh {
		if err := r.registerNCCL(g); err != nil {
			return errors.Join(err, r.undo(fresh[:i], drop))
		}
	}
	return nil
}

// undo deregisters made and registers dropped again.
func (r *Registrar) undo(made, dropped []registration) error {
	var errs []error
	for _, g := range made {
		// It was just made; the handle is in r.regs.
		if i := r.find(g.ptr, 1); i < len(r.regs) && r.regs[i].ptr == g.ptr {
			errs = append(errs, r.deregisterNCCL(r.regs[i]))
		}
	}
	for _, g := range dropped {
		errs = append(errs, r.registerNCCL(registration{ptr: g.ptr, size: g.size}))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nccl: undoing a failed change: %w", err)
	}
	return nil
}

// registerNCCL is ncclCommRegister of g, recorded in r.regs once NCCL has
// accepted it.
func (r *Registrar) registerNCCL(g registration) error {
	r.calls++
	h, err := r.lib.CommRegister(r.comm, g.ptr, g.size)
	if err != nil {
		return err
	}
	g.handle = h
	i := r.find(g.ptr, 1)
	r.regs = append(r.regs, registration{})
	copy(r.regs[i+1:], r.regs[i:])
	r.regs[i] = g
	return nil
}

// deregisterNCCL is ncclCommDeregister of g's handle, forgotten from r.regs
// once NCCL has accepted it.
func (r *Registrar) deregisterNCCL(g registration) error {
	r.calls++
	if err := r.lib.CommDeregister(r.comm, g.handle); err != nil {
		return err
	}
	if i := r.find(g.ptr, 1); i < len(r.regs) && r.regs[i].ptr == g.ptr {
		r.regs = append(r.regs[:i], r.regs[i+1:]...)
	}
	return nil
}

// Live returns how many ranges the registrar has set and how many mappings
// it has registered, with their bytes.
func (r *Registrar) Live() (ranges, mappings int, bytes uintptr) { return r.books.Live() }

// Registrations returns how many registrations NCCL holds for the
// registrar (one per mapping, or, with Coalesce, per run) and how many
// ncclCommRegister and ncclCommDeregister calls it has made in all.
func (r *Registrar) Registrations() (held int, calls int64) {
	r.books.With(func() { held, calls = len(r.regs), r.calls })
	return held, calls
}

// Close deregisters what is still registered and forgets what is still set
// (the caller leaked them: the error names them), and makes later calls
// fail with 107002. It does not destroy the communicator, which the caller
// owns. Close is safe to call more than once.
func (r *Registrar) Close() error {
	return r.books.Close("nccl", func(m acl.Mapping) error {
		// The registration covering m goes whole; the other mappings
		// of a run then find none.
		if i := r.find(m.Ptr, 1); i < len(r.regs) && r.regs[i].ptr <= m.Ptr {
			if r.regs[i].ptr < m.Ptr {
				// The run's first mapping could not deregister it:
				// m stays registered with it.
				return fmt.Errorf("nccl: %v stays registered: its run's deregistration failed", m)
			}
			return r.deregisterNCCL(r.regs[i])
		}
		return nil
	}, nil)
}
