// Package cannpath lists where the bindings of CANN's libraries (the ACL
// runtime in acl/ascend, HCCL in acl/hccl) look for a library, in the order
// CANN's users expect: the library they name, then the toolkit's
// environment, then the default install, then the dynamic loader.
package cannpath

import (
	"os"
	"path/filepath"
)

// DefaultInstall is where the CANN toolkit installs by default; the search
// looks in its lib64.
const DefaultInstall = "/usr/local/Ascend/ascend-toolkit/latest"

// Candidate is one place the search looks.
type Candidate struct {
	Path  string // what to dlopen: a path, or a bare name for the dynamic loader
	Where string // why the search looks there, for messages
}

// Search lists where to look for file (e.g. "libhccl.so"), in order. A
// library the caller names (explicit, from where: a file, or a directory
// holding file; made absolute) is the only candidate. Otherwise the list is
// $ASCEND_HOME_PATH/lib64, $ASCEND_TOOLKIT_HOME/lib64 (each place once),
// DefaultInstall's lib64, and file through the dynamic loader.
func Search(explicit, where, file string) (cands []Candidate, isExplicit bool) {
	if explicit != "" {
		if abs, err := filepath.Abs(explicit); err == nil {
			explicit = abs
		}
		if fi, err := os.Stat(explicit); err == nil && fi.IsDir() {
			explicit = filepath.Join(explicit, file)
		}
		return []Candidate{{explicit, where}}, true
	}
	seen := map[string]bool{}
	add := func(path, where string) {
		if !seen[path] {
			seen[path] = true
			cands = append(cands, Candidate{path, where})
		}
	}
	for _, env := range []string{"ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"} {
		if dir := os.Getenv(env); dir != "" {
			add(filepath.Join(dir, "lib64", file), "$"+env)
		}
	}
	add(filepath.Join(DefaultInstall, "lib64", file), "default install")
	add(file, "dynamic loader: LD_LIBRARY_PATH, ld.so.cache")
	return cands, false
}
