package apicheck

import (
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vmarena/vmarena/internal/leakgate"
)

func TestMain(m *testing.M) { leakgate.Main(m) }

var update = flag.Bool("update", false, "rewrite the files under api/ from the code")

const (
	root   = "../.."
	apiDir = root + "/api"
)

// TestAPI: every public package's exported API is the one its file under
// api/ writes down, and every file there belongs to a package.
func TestAPI(t *testing.T) {
	pkgs, err := Load(root, "./...")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) == 0 {
		t.Fatal("no public package found")
	}
	const how = "if the change is meant, run go test ./internal/apicheck -update, commit the files under api/, and say what changed in CHANGELOG.md"
	files := map[string]bool{}
	for _, p := range pkgs {
		name := File(p.Rel)
		files[filepath.ToSlash(name)] = true
		file := filepath.Join(apiDir, filepath.FromSlash(name))
		if *update {
			if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, Format(p), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			t.Errorf("%s: no API file (%v); %s", p.Path, err, how)
			continue
		}
		removed, added := Diff(Parse(data), p.Lines)
		if len(removed)+len(added) == 0 {
			continue
		}
		var b strings.Builder
		for _, l := range removed {
			b.WriteString("\n  - " + l)
		}
		for _, l := range added {
			b.WriteString("\n  + " + l)
		}
		t.Errorf("%s: the API differs from api/%s (- in the file only, + in the code only):%s\n%s", p.Path, name, b.String(), how)
	}
	err = filepath.WalkDir(apiDir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, err := filepath.Rel(apiDir, path)
		if err != nil {
			return err
		}
		if files[filepath.ToSlash(rel)] {
			return nil
		}
		if *update {
			return os.Remove(path)
		}
		t.Errorf("api/%s belongs to no public package; %s", filepath.ToSlash(rel), how)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLines: what a change to each kind of exported name does to the lines.
func TestLines(t *testing.T) {
	const src = `package p

import "context"

const C = 3
const D Kind = 1
var Err error
type Kind int
type S struct {
	A int
	b int
	*E
	inner
}
type E struct{}
func (*E) Close() error { return nil }
type inner struct{}
func (inner) Promoted() {}
func (s S) Value(ctx context.Context, n ...int) (int, error) { return 0, nil }
func (s *S) ptr() {}
type I interface {
	fmt()
	Do(int) bool
}
type G[T ~int | ~int64] struct{ V T }
func New[T ~int | ~int64](v T) *G[T] { return nil }
type Alias = S
func unexported() {}
`
	want := []string{
		"const C untyped int = 3",
		"const D Kind = 1",
		"func New[T ~int | ~int64](T) *G[T]",
		"method (*E) Close() error",
		"method (S) Close() error", // through the embedded pointer
		"method (S) Promoted()",
		"method (S) Value(context.Context, ...int) (int, error)",
		"type Alias = S",
		"type E struct",
		"type G[T ~int | ~int64] struct",
		"type G[T ~int | ~int64] struct, V T",
		"type I interface",
		"type I interface, Do(int) bool",
		"type Kind int",
		"type S struct",
		"type S struct, A int",
		"type S struct, embedded *E",
		"var Err error",
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := (&types.Config{Importer: stdImporter{}}).Check("p", fset, []*ast.File{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := Lines(pkg)
	if !slices.Equal(got, want) {
		removed, added := Diff(want, got)
		t.Errorf("lines differ:\nmissing %q\nextra %q", removed, added)
	}
}

// stdImporter type-checks the one standard package TestLines imports from a
// stub, so that the test needs no export data.
type stdImporter struct{}

func (stdImporter) Import(path string) (*types.Package, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "context.go", "package context\ntype Context interface{ Done() <-chan struct{} }\n", 0)
	if err != nil {
		return nil, err
	}
	return (&types.Config{}).Check(path, fset, []*ast.File{f}, nil)
}
