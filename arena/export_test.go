package arena

import (
	"errors"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
)

// SetDecayAfter sets how many quiet refills shrink the learnt headroom, and
// returns a function that restores it.
func SetDecayAfter(n int) (restore func()) {
	old := decayAfter
	decayAfter = n
	return func() { decayAfter = old }
}

// SetStepHook sets the hook Share and Import call at each of their steps.
func SetStepHook(fn func(step string)) { stepHook = fn }

// ImportedOf imports the shareable handles hs (descriptors the caller keeps),
// chunks of cs bytes, as Import does once it has received them: the
// consumer's side of a hand-over without the socket, for the benchmarks.
func ImportedOf(drv acl.Driver, cs uint64, hs []acl.ShareableHandle) (*Imported, error) {
	o := offer{chunkSize: cs, chunks: uint64(len(hs))}
	pool, own, err := importPool(drv, ImportConfig{}, o, nil)
	if err != nil {
		return nil, err
	}
	t := chunk.NewTenant()
	chunks, err := importAll(pool, t, hs, o, nil, nil)
	if err != nil {
		for _, c := range chunks {
			err = errors.Join(err, pool.Lender().Put(c))
		}
		return nil, errors.Join(err, pool.Close())
	}
	return newImported(drv, pool, own, t, nil, chunks, &importMode{}, 0, cs*uint64(len(hs)))
}

// ForgetDefaultDrivers drops the drivers DefaultDriver opened, so that a test
// that registered a selector of its own leaves none behind.
func ForgetDefaultDrivers() {
	defaults.Lock()
	defaults.m = nil
	defaults.Unlock()
}

// ChunkAt returns the chunk mapped at p in a, for tests that export one.
func ChunkAt(a *Arena, p acl.DevicePtr) (chunk.Chunk, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p < a.base {
		return chunk.Chunk{}, false
	}
	i := a.geo.index(uint64(p - a.base))
	if i >= a.geo.n() {
		return chunk.Chunk{}, false
	}
	return a.geo.cs[i], true
}

// DropRecords returns how many drops a keeps for the staleness check.
func DropRecords(a *Arena) int { return a.drops.records() }

// SetEpoch moves a's allocator epoch to full, as if that many freezes had
// run, for tests of the epoch's wrap into its era.
func SetEpoch(a *Arena, full uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.state.Load()
	a.lowWater.Store(a.lowWater.Load()&lenMask | full>>epochBits<<lenBits)
	a.state.Store(s&^epochMask | full<<lenBits&epochMask)
}

// LowWater returns a's low-water mark.
func LowWater(a *Arena) int { return int(a.lowWater.Load() & lenMask) }

// Layout returns the sizes of a's chunks, lowest address first.
func Layout(a *Arena) []int {
	sizes, _ := LayoutAndCap(a)
	return sizes
}

// LayoutAndCap returns Layout(a) and Cap, read together under a's lock.
func LayoutAndCap(a *Arena) ([]int, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	sizes := make([]int, a.geo.n())
	for i := range sizes {
		sizes[i] = int(a.geo.size(i))
	}
	return sizes, int(a.cap.Load())
}
