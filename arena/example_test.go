package arena_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// A zero Config works: the arena runs on the process's default driver, the
// host driver unless $VMARENA_DEVICE names a device (see DefaultDriver).
func Example() {
	a, err := arena.New(arena.Config{Reserve: 1 << 30})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	// A tensor of 1024 float32s, 64-byte aligned. The arena maps a chunk.
	t, err := a.Alloc(1024*4, 64)
	if err != nil {
		log.Fatal(err)
	}
	x := make([]float32, 1024)
	for i := range x {
		x[i] = float32(i) / 2
	}
	if err := arena.CopyIn(t, x); err != nil {
		log.Fatal(err)
	}
	y := make([]float32, 1024)
	if err := arena.CopyOut(y, t); err != nil {
		log.Fatal(err)
	}
	fmt.Println("y[1023] =", y[1023])
	fmt.Println("len", a.Len(), "cap", a.Cap())
	// Output:
	// y[1023] = 511.5
	// len 4096 cap 2097152
}

// Grow maps memory ahead of need; data and pointers do not move.
func ExampleArena_Grow() {
	drv, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	a, err := arena.New(arena.Config{Driver: drv, Reserve: 32 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	first, _ := a.Alloc(100, 1)
	_ = arena.CopyIn(first, []byte("kept"))
	ptr := first.Ptr()

	if err := a.Grow(10 << 20); err != nil { // room for 10 MiB more
		log.Fatal(err)
	}
	fmt.Println("cap MiB:", a.Cap()>>20)
	fmt.Println("pointer stable:", first.Ptr() == ptr)
	got := make([]byte, 4)
	_ = arena.CopyOut(got, first)
	fmt.Println("data:", string(got))

	// Past the reservation, Grow fails and changes nothing.
	err = a.Grow(64 << 20)
	fmt.Println(errors.Is(err, arena.ErrExhausted), a.Cap()>>20)
	// Output:
	// cap MiB: 12
	// pointer stable: true
	// data: kept
	// true 12
}

// Shrink gives the chunks above Len back to the pool; regrowing takes them
// from its cache without a physical allocation.
func ExampleArena_Shrink() {
	drv, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	a, err := arena.New(arena.Config{Driver: drv, Reserve: 32 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	_, _ = a.Alloc(16<<20, 1)
	_ = a.Reset()
	_, _ = a.Alloc(3<<20, 1) // keep 3 MiB
	_ = a.Shrink()
	fmt.Println("mapped MiB after shrink:", a.Cap()>>20)
	fmt.Println("cached chunks:", a.Pool().Stats().Cached)

	_ = a.Grow(13 << 20)
	p := a.Pool().Stats()
	fmt.Println("physical allocations:", p.Allocs, "cache hits:", p.Hits)
	// Output:
	// mapped MiB after shrink: 4
	// cached chunks: 6
	// physical allocations: 8 cache hits: 6
}

// Arenas of several tenants share one pool and its budget: one tenant
// running into the budget gets ErrOutOfMemory and disturbs nobody.
// A slot of a server serves one request after another. Between two, it
// keeps what its next request needs mapped and gives the rest back, where
// another slot's growth finds it without allocating afresh.
func ExampleArena_ShrinkTo() {
	drv, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	a, err := arena.New(arena.Config{Driver: drv, Reserve: 32 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	_, _ = a.Alloc(20<<20, 1) // a long request's cache
	_ = a.Reset()             // it finished
	_ = a.ShrinkTo(6 << 20)   // the next one's prompt needs 6 MiB
	fmt.Println("mapped MiB:", a.Cap()>>20, "cached chunks:", a.Pool().Stats().Cached)

	allocs := a.Pool().Stats().Allocs
	_ = a.Grow(6 << 20)
	fmt.Println("new physical allocations for the next prompt:", a.Pool().Stats().Allocs-allocs)
	// Output:
	// mapped MiB: 6 cached chunks: 7
	// new physical allocations for the next prompt: 0
}

// A KV cache appends a token's K and V for every layer in one call: one
// step of the allocator, not two per layer, and the tensors lie one after
// another as separate Allocs would cut them.
func ExampleArena_AllocN() {
	drv, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	a, err := arena.New(arena.Config{Driver: drv, Reserve: 32 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	const layers, kvBytes = 4, 1000 // per layer, per token: K or V
	kv := make([]arena.Buffer, 2*layers)
	for token := range 2 {
		if err := a.AllocN(kv, kvBytes, 256); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("token %d: layer 0 K at %d, V at %d; layer 3 V at %d\n", token, kv[0].Offset(), kv[1].Offset(), kv[7].Offset())
	}
	fmt.Println("bytes in use:", a.Len())
	// Output:
	// token 0: layer 0 K at 0, V at 1024; layer 3 V at 7168
	// token 1: layer 0 K at 8192, V at 9216; layer 3 V at 15360
	// bytes in use: 16360
}

func Example_sharedPool() {
	drv, err := host.New(host.Config{Capacity: 256 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	pool, err := chunk.New(drv, chunk.Config{Size: 4 << 20, Budget: 32 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	a, _ := arena.New(arena.Config{Pool: pool, Reserve: 64 << 20})
	defer a.Close()
	b, _ := arena.New(arena.Config{Pool: pool, Reserve: 64 << 20})
	defer b.Close()

	fmt.Println(a.Grow(24<<20), b.Grow(8<<20))
	err = b.Grow(16 << 20)
	fmt.Println(errors.Is(err, arena.ErrOutOfMemory), errors.Is(err, chunk.ErrBudget))
	fmt.Println("a MiB:", a.Cap()>>20, "b MiB:", b.Cap()>>20)
	// Output:
	// <nil> <nil>
	// true true
	// a MiB: 24 b MiB: 8
}

// A buffer kept past the Reset that dropped it cannot write into what the
// arena cuts from its range next: its copies fail with ErrStale.
func ExampleErrStale() {
	drv, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	a, err := arena.New(arena.Config{Driver: drv, Reserve: 32 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	request1, _ := a.Alloc(64, 64) // one request's KV block
	_ = a.Reset()                  // the request is done
	request2, _ := a.Alloc(64, 64) // the next request's, at the same place
	_ = arena.CopyIn(request2, []byte("request 2"))

	err = arena.CopyIn(request1, []byte("request 1, too late"))
	fmt.Println("same offset:", request1.Offset() == request2.Offset())
	fmt.Println("stale:", errors.Is(err, arena.ErrStale))
	got := make([]byte, 9)
	_ = arena.CopyOut(got, request2)
	fmt.Println(string(got))
	// Output:
	// same offset: true
	// stale: true
	// request 2
}

// Two requests each hold half of a pool's budget and each wait for more: no
// memory can come back, so the younger fails at once with ErrDeadlock
// instead of waiting out its deadline. A server preempts it (here: drops its
// memory), and the older is served.
func ExampleErrDeadlock() {
	drv, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	pool, err := chunk.New(drv, chunk.Config{Budget: 8 << 20}) // four chunks of 2 MiB
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	older, _ := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	defer older.Close()
	younger, _ := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	defer younger.Close()
	_, _ = older.Alloc(4<<20, 1) // half the budget each, in use
	_, _ = younger.Alloc(4<<20, 1)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- older.GrowContext(ctx, 4<<20) }() // waits
	for pool.Lender().Waiters() == 0 {
		time.Sleep(time.Millisecond)
	}
	err = younger.GrowContext(ctx, 4<<20)
	fmt.Println("younger:", errors.Is(err, arena.ErrDeadlock), errors.Is(err, arena.ErrOutOfMemory))

	_ = younger.Reset() // preempt it
	_ = younger.Shrink()
	fmt.Println("older:", <-served)
	// Output:
	// younger: true true
	// older: <nil>
}
