package leakgate

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestEveryPackageIsGated: every package of the module that has tests runs
// them through the gate — its TestMain calls leakgate.Main or Run, or, when
// its tests import arena (and so may use the default driver), arenagate's.
func TestEveryPackageIsGated(t *testing.T) {
	const root = "../.."
	type pkg struct {
		tests, arena bool
		gate         string // the gate TestMain calls: "leakgate", "arenagate", or ""
	}
	pkgs := map[string]*pkg{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if path != root && (e.Name() == "testdata" || strings.HasPrefix(e.Name(), ".") || strings.HasPrefix(e.Name(), "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		p := pkgs[dir]
		if p == nil {
			p = &pkg{}
			pkgs[dir] = p
		}
		p.tests = true
		for _, spec := range f.Imports {
			if path, _ := strconv.Unquote(spec.Path.Value); path == "github.com/vmarena/vmarena/arena" {
				p.arena = true
			}
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Name.Name != "TestMain" {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok || (sel.Sel.Name != "Main" && sel.Sel.Name != "Run") {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); ok && (x.Name == "leakgate" || x.Name == "arenagate") {
					p.gate = x.Name
				}
				return true
			})
			if p.gate == "" && strings.HasSuffix(dir, "internal/leakgate") {
				p.gate = "leakgate" // this package: Main(m) is its own
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 30 {
		t.Fatalf("found %d test packages: the walk missed the module", len(pkgs))
	}
	for dir, p := range pkgs {
		switch {
		case p.gate == "":
			t.Errorf("%s: its tests do not run through the leak gate: add a TestMain that calls leakgate.Main(m) (arenagate.Main(m) if they use arenas)", dir)
		case p.arena && p.gate != "arenagate":
			t.Errorf("%s: its tests use arenas, so the default driver may hold what they left: gate them with arenagate", dir)
		}
	}
}
