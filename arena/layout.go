package arena

import (
	"sort"
	"sync/atomic"

	"github.com/vmarena/vmarena/chunk"
)

// layout is where an arena's chunks lie: the chunks mapped below Cap, in
// address order, and the offset past each. Chunk i spans [off(i), off(i+1))
// of the arena's range, so the arena's offsets never assume that every
// chunk is one size; Cap is top(). It is read and changed under the arena's
// mu.
//
// A pool of two sizes lends large chunks and tail chunks (a unit each). A
// large chunk only ever lies on a block [b·large, (b+1)·large) of its own,
// so every multiple of large is a chunk boundary, and one bit per block says
// which chunk holds a byte: end, the one reader without the lock (the
// pool's questions to its members, member.go), needs nothing else.
type layout struct {
	cs   []chunk.Chunk // chunk i, mapped at base+off(i)
	ends []uint64      // ends[i] = off(i+1): the offset past chunk i

	large, unit uint64          // the sizes a chunk may have
	big         []atomic.Uint64 // bit b: block b is one large chunk; nil while large == unit
}

// sizes sets the chunk sizes of a layout spanning reserved bytes.
func (g *layout) sizes(large, unit, reserved uint64) {
	g.large, g.unit = large, unit
	if large != unit {
		g.big = make([]atomic.Uint64, (reserved/large+63)/64)
	}
}

// mark sets or clears the bit of the large chunk at off.
func (g *layout) mark(off uint64, set bool) {
	b := off / g.large
	if set {
		g.big[b/64].Or(1 << (b % 64))
	} else {
		g.big[b/64].And(^(1 << (b % 64)))
	}
}

// end returns the offset past the chunk that holds byte x-1 (0 for x 0),
// for an x at most a block past top(), without the arena's lock.
func (g *layout) end(x uint64) uint64 {
	if x == 0 {
		return 0
	}
	if g.big != nil {
		if b := (x - 1) / g.large; b/64 < uint64(len(g.big)) && g.big[b/64].Load()&(1<<(b%64)) != 0 {
			return (b + 1) * g.large
		}
	}
	return (x + g.unit - 1) / g.unit * g.unit
}

// n returns the number of chunks.
func (g *layout) n() int { return len(g.cs) }

// off returns the offset of chunk i; off(n()) is top().
func (g *layout) off(i int) uint64 {
	if i == 0 {
		return 0
	}
	return g.ends[i-1]
}

// top returns the offset past the last chunk: Cap.
func (g *layout) top() uint64 { return g.off(len(g.cs)) }

// size returns the bytes of chunk i.
func (g *layout) size(i int) uint64 { return g.ends[i] - g.off(i) }

// push adds c, of size bytes, at top(). A large chunk off its block would
// break end, so it panics: placement (tile) never puts one there.
func (g *layout) push(c chunk.Chunk, size uint64) {
	top := g.top()
	if g.big != nil && size != g.unit {
		if size != g.large || top%g.large != 0 {
			panic("arena: a large chunk off its block")
		}
		g.mark(top, true)
	}
	g.ends = append(g.ends, top+size)
	g.cs = append(g.cs, c)
}

// cut drops the chunks keep.. (the caller has given them back).
func (g *layout) cut(keep int) {
	if g.big != nil {
		for i := keep; i < len(g.cs); i++ {
			if g.size(i) == g.large {
				g.mark(g.off(i), false)
			}
		}
	}
	clear(g.cs[keep:])
	g.cs, g.ends = g.cs[:keep], g.ends[:keep]
}

// reset drops every chunk.
func (g *layout) reset() { g.cut(0) }

// index returns the chunk holding byte x, or n() when x ≥ top().
func (g *layout) index(x uint64) int {
	return sort.Search(len(g.ends), func(i int) bool { return g.ends[i] > x })
}

// keep returns how many chunks hold the bytes [0, x): those from the bottom
// up to the one holding byte x-1. A Len of x needs them mapped.
func (g *layout) keep(x uint64) int {
	if x == 0 {
		return 0
	}
	return min(g.index(x-1)+1, len(g.cs))
}

// tile returns the sizes that fill [from, to) (multiples of unit) as
// placement lays chunks: unit chunks up to the first multiple of large,
// a large chunk for each whole block, unit chunks for the rest. It appends
// to dst.
func (g *layout) tile(dst []uint64, from, to uint64) []uint64 {
	for x := from; x < to; {
		s := g.next(x, to)
		dst = append(dst, s)
		x += s
	}
	return dst
}

// next returns the size of the chunk tile lays at x, of a gap that ends at
// to.
func (g *layout) next(x, to uint64) uint64 {
	if x%g.large == 0 && x+g.large <= to {
		return g.large
	}
	return g.unit
}
