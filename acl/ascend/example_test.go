package ascend_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/arena"
)

// An arena on NPU 0. Without an NPU, Open fails with an error matching
// acl.ErrNotSupported. (No Output: it needs an NPU, so it is compiled, not run.)
func ExampleOpen() {
	d, err := ascend.Open(ascend.Config{Device: 0})
	if errors.Is(err, acl.ErrNotSupported) {
		log.Printf("no Ascend NPU here: %v", err)
		return
	}
	if err != nil {
		log.Fatal(err) // a runtime is installed but does not work
	}
	defer d.Close()
	fmt.Println(d.Name(), d.SocName())

	a, err := arena.New(arena.Config{Driver: d, Reserve: 8 << 30})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	buf, err := a.Alloc(64<<20, 512) // HBM, mapped on demand; the address never moves
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(buf.Ptr())
}
