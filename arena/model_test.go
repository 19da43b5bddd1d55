package arena_test

// Model-based testing: random sequences of operations on several arenas that
// share a budgeted pool, each checked against a simple reference model after
// every step. TestModel runs seeded sequences; TestModelFaultEveryCall runs
// one sequence again and again with a fault injected at each driver call
// position in turn; TestModelRandomFaults lets faults fall at random, two or
// more in one operation included; FuzzModel (fuzz_test.go) lets the fuzzer
// choose the operations.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// chooser makes the model's random decisions.
type chooser interface {
	intn(n int) int // in [0, n); n ≥ 1
	done() bool     // no more decisions: end the sequence
}

type rngChooser struct{ r *rand.Rand }

func (c rngChooser) intn(n int) int { return c.r.IntN(n) }
func (c rngChooser) done() bool     { return false }

// byteChooser decodes decisions from fuzzer bytes: zeros once they run out.
type byteChooser struct{ b []byte }

func (c *byteChooser) intn(n int) int {
	var v uint32
	for k := n - 1; k > 0 && len(c.b) > 0; k >>= 8 {
		v = v<<8 | uint32(c.b[0])
		c.b = c.b[1:]
	}
	return int(v % uint32(n))
}

func (c *byteChooser) done() bool { return len(c.b) == 0 }

// modelOpts configures a world.
type modelOpts struct {
	ops       int         // operations to run (a byteChooser may stop sooner)
	limit     int         // chunks the pool may hold: its budget, or the device's capacity
	byDevice  bool        // limit is the device's capacity, not a pool budget
	maxCached int         // pool cache bound
	maxArenas int         // arenas open at once
	scrub     chunk.Scrub // pool scrub mode
	// weak: faults may hit the undo of a failed operation (several faults in
	// one operation), so a failed operation may lose what it was undoing; the
	// model then checks only what must survive that: the arenas stay
	// consistent with the driver, no byte below Len changes, nothing leaks.
	weak bool
	// streams gives some arenas a stream, on which the model queues stand-in
	// kernels that read their buffers and finish a little later: every
	// unmap must wait for them, and no device-wide wait may be needed.
	streams bool
	// headroom gives some arenas headroom, which the pool's worker refills
	// between operations (the model lets it settle after each).
	headroom bool
	// tenants puts some arenas in one shared tenant, between whose arenas
	// chunks move without being cleared.
	tenants bool
	// skimRefills skips scanning the chunks the worker maps for headroom
	// for foreign bytes (each scan faults in 512 pages): runs that test
	// failure atomicity at every call position set it; the runs that test
	// isolation do not.
	skimRefills bool
	// sleep puts arenas to sleep (Discard or Offload) and wakes them, and
	// calls a sleeping arena's operations, which must fail with ErrAsleep.
	sleep bool
	// twoSizes makes the pool lend large chunks of two granules and tail
	// chunks of one: the model counts in tails, and reads where a chunk ends
	// from the arena's layout (a large chunk is kept or dropped whole).
	twoSizes bool
}

func defaultModelOpts() modelOpts {
	return modelOpts{ops: 200, limit: 12, maxCached: 6, maxArenas: 4}
}

// deferredOpts is defaultModelOpts with every mechanism of deferred
// reclamation and grow-ahead on.
func deferredOpts() modelOpts {
	o := defaultModelOpts()
	o.streams, o.headroom, o.tenants = true, true, true
	return o
}

// modelCounts is what a run did, for the figures in docs/reliability.md.
type modelCounts struct {
	ops, failed, injected, badInputs, checks, bytesChecked, chunksScanned int64
	faultFailed                                                           int64                // operations an injected fault failed
	faultAbsorbed                                                         int64                // operations that succeeded despite one (a free the pool retries)
	reclaimed, ordered, refills, kernels                                  int64                // chunks reclaimed under pressure, unmapped after their events, refills, kernels queued
	sleeps, wakes                                                         int64                // Sleeps and Wakes that succeeded
	multi                                                                 int64                // operations that took two faults or more
	sleepWakeFaulted                                                      int64                // Sleeps and Wakes that took a fault
	large                                                                 int64                // large chunks seen mapped, counted at each check (two sizes)
	tookBack                                                              int64                // growths that took back a waiting large chunk past their target
	byKind                                                                [len(faultOps)]int64 // faults injected, per kind of call
}

var faultOps = [...]faultdriver.Op{
	faultdriver.MallocPhysical, faultdriver.FreePhysical, faultdriver.ReserveMemAddress,
	faultdriver.ReleaseMemAddress, faultdriver.MapMem, faultdriver.UnmapMem, faultdriver.MemSetAccess,
	faultdriver.MemcpyHtoD, faultdriver.MemcpyDtoH, faultdriver.MemcpyDtoD, faultdriver.Memset,
	faultdriver.MemsetAsync, faultdriver.SynchronizeDevice, faultdriver.SynchronizeStream,
	faultdriver.CreateEvent, faultdriver.RecordEvent, faultdriver.QueryEvent, faultdriver.SynchronizeEvent,
	faultdriver.DestroyEvent, faultdriver.MallocHost, faultdriver.FreeHost,
}

func (c *modelCounts) add(d modelCounts) {
	c.ops += d.ops
	c.failed += d.failed
	c.faultFailed += d.faultFailed
	c.faultAbsorbed += d.faultAbsorbed
	for i := range c.byKind {
		c.byKind[i] += d.byKind[i]
	}
	c.injected += d.injected
	c.badInputs += d.badInputs
	c.checks += d.checks
	c.bytesChecked += d.bytesChecked
	c.chunksScanned += d.chunksScanned
	c.reclaimed += d.reclaimed
	c.ordered += d.ordered
	c.refills += d.refills
	c.kernels += d.kernels
	c.sleeps += d.sleeps
	c.wakes += d.wakes
	c.multi += d.multi
	c.sleepWakeFaulted += d.sleepWakeFaulted
	c.large += d.large
	c.tookBack += d.tookBack
}

// kinds lists the faults injected per kind of call.
func (c *modelCounts) kinds() string {
	var parts []string
	for i, n := range c.byKind {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", faultOps[i], n))
		}
	}
	return strings.Join(parts, ", ")
}

// world is the system under test beside its model.
type world struct {
	t          testing.TB
	c          chooser
	o          modelOpts
	hd         *host.Driver
	fd         *faultdriver.Driver
	reg        *acltest.Registrations // every arena registered with it, in front of hd
	pool       *chunk.Pool
	cs         int // the unit: the tail size (the chunk size on a pool of one size)
	large      int // the pool's chunk size
	open       []*marena
	closed     []*marena
	stale      []mbuf // buffers dropped by Truncate, Reset or a Discard sleep
	tags       int
	n          modelCounts
	trace      []string
	inject     int64 // fd.Injected(Any) before the current operation
	lastErr    error // the error of the last operation settled
	shared     chunk.Tenant
	sharedSeen *[256]bool // the byte values the shared tenant's arenas may hold
	kernels    int64      // stand-in kernels queued
	sleepWake  bool       // the operation under way is a Sleep or a Wake
}

// marena is the model of one arena.
type marena struct {
	a        *arena.Arena
	id       int
	base     acl.DevicePtr
	reserved int
	len, cap int
	trap     bool
	tag      byte // high nibble of every byte this arena writes
	bufs     []mbuf
	shadow   map[int]byte    // bytes known to be at these offsets, all below len
	seen     *[256]bool      // byte values that may be in the arena's memory (its tenant's)
	strayOK  bool            // a failure's undo was itself failed: strays may exist
	floor    int             // what Grow promised to keep mapped until the next drop
	headroom int             // Config.Headroom
	maxHead  int             // Config.MaxHeadroom: the learnt headroom lies in [headroom, maxHead]
	stream   acl.Stream      // its stream, or 0
	busy     []chan struct{} // done channels of kernels that may be in flight on stream
	asleep   bool            // Sleep gave its memory back: Cap 0, Len kept
	sleptCap int             // Cap when it fell asleep: a Wake maps no more (a double fault may have left Cap below the promise)
	slept    []int           // its layout when it fell asleep (arena.Layout)
	mode     arena.SleepMode // of the last Sleep
}

// keep is what a pool under pressure leaves the arena: the chunks that
// hold its bytes in use and what Grow promised.
func (m *marena) keep(w *world) int { return min(m.cap, w.chunkEnd(m, max(m.len, m.floor))) }

// tookBack returns m's Cap after a growth to newCap: newCap, or, on a pool
// of two sizes, up to the end of the block past it, where the growth took
// back whole a large chunk of its own that was waiting for the device and
// starts below newCap.
func (w *world) tookBack(m *marena, newCap int) int {
	if c := m.a.Cap(); w.large != w.cs && c > newCap && c <= (newCap+w.large-1)/w.large*w.large {
		w.n.tookBack++
		return c
	}
	return newCap
}

// chunkEnd returns the offset past the chunk of m's layout that holds byte
// x-1 (0 for x 0), or x rounded up to the unit past the last chunk.
func (w *world) chunkEnd(m *marena, x int) int { return endIn(arena.Layout(m.a), x, w.cs) }

// endIn is chunkEnd in layout.
func endIn(layout []int, x, unit int) int {
	if x == 0 {
		return 0
	}
	off := 0
	for _, n := range layout {
		if off += n; off >= x {
			return off
		}
	}
	return (x + unit - 1) / unit * unit
}

// quiesce waits for the stand-in kernels queued on the arena's stream, as a
// careful caller does before touching the memory they use from the host.
func (w *world) quiesce(ms ...*marena) {
	for _, m := range ms {
		if len(m.busy) == 0 {
			continue
		}
		if err := w.hd.SynchronizeStream(m.stream); err != nil {
			w.fatalf("a%d: synchronise its stream: %v", m.id, err)
		}
		m.busy = m.busy[:0]
	}
}

type mbuf struct {
	m   *marena
	b   arena.Buffer
	off int
	n   int
}

func newWorld(t testing.TB, c chooser, o modelOpts) *world {
	const g = acl.HugePageSize
	capacity := uintptr(o.limit) * g
	if !o.byDevice || o.limit == 0 {
		capacity = 256 << 20
	}
	hd, err := host.New(host.Config{Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	reg := acltest.NewRegistrations(hd, nil)
	w := &world{t: t, c: c, o: o, hd: hd, reg: reg, fd: faultdriver.New(reg.Driver()), shared: chunk.NewTenant(), sharedSeen: new([256]bool)}
	w.sharedSeen[0] = true
	budget := int64(0)
	if !o.byDevice {
		budget = int64(o.limit) * g
	}
	cfg := chunk.Config{Budget: budget, MaxCached: o.maxCached, Scrub: o.scrub, FreshZeroed: true}
	if o.twoSizes {
		cfg.Size, cfg.TailSize = 2*g, g
	}
	w.pool, err = chunk.New(w.fd, cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.cs, w.large = w.pool.TailSize(), w.pool.ChunkSize()
	return w
}

func (w *world) fatalf(format string, args ...any) {
	w.t.Helper()
	w.t.Fatalf("%s\nlast operations:\n  %s", fmt.Sprintf(format, args...), strings.Join(w.trace, "\n  "))
}

func (w *world) logf(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	if len(w.trace) == 12 {
		copy(w.trace, w.trace[1:])
		w.trace = w.trace[:11]
	}
	w.trace = append(w.trace, s)
}

func (w *world) roundUp(n int) int { return (n + w.cs - 1) / w.cs * w.cs }

// run runs the operations, then tears everything down and checks that the
// driver holds nothing.
func (w *world) run() {
	w.check()
	for i := 0; i < w.o.ops && !w.c.done(); i++ {
		start := w.fd.Injected(faultdriver.Any)
		w.inject = start
		w.sleepWake = false
		w.step()
		w.n.ops++
		if k := w.fd.Injected(faultdriver.Any) - start; k >= 2 {
			w.n.multi++
		}
		if w.sleepWake && w.fd.Injected(faultdriver.Any) != start {
			w.n.sleepWakeFaulted++
		}
		w.settleWorker()
		w.check()
	}
	w.teardown()
}

// settleWorker lets the pool's worker finish the refills the operation asked
// for, then brings the model's Caps of arenas with headroom in line, within
// the bounds a refill may reach: it maps only memory that is free, up to
// Len + MaxHeadroom (the most the learnt headroom can be).
func (w *world) settleWorker() {
	if !w.o.headroom {
		return
	}
	w.pool.Lender().Settle()
	for _, m := range w.open {
		if m.headroom == 0 {
			continue
		}
		c, learnt := m.a.Cap(), m.a.Stats().Headroom
		if learnt < m.headroom || learnt > m.maxHead {
			w.fatalf("a%d: learnt headroom %d, want %d to %d", m.id, learnt, m.headroom, m.maxHead)
		}
		hi := max(m.cap, w.roundUp(min(m.len+m.maxHead, m.reserved)))
		if c < m.cap || c > hi {
			w.fatalf("a%d: Cap %d after the worker's refill, want %d to %d", m.id, c, m.cap, hi)
		}
		if c > m.cap && !w.o.skimRefills {
			w.checkFresh(m, m.cap, c)
		}
		m.cap = c
	}
}

// reclaimedFrom brings the model's Caps of the arenas other than m in line
// after m's growth, which may have reclaimed chunks they held above what they
// keep: idle arenas (Len 0) first.
func (w *world) reclaimedFrom(m *marena) {
	lost := false
	idleLeft := false
	for _, o := range w.open {
		if o == m {
			continue
		}
		c := o.a.Cap()
		switch {
		case c > o.cap:
			if o.headroom == 0 {
				w.fatalf("a%d: Cap rose from %d to %d while a%d grew", o.id, o.cap, c, m.id)
			}
		case c < o.keep(w):
			w.fatalf("a%d: reclaimed down to %d, below what it keeps (%d: len %d, floor %d)", o.id, c, o.keep(w), o.len, o.floor)
		case c < o.cap && o.len > 0:
			lost = true
		}
		if o.len == 0 && c > o.keep(w) {
			idleLeft = true
		}
		o.cap = c
	}
	if lost && idleLeft {
		w.fatalf("a%d's growth reclaimed from an arena in use while an idle one still held chunks", m.id)
	}
}

// faulted reports whether a fault was injected during the current operation.
func (w *world) faulted() bool { return w.fd.Injected(faultdriver.Any) != w.inject }

// hasNaturalCause reports whether err, a tree of joined and wrapped errors,
// has a branch that no injected fault caused.
func hasNaturalCause(err error) bool {
	if err == nil {
		return false
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if hasNaturalCause(e) {
				return true
			}
		}
		return false
	}
	if u := errors.Unwrap(err); u != nil {
		return hasNaturalCause(u)
	}
	return !isInjected(err)
}

func isInjected(err error) bool {
	var e *acl.Error
	return errors.As(err, &e) && e.Msg == faultdriver.InjectedMsg
}

// settle checks an operation's error against the model's prediction (want:
// nil for success, else a sentinel the error must match) and reports whether
// the operation took effect. An injected fault may fail any operation.
func (w *world) settle(op string, err, want error) bool {
	w.t.Helper()
	w.logf("%s -> %v", op, err)
	w.lastErr = err
	if err == nil {
		if w.faulted() {
			w.n.faultAbsorbed++
		}
		if want != nil {
			w.fatalf("%s succeeded, want an error matching %v (pool %+v)", op, want, w.pool.Stats())
		}
		return true
	}
	w.n.failed++
	// An injected fault fails the operation, or, absorbed on the way (say,
	// an unmap of a reclaimed chunk that fails and leaves it waiting), leaves
	// it short of memory.
	if w.faulted() && (isInjected(err) || errors.Is(err, arena.ErrOutOfMemory)) {
		w.n.faultFailed++
		return false
	}
	if want == nil || !errors.Is(err, want) {
		var caps []string
		for _, o := range w.open {
			caps = append(caps, fmt.Sprintf("a%d len %d cap %d stats %+v", o.id, o.a.Len(), o.a.Cap(), o.a.Stats()))
		}
		w.fatalf("%s: error %v, want %v\n(afterwards: pool %+v; arenas %v; driver holds %+v)", op, err, want, w.pool.Stats(), caps, w.hd.Live())
	}
	return false
}

// afterFailure brings the model in line with an arena whose operation
// failed. Without double faults a failed operation changes nothing, and the
// check that follows proves it; with them, it may have lost what it was
// undoing: Cap (and Len with it) may drop, and strays appear.
//
// One injected fault makes a double failure too when it hits the undo of an
// operation that failed for a reason of its own (a budget or the device
// running out): then the arena may keep a stray, and the model follows it.
func (w *world) afterFailure(m *marena) {
	if m == nil {
		return
	}
	if !w.o.weak {
		if !w.faulted() || !hasNaturalCause(w.lastErr) {
			return
		}
		m.strayOK = true
	}
	if l := m.a.Len(); l < m.len {
		w.stale = append(w.stale, m.dropAbove(l)...)
	}
	m.cap = m.a.Cap()
}

// dropAbove lowers Len to n, and returns the buffers that end above it,
// which are stale from now on.
func (m *marena) dropAbove(n int) (stale []mbuf) {
	m.len = n
	stale = m.dropBufs(n)
	for off := range m.shadow {
		if off >= n {
			delete(m.shadow, off)
		}
	}
	return stale
}

// dropBufs forgets the buffers that end above n, and returns them.
func (m *marena) dropBufs(n int) (stale []mbuf) {
	kept := m.bufs[:0]
	for _, b := range m.bufs {
		if b.off+b.n <= n {
			kept = append(kept, b)
		} else {
			stale = append(stale, b)
		}
	}
	clear(m.bufs[len(kept):])
	m.bufs = kept
	return stale
}

// check compares every arena, the pool and the driver with the model.
func (w *world) check() {
	w.t.Helper()
	w.n.checks++
	if v := w.reg.Violations(); len(v) > 0 {
		w.fatalf("the arenas' registrations broke the protocol: %v", errors.Join(v...))
	}
	var sumCap, sumRes, strays, held, chunks int
	for _, m := range w.open {
		s := m.a.Stats()
		switch {
		case m.a.Base() != m.base:
			w.fatalf("arena %d: base moved from %v to %v", m.id, m.base, m.a.Base())
		case s.Used != m.len || s.Mapped != m.cap || s.Reserved != m.reserved:
			w.fatalf("arena %d: len/cap/reserved %d/%d/%d, model %d/%d/%d", m.id, s.Used, s.Mapped, s.Reserved, m.len, m.cap, m.reserved)
		case s.Mapped%w.cs != 0 || (s.Used > s.Mapped && !m.asleep) || s.Mapped > s.Reserved:
			w.fatalf("arena %d: invariants broken: %+v", m.id, s)
		case s.Strays != 0 && !w.o.weak && !m.strayOK:
			w.fatalf("arena %d: %d strays without double faults", m.id, s.Strays)
		case s.Maps-s.Unmaps != int64(s.Chunks+s.Strays):
			w.fatalf("arena %d: %d maps - %d unmaps, but %d chunks mapped", m.id, s.Maps, s.Unmaps, s.Chunks+s.Strays)
		case !m.asleep && canonical(m.a) != "":
			w.fatalf("arena %d: %s", m.id, canonical(m.a))
		}
		for _, n := range arena.Layout(m.a) {
			if n != w.cs {
				w.n.large++
			}
		}
		if s.Strays == 0 {
			m.strayOK = false // the next Grow, Shrink or Close unmapped them
		}
		sumCap += m.cap
		sumRes += m.reserved
		strays += s.Strays
		chunks += s.Chunks
		held += s.Held
		if s.Held != 0 && !m.asleep {
			w.fatalf("arena %d: awake, holding %d chunks unmapped", m.id, s.Held)
		}
		if m.asleep != m.a.Asleep() {
			w.fatalf("arena %d: asleep %v, model %v", m.id, m.a.Asleep(), m.asleep)
		}
		if len(m.shadow) > 0 && !m.asleep {
			mem, err := w.hd.Bytes(m.base, uintptr(m.len))
			if err != nil {
				w.fatalf("arena %d: bytes in use are not all mapped: %v", m.id, err)
			}
			for off, v := range m.shadow {
				if mem[off] != v {
					w.fatalf("arena %d: byte at %d is %#x, want %#x", m.id, off, mem[off], v)
				}
			}
			w.n.bytesChecked += int64(len(m.shadow))
		}
	}
	if f := w.hd.Faults(); f != 0 {
		w.fatalf("the device saw %d faults: memory unmapped under queued work, or copies racing it", f)
	}
	// The worker unmaps and puts back chunks whose events have completed
	// whenever the device finishes work, which no operation of the test
	// orders: a chunk may be unmapped but still counted as waiting, or
	// counted as neither waiting nor cached for the moment between the two.
	// Such a view passes once the worker is done with it; a real mismatch
	// stays.
	for try := 0; ; try++ {
		msg, inFlight := w.checkDriver(chunks+strays, sumCap, strays, held, sumRes)
		if msg == "" {
			return
		}
		if !inFlight || try == 200 {
			w.fatalf("%s", msg)
		}
		w.pool.Lender().Settle()
		time.Sleep(time.Millisecond)
	}
}

// checkDriver compares the driver's live objects and the pool's books with
// the chunks the arenas map and the bytes they reserve. It reports what differs, and whether releases
// were in flight when it looked.
// arenaChunks and capBytes are what the arenas map below their Caps, strays
// the chunks mapped above (of either size).
func (w *world) checkDriver(arenaChunks, capBytes, strays, held, reserved int) (msg string, inFlight bool) {
	ps := w.pool.Stats()
	live := w.hd.Live()
	after := w.pool.Stats()
	inFlight = ps.Pending > 0 || ps.Freeing > 0 || after.Freeing > 0 || after.Pending != ps.Pending || after.Ordered != ps.Ordered
	mapped := arenaChunks + ps.Pending
	lo := uintptr(capBytes) + uintptr(ps.PendingBytes) + uintptr(strays*w.cs) // mapped bytes, strays all tails
	hi := lo + uintptr(strays*(w.large-w.cs))                                 // or all large
	switch {
	case live.Reservations != len(w.open) || live.ReservedBytes != uintptr(reserved):
		return fmt.Sprintf("driver holds %d reservations (%d bytes); model %d (%d)", live.Reservations, live.ReservedBytes, len(w.open), reserved), false
	case live.Mappings != mapped || live.MappedBytes < lo || live.MappedBytes > hi:
		return fmt.Sprintf("driver holds %d mappings (%d bytes), arenas %d (%d of them waiting for the device; %d to %d bytes)",
			live.Mappings, live.MappedBytes, mapped, ps.Pending, lo, hi), inFlight
	case ps.InUse != mapped+held:
		return fmt.Sprintf("pool lends %d chunks, arenas map %d (%d waiting for the device) and hold %d unmapped", ps.InUse, mapped, ps.Pending, held), inFlight
	case live.Handles != ps.InUse+ps.Cached || live.PhysicalBytes != uintptr(ps.HeldBytes):
		return fmt.Sprintf("driver holds %d handles (%d bytes), pool %d in use + %d cached (%d bytes)", live.Handles,
			live.PhysicalBytes, ps.InUse, ps.Cached, ps.HeldBytes), inFlight
	case w.o.limit > 0 && ps.HeldBytes > int64(w.o.limit*w.cs):
		return fmt.Sprintf("pool holds %d bytes, over its limit of %d chunks", ps.HeldBytes, w.o.limit), false
	}
	return "", false
}

// fits predicts whether the pool can supply need more chunks to m, which
// first gives back its strays, if any. Everything the pool holds is
// available except what the arenas keep (their bytes in use, what Grow
// promised, rounded up to chunks) and their strays: cached chunks, chunks
// waiting for the device, and chunks other arenas hold mapped above what
// they keep, which the pool reclaims under pressure.
func (w *world) fits(m *marena, need int) bool {
	if w.o.limit == 0 {
		return true
	}
	used := m.cap / w.cs
	for _, o := range w.open {
		if o != m {
			used += o.keep(w)/w.cs + o.a.Stats().Strays
		}
	}
	return used+need <= w.o.limit
}

var zeroBlock = make([]byte, 4096)

// checkFresh checks the chunks an arena just mapped, [from, to): every byte
// is zero or one the arena itself may have written. Another tenant's byte
// there means a chunk changed owner without a scrub.
func (w *world) checkFresh(m *marena, from, to int) {
	if to <= from || w.o.scrub == chunk.ScrubNever {
		return
	}
	if m.stream != 0 {
		// Scrubs for an arena with a stream are queued on it: let them run
		// before looking, as the arena's own copies do.
		if err := w.hd.SynchronizeStream(m.stream); err != nil {
			w.fatalf("a%d: synchronise its stream: %v", m.id, err)
		}
		m.busy = m.busy[:0]
	}
	mem, err := w.hd.Bytes(m.base.Add(uintptr(from)), uintptr(to-from))
	if err != nil {
		w.fatalf("arena %d: new chunks not mapped: %v", m.id, err)
	}
	w.n.chunksScanned += int64((to - from) / w.cs)
	for i := 0; i < len(mem); i += len(zeroBlock) {
		blk := mem[i : i+len(zeroBlock)]
		if bytes.Equal(blk, zeroBlock) {
			continue
		}
		for j, v := range blk {
			if !m.seen[v] {
				w.fatalf("arena %d: byte %#x at %d of a chunk it just mapped was written by another arena", m.id, v, from+i+j)
			}
		}
	}
}

// pickArena returns an open arena that is awake, or nil.
func (w *world) pickArena() *marena {
	return w.pick(false)
}

// pick returns an open arena asleep or awake as asked, or nil.
func (w *world) pick(asleep bool) *marena {
	var ms []*marena
	for _, m := range w.open {
		if m.asleep == asleep {
			ms = append(ms, m)
		}
	}
	if len(ms) == 0 {
		return nil
	}
	return ms[w.c.intn(len(ms))]
}

// pickBuf returns a live buffer with at least one byte, or false.
func (w *world) pickBuf() (mbuf, bool) {
	m := w.pickArena()
	if m == nil || len(m.bufs) == 0 {
		return mbuf{}, false
	}
	b := m.bufs[w.c.intn(len(m.bufs))]
	return b, b.n > 0
}

func (w *world) step() {
	if len(w.open) == 0 {
		w.newArena()
		return
	}
	if w.pickArena() == nil {
		w.wake() // every arena is asleep
		return
	}
	n := 100
	if w.o.sleep {
		n = 110
	}
	switch k := w.c.intn(n); {
	case k >= 106:
		w.sleep()
	case k >= 103:
		w.wake()
	case k >= 100:
		w.asleepOps()
	case k < 5:
		w.newArena()
	case k < 25:
		w.alloc()
	case k < 34:
		w.grow()
	case k < 48:
		w.write()
	case k < 56:
		w.read()
	case k < 61:
		w.copyDtoD()
	case k < 64:
		w.fill()
	case k < 68:
		w.slice()
	case k < 75:
		w.truncate(false)
	case k < 78:
		w.truncate(true)
	case k < 85:
		w.shrink()
	case k < 88:
		w.closeArena()
	case k < 93:
		w.useDropped()
	case k < 96 && w.o.streams:
		w.launch()
	default:
		w.badInput()
	}
}

func (w *world) newArena() {
	if len(w.open) >= w.o.maxArenas {
		w.alloc()
		return
	}
	k := 1 + w.c.intn(8)
	reserve := k*w.cs - w.c.intn(w.cs)
	trap := w.c.intn(4) == 0
	cfg := arena.Config{Pool: w.pool, Reserve: reserve, TrapStale: trap}
	var stream acl.Stream
	if w.o.streams && w.c.intn(2) == 0 {
		s, err := w.hd.CreateStream()
		if err != nil {
			w.fatalf("create stream: %v", err)
		}
		stream = s
		cfg.Streams = []acl.Stream{s}
	}
	if w.o.headroom && w.c.intn(2) == 0 {
		h := min(1+w.c.intn(3), k) // within the reservation, as New requires
		mh := h                    // a fixed headroom, or one it learns
		if w.c.intn(2) == 0 {
			mh = min(h*(1+w.c.intn(4)), k)
			if b := int(w.pool.Budget()); b > 0 {
				mh = max(h, min(mh, b/w.cs))
			}
		}
		cfg.Headroom, cfg.MaxHeadroom = h*w.cs, mh*w.cs
		if w.c.intn(3) == 0 {
			// A headroom under a chunk, kept in bytes: a few tokens ahead.
			b := w.cs / 8 * (1 + w.c.intn(7))
			cfg.Headroom, cfg.MaxHeadroom = b, max(b, min(b*(1+w.c.intn(4)), k*w.cs))
			if bud := int(w.pool.Budget()); bud > 0 {
				cfg.MaxHeadroom = max(b, min(cfg.MaxHeadroom, bud/w.cs*w.cs))
			}
		}
	}
	shared := w.o.tenants && w.c.intn(2) == 0
	if shared {
		cfg.Tenant = w.shared
	}
	a, err := arena.New(cfg)
	op := fmt.Sprintf("New(reserve %d, trap %v, stream %v, headroom %d, shared %v)", reserve, trap, stream != 0, cfg.Headroom, shared)
	if !w.settle(op, err, nil) {
		if stream != 0 {
			_ = w.hd.DestroyStream(stream)
		}
		return
	}
	// Registered for its whole life: the registration double checks, at
	// every step, that nothing registered is unmapped and nothing is
	// registered before it is mapped with access (check).
	if err := a.OnBackingChange(arena.RegisterWith(w.reg)); err != nil {
		w.fatalf("register a new arena: %v", err)
	}
	w.tags++
	tag := byte(w.tags%14 + 1)
	if tag >= 0xA {
		tag++ // PoisonByte's nibble is nobody's tag
	}
	m := &marena{a: a, id: w.tags, base: a.Base(), reserved: k * w.cs, trap: trap, tag: tag << 4,
		shadow: make(map[int]byte), seen: new([256]bool), stream: stream, headroom: int(cfg.Headroom),
		maxHead: int(cfg.MaxHeadroom)}
	if shared {
		m.seen = w.sharedSeen
	}
	m.seen[0] = true
	for v := range 16 {
		m.seen[m.tag|byte(v)] = true
	}
	if trap {
		m.seen[arena.PoisonByte] = true
	}
	if m.base%acl.DevicePtr(w.cs) != 0 { // the granularity: ACL reserves at no other alignment
		w.fatalf("arena %d: base %v is not chunk-aligned", m.id, m.base)
	}
	w.open = append(w.open, m)
}

// grow predicts and checks a Grow.
func (w *world) grow() {
	m := w.pickArena()
	var n int
	switch w.c.intn(10) {
	case 0:
		n = 0
	case 1:
		n = m.reserved - m.len + 1 + w.c.intn(w.cs) // past the reservation
	default:
		n = w.c.intn(3 * w.cs)
	}
	var want error
	target := m.len + n
	newCap := max(m.cap, w.roundUp(target))
	switch {
	case n > m.reserved-m.len:
		want = arena.ErrExhausted
	case !w.fits(m, (newCap-m.cap)/w.cs):
		want = arena.ErrOutOfMemory
	}
	err := m.a.Grow(n)
	ok := w.settle(fmt.Sprintf("a%d.Grow(%d) len %d cap %d", m.id, n, m.len, m.cap), err, want)
	w.reclaimedFrom(m)
	if ok {
		old := m.cap
		m.cap = w.tookBack(m, newCap)
		m.floor = max(m.floor, target)
		w.checkFresh(m, old, newCap)
		return
	}
	w.afterFailure(m)
}

func (w *world) alloc() {
	m := w.pickArena()
	var size int
	switch w.c.intn(10) {
	case 0:
		size = 0
	case 1, 2, 3, 4, 5:
		size = 1 + w.c.intn(4096)
	case 6, 7, 8:
		size = 1 + w.c.intn(w.cs/2)
	default:
		size = 1 + w.c.intn(2*w.cs+w.cs/2)
	}
	align := 1 << w.c.intn(13)
	start := (m.len + align - 1) &^ (align - 1)
	end := start + size
	newCap := max(m.cap, w.roundUp(end))
	var want error
	switch {
	case end > m.reserved:
		want = arena.ErrExhausted
	case !w.fits(m, (newCap-m.cap)/w.cs):
		want = arena.ErrOutOfMemory
	}
	b, err := m.a.Alloc(size, align)
	ok := w.settle(fmt.Sprintf("a%d.Alloc(%d, %d) len %d cap %d", m.id, size, align, m.len, m.cap), err, want)
	if newCap > m.cap {
		w.reclaimedFrom(m)
	}
	if !ok {
		w.afterFailure(m)
		return
	}
	if b.Offset() != start || b.Len() != size || b.Ptr() != m.base.Add(uintptr(start)) || b.Arena() != m.a {
		w.fatalf("a%d.Alloc(%d, %d) = %v, want offset %d", m.id, size, align, b, start)
	}
	old := m.cap
	m.len, m.cap = end, w.tookBack(m, newCap)
	m.bufs = append(m.bufs, mbuf{m: m, b: b, off: start, n: size})
	w.checkFresh(m, old, newCap)
}

// span picks a subrange of at most max bytes of a buffer of n bytes.
func (w *world) span(n, most int) (int, int) {
	l := 1 + w.c.intn(min(n, most))
	i := w.c.intn(n - l + 1)
	return i, i + l
}

func (w *world) write() {
	b, ok := w.pickBuf()
	if !ok {
		w.alloc()
		return
	}
	m := b.m
	w.quiesce(m)
	i, j := w.span(b.n, 64)
	if b.n <= 256 && w.c.intn(2) == 0 {
		i, j = 0, b.n
	}
	data := make([]byte, j-i)
	for k := range data {
		data[k] = m.tag | byte(w.c.intn(16))
	}
	sub, err := b.b.Slice(i, j)
	if err != nil {
		w.fatalf("slice [%d:%d] of %v: %v", i, j, b.b, err)
	}
	if !w.settle(fmt.Sprintf("a%d.CopyIn(%d bytes at %d)", m.id, len(data), b.off+i), arena.CopyIn(sub, data), nil) {
		w.afterFailure(m)
		return
	}
	for k, v := range data {
		m.shadow[b.off+i+k] = v
	}
}

func (w *world) read() {
	b, ok := w.pickBuf()
	if !ok {
		w.alloc()
		return
	}
	m := b.m
	w.quiesce(m)
	i, j := w.span(b.n, 4096)
	sub, _ := b.b.Slice(i, j)
	got := make([]byte, j-i)
	if !w.settle(fmt.Sprintf("a%d.CopyOut(%d bytes at %d)", m.id, len(got), b.off+i), arena.CopyOut(got, sub), nil) {
		w.afterFailure(m)
		return
	}
	for k, v := range got {
		if want, ok := m.shadow[b.off+i+k]; ok && v != want {
			w.fatalf("a%d: CopyOut byte %d is %#x, want %#x", m.id, b.off+i+k, v, want)
		}
	}
	// A too-long copy is refused whole.
	err := arena.CopyOut(make([]byte, b.n+1), b.b)
	w.settle("CopyOut(one byte too many)", err, arena.ErrRange)
	w.n.badInputs++
}

func (w *world) copyDtoD() {
	src, ok1 := w.pickBuf()
	dst, ok2 := w.pickBuf()
	if !ok1 || !ok2 {
		w.alloc()
		return
	}
	w.quiesce(src.m, dst.m)
	n := 1 + w.c.intn(min(src.n, dst.n, 256))
	si, di := w.c.intn(src.n-n+1), w.c.intn(dst.n-n+1)
	s, _ := src.b.Slice(si, si+n)
	d, _ := dst.b.Slice(di, di+n)
	var want error
	sp, dp := s.Ptr(), d.Ptr()
	if dp < sp.Add(uintptr(n)) && sp < dp.Add(uintptr(n)) {
		want = arena.ErrInvalid
		w.n.badInputs++
	}
	op := fmt.Sprintf("Copy(a%d@%d <- a%d@%d, %d bytes)", dst.m.id, dst.off+di, src.m.id, src.off+si, n)
	if !w.settle(op, arena.Copy(d, s), want) {
		w.afterFailure(dst.m)
		return
	}
	vals := make([]int, n) // -1: unknown
	for k := range n {
		vals[k] = -1
		if v, ok := src.m.shadow[src.off+si+k]; ok {
			vals[k] = int(v)
		}
	}
	for k, v := range vals {
		if v < 0 {
			delete(dst.m.shadow, dst.off+di+k)
		} else {
			dst.m.shadow[dst.off+di+k] = byte(v)
		}
	}
	if src.m != dst.m {
		for v, ok := range src.m.seen {
			dst.m.seen[v] = dst.m.seen[v] || ok
		}
	}
}

func (w *world) fill() {
	b, ok := w.pickBuf()
	if !ok {
		w.alloc()
		return
	}
	m := b.m
	w.quiesce(m)
	i, j := w.span(b.n, 512)
	v := m.tag | byte(w.c.intn(16))
	sub, _ := b.b.Slice(i, j)
	if !w.settle(fmt.Sprintf("a%d.Fill(%d bytes at %d, %#x)", m.id, j-i, b.off+i, v), arena.Fill(sub, v), nil) {
		w.afterFailure(m)
		return
	}
	for k := b.off + i; k < b.off+j; k++ {
		m.shadow[k] = v
	}
}

func (w *world) slice() {
	m := w.pickArena()
	i, j := w.c.intn(m.len+2)-1, w.c.intn(m.len+2)-1
	var want error
	if i < 0 || j < i || j > m.len {
		want = arena.ErrRange
		w.n.badInputs++
	}
	b, err := m.a.Slice(i, j)
	if w.settle(fmt.Sprintf("a%d.Slice(%d, %d) len %d", m.id, i, j, m.len), err, want) {
		if b.Ptr() != m.base.Add(uintptr(i)) || b.Len() != j-i {
			w.fatalf("a%d.Slice(%d, %d) = %v", m.id, i, j, b)
		}
	}
}

func (w *world) truncate(reset bool) {
	m := w.pickArena()
	n := 0
	var want error
	switch {
	case reset:
	case w.c.intn(10) == 0:
		n = []int{-1, m.len + 1}[w.c.intn(2)]
		want = arena.ErrRange
		w.n.badInputs++
	default:
		n = w.c.intn(m.len + 1)
	}
	var err error
	if reset {
		err = m.a.Reset()
	} else {
		err = m.a.Truncate(n)
	}
	if !w.settle(fmt.Sprintf("a%d.Truncate(%d) len %d cap %d trap %v", m.id, n, m.len, m.cap, m.trap), err, want) {
		w.afterFailure(m)
		if w.o.scrub == chunk.ScrubOnRelease && m.trap && want == nil {
			m.forgetAbove(n) // scrubbed on release before the failure
		}
		return
	}
	old := m.len
	w.stale = append(w.stale, m.dropAbove(n)...)
	m.floor = n
	if !m.trap {
		return
	}
	m.cap = w.chunkEnd(m, n) // the chunk holding Len stays whole
	if end := min(old, m.cap); end > n {
		mem, err := w.hd.Bytes(m.base.Add(uintptr(n)), uintptr(end-n))
		if err != nil {
			w.fatalf("a%d: kept chunk unmapped: %v", m.id, err)
		}
		for k, v := range mem {
			if v != arena.PoisonByte {
				w.fatalf("a%d: dropped byte %d is %#x, not poison", m.id, n+k, v)
			}
		}
	}
}

// forgetAbove marks the bytes at and above n unknown.
func (m *marena) forgetAbove(n int) {
	for off := range m.shadow {
		if off >= n {
			delete(m.shadow, off)
		}
	}
}

func (w *world) shrink() {
	m := w.pickArena()
	if w.c.intn(2) == 0 {
		// ShrinkTo keeps up to keep bytes, which may lie past Cap.
		keep := w.c.intn(m.cap + 2*w.cs + 1)
		end := w.chunkEnd(m, max(m.len, keep)) // the chunks that hold it, whole
		if !w.settle(fmt.Sprintf("a%d.ShrinkTo(%d) len %d cap %d", m.id, keep, m.len, m.cap), m.a.ShrinkTo(keep), nil) {
			w.afterFailure(m)
			return
		}
		m.cap = min(m.cap, end)
		m.floor = m.len
		return
	}
	end := w.chunkEnd(m, m.len)
	if !w.settle(fmt.Sprintf("a%d.Shrink() len %d cap %d", m.id, m.len, m.cap), m.a.Shrink(), nil) {
		w.afterFailure(m)
		return
	}
	m.cap = end
	m.floor = m.len
}

// launch queues a stand-in kernel on an arena's stream that reads one of its
// buffers and finishes within a couple of milliseconds: the arena must not
// unmap that memory before it has.
func (w *world) launch() {
	b, ok := w.pickBuf()
	if !ok || b.m.stream == 0 {
		w.alloc()
		return
	}
	done := make(chan struct{})
	if err := w.hd.Launch(b.m.stream, b.b.Ptr(), uintptr(b.n), done); err != nil {
		w.fatalf("a%d: launch on %v: %v", b.m.id, b.b, err)
	}
	w.kernels++
	b.m.busy = append(b.m.busy, done)
	time.AfterFunc(time.Duration(w.c.intn(2000))*time.Microsecond, func() { close(done) })
	w.logf("a%d: kernel on %v", b.m.id, b.b)
}

func (w *world) closeArena() {
	i := w.c.intn(len(w.open))
	m := w.open[i]
	refills := m.a.Stats().Refills
	if !w.settle(fmt.Sprintf("a%d.Close() len %d cap %d", m.id, m.len, m.cap), m.a.Close(), nil) {
		if !w.closedAnyway(m) {
			w.closeFailed(m)
			return
		}
	}
	w.n.refills += refills
	w.open = append(w.open[:i], w.open[i+1:]...)
	w.closed = append(w.closed, m)
	w.dropStream(m)
}

// closedAnyway reports whether a Close that failed closed the arena: its
// last step, freeing a sleeping arena's host copy, failed after the
// reservation was released. A second Close frees what the first left.
func (w *world) closedAnyway(m *marena) bool {
	if !m.a.Stats().Closed {
		return false
	}
	for try := 0; ; try++ {
		w.inject = w.fd.Injected(faultdriver.Any)
		if w.settle(fmt.Sprintf("a%d.Close() again", m.id), m.a.Close(), nil) {
			return true
		}
		if !w.o.weak || try == 100 {
			w.fatalf("a%d: a second Close did not free what the first left", m.id)
		}
		// Faults keep falling on the retries: each one tries again.
	}
}

// closeFailed brings the model in line with an arena whose Close failed.
// Close first takes back the arena's chunks still waiting in the pool for
// the device, as strays to unmap with the rest; a fault in one of those
// unmaps leaves them strays, which one fault explains. Whether a chunk still
// waited depends on when the device finished its work, which the model does
// not follow, so an arena with a stream may keep strays.
func (w *world) closeFailed(m *marena) {
	if m.stream != 0 {
		m.strayOK = true
	}
	w.afterFailure(m)
	if w.o.scrub == chunk.ScrubOnRelease {
		m.forgetAbove(0)
	}
}

// dropStream destroys a closed arena's stream.
func (w *world) dropStream(m *marena) {
	if m.stream == 0 {
		return
	}
	w.quiesce(m)
	if err := w.hd.DestroyStream(m.stream); err != nil {
		w.fatalf("a%d: destroy stream: %v", m.id, err)
	}
	m.stream = 0
}

// useDropped uses what the caller no longer owns: a buffer above Len after
// a Truncate, or an arena after Close. Each is refused, and changes nothing.
func (w *world) useDropped() {
	if len(w.closed) > 0 && w.c.intn(2) == 0 {
		m := w.closed[w.c.intn(len(w.closed))]
		w.n.badInputs += 8
		_, err := m.a.Alloc(1, 1)
		w.settle("closed.Alloc", err, arena.ErrClosed)
		w.settle("closed.Grow", m.a.Grow(1), arena.ErrClosed)
		w.settle("closed.Truncate", m.a.Truncate(0), arena.ErrClosed)
		w.settle("closed.Shrink", m.a.Shrink(), arena.ErrClosed)
		w.settle("closed.ShrinkTo", m.a.ShrinkTo(w.cs), arena.ErrClosed)
		_, err = m.a.Slice(0, 0)
		w.settle("closed.Slice", err, arena.ErrClosed)
		w.settle("closed.Close", m.a.Close(), nil)
		if len(m.bufs) > 0 {
			b := m.bufs[0]
			w.settle("closed buffer CopyIn", arena.CopyIn(b.b, []byte{m.tag}), arena.ErrClosed)
			w.settle("closed buffer Fill", arena.Fill(b.b, m.tag), arena.ErrClosed)
		}
		return
	}
	for k := len(w.stale) - 1; k >= 0; k-- {
		b := w.stale[k]
		if b.m.a.Stats().Closed {
			w.stale = append(w.stale[:k], w.stale[k+1:]...)
			continue
		}
		if b.m.asleep {
			continue // asleep: ErrAsleep first (asleepOps)
		}
		// Stale, in use again or not: the copies fail and change nothing.
		w.n.badInputs += 3
		w.settle("stale CopyIn", arena.CopyIn(b.b, []byte{b.m.tag}), arena.ErrStale)
		w.settle("stale CopyOut", arena.CopyOut(make([]byte, 1), b.b), arena.ErrStale)
		_, err := b.b.Slice(0, 0)
		w.settle("stale Slice", err, arena.ErrStale)
		return
	}
}

// badInput makes a call with arguments the API rejects.
func (w *world) badInput() {
	m := w.pickArena()
	w.n.badInputs++
	const maxInt = int(^uint(0) >> 1)
	switch w.c.intn(8) {
	case 0:
		_, err := m.a.Alloc(-1-w.c.intn(1<<20), 1)
		w.settle("Alloc(negative)", err, arena.ErrInvalid)
	case 1:
		align := []int{0, -1, 3, 6, 1 << 31, -(1 << 62), maxInt}[w.c.intn(7)]
		_, err := m.a.Alloc(1, align)
		w.settle(fmt.Sprintf("Alloc(1, %d)", align), err, arena.ErrInvalid)
	case 2:
		// size + align wraps around: refused, nothing mapped.
		_, err := m.a.Alloc(maxInt-w.c.intn(4096), 1<<w.c.intn(13))
		w.settle("Alloc(huge)", err, arena.ErrExhausted)
	case 3:
		w.settle("Grow(negative)", m.a.Grow(-1-w.c.intn(100)), arena.ErrInvalid)
	case 4:
		w.settle("Grow(huge)", m.a.Grow(maxInt-w.c.intn(100)), arena.ErrExhausted)
	case 5:
		_, err := m.a.Slice(maxInt, maxInt)
		w.settle("Slice(huge, huge)", err, arena.ErrRange)
	case 6:
		b, ok := w.pickBuf()
		if !ok {
			return
		}
		_, err := b.b.Slice(w.c.intn(b.n+1), b.n+1+w.c.intn(10))
		w.settle("Buffer.Slice(past end)", err, arena.ErrRange)
		_, err = b.b.Slice(1, 0)
		w.settle("Buffer.Slice(j < i)", err, arena.ErrRange)
	case 7:
		b, ok := w.pickBuf()
		if !ok {
			return
		}
		w.settle("CopyIn(too long)", arena.CopyIn(b.b, make([]byte, b.n+1)), arena.ErrRange)
	}
}

// sleep puts an awake arena to sleep. Afterwards it holds no chunk (Cap 0),
// keeps Len, and, in Offload mode, its bytes below Len for the wake. A fault
// leaves it awake and as it was, or, a free that failed (or, with several
// faults, an undo that failed), asleep holding what it could not give back,
// which a second Sleep gives back; with faults still falling, that one may
// fail too, and the arena stays asleep, its bytes kept.
func (w *world) sleep() {
	m := w.pickArena()
	w.sleepWake = true
	mode := []arena.SleepMode{arena.Discard, arena.Offload}[w.c.intn(2)]
	op := fmt.Sprintf("a%d.Sleep(%v) len %d cap %d", m.id, mode, m.len, m.cap)
	slept := arena.Layout(m.a)
	err := m.a.Sleep(context.Background(), mode)
	if !w.settle(op, err, nil) {
		if !m.a.Asleep() {
			w.afterFailure(m)
			return
		}
		// A free failed: asleep, the chunk held. Sleep again frees it.
		w.inject = w.fd.Injected(faultdriver.Any)
		if !w.settle(fmt.Sprintf("a%d.Sleep(%v) again", m.id, mode), m.a.Sleep(context.Background(), mode), nil) && !w.o.weak {
			w.fatalf("a%d: a second Sleep did not free what the first held", m.id)
		}
	}
	m.asleep, m.mode, m.sleptCap, m.cap, m.slept = true, mode, m.cap, 0, slept
	m.busy = m.busy[:0] // Sleep waited for the stream
	w.n.sleeps++
	if mode == arena.Discard {
		m.forgetAbove(0)
		w.stale = append(w.stale, m.dropBufs(0)...) // the bytes went: so did the allocations
	}
}

// wake wakes a sleeping arena: it maps Len and what Grow promised at the
// same addresses, taking memory as a growth does (reclaiming idle memory of
// the other arenas), or fails for want of it, still asleep. An Offload's
// bytes come back; a Discard's are a new mapping's (zeros or the tenant's
// own).
func (w *world) wake() {
	m := w.pick(true)
	if m == nil {
		w.alloc()
		return
	}
	w.sleepWake = true
	newCap := min(endIn(m.slept, max(m.len, m.floor), w.cs), m.sleptCap) // every slot comes back at its offset, a large one as one or as tails
	var want error
	if !w.fits(m, newCap/w.cs) {
		want = arena.ErrOutOfMemory
	}
	// A Wake short of memory waits for it; this single-threaded sequence
	// frees none meanwhile, so the wait ends as soon as it begins (modelHook).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	modelWaits.Store(w.pool, cancel)
	defer modelWaits.Delete(w.pool)
	err := m.a.Wake(ctx)
	ok := w.settle(fmt.Sprintf("a%d.Wake() len %d floor %d, %v", m.id, m.len, m.floor, m.mode), err, want)
	w.reclaimedFrom(m)
	if !ok {
		if !m.a.Asleep() {
			w.fatalf("a%d: a failed Wake left it awake", m.id)
		}
		return
	}
	if c := m.a.Cap(); w.o.weak && c > newCap && c <= m.sleptCap {
		// A double fault left a slot above the promise mapped while
		// asleep: the Wake keeps what lies below it.
		newCap = c
	}
	m.asleep, m.cap = false, newCap
	w.n.wakes++
	from := 0
	if m.mode == arena.Offload {
		// Below Len: the bytes that were there, which check compares
		// (checkFresh scans whole 4 KiB blocks, the arena's own bytes pass).
		from = m.len &^ (len(zeroBlock) - 1)
	}
	w.checkFresh(m, from, newCap)
}

// asleepOps calls what a sleeping arena refuses: each fails with ErrAsleep
// and changes nothing.
func (w *world) asleepOps() {
	m := w.pick(true)
	if m == nil {
		w.sleep()
		return
	}
	w.n.badInputs += 5
	_, err := m.a.Alloc(1, 1)
	w.settle(fmt.Sprintf("asleep a%d.Alloc", m.id), err, arena.ErrAsleep)
	w.settle(fmt.Sprintf("asleep a%d.Grow", m.id), m.a.Grow(1), arena.ErrAsleep)
	w.settle(fmt.Sprintf("asleep a%d.Truncate", m.id), m.a.Truncate(0), arena.ErrAsleep)
	w.settle(fmt.Sprintf("asleep a%d.Shrink", m.id), m.a.Shrink(), arena.ErrAsleep)
	w.settle(fmt.Sprintf("asleep a%d.ShrinkTo", m.id), m.a.ShrinkTo(w.cs), arena.ErrAsleep)
	if len(m.bufs) > 0 {
		b := m.bufs[w.c.intn(len(m.bufs))]
		w.settle(fmt.Sprintf("asleep a%d CopyIn", m.id), arena.CopyIn(b.b, []byte{m.tag}), arena.ErrAsleep)
	}
}

// teardown closes every arena and the pool, first with the faults still
// armed (a Close that fails must change nothing), then with them off, and
// checks that the driver holds nothing.
func (w *world) teardown() {
	for len(w.open) > 0 {
		w.inject = w.fd.Injected(faultdriver.Any)
		m := w.open[0]
		refills := m.a.Stats().Refills
		err := m.a.Close()
		if !w.settle(fmt.Sprintf("teardown a%d.Close()", m.id), err, nil) && !w.closedAnyway(m) {
			w.closeFailed(m)
			w.check()
			w.fd.Clear() // and try again
			continue
		}
		w.n.refills += refills
		w.open = w.open[1:]
		w.dropStream(m)
		w.check()
	}
	w.inject = w.fd.Injected(faultdriver.Any)
	ps := w.pool.Stats()
	w.n.reclaimed, w.n.ordered, w.n.kernels = ps.Reclaimed, ps.Ordered, w.kernels
	if err := w.pool.Close(); err != nil {
		if !w.faulted() || !isInjected(err) {
			w.fatalf("pool.Close: %v", err)
		}
		w.n.faultFailed++
		ps := w.pool.Stats()
		if l := w.hd.Live(); l.Handles != ps.Cached || ps.InUse != 0 {
			w.fatalf("pool.Close failed and lost track: driver %+v, pool %+v", l, ps)
		}
		w.fd.Clear()
		if err := w.pool.Close(); err != nil {
			w.fatalf("second pool.Close: %v", err)
		}
	}
	w.fd.Clear()
	if l := w.hd.Live(); !l.Zero() {
		w.fatalf("leaked: %+v", l)
	}
	if l := w.reg.Live(); !l.Zero() {
		w.fatalf("left registered: %+v", l)
	}
	w.n.injected += w.fd.Injected(faultdriver.Any)
	for i, op := range faultOps {
		w.n.byKind[i] += w.fd.Injected(op)
	}
	if err := w.hd.Close(); err != nil {
		w.fatalf("driver.Close: %v", err)
	}
}

// modelWaits maps a world's pool to the cancel function of its Wake under
// way.
var modelWaits sync.Map // *chunk.Pool → context.CancelFunc

// modelHook ends a model's Wake that joins its pool's queue of waiters: in a
// single-threaded sequence nobody frees memory while it waits, so it would
// only wait out its deadline. The Wake then fails for want of memory, as the
// model predicts (or an injected fault explains). Tests that run worlds
// install it for their duration.
func modelHook(tb testing.TB) {
	tb.Cleanup(sched.Set(func(p sched.Point, who any) {
		if p != sched.WaitEnqueued {
			return
		}
		if cancel, ok := modelWaits.Load(who); ok {
			cancel.(context.CancelFunc)()
		}
	}))
}

// envInt reads a scale factor from the environment.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// modelScale returns the sequence length and seed count for this run: the
// environment variables prefix_OPS and prefix_SEEDS override them; -short
// and -race cut them down.
func modelScale(prefix string, ops, seeds int) (int, int) {
	if testing.Short() || raceEnabled {
		ops, seeds = ops/2, max(1, seeds/2)
	}
	return envInt(prefix+"_OPS", ops), envInt(prefix+"_SEEDS", seeds)
}

// TestModel runs seeded random sequences in each configuration, without
// faults, so every outcome is predicted exactly.
func TestModel(t *testing.T) {
	modelHook(t)
	ops, seeds := modelScale("VMARENA_MODEL", 300, 4)
	configs := []struct {
		name string
		mod  func(*modelOpts)
	}{
		{"budget", func(*modelOpts) {}},
		{"device-limit", func(o *modelOpts) { o.byDevice = true }},
		{"no-limit-no-cache", func(o *modelOpts) { o.limit, o.maxCached = 0, -1 }},
		{"scrub-on-release", func(o *modelOpts) { o.scrub = chunk.ScrubOnRelease }},
		{"scrub-never", func(o *modelOpts) { o.scrub = chunk.ScrubNever }},
		{"deferred", func(o *modelOpts) { *o = deferredOpts() }},
		{"deferred-device-limit", func(o *modelOpts) { *o = deferredOpts(); o.byDevice = true }},
		{"deferred-scrub-on-release", func(o *modelOpts) { *o = deferredOpts(); o.scrub = chunk.ScrubOnRelease }},
		{"deferred-tight", func(o *modelOpts) { *o = deferredOpts(); o.limit, o.maxCached = 6, 2 }},
		{"sleep", func(o *modelOpts) { o.sleep = true }},
		{"sleep-deferred", func(o *modelOpts) { *o = deferredOpts(); o.sleep = true }},
		{"sleep-deferred-tight", func(o *modelOpts) { *o = deferredOpts(); o.sleep, o.limit, o.maxCached = true, 6, 2 }},
		{"two-sizes", func(o *modelOpts) { o.twoSizes = true }},
		{"two-sizes-device-limit", func(o *modelOpts) { o.twoSizes, o.byDevice = true, true }},
		{"two-sizes-deferred", func(o *modelOpts) { *o = deferredOpts(); o.twoSizes = true }},
		{"two-sizes-sleep", func(o *modelOpts) { o.twoSizes, o.sleep = true, true }},
		{"two-sizes-sleep-tight", func(o *modelOpts) { o.twoSizes, o.sleep, o.limit, o.maxCached = true, true, 5, 2 }},
	}
	var total modelCounts
	for _, cfg := range configs {
		t.Run(cfg.name, func(t *testing.T) {
			for seed := range seeds {
				o := defaultModelOpts()
				cfg.mod(&o)
				o.ops = ops
				w := newWorld(t, rngChooser{rand.New(rand.NewPCG(uint64(seed), 1))}, o)
				w.run()
				total.add(w.n)
			}
		})
	}
	t.Logf("model: %d sequences, %d operations (%d failed as predicted, %d bad inputs), %d checks, %d bytes compared, %d new chunks scanned for foreign bytes; %d chunks reclaimed under pressure, %d unmapped after their events, %d headroom refills, %d kernels in flight, %d sleeps and %d wakes, %d large chunks seen mapped (two sizes) and %d growths past their target by a large chunk taken back, no device fault",
		len(configs)*seeds, total.ops, total.failed, total.badInputs, total.checks, total.bytesChecked, total.chunksScanned,
		total.reclaimed, total.ordered, total.refills, total.kernels, total.sleeps, total.wakes, total.large, total.tookBack)
}

// TestModelFaultEveryCall runs one sequence once to count its driver calls,
// then once more per call position with that call failing, checking after
// every operation that a failed one changed nothing, and at the end that
// nothing leaked.
func TestModelFaultEveryCall(t *testing.T) {
	modelHook(t)
	ops, seeds := modelScale("VMARENA_FAULT", 100, 1)
	var (
		mu        sync.Mutex
		total     modelCounts
		positions int
		unreached int // positions past the end of a run: see below
	)
	workers := runtime.GOMAXPROCS(0)
	t.Run("runs", func(t *testing.T) {
		for seed := range seeds {
			for _, run := range []struct {
				scrub    chunk.Scrub
				twoSizes bool
			}{{chunk.ScrubOnReuse, false}, {chunk.ScrubOnRelease, false}, {chunk.ScrubOnReuse, true}} {
				scrub := run.scrub
				mk := func(t testing.TB) *world {
					o := defaultModelOpts()
					o.ops, o.scrub, o.twoSizes = ops, scrub, run.twoSizes
					// Headroom and shared tenants keep the driver calls in the
					// same order from run to run; streams would not (the
					// worker polls events as the kernels finish), so they
					// take their faults in TestModelRandomFaults.
					o.headroom, o.tenants, o.skimRefills, o.sleep = true, true, true, true
					if scrub == chunk.ScrubOnRelease {
						o.maxCached = 2 // evictions: frees in the middle of operations
					}
					return newWorld(t, rngChooser{rand.New(rand.NewPCG(uint64(seed), 2))}, o)
				}
				w := mk(t)
				before := w.fd.Calls(faultdriver.Any)
				w.run()
				calls := int(w.fd.Calls(faultdriver.Any) - before)
				total.add(w.n)
				positions += calls
				// The positions, spread over parallel workers.
				for i := range workers {
					t.Run(fmt.Sprintf("seed%d-%v-two=%v-%d", seed, scrub, run.twoSizes, i), func(t *testing.T) {
						t.Parallel()
						for k := 1 + i; k <= calls; k += workers {
							w := mk(t)
							w.fd.FailNth(faultdriver.Any, k, 0)
							w.run()
							mu.Lock()
							total.add(w.n)
							if w.n.injected == 0 {
								// The run made fewer calls than the first: the
								// worker's refills vary by a call or two with
								// timing. Counted below; the run still passed
								// every check.
								unreached++
							}
							mu.Unlock()
							if w.n.injected > 1 {
								t.Fatalf("position %d: %d faults injected, want 1", k, w.n.injected)
							}
						}
					})
				}
			}
		}
	})
	if unreached > positions/20 {
		t.Errorf("%d of %d call positions were never reached: the runs' calls vary too much to test every one", unreached, positions)
	}
	t.Logf("fault at every call: %d call positions (each a run with that call failing; %s; %d not reached, the run ending first), %d operations (%d sleeps and %d wakes), %d faults injected: %d operations failed by them and changed nothing, %d absorbed; %d checks, %d chunks scanned, nothing leaked",
		positions, total.kinds(), unreached, total.ops, total.sleeps, total.wakes, total.injected, total.faultFailed, total.faultAbsorbed, total.checks, total.chunksScanned)
}

// TestModelRandomFaults lets every driver call fail with some probability,
// so faults also hit the undo of a failed operation. The model checks what
// must survive that: every arena consistent with the driver, no byte below
// Len changed, nothing leaked once the faults stop.
func TestModelRandomFaults(t *testing.T) {
	modelHook(t)
	ops, seeds := modelScale("VMARENA_RANDOM", 300, 8)
	rate := 0.05
	if v, err := strconv.ParseFloat(os.Getenv("VMARENA_RANDOM_RATE"), 64); err == nil && v > 0 && v <= 1 {
		rate = v
	}
	var total modelCounts
	for seed := range seeds {
		o := defaultModelOpts()
		o.ops, o.weak = ops, true
		o.sleep = seed%4 != 3 // sleeps and wakes, faults in them included, in three runs of four
		switch seed % 3 {     // vary the pool
		case 1:
			o.scrub, o.maxCached = chunk.ScrubOnRelease, 2
		case 2:
			o.byDevice = true
		}
		if seed%2 == 1 { // and deferred reclamation, grow-ahead, streams
			o.streams, o.headroom, o.tenants = true, true, true
		}
		o.twoSizes = seed%5 == 4 // and the sizes of its chunks
		w := newWorld(t, rngChooser{rand.New(rand.NewPCG(uint64(seed), 3))}, o)
		w.fd.FailRandom(faultdriver.Any, rate, uint64(seed), 0)
		w.run()
		total.add(w.n)
	}
	t.Logf("random faults: %d sequences, %d operations at %.0f%% faults per driver call, %d faults injected (%s): %d operations failed by them, %d absorbed, %d took two or more; %d sleeps and %d wakes succeeded, %d sleeps and wakes took a fault; %d checks, %d new chunks scanned for another tenant's bytes (none), no device fault, nothing leaked",
		seeds, total.ops, 100*rate, total.injected, total.kinds(), total.faultFailed, total.faultAbsorbed, total.multi,
		total.sleeps, total.wakes, total.sleepWakeFaulted, total.checks, total.chunksScanned)
}
