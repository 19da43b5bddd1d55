package device

import (
	"fmt"

	"github.com/vmarena/vmarena/acl"
)

// openAscend opens Ascend device n. (Replaced by the ACL binding.)
func openAscend(n int) (acl.Driver, error) {
	return nil, fmt.Errorf("ascend:%d: %w: the ACL binding is not built yet", n, acl.ErrNotSupported)
}
