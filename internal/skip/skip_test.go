package skip

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// root is the module, from this package's directory.
const root = "../.."

// TestOnlyThisPackageSkips fails on every call of a method named Skip,
// Skipf or SkipNow in the module's Go files outside this package (and
// outside testdata, which holds fixtures of wrong code on purpose): a skip
// goes through a helper here, which tags its reason.
func TestOnlyThisPackageSkips(t *testing.T) {
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			abs, err := filepath.Abs(path)
			if err != nil {
				return err
			}
			name := e.Name()
			if abs == self || name == "testdata" || (path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err // a Go file we ship that does not parse is a failure too
		}
		files++
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
				switch sel.Sel.Name {
				case "Skip", "Skipf", "SkipNow":
					t.Errorf("%s: %s skips without a reason tag: use internal/skip (NoDevice, Unsupported, IfShort, ByFlag, NoGCC), or fail",
						fset.Position(call.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("only %d Go files found under %s: is the walk looking at the module?", files, root)
	}
}

// recorder stands in for a test: it records what a helper did to it.
type recorder struct {
	testing.TB
	skipped, fatal string
}

type stop struct{}

func (r *recorder) Helper() {}
func (r *recorder) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	panic(stop{})
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	panic(stop{})
}

// run calls fn on a recorder, stopping where a skip or failure would end the
// test.
func run(fn func(t testing.TB)) (r *recorder) {
	r = &recorder{}
	defer func() {
		if v := recover(); v != nil {
			if _, ok := v.(stop); !ok {
				panic(v)
			}
		}
	}()
	fn(r)
	return r
}

func TestHelpersTagTheirReason(t *testing.T) {
	t.Setenv(CIEnv, "")
	for _, tc := range []struct {
		fn     func(t testing.TB)
		reason Reason
		why    string
	}{
		{func(t testing.TB) { NoDevice(t, "no NPU: %v", "absent") }, Device, "no NPU: absent"},
		{func(t testing.TB) { Unsupported(t, "darwin") }, Platform, "darwin"},
		{func(t testing.TB) { ByFlag(t, "-trace") }, Flag, "-trace"},
		{func(t testing.TB) { NoGCC(t, errors.New("no gcc")) }, GCC, "no gcc"},
	} {
		r := run(tc.fn)
		reason, why, ok := Parse("    x_test.go:12: " + r.skipped + "\n")
		if !ok || reason != tc.reason || strings.TrimSpace(why) != tc.why {
			t.Errorf("skipped with %q: parsed as %q, %q, %v; want %q, %q", r.skipped, reason, why, ok, tc.reason, tc.why)
		}
		if !Allowed(reason, false) {
			t.Errorf("%s is not allowed outside CI", reason)
		}
	}
	if r := run(func(t testing.TB) { IfShort(t, "long") }); testing.Short() != (r.skipped != "") {
		t.Errorf("IfShort under -short=%v skipped: %q", testing.Short(), r.skipped)
	}
}

func TestNoGCCFailsInCI(t *testing.T) {
	t.Setenv(CIEnv, "true")
	r := run(func(t testing.TB) { NoGCC(t, errors.New("no gcc")) })
	if r.skipped != "" || !strings.Contains(r.fatal, "no gcc") {
		t.Errorf("under CI=true NoGCC skipped %q, failed %q; want a failure", r.skipped, r.fatal)
	}
	if Allowed(GCC, true) || !Allowed(GCC, false) || !Allowed(Device, true) {
		t.Error("Allowed: gcc is allowed only outside CI; device everywhere")
	}
	for _, bad := range []string{"", "skip[maybe]: ", "skipped: no double"} {
		if r, _, ok := Parse(bad); ok && Allowed(r, false) {
			t.Errorf("Parse(%q) gave an allowed reason %q", bad, r)
		}
	}
}

func TestCC(t *testing.T) {
	t.Setenv("CC", "vmarena-no-such-compiler")
	cc, err := CC()
	if cc != "vmarena-no-such-compiler" || err == nil || !strings.Contains(err.Error(), "vmarena-no-such-compiler") {
		t.Errorf("CC() = %q, %v; want the missing $CC named", cc, err)
	}
}
