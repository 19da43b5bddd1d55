package device

import (
	"errors"
	"fmt"
	"math"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ascend"
)

// openAscend opens Ascend NPU n through the ACL runtime, found as package
// ascend describes ($VMARENA_ASCEND_LIBRARY, $ASCEND_HOME_PATH, …). Without a
// runtime or an NPU the error wraps acl.ErrNotSupported.
func openAscend(n int) (acl.Driver, error) {
	if n > math.MaxInt32 {
		return nil, fmt.Errorf("ascend:%d: %w: device id out of range", n, acl.ErrInvalidParam)
	}
	d, err := ascend.Open(ascend.Config{Device: int32(n)})
	if err != nil {
		hint := "see docs/ascend.md"
		if errors.Is(err, acl.ErrNotSupported) {
			hint = "set " + ascend.LibraryEnv + " to libascendcl.so (or its directory), or ASCEND_HOME_PATH to " +
				"the CANN toolkit (CANN's set_env.sh sets it); see docs/ascend.md"
		}
		return nil, &openError{spec: fmt.Sprintf("ascend:%d", n), kind: "ascend", err: err, hint: hint}
	}
	return d, nil
}
