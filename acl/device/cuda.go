package device

import (
	"fmt"

	"github.com/vmarena/vmarena/acl"
)

// openCUDA opens CUDA device n. (Replaced by the CUDA binding.)
func openCUDA(n int) (acl.Driver, error) {
	return nil, fmt.Errorf("cuda:%d: %w: the CUDA binding is not built yet", n, acl.ErrNotSupported)
}
