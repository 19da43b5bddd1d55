//go:build linux && (amd64 || arm64)

package hccl_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/hccl"
)

// An Open whose library loads but lacks a required call leaves nothing
// loaded.
func TestFailedOpenUnloads(t *testing.T) {
	bad := doubles.Instance(t, "nocomm", "libhccl.so")
	_, err := hccl.Open(hccl.Config{Library: bad})
	require.ErrorIs(t, err, acl.ErrNotSupported)
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	require.False(t, strings.Contains(string(maps), bad), "a failed Open left %s loaded", bad)
}
