// Command tour is the README's short tour, compiled and run by its test.
package main

import (
	"fmt"
	"log"

	_ "github.com/vmarena/vmarena/acl/device" // honour VMARENA_DEVICE for every device, the model included
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

func main() {
	if err := tour(); err != nil {
		log.Fatal(err)
	}
	if err := shared(); err != nil {
		log.Fatal(err)
	}
}

// tour uses one arena with the zero Config: the driver $VMARENA_DEVICE names
// (the host driver when it is unset), a reservation as large as the device's
// memory, and a private pool of 2 MiB chunks.
func tour() error {
	a, err := arena.New(arena.Config{})
	if err != nil {
		return err
	}
	defer a.Close()

	t, err := a.Alloc(1024*4, 64) // 1024 float32s, 64-byte aligned: maps a chunk
	if err != nil {
		return err
	}
	if err := arena.CopyIn(t, []float32{1, 2, 3, 4}); err != nil { // host → device
		return err
	}
	out := make([]float32, 4)
	if err := arena.CopyOut(out, t); err != nil { // device → host
		return err
	}
	p := t.Ptr() // the device address: stable until a Truncate or Reset drops t, or Close
	fmt.Println("read back", out, "at", p)

	if err := a.Grow(64 << 20); err != nil { // room for 64 MiB more, like bytes.Buffer.Grow; nothing moves
		return err
	}
	if err := a.Reset(); err != nil { // drop every allocation, keep the memory mapped
		return err
	}
	if err := a.Shrink(); err != nil { // unmap the chunks above Len into the pool's cache
		return err
	}
	s := a.Stats()
	fmt.Printf("driver %s: %d MiB reserved, %d bytes mapped, peak %d bytes used, %d chunks mapped, %d unmapped\n",
		a.Driver().Name(), s.Reserved>>20, s.Mapped, s.Peak, s.Maps, s.Unmaps)
	return nil
}

// shared gives two arenas one pool: its reuse cache and its budget.
func shared() error {
	drv, err := arena.DefaultDriver() // what the zero Config uses; or device.FromEnv(), host.New, cuda.Open…
	if err != nil {
		return err
	}
	pool, err := chunk.New(drv, chunk.Config{Size: 2 << 20, Budget: 1 << 30})
	if err != nil {
		return err
	}
	defer pool.Close() // deferred first, so it runs last: after the arenas' Close

	k, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 30})
	if err != nil {
		return err
	}
	defer k.Close()
	v, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 30})
	if err != nil {
		return err
	}
	defer v.Close()

	if err := k.Grow(8 << 20); err != nil {
		return err
	}
	if err := k.Shrink(); err != nil { // k's four chunks go to the pool's cache…
		return err
	}
	if err := v.Grow(8 << 20); err != nil { // …and v maps them, cleared (another tenant): no new memory
		return err
	}
	ps := pool.Stats()
	fmt.Printf("pool: %d chunks in use, %d physical allocations, %d from the cache\n", ps.InUse, ps.Allocs, ps.Hits)
	return nil
}
