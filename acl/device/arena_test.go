package device_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	_ "github.com/vmarena/vmarena/acl/device" // registers the selector the zero arena.Config uses
	"github.com/vmarena/vmarena/arena"
)

// A program that links the selector gets, from the zero arena.Config, the
// device $VMARENA_DEVICE names, or an error that says what to do; never the
// host driver in place of a device it asked for.
func TestZeroArenaConfigFollowsDeviceEnv(t *testing.T) {
	t.Setenv("VMARENA_CUDA_LIBRARY", t.TempDir()+"/libcuda.so.1")
	t.Setenv(acl.DeviceEnv, "cuda")
	a, err := arena.New(arena.Config{Reserve: 8 << 20})
	require.Error(t, err)
	assert.Nil(t, a)
	assert.ErrorIs(t, err, acl.ErrNotSupported)
	for _, s := range []string{`VMARENA_DEVICE="cuda"`, "cuda:0: load", "VMARENA_CUDA_LIBRARY", "docs/cuda.md"} {
		assert.ErrorContains(t, err, s)
	}

	t.Setenv(acl.DeviceEnv, "model:h200")
	a, err = arena.New(arena.Config{Reserve: 8 << 20})
	require.NoError(t, err)
	assert.Contains(t, a.Driver().Name(), "model")
	require.NoError(t, a.Grow(1))
	require.NoError(t, a.Close())

	t.Setenv(acl.DeviceEnv, "host")
	a, err = arena.New(arena.Config{Reserve: 8 << 20})
	require.NoError(t, err)
	assert.Equal(t, "host", a.Driver().Name())
	require.NoError(t, a.Close())
}
