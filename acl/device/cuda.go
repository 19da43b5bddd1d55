package device

import (
	"fmt"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/cuda"
)

// openCUDA opens CUDA device n through the CUDA driver library
// (libcuda.so.1, or $VMARENA_CUDA_LIB).
func openCUDA(n int) (acl.Driver, error) {
	d, err := cuda.Open(cuda.Config{Device: n})
	if err != nil {
		return nil, fmt.Errorf("cuda:%d: %w", n, err)
	}
	return d, nil
}
