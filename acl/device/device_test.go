package device

import (
	"strings"
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
	t.Setenv(acl.DeviceEnv, "")
	c, err := FromEnv()
	require.NoError(t, err)
	t.Cleanup(func() { c.Driver.Close() })
	assert.Equal(t, "auto", c.Spec)
	assert.NotEmpty(t, c.Reason)
	assert.NotContains(t, c.Reason, "\n")
	assert.Less(t, len(c.Reason), 100, "one short line: %q", c.Reason)
	if c.Driver.Name() == "host" {
		assert.Equal(t, "host driver: no Ascend or CUDA device answered", c.Reason)
		require.Error(t, c.Detail, "why each device was passed over")
		assert.Contains(t, c.Detail.Error(), "ascend:0: ")
		assert.Contains(t, c.Detail.Error(), "cuda:0: ")
	}
}

// An explicit device that cannot be opened says which library was looked
// for, the variable that points at it and the page to read, and names the
// device once.
func TestExplicitFailureSaysWhatToDo(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("VMARENA_CUDA_LIBRARY", dir+"/libcuda.so.1")
	t.Setenv("VMARENA_ASCEND_LIBRARY", dir+"/libascendcl.so")
	for spec, want := range map[string][]string{
		"cuda":     {"cuda:0: ", "libcuda.so.1", "VMARENA_CUDA_LIBRARY", "docs/cuda.md"},
		"cuda:1":   {"cuda:1: ", "libcuda.so.1", "VMARENA_CUDA_LIBRARY", "docs/cuda.md"},
		"ascend":   {"ascend:0: ", "libascendcl.so", "VMARENA_ASCEND_LIBRARY", "ASCEND_HOME_PATH", "docs/ascend.md"},
		"ascend:2": {"ascend:2: ", "libascendcl.so", "VMARENA_ASCEND_LIBRARY", "docs/ascend.md"},
	} {
		c, err := Open(spec)
		require.Error(t, err, spec)
		assert.Nil(t, c.Driver, "never another driver")
		assert.ErrorIs(t, err, acl.ErrNotSupported, spec)
		msg := err.Error()
		assert.True(t, strings.HasPrefix(msg, want[0]), "%s: %q", spec, msg)
		for _, w := range want[1:] {
			assert.Contains(t, msg, w, spec)
		}
		for _, rep := range []string{"cuda:0: cuda:", "cuda:1: cuda:", "ascend:0: ascend", "ascend:2: ascend"} {
			assert.NotContains(t, msg, rep, "a repeated prefix")
		}
	}
}

// Importing the package registers its Open as the process's selector, which
// the zero arena.Config consults.
func TestRegistersSelector(t *testing.T) {
	sel := acl.RegisteredSelector()
	require.NotNil(t, sel)
	d, reason, err := sel("host")
	require.NoError(t, err)
	assert.Equal(t, "host", d.Name())
	assert.Contains(t, reason, "asked for")
	require.NoError(t, d.Close())
	_, _, err = sel("gpu")
	assert.ErrorIs(t, err, acl.ErrInvalidParam)
}
