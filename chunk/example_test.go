package chunk_test

import (
	"fmt"
	"log"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/chunk"
)

func ExamplePool() {
	drv, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	pool, err := chunk.New(drv, chunk.Config{Size: 4 << 20, MaxCached: 8})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	c, _ := pool.Lender().Get() // a miss: MallocPhysical
	_ = pool.Lender().Put(c)    // into the cache
	c, _ = pool.Lender().Get()  // a hit: no driver call
	_ = pool.Lender().Put(c)
	s := pool.Stats()
	fmt.Printf("chunk %d MiB, hits %d, misses %d, cached %d\n", s.ChunkSize>>20, s.Hits, s.Misses, s.Cached)
	// Output: chunk 4 MiB, hits 1, misses 1, cached 1
}

// A pool given a budget and no chunk size chooses its chunks from the
// budget: the granularity for a small one, larger chunks (fewer driver
// calls) for a large one, with tails of a quarter of them at the arenas'
// edges where that is a multiple of the granularity (DefaultTailSize).
func ExampleSizeFor() {
	const granularity = 2 << 20
	for _, budget := range []int64{0, 1 << 30, 8 << 30, 16 << 30, 80 << 30, 1 << 40} {
		size := chunk.SizeFor(budget, granularity)
		tails := "one size"
		if tail := chunk.DefaultTailSize(size, granularity); tail < size {
			tails = fmt.Sprintf("%d MiB tails", tail>>20)
		}
		fmt.Printf("budget %4d GiB: %2d MiB chunks, %s\n", budget>>30, size>>20, tails)
	}

	drv, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	pool, err := chunk.New(drv, chunk.Config{Budget: 16 << 30})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	fmt.Printf("the pool chose %d MiB, tails %d MiB\n", pool.ChunkSize()>>20, pool.TailSize()>>20)
	// Output:
	// budget    0 GiB:  2 MiB chunks, one size
	// budget    1 GiB:  2 MiB chunks, one size
	// budget    8 GiB:  8 MiB chunks, 2 MiB tails
	// budget   16 GiB: 16 MiB chunks, 4 MiB tails
	// budget   80 GiB: 32 MiB chunks, 8 MiB tails
	// budget 1024 GiB: 32 MiB chunks, 8 MiB tails
	// the pool chose 16 MiB, tails 4 MiB
}
