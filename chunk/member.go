package chunk

import (
	"context"
	"slices"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
)

// A Client is a pool member: something that holds chunks mapped but unused
// and can give them back under pressure, and may keep mapped headroom that
// the pool's worker refills. Arenas are clients.
//
// Its methods never wait: the pool calls them while it holds its own locks
// (Reclaimable and Held under its mutex, Give under its reliefMu), and from
// its worker, which never waits.
//
// Reclaimable, Held and Give count units of the pool's tail size
// (Pool.TailSize; on a pool of one size a unit is a chunk), whatever the
// sizes of the chunks that hold them.
type Client interface {
	// Reclaimable reports, without blocking, how many units the client
	// would give the relief with ticket by now (Give), and whether it is
	// idle (uses none).
	Reclaimable(by Ticket) (units int, idle bool)
	// Held reports, without blocking, how many units the client holds
	// mapped, in use or not.
	Held() int
	// Give detaches whole chunks from the top of the client's mapped memory,
	// until they make n units or more (the last chunk, a large one, may
	// take it past n: the relief hands the surplus to its growth), for the
	// relief with ticket by: above what it uses, what it promised and,
	// while its own growth is protected from that relief
	// (Growth.ProtectedFrom), what that growth is growing into. It hands
	// them over still mapped, lowest address first, with the streams whose
	// queued work may touch them (none: any work on the device may), by
	// calling take while it still holds its lock, so that no growth of its
	// own can map over them before the pool has them in its books. The pool
	// orders their unmaps and owns them from then on. It returns how many
	// units it gave. It never waits for its lock: when the lock is held it
	// gives nothing and reports busy, and the relief comes back to it.
	Give(n int, by Ticket, take func(ms []Mapped, streams []acl.Stream)) (given int, busy bool)
	// Refill maps the headroom the client keeps, with memory that is free
	// now (a speculative growth: TryAcquire, and no wait for a chunk in its
	// way). The pool clears the member's request before it calls Refill, so
	// a client that cannot refill now (its lock is busy, a chunk in its way)
	// asks again (Member.WantRefill) rather than drop the request: the
	// worker serves it on its next round.
	Refill()
}

// A Meter is a Client that also says how much of the memory it holds is in
// use, so that the pool's Stats can report the bytes its members use
// (Stats.UsedBytes), which the pool cannot see: it lends whole chunks.
// Arenas are Meters.
type Meter interface {
	Client
	// Used reports, without blocking, how many bytes of the client's
	// mapped memory are in use. The pool calls it under its mutex.
	Used() int64
}

// An Unmapper is a Client that keeps books of the chunks mapped in its
// range, as a client does that registers its memory with a library (see
// acl.Registrar): the pool tells it before it unmaps chunks the client let
// go of still mapped (Give, or Member.ReleaseAfter), so that it can take
// them off its books (deregister them) while they are still mapped. The pool
// calls it on the goroutine that unmaps (its worker, a relief, Close),
// holding none of its own locks, never with the client's lock.
type Unmapper interface {
	// Unmapping is told that ms, chunks the client let go of, are about to
	// be unmapped: the device is done with them. An error keeps them
	// mapped, waiting, and the pool tries again later (its worker, or the
	// client's own growth, which may take them back where they lie).
	Unmapping(ms []Mapped) error
	// StillMapped is told that the unmaps of ms failed after Unmapping:
	// they stay mapped, waiting, and the pool tries again later.
	StillMapped(ms []Mapped)
}

// A Member is a Client's membership of a pool.
type Member struct {
	p      *Pool
	c      Client
	w      *worker // the pool's worker, when the member asked for refills
	last   atomic.Uint64
	want   atomic.Bool
	asleep bool // under Pool.mu: see Sleep
}

// Join makes c a member of the pool: it may be asked to give chunks back
// under pressure and, if refill is set, to refill its headroom from the
// pool's background worker (which Join starts). Leave ends the membership.
func (p Lender) Join(c Client, refill bool) (*Member, error) {
	p.pool.mu.Lock()
	defer p.pool.mu.Unlock()
	if p.pool.closed {
		return nil, errClosed
	}
	m := &Member{p: p.pool, c: c}
	if refill {
		m.w = p.pool.workerLocked()
	}
	m.last.Store(p.pool.tick.Add(1))
	p.pool.members = append(p.pool.members, m)
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

// AskRefill asks the pool's worker for a refill of the member, as
// WantRefill does, for a member that joined without refills too: it
// starts the worker if it is not running, taking the pool's mutex only
// then. It is for a request the caller makes now and then (an arena's
// Prefetch). It does nothing once the pool is closed.
func (m *Member) AskRefill() {
	if m.want.Swap(true) {
		return // asked before and not yet served: that ask's poke serves this one
	}
	if w := m.p.started.Load(); w != nil {
		w.poke() // once the pool is closed, a poke nobody reads
		return
	}
	m.p.wake()
}

// Sleep marks the member asleep: it holds no memory and asks for none until
// Wake. A pool whose members are all asleep keeps no chunks ahead
// (Config.Ahead): the worker makes none, and Sleep waits, holding nothing,
// until ctx is done, for the allocations ahead already under way, so that a
// Trim after it leaves such a pool holding nothing. (A pool with no member
// keeps its chunks ahead, for the first.)
func (m *Member) Sleep(ctx context.Context) error {
	p := m.p
	p.mu.Lock()
	m.asleep = true
	p.mu.Unlock()
	return poll(ctx, nil, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.filling == 0 || !p.dormantLocked()
	})
}

// Wake marks the member awake again, after Sleep: its pool keeps chunks
// ahead again.
func (m *Member) Wake() {
	p := m.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if !m.asleep {
		return
	}
	m.asleep = false
	if p.ahead > 0 {
		p.wakeLocked() // the worker makes the chunks ahead again
	}
}

// dormantLocked reports whether the pool has members and every one is
// asleep: it then keeps nothing ahead. Call with mu held.
func (p *Pool) dormantLocked() bool {
	if len(p.members) == 0 {
		return false
	}
	for _, m := range p.members {
		if !m.asleep {
			return false
		}
	}
	return true
}
