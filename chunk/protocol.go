package chunk

import (
	"context"
	"errors"
	"fmt"
	"runtime/trace"
	"slices"
	"sync/atomic"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/sched"
	"github.com/vmarena/vmarena/internal/units"
)

// The growth protocol: its states and its one loop. How a growth gets memory
// when its pool has no room, what each chunk a member lets go of goes through
// meanwhile, and why nobody waits holding anything, is told once, with these
// names, in docs/design.md ("Pressure").

// GrowthState is where a growth is in the protocol (Growth.State).
type GrowthState uint32

// The states of a growth. One try of a growth runs from GrowLocked to
// GrowMapped or GrowFailed; a growth that waits for memory between its tries
// (GrowContext) is GrowQueued meanwhile.
const (
	GrowIdle      GrowthState = iota // no growth has run yet
	GrowLocked                       // holds its client's lock and places what is at hand (Placer.Place)
	GrowBlocked                      // lock released, holding nothing: waits for a chunk in its way (claimed or being unmapped)
	GrowRelieving                    // lock released, holding nothing: a relief looks for memory for it
	GrowChosen                       // a relief chose chunks for it; it holds its ticket, protected from younger reliefs
	GrowHanded                       // the chunks it was chosen are unmapped and its own; it takes its lock again
	GrowMapped                       // served
	GrowFailed                       // failed; its protection is undone
	GrowQueued                       // between the tries of a waiting growth, in the pool's queue
)

var growthStates = [...]string{"idle", "locked", "blocked", "relieving", "chosen", "handed", "mapped", "failed", "queued"}

// String returns the state's name, as docs/design.md writes it.
func (s GrowthState) String() string {
	if int(s) < len(growthStates) {
		return growthStates[s]
	}
	return fmt.Sprintf("chunk.GrowthState(%d)", uint32(s))
}

// chunkState is where a chunk a member let go of is, from its release (or
// its gift to a relief) until it leaves the pool's books of chunks waiting
// for the device.
type chunkState uint8

const (
	chunkWaiting   chunkState = iota // still mapped in the member's range, waiting for its device work; the worker's
	chunkClaimed                     // waiting, and claimed by a relief, which unmaps it and hands it to its growth
	chunkUnmapping                   // being unmapped, by the worker, a relief, or a Close of the pool
	chunkUnmapped                    // unmapped and put back in the cache (or freed)
	chunkHanded                      // unmapped and handed to a relief's growth, out of the pool
	chunkMapped                      // taken back where it lies by its member (Reclaim): mapped in the member again
)

var chunkStates = [...]string{"waiting", "claimed", "unmapping", "unmapped", "handed", "mapped"}

func (s chunkState) String() string { return chunkStates[s] }

// busy reports whether a chunk in this state is another's to settle: a
// member growing into its address waits for it.
func (s chunkState) busy() bool { return s == chunkClaimed || s == chunkUnmapping }

// A Ticket orders reliefs: the pool hands one out each time a relief
// starts choosing, and a growth keeps the ticket of its first relief until
// it ends. A smaller ticket is an older growth.
type Ticket uint64

// A Growth is a client's growth in progress, as the pool sees it: its
// state and, once a relief has chosen for it, its ticket. A client keeps one
// per growth it runs at a time (serialised by the client), passes it to
// Lender.Grow, and calls End when the growth is over, whether or not it
// succeeded.
type Growth struct {
	ticket   atomic.Uint64 // of its first relief; 0 before it has one
	state    atomic.Uint32 // a GrowthState
	relieved atomic.Bool   // it has gone to a relief since it began
}

// State returns where the growth is.
func (g *Growth) State() GrowthState { return GrowthState(g.state.Load()) }

// set records the growth's state. (A load first: a store is a locked
// instruction, and a growth from the cache goes from one state to the next
// it already shows.)
func (g *Growth) set(s GrowthState) {
	if g.state.Load() != uint32(s) {
		g.state.Store(uint32(s))
	}
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

// End ends the growth, and its protection, and reports whether it went to
// a relief: a client whose growth failed after one wakes the first waiter
// (Member.Failed), since what the growth protected is reclaimable again.
func (g *Growth) End() (relieved bool) {
	if g.ticket.Load() != 0 {
		g.ticket.Store(0)
	}
	return g.relieved.Load() && g.relieved.Swap(false)
}

// A Placer is a client's side of one growth, which Lender.Grow drives.
type Placer interface {
	// Place runs with the client's lock held. It places the growth from
	// what is at hand and never waits: have (chunks a relief handed to the
	// growth, out of the pool and unmapped), the client's own chunks still
	// waiting for the device where it grows (Lender.ReclaimSpan), and memory
	// free in the pool now (TakeFree, or TryAcquire for a speculative
	// growth). have may hold chunks of both of the pool's sizes, and more
	// units than the growth lacks (a member gives whole chunks): the growth
	// uses what fits it and puts the rest back (Put). Either it completes the growth and returns the zero Step, or
	// it changes nothing, keeps no chunk (have included) and returns why:
	// a Step that says what is missing or what is in its way, or an error
	// that ends the growth.
	Place(have []Chunk) (Step, error)
	// Unlock releases the client's lock, for a wait, and returns a channel
	// that is closed when the client stops growing (it is closing, or going
	// to sleep): the growth's waits end then, and its next Place says why.
	Unlock() (stop <-chan struct{})
	// Lock takes the client's lock again after a wait.
	Lock()
}

// A Step is why a Place did not complete its growth.
type Step struct {
	// Missing is how many units of fresh memory (of the pool's tail size,
	// Pool.TailSize: chunks on a pool of one size) the pool had no room
	// for, and Short why (an error matching ErrBudget, or acl.ErrOutOfMemory for the
	// device).
	Missing int
	Short   error
	// Busy is set when a chunk waiting at an address the growth maps into
	// is claimed by a relief or being unmapped: the growth waits for it
	// (holding nothing), then tries again.
	Busy Busy
}

// Busy is a chunk, waiting for the device at an address of a member, that
// another goroutine is settling: a relief claimed it, or it is being
// unmapped. The zero Busy is nothing.
type Busy struct {
	p  *Pool
	at acl.DevicePtr
}

// IsZero reports whether b is nothing to wait for.
func (b Busy) IsZero() bool { return b.p == nil }

// Wait waits, holding nothing, until the chunk is no longer busy (unmapped,
// or given back to waiting), ctx is done (ctx.Err()) or stop is closed
// (nil). It polls, as the waits for events do.
func (b Busy) Wait(ctx context.Context, stop <-chan struct{}) error {
	if b.p == nil {
		return nil
	}
	return poll(ctx, stop, func() bool { return !b.p.busyAt(b.at) })
}

// busyAt reports whether the chunk waiting at ptr, if any, is busy.
func (p *Pool) busyAt(ptr acl.DevicePtr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	it := p.pending.byAddr[ptr]
	return it != nil && it.state.busy()
}

// poll calls done, from every pendingPollMin up to every pendingPollMax,
// until it returns true (nil), ctx is done (ctx.Err()) or stop is closed
// (nil).
func poll(ctx context.Context, stop <-chan struct{}, done func() bool) error {
	delay := pendingPollMin
	for !done() {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-stop:
			t.Stop()
			return nil
		case <-t.C:
		}
		delay = min(2*delay, pendingPollMax)
	}
	return nil
}

// pause waits for d, or until ctx is done (ctx.Err()) or stop is closed
// (nil).
func pause(ctx context.Context, stop <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
	case <-t.C:
	}
	return nil
}

// stopped reports whether stop is closed.
func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// GrowMode says how a growth may get its memory.
type GrowMode uint8

const (
	// MayRelieve lets the growth wait, holding nothing, for chunks in its
	// way and for reliefs of the pressure (growths on a caller's path).
	MayRelieve GrowMode = iota
	// Speculative takes only what is at hand: the growth ends at the first
	// shortage (an error matching acl.ErrOutOfMemory) or chunk in its way
	// (ErrBusy). The worker's refills are speculative: it never waits.
	Speculative
)

// maxReliefs bounds the reliefs of one growth: a growth whose relief found
// memory that was no longer enough when it placed it (its own chunks waiting
// for the device were unmapped meanwhile, say) goes round again at most this
// often. Waits for a chunk in its way do not count: each ends when that
// chunk is settled.
const maxReliefs = 3

// Grow runs the growth g of tenant t to its end: the protocol's one loop,
// for every growth of the pool's members (and for Acquire). It calls
// pl.Place; what Place cannot complete it waits for, holding nothing (the
// client's lock released, no chunk kept): a chunk in its way, or a relief of
// the pressure, which takes memory for it from the pool's members and waits
// for the device to finish with it, then hands it to the growth for the next
// Place. A speculative growth only places. Call with the client's lock
// held; it returns with the lock held.
//
// The growth fails with Place's error, with an error matching
// acl.ErrOutOfMemory (and ErrBudget when the budget is short) when no relief
// finds enough, and with one that also wraps ctx.Err() when ctx is done
// while it waits. A growth stopped (Placer.Unlock's channel) tries Place
// once more, which says why it cannot go on.
func (p Lender) Grow(ctx context.Context, g *Growth, t Tenant, pl Placer, mode GrowMode) error {
	if !p.pool.made() {
		return errNotMade
	}
	p.pool.growing.Add(1) // the rule of ErrDeadlock waits for it
	err := p.grow(ctx, g, t, pl, mode)
	p.pool.growing.Add(-1)
	return err
}

func (p Lender) grow(ctx context.Context, g *Growth, t Tenant, pl Placer, mode GrowMode) error {
	relieving := false
	defer func() {
		if relieving {
			p.pool.relieving.Add(-1)
		}
	}()
	g.set(GrowLocked)
	var have []Chunk
	for reliefs := 0; ; {
		returns := p.pool.returnsNow() // the relief counts what comes back from now on
		st, err := pl.Place(have)
		have = nil
		switch {
		case err != nil:
			g.set(GrowFailed)
			return err
		case st.Missing == 0 && st.Busy.IsZero():
			g.set(GrowMapped)
			return nil
		case mode == Speculative && !st.Busy.IsZero():
			g.set(GrowFailed)
			return errBusy
		case mode == Speculative:
			g.set(GrowFailed)
			return st.Short // TryAcquire counted it
		case !st.Busy.IsZero():
			g.set(GrowBlocked)
			stop := pl.Unlock()
			sched.At(sched.GrowBlocked, p.pool)
			werr := st.Busy.Wait(ctx, stop)
			pl.Lock()
			g.set(GrowLocked)
			if werr != nil {
				g.set(GrowFailed)
				return fmt.Errorf("chunk: wait for a chunk in the growth's way: %w", werr)
			}
			continue
		case reliefs == maxReliefs:
			g.set(GrowFailed)
			return p.pool.failed(st.Missing, st.Short, nil)
		}
		if err := ctx.Err(); err != nil {
			g.set(GrowFailed)
			return p.pool.failed(st.Missing, st.Short, err)
		}
		if !relieving {
			relieving = true
			g.relieved.Store(true)
			p.pool.relieving.Add(1)
		}
		reliefs++
		g.set(GrowRelieving)
		stop := pl.Unlock()
		var rerr error
		have, rerr = p.pool.relieve(ctx, stop, t, st.Missing, g, st.Short, returns)
		pl.Lock()
		g.set(GrowLocked)
		if rerr != nil {
			g.set(GrowFailed)
			cause := rerr
			if rerr == errNoProgress {
				cause = nil
			}
			return errors.Join(p.pool.failed(st.Missing, st.Short, cause), p.pool.putAll(have))
		}
	}
}

// errNoProgress is relieve's answer when nothing came back that a retry
// could use: the growth fails as its take did.
var errNoProgress = errors.New("chunk: nothing came back")

// failed returns the error of a growth of n units that ends short for the
// reason short (and cause, when ctx ended it), counts it among the pool's
// failures and reports it.
func (p *Pool) failed(n int, short, cause error) error {
	st := p.Stats() // one view, for the error and the record alike
	err := short
	if errors.Is(short, ErrBudget) {
		err = fmt.Errorf("chunk: %w: %w: %s held (%d chunks in use, %d cached, %d waiting for the device), %s asked",
			ErrBudget, acl.ErrOutOfMemory, budgetView(st), st.InUse, st.Cached, st.Pending, units.IEC(int64(n)*int64(p.tail)))
	}
	if cause != nil {
		err = fmt.Errorf("%w (%w)", err, cause)
	}
	p.mu.Lock()
	p.stats.Failures++
	p.mu.Unlock()
	p.logOOM(n, st, err)
	return err
}

// relieve frees room for a growth g of need units for tenant t, whose
// Place fell short for the reason short, holding nothing while it waits. It
// returns the chunks it took for the growth (leased to t, unmapped), or
// errNoProgress when nothing came back that a retry could use (chunks put
// back in the cache, handed over, freed by peers, more room than it found,
// or any chunk that came back to the cache or the driver since the pool's
// returns count read returns, before the take that fell short), or an error
// wrapping ctx.Err(). When stop is closed it returns what it has.
func (p *Pool) relieve(ctx context.Context, stop <-chan struct{}, t Tenant, need int, g *Growth, short error, returns uint64) (handed []Chunk, err error) {
	defer trace.StartRegion(ctx, RegionRelieve).End()
	sched.At(sched.ReliefBegin, p)
	// took: the chunks members gave; peers: those other pools freed, and
	// their units (of this pool's tail size).
	start, took, peers, peerUnits := time.Now(), 0, 0, 0
	defer func() { p.logRelieve(need, p.unitsOf(handed)+peerUnits, took, peers, short, start) }()

	// Chunks whose device work has ended cost no wait: they go first.
	settled, _ := p.settleReady()
	room, err := p.roomNow(ctx, stop)
	if err != nil {
		return nil, err
	}
	if room >= need || stopped(stop) {
		return nil, nil // enough came back meanwhile
	}
	budget := errors.Is(short, ErrBudget)
	var claims []*batch
	for want, delay := need-room, pendingPollMin; ; delay = min(2*delay, pendingPollMax) {
		cl, got, given, busy, ok := p.choose(want, g, budget)
		claims = append(claims, cl...)
		took += given
		want -= got
		if !ok || want <= 0 || !busy {
			break
		}
		// A member that could give was busy (its lock held for a few
		// driver calls): come back to it, holding only what was claimed.
		if err := pause(ctx, stop, delay); err != nil || stopped(stop) {
			p.unclaim(claims)
			return nil, err
		}
	}
	if len(claims) > 0 {
		g.set(GrowChosen)
	}
	sched.At(sched.ReliefSelect, p)
	ready, err := p.await(ctx, stop, claims)
	for _, b := range ready {
		handed = append(handed, p.handBatch(b, t)...)
	}
	if took > 0 {
		p.mu.Lock()
		p.stats.Reclaimed += int64(took)
		p.mu.Unlock()
	}
	g.set(GrowHanded)
	sched.At(sched.ReliefDone, p)
	if err != nil {
		return handed, err
	}
	if !budget && p.unitsOf(handed) < need-room {
		if n, bytes := p.dev.trimOthers(p); n > 0 {
			p.mu.Lock()
			p.stats.PeerTrimmed += int64(n)
			p.mu.Unlock()
			peers, peerUnits = n, int(bytes/p.tail)
		}
	}
	// The worker may have put back, since the take fell short, chunks this
	// relief claimed while it was unmapping them, or that left the books
	// before it looked: they are in the cache, not handed over, or, the
	// cache full, freed: room on the device that no count of the pool's
	// shows (the device's limit is not the pool's).
	more := p.unitsOf(handed) < need && (p.roomNowNoWait() > room || p.returnsSince(returns))
	if settled > 0 || len(handed) > 0 || peers > 0 || more || stopped(stop) {
		return handed, nil
	}
	return nil, errNoProgress
}

// choose picks, one relief at a time, the chunks a relief takes for want
// more units: members' idle chunks (idle members first, then least
// recently used first), then chunks waiting for the device that nobody has
// claimed (oldest first). It claims them, in batches that wait for their own
// events, and returns the batches, how many units they hold, how many
// chunks members gave, and whether a member that could have given was busy
// (its lock held): it asks none with a blocking lock. Where the budget is
// what is short and all of that would not cover want, it takes nothing and
// returns ok false.
func (p *Pool) choose(want int, g *Growth, budget bool) (claims []*batch, got, given int, busy, ok bool) {
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
			unclaimed += b.units
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
		return nil, 0, 0, false, false // it would not fit even with every idle chunk: take none
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
	for _, c := range cands {
		if got >= want {
			break
		}
		n, wait := c.m.c.Give(want-got, by, func(ms []Mapped, streams []acl.Stream) {
			claims = append(claims, p.enqueue(c.m, ms, streams, true))
			given += len(ms)
		})
		got += n
		busy = busy || wait
	}
	if got < want {
		p.mu.Lock()
		for _, b := range p.pending.queue {
			if got >= want {
				break
			}
			if !b.claimed && b.left > 0 {
				p.claimLocked(b)
				claims = append(claims, b)
				got += b.units
			}
		}
		p.mu.Unlock()
	}
	return claims, got, given, busy, true
}
