package chunk

import (
	"context"
	"errors"
	"reflect"
	"runtime/trace"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/sched"
)

// Pressure: who gives memory back when a growth finds no room.
//
// Memory a tenant drops (an arena's Truncate or Reset) stays mapped where it
// is, so that using it again costs no driver call. A pool takes it back only
// when someone needs it: when an Acquire finds the budget or the device full.
// The protocol, with its invariants, is in docs/design.md ("Pressure"); in
// short:
//
//  1. A growth holds nothing while it waits. An Acquire that falls short puts
//     back what it took, and the arena that asked releases its own lock
//     before the pool relieves the pressure for it: so every member can be
//     asked, with a plain Lock, and none is ever skipped as busy. The holders
//     of an arena's lock never wait for memory (the worker's refills take
//     only free memory), so asking one waits for a few driver calls at most.
//  2. Reliefs choose their chunks one at a time (Pool.reliefMu), each with
//     a ticket; a growth keeps the ticket of its first relief, and is
//     protected from every younger relief: until it ends, they leave its
//     arena the memory it is growing into (Growth). So of two growths that
//     need each other's idle memory, the first to choose takes it, through
//     as many rounds as it needs, and the second cannot take it back: no
//     livelock, and never both refused when one could be served.
//  3. A relief first counts what it could take: when the budget is short and
//     even every idle chunk of every member would not cover the growth, it
//     takes nothing (disturbing no tenant for a growth that cannot happen).
//  4. The chunks a relief takes go to its growth directly, never through
//     the cache where another growth could take them first, and it waits only
//     for their own events (recorded on the streams of the member that gave
//     them), preferring chunks whose device work has already ended; it waits
//     for the whole device only for members without streams, or when an
//     event call fails.
//  5. Whatever a growth gives up wakes the first waiter (wait.go): a chunk
//     put back, released, freed or dropped, a growth that failed (its
//     protection and promise undone), an arena closing, the budget raised.

// A Client is a pool member: something that holds chunks mapped but unused
// and can give them back under pressure, and may keep mapped headroom that
// the pool's worker refills. Arenas are clients.
//
// A client's lock (whatever serialises its Give and Refill) must never be
// held while its holder waits for memory: a relief takes it with a plain
// Lock, and would otherwise wait for the growth it is relieving.
type Client interface {
	// Reclaimable reports, without blocking, how many chunks the client
	// would give the relief with ticket by now (Give), and whether it is
	// idle (uses none).
	Reclaimable(by Ticket) (chunks int, idle bool)
	// Give detaches up to n chunks from the top of the client's mapped
	// memory for the relief with ticket by: above what it uses, what it
	// promised and, while its own growth is protected from that relief
	// (Growth.ProtectedFrom), what that growth is growing into. It hands
	// them over still mapped, lowest address first, with the streams
	// whose queued work may touch them (none: any work on the device may),
	// by calling take while it still holds its lock, so that no growth of
	// its own can map over them before the pool has them in its books. The
	// pool orders their unmaps and owns them from then on. It returns how
	// many it gave.
	Give(n int, by Ticket, take func(ms []Mapped, streams []acl.Stream)) int
	// Refill maps the headroom the client keeps, with memory that is free
	// now (TryAcquire): it takes nothing from anyone. The pool clears the
	// member's request before it calls Refill, so a client that cannot
	// refill now (its lock is busy) asks again (Member.WantRefill) rather
	// than drop the request: the worker serves it on its next round.
	Refill()
}

// A Ticket orders reliefs: the pool hands one out each time a relief
// starts choosing, and a growth keeps the ticket of its first relief until
// it ends. A smaller ticket is an older growth.
type Ticket uint64

// A Growth is a client's growth in progress, as the pool sees it under
// pressure. A client keeps one per growth under way (serialised by the
// client), passes it to Relieve and Resets it when the growth ends,
// whether or not it succeeded.
type Growth struct {
	ticket atomic.Uint64 // of its first relief; 0 before it has one
}

// ProtectedFrom reports whether the growth is protected from the relief with
// ticket by: a relief chose chunks for it first. Until the growth ends, the
// client keeps what it is growing into out of what it Gives that relief.
// Reliefs of the same growth, or younger ones, cannot take it back; an older
// growth's relief can (it was there first).
func (g *Growth) ProtectedFrom(by Ticket) bool {
	if g == nil {
		return false
	}
	t := Ticket(g.ticket.Load())
	return t != 0 && t <= by
}

// Reset ends the growth, and its protection.
func (g *Growth) Reset() {
	if g != nil {
		g.ticket.Store(0)
	}
}

// A Member is a Client's membership of a pool.
type Member struct {
	p    *Pool
	c    Client
	w    *worker // the pool's worker, when the member asked for refills
	last atomic.Uint64
	want atomic.Bool
}

// Join makes c a member of the pool: it may be asked to give chunks back
// under pressure and, if refill is set, to refill its headroom from the
// pool's background worker (which Join starts). Leave ends the membership.
func (p Lender) Join(c Client, refill bool) (*Member, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrClosed
	}
	m := &Member{p: p.Pool, c: c}
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

// relieve frees room for a growth of need chunks for tenant t, for which an
// Acquire fell short for the reason short. It returns the chunks it took for
// the growth (leased to t, unmapped), and whether anything came back that a
// retry could use (enough room, chunks put back in the cache, taken, freed
// by peers, or more room than it found): without, a retry would fail as the
// take did.
func (p *Pool) relieve(ctx context.Context, t Tenant, need int, g *Growth, short error) (handed []Chunk, progressed bool) {
	defer trace.StartRegion(ctx, RegionRelieve).End()
	sched.At(sched.ReliefBegin, p)
	start, took, peers := time.Now(), 0, 0
	defer func() { p.logRelieve(need, len(handed)+peers, took, peers, short, start) }()

	// Chunks whose device work has ended cost no wait: they go first.
	settled, _ := p.settleReady()
	room := p.roomNow()
	if room >= need {
		return nil, true // enough came back meanwhile
	}
	budget := errors.Is(short, ErrBudget)
	claims, took := p.choose(need-room, g, budget)
	sched.At(sched.ReliefSelect, p)
	for _, b := range p.await(ctx, claims) {
		handed = append(handed, p.handBatch(b, t)...)
	}
	if took > 0 {
		p.mu.Lock()
		p.stats.Reclaimed += int64(took)
		p.mu.Unlock()
	}
	sched.At(sched.ReliefDone, p)
	if !budget && len(handed) < need-room {
		if n := p.dev.trimOthers(p); n > 0 {
			p.mu.Lock()
			p.stats.PeerTrimmed += int64(n)
			p.mu.Unlock()
			peers = n
		}
	}
	// The worker may have put back, meanwhile, chunks this relief claimed
	// while it was unmapping them: they are in the cache, not handed over.
	more := len(handed) < need && p.roomNow() > room
	return handed, settled > 0 || len(handed) > 0 || peers > 0 || more
}

// choose picks, one relief at a time, the chunks a relief takes for want
// more chunks: members' idle chunks (idle members first, then least
// recently used first), then chunks waiting for the device that nobody has
// claimed (oldest first). It claims them, in batches that wait for their own
// events, and returns the batches and how many chunks members gave. Where the
// budget is what is short and all of that would not cover want, it takes
// nothing.
func (p *Pool) choose(want int, g *Growth, budget bool) (claims []*batch, given int) {
	type cand struct {
		m      *Member
		n      int
		idle   bool
		stamps uint64
	}
	p.reliefMu.Lock()
	defer p.reliefMu.Unlock()
	p.tickets++
	by := Ticket(p.tickets)
	if g != nil {
		// From now on younger reliefs leave this growth alone; it keeps the
		// ticket of its first relief through its later rounds.
		if !g.ticket.CompareAndSwap(0, uint64(by)) {
			by = Ticket(g.ticket.Load())
		}
	}
	p.mu.Lock()
	members := slices.Clone(p.members)
	unclaimed := 0
	for _, b := range p.pending.queue {
		if !b.claimed {
			unclaimed += b.left
		}
	}
	p.mu.Unlock()
	cands := make([]cand, 0, len(members))
	avail := unclaimed
	for _, m := range members {
		if n, idle := m.c.Reclaimable(by); n > 0 {
			cands = append(cands, cand{m, n, idle, m.last.Load()})
			avail += n
		}
	}
	if budget && avail < want {
		return nil, 0 // it would not fit even with every idle chunk: take none
	}
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
	got := 0
	for _, c := range cands {
		if got >= want {
			break
		}
		n := c.m.c.Give(want-got, by, func(ms []Mapped, streams []acl.Stream) {
			claims = append(claims, p.enqueue(ms, streams, true))
		})
		got += n
		given += n
	}
	if got < want {
		p.mu.Lock()
		for _, b := range p.pending.queue {
			if got >= want {
				break
			}
			if !b.claimed && b.left > 0 {
				b.claimed = true
				claims = append(claims, b)
				got += b.left
			}
		}
		p.mu.Unlock()
	}
	return claims, given
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
