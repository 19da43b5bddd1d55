//go:build linux && (amd64 || arm64)

package cuda_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/cuda"
	"github.com/vmarena/vmarena/acl/device"
)

// VMARENA_DEVICE=cuda, cuda:N and auto reach the CUDA binding.
func TestDeviceSelector(t *testing.T) {
	path, set, requireClean := cuda.NewFakeLibrary(t)
	set("devices", 2)
	t.Setenv(cuda.LibraryEnv, path)
	for spec, want := range map[string]string{"cuda": "cuda:0", "cuda:1": "cuda:1", "CUDA:0": "cuda:0", "auto": "cuda:0"} {
		c, err := device.Open(spec)
		require.NoError(t, err, spec)
		require.Equal(t, want, c.Driver.Name(), spec)
		require.NotEmpty(t, c.Reason)
		require.NoError(t, c.Driver.Close())
	}
	_, err := device.Open("cuda:2")
	require.ErrorIs(t, err, acl.ErrNoDevice)
	requireClean(t)
}

// Without a CUDA driver, cuda is an error that says why and auto falls back
// to the host driver.
func TestDeviceSelectorNoDriver(t *testing.T) {
	missing := t.TempDir() + "/libcuda.so.1"
	t.Setenv(cuda.LibraryEnv, missing)
	_, err := device.Open("cuda")
	require.ErrorIs(t, err, acl.ErrNotSupported)
	require.ErrorContains(t, err, missing)
	c, err := device.Open("auto")
	require.NoError(t, err)
	defer c.Driver.Close()
	require.Equal(t, "host", c.Driver.Name())
	require.NotContains(t, c.Reason, missing, "the reason is one short line")
	require.ErrorContains(t, c.Detail, missing, "the details are kept")
}
