package faultdriver_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
)

// A Grow whose third chunk fails to map rolls back: the arena and the
// driver are as they were.
func Example() {
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer hd.Close()
	fd := faultdriver.New(hd)
	a, err := arena.New(arena.Config{Driver: fd, Reserve: 16 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	fd.FailNth(faultdriver.MapMem, 3, acl.ErrCodeRTMemoryAllocation)
	err = a.Grow(8 << 20)
	fmt.Println("out of memory:", errors.Is(err, arena.ErrOutOfMemory))
	fmt.Println("cap:", a.Cap(), "mappings:", fd.Live().Mappings, "injected:", fd.Injected(faultdriver.Any))
	fmt.Println("retry:", a.Grow(8<<20), "cap:", a.Cap())
	// Output:
	// out of memory: true
	// cap: 0 mappings: 0 injected: 1
	// retry: <nil> cap: 8388608
}
