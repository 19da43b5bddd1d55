// Package boundary holds the module's import rules, the ones
// docs/design.md states under "Layers", as code that can check them: only
// the packages under acl/ talk to the operating system and to the vendor
// libraries, and arena and chunk reach no backend except the default
// driver. Its test checks every Go file of the module against them (go test
// ./internal/boundary, part of go test ./...), and fails with the file, the
// line and the import that breaks one.
//
// The rules, for every Go file of the module outside testdata/:
//
//  1. Bindings: outside acl/, no file imports golang.org/x/sys (any of its
//     packages), github.com/ebitengine/purego, or "C" (cgo). Test files
//     neither: a test that needs the system calls of a driver uses the
//     driver, or lives in acl/.
//  2. syscall: outside acl/, package syscall is imported by test files only
//     (a test signals a child it started, or reads its own thread's CPU
//     time), and by the exceptions Exceptions lists, each with its reason;
//     an exception that no file needs any more is an error too.
//  3. unsafe: outside acl/, unsafe serves only to view memory the program
//     owns as other types (a slice of numbers as bytes for a copy, the size
//     of an element): unsafe.Sizeof, Alignof, Offsetof, Slice, SliceData,
//     String, StringData and Pointer, and no conversion between an
//     unsafe.Pointer and a uintptr, which is how a system call is made and
//     how a pointer escapes the garbage collector's view.
//  4. Backends: the non-test files of chunk/ import, of the module, only acl
//     and the module's internal/ packages; those of arena/ only acl, acl/ipc
//     (the sockets sharing uses), acl/host, chunk, arena's own packages and
//     internal/. acl/host serves one purpose there, the process's default
//     driver (arena.DefaultDriver), so arena names nothing of it but
//     host.Default and the type host.Driver. Every other driver (acl/ascend,
//     acl/cuda, acl/model, acl/device, …) reaches arena only through the
//     selector a program links (acl/device registers it with acl).
//  5. Imports point down: the non-test files of acl/ import nothing of
//     chunk/, arena/, bench/ or examples/, and those of package acl itself
//     nothing of the module at all (drivers import acl, never the reverse);
//     chunk/ imports nothing of arena/, bench/ or examples/; arena/ nothing
//     of bench/ or examples/.
//
// Test files may import any driver (a test picks the one it runs on) and
// may import upwards (acl/host's tests may use arena); rules 1 and 3 hold
// for them as for the rest.
package boundary

import (
	"bufio"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// An Exception allows one import the rules forbid, in the files of one
// directory, for a reason.
type Exception struct {
	Dir    string // slash-separated, relative to the module root
	Import string
	Why    string
}

// Exceptions are the imports allowed against rule 2. Keep it short: each
// entry is a place where code outside acl/ talks to the operating system.
var Exceptions = []Exception{
	{Dir: "bench", Import: "syscall",
		Why: "the benchmark program reads its own CPU time (getrusage, GetProcessTimes) and the id of its caller's OS thread (gettid), which package os does not offer; it is a program, not the library"},
}

// A Violation is an import, or a use of unsafe, that breaks a rule.
type Violation struct {
	Pos  token.Position // file (relative to the module root) and line
	Rule int            // 1 to 5, as in the package doc; 0 for a stale exception
	Msg  string
}

func (v Violation) String() string {
	return fmt.Sprintf("%s:%d: %s (rule %d of internal/boundary)", v.Pos.Filename, v.Pos.Line, v.Msg, v.Rule)
}

// unsafeViews are the functions of unsafe that rule 3 allows outside acl/.
var unsafeViews = []string{"Sizeof", "Alignof", "Offsetof", "Slice", "SliceData", "String", "StringData", "Pointer"}

// Check checks every Go file of the module rooted at root (the directory
// that holds go.mod) and returns what breaks the rules, sorted by file and
// line, and how many files it read. Files under testdata/ and under
// directories whose name starts with "." or "_" are not the module's and
// are not read.
func Check(root string) ([]Violation, int, error) {
	module, err := modulePath(root)
	if err != nil {
		return nil, 0, err
	}
	c := &checker{module: module, used: make([]bool, len(Exceptions))}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := e.Name()
		if e.IsDir() {
			if path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err // a Go file of the module that does not parse is a failure, not a pass
		}
		files++
		c.file(fset, filepath.ToSlash(rel), f)
		return nil
	})
	if err != nil {
		return nil, files, err
	}
	for i, used := range c.used {
		if !used {
			x := Exceptions[i]
			c.add(token.Position{Filename: x.Dir}, 0, "the exception for %q is no longer needed: no file there imports it; drop it from boundary.Exceptions", x.Import)
		}
	}
	sort.SliceStable(c.out, func(i, j int) bool {
		a, b := c.out[i].Pos, c.out[j].Pos
		if a.Filename != b.Filename {
			return a.Filename < b.Filename
		}
		return a.Line < b.Line
	})
	return c.out, files, nil
}

// modulePath reads the module's path from root/go.mod.
func modulePath(root string) (string, error) {
	f, err := os.Open(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(s.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	if err := s.Err(); err != nil {
		return "", err
	}
	return "", errors.New("boundary: go.mod names no module")
}

type checker struct {
	module string
	used   []bool // of Exceptions
	out    []Violation
}

func (c *checker) add(pos token.Position, rule int, format string, args ...any) {
	c.out = append(c.out, Violation{Pos: pos, Rule: rule, Msg: fmt.Sprintf(format, args...)})
}

// under reports whether the slash path p is dir or lies below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// file checks one file; rel is its slash path relative to the module root.
func (c *checker) file(fset *token.FileSet, rel string, f *ast.File) {
	dir := filepath.ToSlash(filepath.Dir(rel))
	test := strings.HasSuffix(rel, "_test.go")
	inACL := under(dir, "acl")
	pos := func(n ast.Node) token.Position {
		p := fset.Position(n.Pos())
		p.Filename = rel
		return p
	}
	var unsafeName, hostName string // the names the file gives those imports
	for _, spec := range f.Imports {
		path, err := strconv.Unquote(spec.Path.Value)
		if err != nil {
			continue // the parser accepted it; it is a string
		}
		local := func(def string) string {
			if spec.Name != nil {
				return spec.Name.Name
			}
			return def
		}
		at := pos(spec)
		if !inACL {
			switch {
			case path == "C":
				c.add(at, 1, `imports "C": cgo belongs in acl/, with the bindings`)
			case under(path, "golang.org/x/sys"), under(path, "github.com/ebitengine/purego"):
				c.add(at, 1, "imports %q: only packages under acl/ may (the operating system and vendor bindings live there)", path)
			case path == "syscall" && !test:
				if i := c.exception(dir, path); i >= 0 {
					c.used[i] = true
				} else {
					c.add(at, 2, `imports "syscall": only packages under acl/, and tests, may`)
				}
			case path == "unsafe":
				unsafeName = local("unsafe")
			}
		}
		mod, ok := c.inModule(path)
		if !ok {
			continue
		}
		if !test {
			if msg := c.backend(dir, mod); msg != "" {
				c.add(at, 4, "imports %q: %s", path, msg)
			}
			if msg := down(dir, mod); msg != "" {
				c.add(at, 5, "imports %q: %s", path, msg)
			}
			if mod == "acl/host" && under(dir, "arena") {
				hostName = local("host")
			}
		}
	}
	if unsafeName == "" && hostName == "" {
		return
	}
	ptrs := pointerNames(f, unsafeName)
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			x, ok := n.X.(*ast.Ident)
			if !ok {
				return true
			}
			switch x.Name {
			case unsafeName:
				if !slices.Contains(unsafeViews, n.Sel.Name) {
					c.add(pos(n), 3, "uses unsafe.%s: outside acl/, unsafe only views memory the program owns (%s)", n.Sel.Name, strings.Join(unsafeViews, ", "))
				}
			case hostName:
				if n.Sel.Name != "Default" && n.Sel.Name != "Driver" {
					c.add(pos(n), 4, "uses host.%s: arena uses acl/host only for the default driver (host.Default, host.Driver)", n.Sel.Name)
				}
			}
		case *ast.CallExpr:
			// uintptr(p) with p an unsafe.Pointer, or unsafe.Pointer(u)
			// with u a uintptr, as far as the file's syntax shows them:
			// p names unsafe or a name declared as an unsafe.Pointer, u
			// names uintptr. (go vet's unsafeptr check covers the second
			// form with types.)
			if unsafeName == "" || len(n.Args) != 1 {
				return true
			}
			if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "uintptr" && (mentions(n.Args[0], unsafeName) || mentionsAny(n.Args[0], ptrs)) {
				c.add(pos(n), 3, "converts an unsafe.Pointer to uintptr: outside acl/, unsafe only views memory the program owns")
			}
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && isIdent(sel.X, unsafeName) && sel.Sel.Name == "Pointer" && mentions(n.Args[0], "uintptr") {
				c.add(pos(n), 3, "converts a uintptr to unsafe.Pointer: outside acl/, unsafe only views memory the program owns")
			}
		}
		return true
	})
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// pointerNames returns the names f declares with the type unsafe.Pointer
// (unsafeName.Pointer): parameters, results, variables, and those := binds
// to an unsafe.Pointer conversion.
func pointerNames(f *ast.File, unsafeName string) map[string]bool {
	names := map[string]bool{}
	if unsafeName == "" {
		return names
	}
	isPtr := func(e ast.Expr) bool {
		sel, ok := e.(*ast.SelectorExpr)
		return ok && isIdent(sel.X, unsafeName) && sel.Sel.Name == "Pointer"
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncType:
			for _, l := range []*ast.FieldList{n.Params, n.Results} {
				if l == nil {
					continue
				}
				for _, fld := range l.List {
					if isPtr(fld.Type) {
						for _, id := range fld.Names {
							names[id.Name] = true
						}
					}
				}
			}
		case *ast.ValueSpec:
			for i, id := range n.Names {
				conv := i < len(n.Values) && isConversion(n.Values[i], isPtr)
				if (n.Type != nil && isPtr(n.Type)) || conv {
					names[id.Name] = true
				}
			}
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE && len(n.Lhs) == len(n.Rhs) {
				for i, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok && isConversion(n.Rhs[i], isPtr) {
						names[id.Name] = true
					}
				}
			}
		}
		return true
	})
	return names
}

func isConversion(e ast.Expr, to func(ast.Expr) bool) bool {
	call, ok := e.(*ast.CallExpr)
	return ok && to(call.Fun)
}

func mentionsAny(e ast.Expr, names map[string]bool) bool {
	for n := range names {
		if mentions(e, n) {
			return true
		}
	}
	return false
}

// mentions reports whether the identifier name appears in e.
func mentions(e ast.Expr, name string) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if isIdent(asExpr(n), name) {
			found = true
		}
		return !found
	})
	return found
}

func asExpr(n ast.Node) ast.Expr {
	e, _ := n.(ast.Expr)
	return e
}

// exception returns the index in Exceptions of the entry that allows path
// in dir, or -1.
func (c *checker) exception(dir, path string) int {
	return slices.IndexFunc(Exceptions, func(x Exception) bool { return x.Dir == dir && x.Import == path })
}

// inModule returns the import path relative to the module ("acl/host"; ""
// for the module's root package), and whether it is in the module.
func (c *checker) inModule(path string) (string, bool) {
	if path == c.module {
		return "", true
	}
	rest, ok := strings.CutPrefix(path, c.module+"/")
	return rest, ok
}

// backend applies rule 4 to a non-test file of dir that imports mod, a
// package of the module; it returns what is wrong, or "".
func (c *checker) backend(dir, mod string) string {
	switch {
	case under(dir, "chunk"):
		if mod == "acl" || under(mod, "chunk") || under(mod, "internal") {
			return ""
		}
		return "chunk/ imports acl (the contract), its own packages and internal/ only, never a driver or anything above it"
	case under(dir, "arena"):
		switch {
		case mod == "acl", mod == "acl/ipc", mod == "acl/host", under(mod, "arena"), under(mod, "chunk"), under(mod, "internal"):
			return ""
		case under(mod, "acl"):
			return "arena/ reaches no backend but the default driver (acl/host); a program links the others (import _ \"…/acl/device\")"
		}
	}
	return ""
}

// down applies rule 5 to a non-test file of dir that imports mod.
func down(dir, mod string) string {
	var above []string
	switch {
	case dir == "acl":
		return "package acl, the contract, imports nothing of the module: the drivers import it"
	case under(dir, "acl"):
		above = []string{"chunk", "arena", "bench", "examples"}
	case under(dir, "chunk"):
		above = []string{"arena", "bench", "examples"}
	case under(dir, "arena"):
		above = []string{"bench", "examples"}
	}
	for _, up := range above {
		if under(mod, up) {
			return fmt.Sprintf("%s/ lies above %s/: imports point down (arena → chunk → acl)", up, strings.SplitN(dir, "/", 2)[0])
		}
	}
	return ""
}
