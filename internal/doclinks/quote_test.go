package doclinks

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A page may show Go code as a quote of a file of the repository: a line
//
//	<!-- quote examples/serve/main.go newPool server.admit -->
//
// right before a ```go block says that the block is those top-level
// declarations of that file (a function or type by its name, a method as
// Type.Method, a var or const by any name its group declares), each with
// its doc comment, byte for byte, in that order, one blank line apart.
// TestQuotes holds every such block to its file, so that the page cannot
// drift from the code it shows; go test ./internal/doclinks -run TestQuotes
// -update copies the declarations into the blocks.
var quoteMarker = regexp.MustCompile(`^<!-- quote (\S+)((?: [\w.]+)+) -->$`)

// quotedPages are the pages whose every ```go block must be a quote: their
// code is a program's, and the program's test runs it.
var quotedPages = []string{"docs/serving.md"}

var update = flag.Bool("update", false, "TestQuotes: copy the quoted declarations into the pages' blocks")

// A quote is one marker and the block after it.
type quote struct {
	line  int // of the marker, from 1; the block's lines follow its fence
	file  string
	names []string
	block string // the block's lines, each ending in a newline
}

// quotes returns a page's quotes, and a problem for each ```go block
// without a marker when every block must be one, or a marker with no block.
func quotes(text string, every bool) (qs []quote, problems []string) {
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		m := quoteMarker.FindStringSubmatch(lines[i])
		isGo := strings.TrimSpace(lines[i]) == "```go"
		switch {
		case m != nil:
			if i+1 >= len(lines) || strings.TrimSpace(lines[i+1]) != "```go" {
				problems = append(problems, fmt.Sprintf("line %d: a quote marker not followed by a ```go block", i+1))
				continue
			}
			q := quote{line: i + 1, file: m[1], names: strings.Fields(m[2])}
			j := i + 2
			for ; j < len(lines) && !fence.MatchString(lines[j]); j++ {
				q.block += lines[j] + "\n"
			}
			if j == len(lines) {
				problems = append(problems, fmt.Sprintf("line %d: the ```go block is not closed", i+2))
			}
			qs = append(qs, q)
			i = j
		case isGo && every:
			problems = append(problems, fmt.Sprintf("line %d: a ```go block that quotes no file (put <!-- quote FILE NAME… --> before it)", i+1))
			fallthrough
		case fence.MatchString(lines[i]):
			for i++; i < len(lines) && !fence.MatchString(lines[i]); i++ {
			}
		}
	}
	return qs, problems
}

// declarations returns the source of the named top-level declarations of
// a Go file, with their doc comments, one blank line apart.
func declarations(src []byte, names []string) (string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", src, parser.ParseComments)
	if err != nil {
		return "", err
	}
	text := func(doc *ast.CommentGroup, n ast.Node) string {
		start := n.Pos()
		if doc != nil {
			start = doc.Pos()
		}
		return string(src[fset.Position(start).Offset:fset.Position(n.End()).Offset])
	}
	found := map[string]string{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			name := d.Name.Name
			if d.Recv != nil && len(d.Recv.List) == 1 {
				typ := d.Recv.List[0].Type
				if s, ok := typ.(*ast.StarExpr); ok {
					typ = s.X
				}
				if id, ok := typ.(*ast.Ident); ok {
					name = id.Name + "." + name
				}
			}
			found[name] = text(d.Doc, d)
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					found[s.Name.Name] = text(d.Doc, d)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						found[n.Name] = text(d.Doc, d)
					}
				}
			}
		}
	}
	var out []string
	for _, n := range names {
		s, ok := found[n]
		if !ok {
			return "", fmt.Errorf("no top-level declaration %s", n)
		}
		out = append(out, s)
	}
	return strings.Join(out, "\n\n") + "\n", nil
}

func TestQuoteParsing(t *testing.T) {
	page := "text\n<!-- quote a.go f T.m -->\n```go\nfunc f() {}\n```\n```sh\necho\n```\n```go\nx\n```\n<!-- quote a.go g -->\ntext\n"
	qs, problems := quotes(page, true)
	if len(qs) != 1 || qs[0].file != "a.go" || strings.Join(qs[0].names, ",") != "f,T.m" || qs[0].block != "func f() {}\n" || qs[0].line != 2 {
		t.Errorf("quotes = %+v", qs)
	}
	want := []string{
		"line 9: a ```go block that quotes no file (put <!-- quote FILE NAME… --> before it)",
		"line 12: a quote marker not followed by a ```go block",
	}
	if strings.Join(problems, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(problems, "\n"), strings.Join(want, "\n"))
	}
	if _, problems := quotes(page, false); len(problems) != 1 {
		t.Errorf("a page that need not quote every block: %q", problems)
	}

	src := []byte("package p\n\n// T is.\ntype T int\n\n// m does.\nfunc (t *T) m() {}\n\nvar (\n\ta = 1\n\tb = 2\n)\n\nfunc f() {\n}\n")
	got, err := declarations(src, []string{"T.m", "b", "f"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "// m does.\nfunc (t *T) m() {}\n\nvar (\n\ta = 1\n\tb = 2\n)\n\nfunc f() {\n}\n"; got != want {
		t.Errorf("declarations:\n%s\nwant:\n%s", got, want)
	}
	if _, err := declarations(src, []string{"T.n"}); err == nil {
		t.Error("a method that is not there was found")
	}
}

// TestQuotes checks every quote of README.md and docs/ against its file.
func TestQuotes(t *testing.T) {
	unseen := map[string]bool{}
	for _, p := range quotedPages {
		unseen[filepath.Join(root, p)] = true
	}
	n := 0
	for _, f := range markdown(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		every := unseen[f]
		delete(unseen, f)
		qs, problems := quotes(string(b), every)
		for _, p := range problems {
			t.Errorf("%s: %s", f, p)
		}
		lines := strings.Split(string(b), "\n")
		var updated []string // the page's lines, the blocks replaced
		next := 0            // the first line of the page not yet in updated
		for _, q := range qs {
			src, err := os.ReadFile(filepath.Join(root, q.file))
			if err != nil {
				t.Errorf("%s:%d: %v", f, q.line, err)
				continue
			}
			want, err := declarations(src, q.names)
			if err != nil {
				t.Errorf("%s:%d: %s: %v", f, q.line, q.file, err)
				continue
			}
			if *update {
				updated = append(append(updated, lines[next:q.line+1]...), strings.Split(strings.TrimSuffix(want, "\n"), "\n")...)
				next = q.line + 1 + strings.Count(q.block, "\n")
				n++
				continue
			}
			if q.block != want {
				t.Errorf("%s:%d: the block differs from %s %s at its line %d (copy the declarations into it):\n%s",
					f, q.line, q.file, strings.Join(q.names, " "), firstDiff(q.block, want), want)
			}
			n++
		}
		if *update && len(qs) > 0 {
			updated = append(updated, lines[next:]...)
			if err := os.WriteFile(f, []byte(strings.Join(updated, "\n")), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for p := range unseen {
		t.Errorf("%s, whose every Go block must be a quote, is not among the pages checked", p)
	}
	t.Logf("%d quotes checked", n)
}

// firstDiff is the first line, from 1, where a and b differ.
func firstDiff(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}
