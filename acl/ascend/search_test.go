package ascend

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
)

// The search order CANN users expect: explicit path, then the toolkit's
// environment, then the default install, then the dynamic loader.
func TestSearchPath(t *testing.T) {
	t.Setenv(LibraryEnv, "")
	t.Setenv("ASCEND_HOME_PATH", "/opt/cann/home")
	t.Setenv("ASCEND_TOOLKIT_HOME", "/opt/cann/toolkit")
	cands, explicit := searchPath(Config{})
	assert.False(t, explicit)
	assert.Equal(t, []candidate{
		{"/opt/cann/home/lib64/libascendcl.so", "$ASCEND_HOME_PATH"},
		{"/opt/cann/toolkit/lib64/libascendcl.so", "$ASCEND_TOOLKIT_HOME"},
		{DefaultInstall + "/lib64/libascendcl.so", "default install"},
		{"libascendcl.so", "dynamic loader: LD_LIBRARY_PATH, ld.so.cache"},
	}, cands)

	// set_env.sh usually sets both to the same place: it is tried once.
	t.Setenv("ASCEND_TOOLKIT_HOME", "/opt/cann/home")
	cands, _ = searchPath(Config{})
	assert.Len(t, cands, 3)

	// An explicit library is the only candidate; the config beats the env.
	t.Setenv(LibraryEnv, "/from/env/libascendcl.so")
	cands, explicit = searchPath(Config{})
	assert.True(t, explicit)
	assert.Equal(t, []candidate{{"/from/env/libascendcl.so", "$" + LibraryEnv}}, cands)
	cands, _ = searchPath(Config{Library: "/from/config/libacl_rt.so"})
	assert.Equal(t, []candidate{{"/from/config/libacl_rt.so", "Config.Library"}}, cands)

	// A directory means the libascendcl.so in it; a relative path is made absolute.
	dir := t.TempDir()
	cands, _ = searchPath(Config{Library: dir})
	assert.Equal(t, filepath.Join(dir, "libascendcl.so"), cands[0].path)
	cands, _ = searchPath(Config{Library: "rel/libascendcl.so"})
	assert.True(t, filepath.IsAbs(cands[0].path), cands[0].path)
}
