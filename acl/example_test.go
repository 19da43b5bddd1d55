package acl_test

import (
	"errors"
	"fmt"

	"github.com/vmarena/vmarena/acl"
)

// Driver errors carry the ACL function, code and message, and match the
// sentinel for their class.
func ExampleError() {
	var err error = acl.NewError("aclrtMallocPhysical", 207001, "out of memory")
	wrapped := fmt.Errorf("grow KV cache: %w", err)

	fmt.Println(wrapped)
	fmt.Println(errors.Is(wrapped, acl.ErrOutOfMemory))
	var e *acl.Error
	if errors.As(wrapped, &e) {
		fmt.Println(e.Op, e.Code)
	}
	// Output:
	// grow KV cache: aclrtMallocPhysical: ACL_ERROR_RT_MEMORY_ALLOCATION (207001): out of memory
	// true
	// aclrtMallocPhysical 207001
}
