package arena

import (
	"syscall"
	"testing"

	"example.com/good/acl/cuda"
)

func TestKill(t *testing.T) { _ = syscall.Kill; _ = cuda.New }
