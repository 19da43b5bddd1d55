package arena

import (
	"runtime"
	"sync/atomic"
)

// Stale buffers.
//
// A Buffer is stale once its allocation is dropped: a Truncate or Reset
// below its end (Shrink only gives back what a drop left above Len), Sleep
// in Discard mode, Close. Its range may by then hold another allocation,
// so the check cannot be "is it below Len": it is "did Len fall below its
// end since it was cut".
//
// Every freeze of the allocator word advances its epoch (arena.go), so the
// epoch a Buffer was cut in says which drops came after it. The word has
// room for 22 bits of epoch only, and an arena that truncates once per
// decode step passes 2^22 in hours; so the bits above, the epoch's era,
// live in the top of the low-water word, which Alloc's fast path reads
// anyway. The full epoch is 45 bits: 2^45 freezes of one arena.
//
// The arena keeps the drops as the stack of their suffix minima: records
// (epoch, Len after the drop) with both strictly increasing, where a new
// drop first removes the records whose Len is not below its own (they can
// no longer be the lowest Len after any epoch). A buffer cut in epoch g
// with end e is stale iff some drop after g left Len below e, that is iff
// the first record newer than g has a Len below e. A program that drops to
// the same place or lower (a KV cache Reset per request) keeps one record;
// records pile up only while each drop leaves Len higher than the one
// before, and a drop below them all clears them.
//
// Copies read the records without a lock (a sequence count, as a seqlock,
// makes a reader that raced a writer look again); writers hold the arena's
// mutex.

// The epoch's era, in the low-water word above its low-water mark.
const (
	epochBits = 63 - lenBits // the epoch bits of the state word
	eraOne    = 1 << lenBits // one era in the low-water word
)

// epochOf returns the full epoch of the state word s, given the low-water
// word w read while s was current.
func epochOf(s, w uint64) uint64 { return w>>lenBits<<epochBits | s&epochMask>>lenBits }

// nextEpoch returns the epoch bits of the state word that follows s, and
// carries a wrap of them into the era. Call with mu held and the state
// frozen: the era changes before the state word that ends the freeze is
// stored, so an Alloc that read the state word before it either fails its
// compare-and-swap or read the era that goes with its epoch.
func (a *Arena) nextEpoch(s uint64) uint64 {
	e := (s + epochOne) & epochMask
	if e == 0 {
		a.lowWater.Add(eraOne)
	}
	return e
}

// dropped records that the freeze ending with state epoch bits e left Len
// at l, below the end of buffers cut before it. Call with mu held, before
// the new state word is stored.
func (a *Arena) dropped(e, l uint64) {
	a.drops.record(epochOf(e, a.lowWater.Load()), l)
}

// stale reports whether b's allocation was dropped: its arena is closed, or
// a drop since b was cut left Len below its end.
func (b Buffer) stale() bool {
	a := b.a
	if a == nil {
		return false
	}
	if a.lifeNow() == lifeClosed {
		return true
	}
	return a.drops.dropped(b.gen, uint64(b.off)+uint64(b.n))
}

// dropLog is an arena's drops, as the stack of suffix minima above.
type dropLog struct {
	seq  atomic.Uint64 // odd while record rewrites the records
	last atomic.Uint64 // the epoch of the newest drop; 0: none (no drop has epoch 0)
	low  atomic.Uint64 // the lowest Len a drop left: the first record's
	// The newest record's Len and the record before it, copied beside the
	// words above, so that a buffer cut a drop or two ago is judged in
	// the arena's own cache lines.
	topLen atomic.Uint64
	prev   dropRec // zero while there is one record
	n      atomic.Int64
	recs   atomic.Pointer[[]dropRec] // all of them, [0, n)
}

type dropRec struct {
	epoch atomic.Uint64 // the epoch the drop began
	len   atomic.Uint64 // Len after it
}

// record adds a drop that began epoch and left Len at l. Call with the
// arena's mutex held.
func (d *dropLog) record(epoch, l uint64) {
	d.seq.Add(1)
	defer d.seq.Add(1)
	var rs []dropRec
	if p := d.recs.Load(); p != nil {
		rs = *p
	}
	n := int(d.n.Load())
	for n > 0 && rs[n-1].len.Load() >= l {
		n--
	}
	// Grow, or give back a backing a Reset left mostly empty.
	if c := len(rs); n == c || (c > 64 && n < c/4) {
		nr := make([]dropRec, max(8, 2*n))
		for i := range n {
			nr[i].epoch.Store(rs[i].epoch.Load())
			nr[i].len.Store(rs[i].len.Load())
		}
		rs = nr
		d.recs.Store(&nr)
	}
	rs[n].epoch.Store(epoch)
	rs[n].len.Store(l)
	d.n.Store(int64(n + 1))
	var pe, pl uint64
	if n > 0 {
		pe, pl = rs[n-1].epoch.Load(), rs[n-1].len.Load()
	}
	d.prev.epoch.Store(pe)
	d.prev.len.Store(pl)
	d.topLen.Store(l)
	d.low.Store(rs[0].len.Load())
	d.last.Store(epoch) // after low: a reader that sees this drop sees its low
}

// dropped reports whether a drop that began after epoch gen left Len below
// end. The two loads settle most copies: a buffer cut after the newest drop,
// or one that ends below every drop (weights under a KV cache that is
// truncated above them); only the rest search the records.
func (d *dropLog) dropped(gen, end uint64) bool {
	return gen < d.last.Load() && end > d.low.Load() && d.stale(gen, end)
}

// stale is dropped's search of the records, for a buffer cut before the
// newest drop (gen below it), under their sequence count: whether the first
// record newer than gen, which holds the lowest Len since gen, is below
// end. Records read while a writer rewrites them may be wrong; it then
// reads them again.
func (d *dropLog) stale(gen, end uint64) bool {
	for try := 0; ; try++ {
		v := d.seq.Load()
		if v&1 == 0 {
			var st bool
			// The Lens of the records fall as their epochs do: the newest
			// first, then the one before, then a search of the rest.
			switch pe := d.prev.epoch.Load(); {
			case d.topLen.Load() < end:
				st = true
			case pe <= gen: // the newest is the first newer record (or the only one)
				st = false
			case d.prev.len.Load() < end:
				st = true
			default:
				st = d.search(gen, end)
			}
			if d.seq.Load() == v {
				return st
			}
		}
		if try >= 4 {
			runtime.Gosched() // a writer holds it: let it finish
		}
	}
}

// search is stale's search of the records older than the two newest, for a
// buffer cut before both, neither of them below its end.
func (d *dropLog) search(gen, end uint64) bool {
	p := d.recs.Load()
	if p == nil {
		return false
	}
	rs := *p
	n := min(int(d.n.Load()), len(rs)) - 2 // [0, n): the older records
	lo, hi := 0, max(n, 0)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if rs[m].epoch.Load() > gen {
			hi = m
		} else {
			lo = m + 1
		}
	}
	// lo == n: the first newer record is the one before the newest, not
	// below end.
	return lo < n && rs[lo].len.Load() < end
}

// records returns the number of drop records kept, for tests.
func (d *dropLog) records() int { return int(d.n.Load()) }
