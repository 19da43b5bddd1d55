package device

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

func TestParse(t *testing.T) {
	for spec, want := range map[string]struct {
		kind string
		n    int
	}{
		"host": {"host", 0}, "ascend": {"ascend", 0}, "ascend:3": {"ascend", 3},
		"cuda:1": {"cuda", 1}, "auto": {"auto", 0},
	} {
		kind, n, err := parse(spec)
		require.NoError(t, err, spec)
		assert.Equal(t, want.kind, kind, spec)
		assert.Equal(t, want.n, n, spec)
	}
	for _, bad := range []string{"gpu", "ascend:-1", "cuda:x", "auto:1", "host:"} {
		_, err := Open(bad)
		assert.ErrorIs(t, err, acl.ErrInvalidParam, bad)
	}
}

func TestOpenHost(t *testing.T) {
	c, err := Open(" HOST ")
	require.NoError(t, err)
	assert.Equal(t, "host", c.Driver.Name())
	assert.Contains(t, c.Reason, "asked for")
	require.NoError(t, c.Driver.Close())
}

// With no device runtime on the machine, auto falls back to the host driver
// and says why. (On a machine with an NPU or GPU it picks that instead.)
func TestAuto(t *testing.T) {
	t.Setenv(EnvVar, "")
	c, err := FromEnv()
	require.NoError(t, err)
	t.Cleanup(func() { c.Driver.Close() })
	assert.Equal(t, "auto", c.Spec)
	assert.NotEmpty(t, c.Reason)
	if c.Driver.Name() == "host" {
		assert.Contains(t, c.Reason, "no device answered")
	}
}
