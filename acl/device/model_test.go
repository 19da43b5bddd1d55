package device

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/model"
)

func TestOpenModel(t *testing.T) {
	for _, spec := range []string{"model:h200", " Model:a100 "} {
		c, err := Open(spec)
		require.NoError(t, err, spec)
		assert.Contains(t, []string{"model:h200", "model:a100"}, c.Driver.Name())
		assert.Contains(t, c.Reason, "times are modelled, not measured")
		require.NoError(t, c.Driver.Close())
	}

	p, err := model.LoadProfile("h200")
	require.NoError(t, err)
	p.Name = "Mine"
	path := filepath.Join(t.TempDir(), "Profile.json") // the path's case is kept
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, p.WriteJSON(f))
	require.NoError(t, f.Close())
	t.Setenv(acl.DeviceEnv, "model:"+path)
	c, err := FromEnv()
	require.NoError(t, err)
	assert.Equal(t, "model:Mine", c.Driver.Name())
	require.NoError(t, c.Driver.Close())

	c, err = Open("model:h200, NoData")
	require.NoError(t, err)
	assert.Contains(t, c.Reason, "nodata")
	assert.Equal(t, "model:h200, NoData", c.Spec)
	_, _, err = c.Driver.GetMemInfo(acl.HBMMem)
	require.NoError(t, err)
	require.NoError(t, c.Driver.Close())
	c, err = Open("model:a100,data,untimed")
	require.NoError(t, err)
	assert.NotContains(t, c.Reason, "nodata")
	assert.Contains(t, c.Reason, "untimed")
	require.NoError(t, c.Driver.Close())

	for _, bad := range []string{"model", "model:", "model:v100", "model:/nonexistent/p.json", "model:h200,fast", "model:,nodata"} {
		_, err := Open(bad)
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "model:", bad)
	}
	_, err = Open("model:")
	assert.ErrorIs(t, err, acl.ErrInvalidParam)
	assert.Contains(t, err.Error(), "h200")
	_, err = Open("gpu")
	assert.Contains(t, err.Error(), "model:NAME")
	_, err = Open("model:h200,fast")
	assert.ErrorIs(t, err, acl.ErrInvalidParam)
	assert.Contains(t, err.Error(), `unknown model option "fast" (want data, nodata, untimed, pessimistic)`)
}
