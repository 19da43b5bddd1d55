package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestEveryCommandIsMapped is the check without the runs: every command
// README.md and docs/ show has an entry saying how CI runs it, each entry
// still matches a command, every block of commands is marked ```sh, a
// device command's failure is the one the docs show, a command run by
// another step is in .ci/run, a scaled-down one adds only documented flags,
// and every go test -run or -bench pattern matches a test of its package.
func TestEveryCommandIsMapped(t *testing.T) {
	cmds, probs, err := extract("../..")
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) < 50 {
		t.Fatalf("only %d commands found in README.md and docs/: is the extraction broken?", len(cmds))
	}
	for _, e := range check("../..", cmds, probs) {
		t.Error(e)
	}
}

func TestExtract(t *testing.T) {
	md := strings.Join([]string{
		"Run `go run ./examples/tour` (or `go vet`, a mention) and",
		"`go test -run 'A|B' ./x`.",
		"",
		"| test | command |",
		"|---|---|",
		"| A | `go test -run 'A\\|B' -v ./arena` |",
		"",
		"```sh",
		"go run ./bench -quick   # seconds",
		"VMARENA_DEVICE=ascend \\",
		"  go run ./bench",
		"# a comment",
		"echo '# not a comment'",
		"```",
		"",
		"```",
		"diagram ──▶ state",
		"```",
		"",
		"```",
		"go run ./bench -h",
		"```",
		"",
		"```go",
		"go run(x) // Go code",
		"```",
	}, "\n")
	cmds, probs := extractFile("x.md", md)
	var got []string
	for _, c := range cmds {
		got = append(got, c.String())
	}
	want := []string{
		"x.md:1: go run ./examples/tour",
		"x.md:2: go test -run 'A|B' ./x",
		"x.md:6: go test -run 'A|B' -v ./arena",
		"x.md:9: go run ./bench -quick",
		"x.md:10: VMARENA_DEVICE=ascend go run ./bench",
		"x.md:13: echo '# not a comment'",
	}
	if !slices.Equal(got, want) {
		t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(probs) != 1 || probs[0].line != 21 || !strings.Contains(probs[0].what, "mark it ```sh") {
		t.Errorf("problems %v, want the unmarked block of line 21", probs)
	}
}

func TestGoTestPatterns(t *testing.T) {
	for cmd, want := range map[string]string{
		"go test -run '^TestExtract$' .":        "",
		"go test -run 'Extract|GoTest' -v .":    "",
		"go test -run 'Extract\\|GoTest' -v .":  "matches no test of .",
		"go test -run '^$' -bench . .":          "matches no test of .",
		"go test -run 'Extract/sub' .":          "",
		"go test -run '(' .":                    "is not a regular expression",
		"VMARENA_X=1 go test -run Nothing -v .": "matches no test of .",
		"go run ./bench -run Nothing":           "",
	} {
		got := checkGoTest(".", cmd)
		if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
			t.Errorf("checkGoTest(%q) = %q, want %q", cmd, got, want)
		}
	}
}

func TestShellWords(t *testing.T) {
	if got := splitShell(`a -x 'p;q' && b "r&&s"; c`); !slices.Equal(got, []string{`a -x 'p;q'`, `b "r&&s"`, "c"}) {
		t.Errorf("splitShell: %q", got)
	}
	if got := stripComment(`go test -run '#1' ./x   # why`); got != `go test -run '#1' ./x   ` {
		t.Errorf("stripComment: %q", got)
	}
	if got := words(`VAR=1 go test -run 'A|B' "./x y"`); !slices.Equal(got, []string{"VAR=1", "go", "test", "-run", "A|B", "./x y"}) {
		t.Errorf("words: %q", got)
	}
}

// A command of a user's own module runs in a new module that replaces this
// one with the tree, offline, and a program there must then allocate; a
// command that gets nothing usable fails.
func TestInNewModule(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	if out, err := inModule(work, root, "go get github.com/vmarena/vmarena@latest", time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := inModule(work, root, "go get github.com/vmarena/vmarena/nosuch@latest", time.Minute)
	if err == nil {
		t.Fatalf("a go get of a package that does not exist passed:\n%s", out)
	}
}
