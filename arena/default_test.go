package arena_test

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
)

// withSelector installs sel (nil: none) as the process's device selector for
// the test, and forgets the default drivers opened meanwhile.
func withSelector(t *testing.T, sel acl.Selector) {
	old := acl.RegisteredSelector()
	acl.RegisterSelector(sel)
	arena.ForgetDefaultDrivers()
	t.Cleanup(func() {
		acl.RegisterSelector(old)
		arena.ForgetDefaultDrivers()
	})
}

// Without the selector linked in, the zero Config gives the host driver for
// unset, auto and host, and refuses every other value, saying how to fix it.
func TestZeroConfigWithoutSelector(t *testing.T) {
	withSelector(t, nil)
	hd, err := host.Default()
	require.NoError(t, err)
	for _, v := range []string{"", "auto", " AUTO ", "host"} {
		t.Setenv(acl.DeviceEnv, v)
		a, err := arena.New(arena.Config{Reserve: 8 << 20})
		require.NoError(t, err, "%q", v)
		assert.True(t, acl.Driver(hd) == a.Driver(), "%q: the process's host driver", v)
		require.NoError(t, a.Close())
	}
	for _, v := range []string{"cuda", "ascend:1", "model:h200", "gpu"} {
		t.Setenv(acl.DeviceEnv, v)
		a, err := arena.New(arena.Config{Reserve: 8 << 20})
		require.Error(t, err, "%q: never a host arena", v)
		assert.Nil(t, a)
		assert.ErrorIs(t, err, acl.ErrNotSupported)
		assert.ErrorContains(t, err, acl.DeviceEnv+"="+strconv.Quote(v))
		assert.ErrorContains(t, err, `import _ "github.com/vmarena/vmarena/acl/device"`)
		assert.ErrorContains(t, err, "Config.Driver")
	}
	// An explicit Driver or Pool does not consult the variable.
	t.Setenv(acl.DeviceEnv, "cuda")
	a, err := arena.New(arena.Config{Driver: hd, Reserve: 8 << 20})
	require.NoError(t, err)
	require.NoError(t, a.Close())
}

// With a selector linked in, the zero Config opens what it names, once per
// process, and fails rather than fall back when it cannot.
func TestZeroConfigWithSelector(t *testing.T) {
	calls := map[string]int{}
	hdev, err := host.New(host.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, hdev.Close()) })
	dev := faultdriver.New(hdev) // stands in for a device
	var fresh *host.Driver       // what auto opens when no device answers
	withSelector(t, func(spec string) (acl.Driver, string, error) {
		calls[spec]++
		switch spec {
		case "cuda:1":
			return dev, "NVIDIA GPU 1 (asked for)", nil
		case "", "auto":
			d, err := host.New(host.Config{})
			fresh = d
			return d, "host driver: no Ascend or CUDA device answered", err
		}
		return nil, "", acl.Errorf("cuInit", acl.ErrCodeRTFeatureNotSupport, "no such library")
	})

	t.Setenv(acl.DeviceEnv, "cuda:1")
	for range 2 {
		a, err := arena.New(arena.Config{Reserve: 8 << 20})
		require.NoError(t, err)
		assert.True(t, acl.Driver(dev) == a.Driver())
		require.NoError(t, a.Close())
	}
	assert.Equal(t, 1, calls["cuda:1"], "opened once, shared")
	_, _, err = dev.GetMemInfo(acl.HBMMem)
	assert.NoError(t, err, "closing the arenas leaves the shared driver open")
	d, err := arena.DefaultDriver()
	require.NoError(t, err)
	assert.True(t, acl.Driver(dev) == d)

	t.Setenv(acl.DeviceEnv, "cuda")
	a, err := arena.New(arena.Config{Reserve: 8 << 20})
	require.Error(t, err, "never a host arena")
	assert.Nil(t, a)
	assert.ErrorIs(t, err, acl.ErrNotSupported)
	assert.ErrorContains(t, err, `VMARENA_DEVICE="cuda"`)

	t.Setenv(acl.DeviceEnv, "")
	a, err = arena.New(arena.Config{Reserve: 8 << 20})
	require.NoError(t, err)
	hd, err := host.Default()
	require.NoError(t, err)
	assert.True(t, acl.Driver(hd) == a.Driver(), "auto with no device: the process's host driver")
	require.NoError(t, a.Close())
	require.NotNil(t, fresh)
	_, _, err = fresh.GetMemInfo(acl.HBMMem)
	assert.Error(t, err, "the selector's own host driver was closed")
}
