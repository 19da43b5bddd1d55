package arena

import (
	"sort"

	"github.com/vmarena/vmarena/chunk"
)

// layout is where an arena's chunks lie: the chunks mapped below Cap, in
// address order, and the offset past each. Chunk i spans [off(i), off(i+1))
// of the arena's range, so the arena's offsets never assume that every
// chunk is one size; Cap is top(). It is read and changed under the arena's
// mu. Readers without the lock (the pool's questions to its members,
// member.go) ask Arena.chunkEnd instead, which needs only the atomic Cap.
type layout struct {
	cs   []chunk.Chunk // chunk i, mapped at base+off(i)
	ends []uint64      // ends[i] = off(i+1): the offset past chunk i
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

// push adds c, of size bytes, at top().
func (g *layout) push(c chunk.Chunk, size uint64) {
	g.ends = append(g.ends, g.top()+size)
	g.cs = append(g.cs, c)
}

// cut drops the chunks keep.. (the caller has given them back).
func (g *layout) cut(keep int) {
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
