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
