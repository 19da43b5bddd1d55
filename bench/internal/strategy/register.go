package strategy

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmarena/vmarena/acl"
)

// Registration modes of the arena strategies (Config.Register): how a
// collective library registers each arena's memory, as acl/hccl and
// acl/nccl do.
const (
	// RegisterNone registers nothing.
	RegisterNone = ""
	// RegisterChunk registers each chunk mapping on its own: HCCL's
	// activation per mapping, NCCL's default registrar.
	RegisterChunk = "chunk"
	// RegisterRun registers each run of adjacent chunks as one buffer,
	// re-registering the run at each change: NCCL with nccl.Coalesce.
	RegisterRun = "run"
)

// RegisterModes are the values Config.Register takes.
var RegisterModes = []string{"none", RegisterChunk, RegisterRun}

// Registrations counts a library's registration calls over a run.
type Registrations struct {
	Register, Deregister int64 // calls made (ncclCommRegister / HcclCommActivateCommMemory, and their undoing)
}

// registrations is what every arena's modelled registrar adds to.
type registrations struct {
	mode  string
	cost  time.Duration
	reg   atomic.Int64
	dereg atomic.Int64
}

// spend charges one library call's modelled host time to the calling
// goroutine (the one that changes the arena's backing: the caller's, or the
// pool's worker for a refill), by spinning: a sleep this short oversleeps.
func (r *registrations) spend() {
	if r.cost <= 0 {
		return
	}
	for t := time.Now(); time.Since(t) < r.cost; {
	}
}

// modelRegistrar is an acl.BatchRegistrar that keeps which chunks of one
// arena are registered and counts the library calls a registrar of the
// mode would make: one per chunk, or one deregistration of each run a
// change touches and one registration of each run it leaves.
type modelRegistrar struct {
	all *registrations
	mu  sync.Mutex
	reg map[acl.DevicePtr]uintptr // registered mappings: start → size
}

var _ acl.BatchRegistrar = (*modelRegistrar)(nil)

func newModelRegistrar(all *registrations) *modelRegistrar {
	return &modelRegistrar{all: all, reg: map[acl.DevicePtr]uintptr{}}
}

func (m *modelRegistrar) SetMemoryRange(acl.DevicePtr, uintptr) error { return nil }
func (m *modelRegistrar) UnsetMemoryRange(acl.DevicePtr) error        { return nil }
func (m *modelRegistrar) Register(x acl.Mapping) error {
	return m.RegisterBatch([]acl.Mapping{x})
}
func (m *modelRegistrar) Deregister(x acl.Mapping) error {
	return m.DeregisterBatch([]acl.Mapping{x})
}

// RegisterBatch records ms and counts the calls.
func (m *modelRegistrar) RegisterBatch(ms []acl.Mapping) error {
	return m.change(ms, true)
}

// DeregisterBatch forgets ms and counts the calls.
func (m *modelRegistrar) DeregisterBatch(ms []acl.Mapping) error {
	return m.change(ms, false)
}

func (m *modelRegistrar) change(ms []acl.Mapping, add bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, x := range ms {
		if _, ok := m.reg[x.Ptr]; ok == add {
			return fmt.Errorf("strategy: modelled registrar: %v registered: %v, asked to register: %v", x, ok, add)
		}
	}
	var regs, deregs int64
	if m.all.mode == RegisterChunk {
		if add {
			regs = int64(len(ms))
		} else {
			deregs = int64(len(ms))
		}
	} else {
		// The runs the change touches go; the runs around them after it
		// are made.
		before := m.runs(ms, add) // adding: the runs beside ms; removing: those holding them
		for _, x := range ms {
			if add {
				m.reg[x.Ptr] = x.Size
			} else {
				delete(m.reg, x.Ptr)
			}
		}
		after := m.runs(ms, !add)
		deregs, regs = int64(len(before)), int64(len(after))
		for _, x := range ms { // put back: the books change below, as one
			if add {
				delete(m.reg, x.Ptr)
			} else {
				m.reg[x.Ptr] = x.Size
			}
		}
	}
	for _, x := range ms {
		if add {
			m.reg[x.Ptr] = x.Size
		} else {
			delete(m.reg, x.Ptr)
		}
	}
	m.all.reg.Add(regs)
	m.all.dereg.Add(deregs)
	for range regs + deregs {
		m.all.spend()
	}
	return nil
}

// runs returns the starts of the runs of registered mappings, as the books
// are now, that hold one of ms (neighbours false) or that hold a mapping
// next to one of ms (neighbours true).
func (m *modelRegistrar) runs(ms []acl.Mapping, neighbours bool) []acl.DevicePtr {
	var starts []acl.DevicePtr
	for _, x := range ms {
		at := []acl.DevicePtr{x.Ptr}
		if neighbours {
			at = []acl.DevicePtr{x.Ptr - acl.DevicePtr(x.Size), x.End()}
		}
		for _, p := range at {
			if _, ok := m.reg[p]; ok {
				starts = append(starts, m.start(p, x.Size))
			}
		}
	}
	slices.Sort(starts)
	return slices.Compact(starts)
}

// start returns the start of the run holding the registered mapping at p,
// of the arena's chunk size.
func (m *modelRegistrar) start(p acl.DevicePtr, size uintptr) acl.DevicePtr {
	for {
		if _, ok := m.reg[p-acl.DevicePtr(size)]; !ok {
			return p
		}
		p -= acl.DevicePtr(size)
	}
}
