package boundary

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/vmarena/vmarena/internal/leakgate"
)

func TestMain(m *testing.M) { leakgate.Main(m) }

// TestModule checks the module's own files: the boundary of docs/design.md,
// "Layers", held by code.
func TestModule(t *testing.T) {
	vs, files, err := Check("../..")
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read %d Go files: the walk missed the module", files)
	}
	for _, v := range vs {
		t.Error(v)
	}
	t.Logf("%d Go files hold the boundary", files)
}

// TestGood is a small module that uses everything the rules allow: acl/
// talks to the system, arena names the default host driver and views a
// slice as bytes, a test uses syscall and a driver, and bench has its
// exception.
func TestGood(t *testing.T) {
	vs, files, err := Check("testdata/good")
	if err != nil {
		t.Fatal(err)
	}
	if files != 7 {
		t.Fatalf("read %d files, want 7", files)
	}
	for _, v := range vs {
		t.Error(v)
	}
}

// TestBad is a module that breaks every rule; each break is reported at
// its file and line, and nothing else is.
func TestBad(t *testing.T) {
	vs, _, err := Check("testdata/bad")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range vs {
		got = append(got, fmt.Sprintf("%s:%d rule %d", v.Pos.Filename, v.Pos.Line, v.Rule))
		if !strings.Contains(v.String(), v.Pos.Filename) || v.Msg == "" {
			t.Errorf("%q does not say where and what", v)
		}
	}
	want := []string{
		"acl/acl.go:3 rule 5",                    // package acl imports the module
		"acl/host/host.go:3 rule 5",              // a driver imports chunk
		"arena/arena.go:4 rule 2",                // syscall
		"arena/arena.go:7 rule 4",                // acl/cuda
		"arena/arena.go:9 rule 1",                // x/sys/unix
		"arena/arena.go:12 rule 4",               // host.New
		"arena/arena.go:14 rule 3",               // u.Add
		"arena/arena.go:16 rule 3",               // uintptr(p), p declared an unsafe.Pointer
		"arena/arena.go:16 rule 3",               // uintptr(u.Pointer(&p))
		"arena/arena.go:18 rule 3",               // u.Pointer(uintptr(a))
		"arena/metrics/metrics.go:4 rule 1",      // cgo
		"arena/metrics/metrics.go:6 rule 1",      // purego
		"arena/metrics/metrics_test.go:3 rule 1", // tests too
		"bench:0 rule 0",                         // the exception no file needs here
		"chunk/chunk.go:4 rule 4",                // a driver
		"chunk/chunk.go:5 rule 4",                // arena: not acl or chunk's own
		"chunk/chunk.go:5 rule 5",                // and above chunk
		"examples/x/main.go:3 rule 2",            // a program outside the exceptions
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("violations:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}
