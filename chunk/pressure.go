package chunk

import (
	"errors"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmarena/vmarena/acl"
)

// Pressure: who gives memory back when a growth finds no room.
//
// Memory a tenant drops (an arena's Truncate or Reset) stays mapped where it
// is, so that using it again costs no driver call. A pool takes it back only
// when someone needs it: when an Acquire finds the budget or the device full.
// Then it asks its members (the arenas that joined it) to give back the
// chunks they hold mapped above what they use, idle members first, least
// recently used first; waits for the device to finish with those chunks; and,
// if the device itself is out of memory, asks the other pools on the same
// device to free their caches. Then it tries again.
//
// No lock is held while a member is asked, and a member that is busy (its
// own lock is taken: it may be the one asking) says so and is skipped, so two
// arenas that reclaim from each other never wait for each other.

// A Client is a pool member: something that holds chunks mapped but unused
// and can give them back under pressure, and may keep mapped headroom that
// the pool's worker refills. Arenas are clients.
type Client interface {
	// Reclaimable reports, without blocking, how many chunks the client
	// holds mapped beyond the bytes it uses, and whether it is idle (uses
	// none).
	Reclaimable() (chunks int, idle bool)
	// Reclaim gives back up to n of those chunks and returns how many it
	// gave. It never blocks on a lock another goroutine may hold: a busy
	// client gives back nothing and says so.
	Reclaim(n int) (given int, busy bool)
	// Refill maps the headroom the client keeps, with memory that is free
	// now (TryAcquire): it takes nothing from anyone.
	Refill()
}

// A Member is a Client's membership of a pool.
type Member struct {
	p    *Pool
	c    Client
	w    *worker // the pool's worker, when the member asked for refills
	last atomic.Uint64
	want atomic.Bool
}

// Join makes c a member of the pool: it may be asked to reclaim under
// pressure and, if refill is set, to refill its headroom from the pool's
// background worker (which Join starts). Leave ends the membership.
func (p *Pool) Join(c Client, refill bool) (*Member, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	m := &Member{p: p, c: c}
	if refill {
		m.w = p.workerLocked()
	}
	m.last.Store(p.tick.Add(1))
	p.members = append(p.members, m)
	return m, nil
}

// Leave ends the membership. It is safe to call more than once.
func (m *Member) Leave() {
	m.p.mu.Lock()
	if i := slices.Index(m.p.members, m); i >= 0 {
		m.p.members = slices.Delete(m.p.members, i, i+1)
	}
	m.p.mu.Unlock()
}

// Touch records that the member was just used, for the least-recently-used
// order of reclaims.
func (m *Member) Touch() { m.last.Store(m.p.tick.Add(1)) }

// WantRefill asks the pool's worker to refill the member's headroom soon. It
// takes no lock, allocates nothing and never blocks: an arena's lock-free
// Alloc calls it when its headroom runs low. It does nothing for a member
// that joined without refills.
func (m *Member) WantRefill() {
	if m.w == nil || m.want.Load() || !m.want.CompareAndSwap(false, true) {
		return
	}
	m.w.poke()
}

// relieve tries to free room for need more chunks after an Acquire fell
// short for the reason short, and returns how many chunks it freed: taken
// back from members, put back from waiting for the device, or trimmed from
// peers (a chunk reclaimed and then put back counts twice). It asks again, a
// few times and briefly, members that were busy (in a growth of their own,
// say): never long enough for two arenas that ask each other to wait on each
// other for more than that.
func (p *Pool) relieve(need int, short error) int {
	defer region(RegionRelieve).End()
	start, reclaimed, peers := time.Now(), 0, 0
	defer func() { p.logRelieve(need, reclaimed+peers, reclaimed, peers, short, start) }()
	freed := 0
	for try, pause := 0, 20*time.Microsecond; ; try, pause = try+1, 2*pause {
		n, busy := p.reclaimFromMembers(need - freed)
		freed += n
		if freed >= need || !busy || try == busyRetries {
			break
		}
		time.Sleep(pause)
	}
	if freed > 0 {
		p.mu.Lock()
		p.stats.Reclaimed += int64(freed)
		p.mu.Unlock()
	}
	reclaimed = freed
	// Reclaimed chunks the device may still read wait for their events, as
	// do the chunks members released before: wait for them now, so that the
	// retry finds them in the cache. Those that stopped waiting meanwhile
	// count as freed, even when no member gave anything, and whether this
	// call or the worker put them back.
	before := p.waitingChunks()
	err := p.settleAll()
	freed += max(0, before-p.waitingChunks())
	if err != nil || errors.Is(short, ErrBudget) {
		return freed // what settled is in the cache; the rest stays pending
	}
	if n := p.dev.trimOthers(p); n > 0 {
		p.mu.Lock()
		p.stats.PeerTrimmed += int64(n)
		p.mu.Unlock()
		freed += n
		peers = n
	}
	return freed
}

// waitingChunks is how many chunks wait for the device now.
func (p *Pool) waitingChunks() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending.chunks
}

// busyRetries bounds how often relieve asks busy members again.
const busyRetries = 4

// reclaimFromMembers asks the members for up to need chunks, idle ones first,
// least recently used first, and reports how many they gave and whether one
// that could have given more was busy.
func (p *Pool) reclaimFromMembers(need int) (freed int, busy bool) {
	type cand struct {
		m      *Member
		n      int
		idle   bool
		stamps uint64
	}
	p.mu.Lock()
	cands := make([]cand, 0, len(p.members))
	for _, m := range p.members {
		n, idle := m.c.Reclaimable()
		if n > 0 {
			cands = append(cands, cand{m, n, idle, m.last.Load()})
		}
	}
	p.mu.Unlock()
	slices.SortFunc(cands, func(a, b cand) int {
		switch {
		case a.idle != b.idle:
			if a.idle {
				return -1
			}
			return 1
		case a.stamps < b.stamps:
			return -1
		case a.stamps > b.stamps:
			return 1
		}
		return 0
	})
	for _, c := range cands {
		if freed >= need {
			break
		}
		n, b := c.m.c.Reclaim(need - freed)
		freed += n
		busy = busy || b
	}
	return freed, busy
}

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
// process: whether more than one ever has. It outlives the pools (the bytes
// a tenant freed may still be in the device's memory), and is kept per
// device name, which is the same for every driver of one device.
type history struct {
	first atomic.Uint64 // the first Tenant; 0 before any
	multi atomic.Bool
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

// trimOthers asks every other pool on the device to free its cache, and
// returns how many chunks they freed.
func (d *device) trimOthers(p *Pool) int {
	d.mu.Lock()
	others := make([]*Pool, 0, len(d.pools))
	for q := range d.pools {
		if q != p {
			others = append(others, q)
		}
	}
	d.mu.Unlock()
	n := 0
	for _, q := range others {
		k, _ := q.trim() // a chunk q fails to free stays in its cache
		n += k
	}
	return n
}
