package chunk

import "math/bits"

// The rule a pool follows to choose its chunk size when Config.Size is 0
// and Config.Budget is set (SizeFor).
const (
	// BudgetChunks is the number of chunks the chosen size divides the
	// budget into, to the nearest power of two. An arena holds at most one
	// partial chunk beyond its length (and its headroom, none by default),
	// so 64 arenas sharing the budget waste at most 64 chunks: 4.4–8.8% of
	// it with 1,024 (the rounding to a power of two moves the size by up to
	// √2 either way), half a chunk each on average, while a 16 GiB budget
	// is mapped in 16 MiB calls, an eighth of the calls of 2 MiB ones.
	BudgetChunks = 1024
	// MaxAutoSize caps the size a pool chooses: 32 MiB maps a GiB in 32
	// calls, and beyond it the calls saved are few while every arena holds
	// at least one chunk, whatever it needs: a pool that holds several
	// models' weights and hundreds of sequences' KV caches (a large budget,
	// many small arenas) wastes more in 64 MiB chunks than the calls save.
	MaxAutoSize = 32 << 20
)

// SizeFor returns the chunk size a pool chooses for Config.Size 0 and
// Config.Budget budget, on a driver whose granularity is granularity bytes:
// the power of two nearest budget/BudgetChunks (nearest on a log scale, so
// from 0.71 to 1.41 times it), at least the granularity and at most
// MaxAutoSize, rounded down to a multiple of the granularity. A budget of 0
// (no cap) gives the granularity, and so does one below 1,449 granularities
// when the granularity is a power of two (2.83 GiB of 2 MiB ones).
// New chooses this size unless the driver's largest reservation is smaller,
// then the granularity. A granularity of 0 or less returns 0.
func SizeFor(budget int64, granularity int) int {
	if granularity <= 0 {
		return 0
	}
	return int(autoSize(budget, uintptr(granularity), ^uintptr(0)))
}

// autoSize is SizeFor for New, within the driver's largest reservation.
func autoSize(budget int64, g, limit uintptr) uintptr {
	if budget <= 0 {
		return g
	}
	q := uint64(budget) / BudgetChunks
	if q == 0 {
		return g
	}
	// The nearest power of two on a log scale: 2^k when q < 2^k·√2.
	k := bits.Len64(q) - 1 // 2^k ≤ q < 2^(k+1)
	p := uint64(1) << k
	// q ≥ p·√2 ⇔ q² ≥ 2p², compared without overflow as q/p ≥ √2.
	if k < 62 && float64(q) >= float64(p)*1.4142135623730951 {
		p <<= 1
	}
	p = min(p, MaxAutoSize)
	size := uintptr(p) / g * g
	if size < g || size > limit {
		return g
	}
	return size
}

// DefaultTailSize returns the tail chunk size a pool of chunks of size bytes
// chooses for Config.TailSize 0, on a driver whose granularity is
// granularity bytes: a quarter of size where that is a multiple of the
// granularity, else size itself (one size). With 2 MiB granules, chunks
// that are a multiple of 8 MiB have tails (2 MiB for 8 MiB, 4 MiB for
// 16 MiB, 8 MiB for 32 MiB: every size SizeFor chooses from 8 MiB up) and
// others do not (4 MiB, 12 MiB). A quarter keeps an arena's unused part of
// its last chunk to an eighth of a large chunk on average, where one size
// keeps half of one, for more driver calls when the arena grows a token at
// a time (two thirds more in the bench's server-size KV caches);
// docs/benchmarks.md has the figures behind the rule. A size or granularity of 0 or less returns size.
func DefaultTailSize(size, granularity int) int {
	if size <= 0 || granularity <= 0 {
		return size
	}
	if q := size / 4; size%4 == 0 && q >= granularity && q%granularity == 0 {
		return q
	}
	return size
}
