package chunk

import (
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
)

// device is what the pools on one device share: each other, to ask for
// their caches when the device runs out of memory, and the device's tenant
// history, which decides whether fresh memory needs clearing.
type device struct {
	mu      sync.Mutex
	pools   map[*Pool]struct{}
	hist    *history
	gen     atomic.Uint64 // releases of memory in the device's pools so far (wait.go)
	waiters atomic.Int32  // growths waiting for memory in the device's pools
}

// history records the tenants that have held memory of a device in this
// process: whether more than one ever has; and whether a pool of this
// process has given memory of the device back to the driver. It outlives
// the pools (the bytes a tenant freed may still be in the device's memory),
// and is kept per device name, which is the same for every driver of one
// device.
type history struct {
	first atomic.Uint64 // the first Tenant; 0 before any
	multi atomic.Bool
	// freed is set before a pool's first FreePhysical on the device.
	// Where the device clears memory between processes (FreshProcess),
	// fresh memory can hold only bytes this process freed; until then it
	// holds none, whatever the tenants (Pool.freshHolder).
	freed atomic.Bool
}

var registry = struct {
	sync.Mutex
	devices map[any]*device
	history map[string]*history
}{devices: make(map[any]*device), history: make(map[string]*history)}

// root returns the driver a chain of wrappers (with Unwrap() acl.Driver)
// wraps: the one that owns the device.
func root(d acl.Driver) acl.Driver {
	for {
		u, ok := d.(interface{ Unwrap() acl.Driver })
		if !ok {
			return d
		}
		d = u.Unwrap()
	}
}

// join registers p with its device.
func join(p *Pool) *device {
	r := root(p.drv)
	registry.Lock()
	defer registry.Unlock()
	h := registry.history[r.Name()]
	if h == nil {
		h = &history{}
		registry.history[r.Name()] = h
	}
	var key any = p // a driver that cannot be a map key shares with nobody
	if reflect.TypeOf(r).Comparable() {
		key = r
	}
	d := registry.devices[key]
	if d == nil {
		d = &device{pools: make(map[*Pool]struct{}), hist: h}
		registry.devices[key] = d
	}
	d.mu.Lock()
	d.pools[p] = struct{}{}
	d.mu.Unlock()
	return d
}

// leave removes p from its device, and the device from the registry with
// its last pool (its history stays).
func leave(p *Pool) {
	registry.Lock()
	defer registry.Unlock()
	d := p.dev
	d.mu.Lock()
	delete(d.pools, p)
	empty := len(d.pools) == 0
	d.mu.Unlock()
	if empty {
		for k, v := range registry.devices {
			if v == d {
				delete(registry.devices, k)
			}
		}
	}
}

// note records that tenant t holds memory of the device.
// It runs on every grant, so it takes no lock: once a second tenant is
// seen, multi stays set, and note returns before the grantee can write.
func (d *device) note(t Tenant) {
	h := d.hist
	if h.multi.Load() || h.first.CompareAndSwap(0, uint64(t)) {
		return
	}
	if Tenant(h.first.Load()) != t {
		h.multi.Store(true)
	}
}

// only reports whether t is the only tenant the device has had.
func (d *device) only(t Tenant) bool {
	h := d.hist
	return !h.multi.Load() && Tenant(h.first.Load()) == t
}

// others returns the pools on the device but except.
func (d *device) others(except *Pool) []*Pool {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*Pool, 0, len(d.pools))
	for q := range d.pools {
		if q != except {
			out = append(out, q)
		}
	}
	return out
}

// trimOthers asks every other pool on the device to free its cache, and
// returns how many chunks they freed, and their bytes.
func (d *device) trimOthers(p *Pool) (n int, bytes uintptr) {
	for _, q := range d.others(p) {
		k, b, _ := q.trim() // a chunk q fails to free stays in its cache
		n += k
		bytes += b
	}
	return n, bytes
}
