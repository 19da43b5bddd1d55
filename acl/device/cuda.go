package device

import (
	"errors"
	"fmt"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/cuda"
)

// openCUDA opens CUDA device n through the CUDA driver library
// (libcuda.so.1, or $VMARENA_CUDA_LIBRARY).
func openCUDA(n int) (acl.Driver, error) {
	d, err := cuda.Open(cuda.Config{Device: n})
	if err != nil {
		hint := "see docs/cuda.md"
		if errors.Is(err, acl.ErrNotSupported) {
			hint = "set " + cuda.LibraryEnv + " to the CUDA driver library (" + cuda.DefaultLibrary +
				", installed with the NVIDIA driver; not the toolkit's stub); see docs/cuda.md"
		}
		return nil, &openError{spec: fmt.Sprintf("cuda:%d", n), kind: "cuda", err: err, hint: hint}
	}
	return d, nil
}
