// Package cdouble builds the C test doubles of the library bindings (the
// HCCL and NCCL doubles, and the ACL and CUDA doubles they run beside) with
// the C compiler, once per test binary, and gives each test a fresh
// instance: a copy under a new path, which dlopen loads as a library of its
// own, with state of its own.
//
// The policy it keeps is internal/skip's: a machine without a C compiler
// skips the tests that need a double, saying why (a failure under CI=true);
// a double that does not build fails them. Call Build from TestMain, before
// any test runs: a test binary that forks the compiler while its tests run
// can deadlock under emulation (qemu-user).
package cdouble

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/internal/skip"
)

// Lib is one library to build: a name for it, its C source (relative to the
// test's package directory) and compiler flags beyond the common ones.
type Lib struct {
	Name  string
	Src   string
	Flags []string
}

// Set is the libraries of one test binary, built together on first use.
type Set struct {
	Libs []Lib

	once  sync.Once
	dir   string
	noCC  error // why there is no C compiler
	err   error // why the build failed
	paths map[string]string
}

// build compiles every library with $CC (else gcc), warnings as errors.
func (s *Set) build() {
	cc, err := skip.CC()
	if err != nil {
		s.noCC = err
		return
	}
	dir, err := os.MkdirTemp("", "vmarena-cdouble-")
	if err != nil {
		s.err = err
		return
	}
	s.dir, s.paths = dir, map[string]string{}
	for _, l := range s.Libs {
		out := filepath.Join(dir, l.Name+".so")
		args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", out, l.Src}, l.Flags...)
		if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
			s.err = fmt.Errorf("building %s (%s) with %s: %v\n%s", l.Name, l.Src, cc, err, b)
			return
		}
		s.paths[l.Name] = out
	}
}

// Build compiles the set, once; TestMain calls it before the tests run.
// What it found is reported to each test by Path.
func (s *Set) Build() { s.once.Do(s.build) }

// Path returns where the library named name was built, building the set if
// Build was not called. Without a C compiler it skips t (skip.NoGCC: a
// failure under CI=true); when the build failed, it fails t.
func (s *Set) Path(t testing.TB, name string) string {
	t.Helper()
	s.Build()
	if s.noCC != nil {
		skip.NoGCC(t, s.noCC)
	}
	require.NoError(t, s.err, "the test doubles must build")
	p, ok := s.paths[name]
	require.True(t, ok, "no library %q in the set", name)
	return p
}

// Remove deletes what the set built; TestMain calls it after the tests.
func (s *Set) Remove() {
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// Instance copies the library named name to file in a new folder of t's,
// and returns its path: loaded from there, it is a fresh instance.
func (s *Set) Instance(t testing.TB, name, file string) string {
	t.Helper()
	src := s.Path(t, name)
	dst := filepath.Join(t.TempDir(), file)
	in, err := os.Open(src)
	require.NoError(t, err)
	defer in.Close()
	out, err := os.Create(dst)
	require.NoError(t, err)
	_, err = io.Copy(out, in)
	require.NoError(t, errors.Join(err, out.Close()))
	return dst
}

// Exported lists the functions the library at path defines and exports whose
// names start with prefix, read from its dynamic symbol table.
func Exported(t testing.TB, path, prefix string) []string {
	t.Helper()
	f, err := elf.Open(path)
	require.NoError(t, err)
	defer f.Close()
	syms, err := f.DynamicSymbols()
	require.NoError(t, err)
	var names []string
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF && strings.HasPrefix(s.Name, prefix) {
			names = append(names, s.Name)
		}
	}
	return names
}
