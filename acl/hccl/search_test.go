package hccl

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/vmarena/vmarena/acl/ascend"
)

// The search order of the ACL binding: explicit path, then the toolkit's
// environment, then the default install, then the dynamic loader.
func TestSearchPath(t *testing.T) {
	t.Setenv(LibraryEnv, "")
	t.Setenv("ASCEND_HOME_PATH", "/opt/cann/home")
	t.Setenv("ASCEND_TOOLKIT_HOME", "/opt/cann/toolkit")
	cands, explicit := searchPath(Config{})
	assert.False(t, explicit)
	assert.Equal(t, []candidate{
		{"/opt/cann/home/lib64/libhccl.so", "$ASCEND_HOME_PATH"},
		{"/opt/cann/toolkit/lib64/libhccl.so", "$ASCEND_TOOLKIT_HOME"},
		{ascend.DefaultInstall + "/lib64/libhccl.so", "default install"},
		{"libhccl.so", "dynamic loader: LD_LIBRARY_PATH, ld.so.cache"},
	}, cands)

	t.Setenv("ASCEND_TOOLKIT_HOME", "/opt/cann/home")
	cands, _ = searchPath(Config{})
	assert.Len(t, cands, 3, "the same place is tried once")

	t.Setenv(LibraryEnv, "/from/env/libhccl.so")
	cands, explicit = searchPath(Config{})
	assert.True(t, explicit)
	assert.Equal(t, []candidate{{"/from/env/libhccl.so", "$" + LibraryEnv}}, cands)
	cands, _ = searchPath(Config{Library: "/from/config/libhccl.so"})
	assert.Equal(t, []candidate{{"/from/config/libhccl.so", "Config.Library"}}, cands)

	dir := t.TempDir()
	cands, _ = searchPath(Config{Library: dir})
	assert.Equal(t, filepath.Join(dir, "libhccl.so"), cands[0].path)
	cands, _ = searchPath(Config{Library: "rel/libhccl.so"})
	assert.True(t, filepath.IsAbs(cands[0].path), cands[0].path)
}
