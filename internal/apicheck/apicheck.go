// Package apicheck writes down the module's exported API, one file per
// package, as the Go project keeps its api/ directory: one line per exported
// name (constant, variable, function, type, field, method) with its
// signature, sorted. Its test compares the API of every public package (not a
// command, nothing under an internal/ directory) with the files under api/
// at the module root and fails, naming each line added or removed, when they
// differ; go test ./internal/apicheck -update rewrites the files.
//
// The API is read from the compiler's export data (go list -export), for
// linux/amd64 with cgo off, so that the files do not depend on the machine
// that writes them.
package apicheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
)

// Env is the build environment the API is read for.
var Env = []string{"GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=0"}

// A Package is the API of one package.
type Package struct {
	Path  string   // import path
	Rel   string   // path relative to the module root ("" for the root)
	Lines []string // sorted
}

type listed struct {
	ImportPath string
	Name       string
	Export     string
	Module     *struct{ Path string }
	DepOnly    bool
	Error      *struct{ Err string }
}

// Load lists the packages that patterns (go list patterns) name, run in dir,
// and returns the API of each public one, sorted by import path.
func Load(dir string, patterns ...string) ([]Package, error) {
	args := append([]string{"list", "-export", "-deps", "-json=ImportPath,Name,Export,Module,DepOnly,Error"}, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), Env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v\n%s", err, stderr.Bytes())
	}
	exports := map[string]string{}
	var roots []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %v", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		exports[p.ImportPath] = p.Export
		if !p.DepOnly && p.Name != "main" && !internal(p.ImportPath) {
			roots = append(roots, p)
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	var pkgs []Package
	for _, r := range roots {
		tp, err := imp.Import(r.ImportPath)
		if err != nil {
			return nil, err
		}
		rel := ""
		if r.Module != nil {
			rel = strings.TrimPrefix(strings.TrimPrefix(r.ImportPath, r.Module.Path), "/")
		}
		pkgs = append(pkgs, Package{Path: r.ImportPath, Rel: rel, Lines: Lines(tp)})
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Path < pkgs[j].Path })
	return pkgs, nil
}

// internal reports whether an import path has an internal element.
func internal(p string) bool {
	for _, e := range strings.Split(p, "/") {
		if e == "internal" {
			return true
		}
	}
	return false
}

// File is the name of the file, relative to the api/ directory, that holds
// the API of the package at rel.
func File(rel string) string {
	if rel == "" {
		return "root.txt"
	}
	return rel + ".txt"
}

// Lines returns the exported API of pkg, one sorted line per name.
func Lines(pkg *types.Package) []string {
	qual := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Name()
	}
	str := func(t types.Type) string { return types.TypeString(t, qual) }
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Const:
			add("const %s %s = %s", name, str(obj.Type()), obj.Val().ExactString())
		case *types.Var:
			add("var %s %s", name, str(obj.Type()))
		case *types.Func:
			sig := obj.Type().(*types.Signature)
			add("func %s%s%s", name, typeParams(sig.TypeParams(), str), signature(sig, str))
		case *types.TypeName:
			typeLines(obj, str, add)
		}
	}
	sort.Strings(lines)
	return lines
}

func typeLines(obj *types.TypeName, str func(types.Type) string, add func(string, ...any)) {
	name := obj.Name()
	if obj.IsAlias() {
		add("type %s = %s", name, str(types.Unalias(obj.Type())))
		return
	}
	named, ok := obj.Type().(*types.Named)
	if !ok {
		add("type %s %s", name, str(obj.Type()))
		return
	}
	head := name + typeParams(named.TypeParams(), str)
	switch u := named.Underlying().(type) {
	case *types.Struct:
		add("type %s struct", head)
		for i := 0; i < u.NumFields(); i++ {
			f := u.Field(i)
			switch {
			case f.Embedded() && (f.Exported() || exportedType(f.Type())):
				add("type %s struct, embedded %s", head, str(f.Type()))
			case f.Exported():
				add("type %s struct, %s %s", head, f.Name(), str(f.Type()))
			}
		}
	case *types.Interface:
		add("type %s interface", head)
		for i := 0; i < u.NumEmbeddeds(); i++ {
			add("type %s interface, embedded %s", head, str(u.EmbeddedType(i)))
		}
		for i := 0; i < u.NumExplicitMethods(); i++ {
			m := u.ExplicitMethod(i)
			if m.Exported() {
				add("type %s interface, %s%s", head, m.Name(), signature(m.Type().(*types.Signature), str))
			}
		}
		return // an interface's methods are its lines
	default:
		add("type %s %s", head, str(u))
	}
	// The method set of *T: what a caller can call, promoted methods included.
	ms := types.NewMethodSet(types.NewPointer(named))
	values := types.NewMethodSet(named)
	for i := 0; i < ms.Len(); i++ {
		sel := ms.At(i)
		m := sel.Obj().(*types.Func)
		if !m.Exported() {
			continue
		}
		recv := "*" + head
		if values.Lookup(m.Pkg(), m.Name()) != nil {
			recv = head // in the method set of T too
		}
		add("method (%s) %s%s", recv, m.Name(), signature(m.Type().(*types.Signature), str))
	}
}

// exportedType reports whether t (or what it points to) is a named type
// whose name is exported.
func exportedType(t types.Type) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := types.Unalias(t).(*types.Named)
	return ok && n.Obj().Exported()
}

func typeParams(tps *types.TypeParamList, str func(types.Type) string) string {
	if tps.Len() == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteByte('[')
	for i := 0; i < tps.Len(); i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		tp := tps.At(i)
		b.WriteString(tp.Obj().Name() + " " + str(tp.Constraint()))
	}
	b.WriteByte(']')
	return b.String()
}

// signature writes a function's parameters and results by type alone: a
// parameter's name is not part of the API.
func signature(sig *types.Signature, str func(types.Type) string) string {
	tuple := func(t *types.Tuple, variadic bool) string {
		var parts []string
		for i := 0; i < t.Len(); i++ {
			ty := t.At(i).Type()
			if variadic && i == t.Len()-1 {
				parts = append(parts, "..."+str(ty.(*types.Slice).Elem()))
				continue
			}
			parts = append(parts, str(ty))
		}
		return strings.Join(parts, ", ")
	}
	s := "(" + tuple(sig.Params(), sig.Variadic()) + ")"
	switch r := sig.Results(); r.Len() {
	case 0:
	case 1:
		s += " " + tuple(r, false)
	default:
		s += " (" + tuple(r, false) + ")"
	}
	return s
}

// Diff returns the lines of want missing from got (removed) and those of got
// missing from want (added); both inputs are sorted.
func Diff(want, got []string) (removed, added []string) {
	w := map[string]bool{}
	for _, l := range want {
		w[l] = true
	}
	g := map[string]bool{}
	for _, l := range got {
		g[l] = true
		if !w[l] {
			added = append(added, l)
		}
	}
	for _, l := range want {
		if !g[l] {
			removed = append(removed, l)
		}
	}
	return removed, added
}

// Parse reads a file written by Format.
func Parse(data []byte) []string {
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// Format returns the contents of a package's API file.
func Format(p Package) []byte {
	var b bytes.Buffer
	for _, l := range p.Lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}
