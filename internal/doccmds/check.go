package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// goTestFlags are go test's own flags a scaled-down command may add: go help
// testflag documents them.
var goTestFlags = []string{"-short", "-count", "-benchtime", "-fuzztime", "-run", "-timeout"}

// check compares what the docs show with the table, and returns what is
// wrong, one line each.
func check(root string, cmds []command, probs []problem) []string {
	var errs []string
	for _, p := range probs {
		errs = append(errs, p.String())
	}
	docs, err := docsText(root)
	if err != nil {
		return append(errs, err.Error())
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		return append(errs, err.Error())
	}
	ciText := normalize(strings.ReplaceAll(string(ci), "\\\n", " ")) // continuation lines joined
	flatDocs := normalize(docs)                                      // a message may wrap

	byCmd := map[string]entry{}
	for _, e := range table {
		if _, dup := byCmd[e.cmd]; dup {
			errs = append(errs, fmt.Sprintf("table: %q is listed twice", e.cmd))
		}
		byCmd[e.cmd] = e
		switch e.how {
		case scaledDown:
			if e.flags == "" {
				errs = append(errs, fmt.Sprintf("table: %q is scaled down by no flag", e.cmd))
			}
			for _, w := range words(e.flags) {
				name, _, _ := strings.Cut(w, "=")
				if !strings.HasPrefix(name, "-") {
					continue // a flag's value
				}
				if !slices.Contains(goTestFlags, name) && !documented(docs, name) {
					errs = append(errs, fmt.Sprintf("table: %q is scaled down by %s, which neither README.md nor docs/ documents", e.cmd, name))
				}
			}
		case needsDevice:
			if e.want == "" || !strings.Contains(flatDocs, normalize(e.want)) {
				errs = append(errs, fmt.Sprintf("table: %q needs a device, but the failure it expects (%q) is not what README.md or docs/ shows", e.cmd, e.want))
			}
		case byCI:
			if !strings.Contains(ciText, normalize(e.line)) {
				errs = append(errs, fmt.Sprintf("table: %q is run by .ci/run as %q, which .ci/run does not hold", e.cmd, e.line))
			}
		}
	}
	used := map[string]bool{}
	for _, c := range cmds {
		used[c.text] = true
		if _, ok := byCmd[c.text]; !ok {
			errs = append(errs, fmt.Sprintf("%s: no entry in internal/doccmds/table.go says how CI runs it: add one", c))
		}
		for _, sub := range splitShell(c.text) {
			if msg := checkGoTest(root, sub); msg != "" {
				errs = append(errs, fmt.Sprintf("%s: %s", c, msg))
			}
		}
	}
	for _, e := range table {
		if !used[e.cmd] {
			errs = append(errs, fmt.Sprintf("table: %q is shown nowhere in README.md or docs/ any more: drop it", e.cmd))
		}
	}
	return errs
}

// docsText returns README.md and docs/*.md, concatenated.
func docsText(root string) (string, error) {
	files, err := markdownFiles(root)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, f := range files {
		t, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", err
		}
		b.Write(t)
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// documented reports whether the docs name a flag: after a blank or a
// backquote, and followed by one, '=' or '`'.
func documented(docs, flag string) bool {
	re := regexp.MustCompile("[\\s`]" + regexp.QuoteMeta(flag) + "[\\s`=]")
	return re.MatchString(docs)
}

var testFunc = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)\w*)\(`)

// checkGoTest checks that the -run and -bench patterns of a go test command
// each match a test of every package it names (by the names in its
// _test.go files), and returns what does not.
func checkGoTest(root, cmd string) string {
	w := words(cmd)
	for len(w) > 0 && strings.Contains(w[0], "=") && !strings.HasPrefix(w[0], "-") {
		w = w[1:] // VAR=value
	}
	if len(w) < 2 || w[0] != "go" || w[1] != "test" {
		return ""
	}
	var pkgs []string
	pats := map[string]string{} // flag → pattern
	for i := 2; i < len(w); i++ {
		a := w[i]
		switch {
		case a == "-run" || a == "-bench" || a == "-fuzz":
			if i+1 < len(w) {
				pats[a] = w[i+1]
				i++
			}
		case strings.HasPrefix(a, "-run=") || strings.HasPrefix(a, "-bench=") || strings.HasPrefix(a, "-fuzz="):
			k, v, _ := strings.Cut(a, "=")
			pats[k] = v
		case strings.HasPrefix(a, "-o"), a == "-c":
		case strings.HasPrefix(a, "./") || a == ".":
			pkgs = append(pkgs, a)
		}
	}
	for flagName, pat := range pats {
		if pat == "^$" {
			continue
		}
		top, _, _ := strings.Cut(pat, "/") // the top-level tests' part
		re, err := regexp.Compile(top)
		if err != nil {
			return fmt.Sprintf("%s %q is not a regular expression: %v", flagName, pat, err)
		}
		prefix := map[string]string{"-run": "", "-bench": "Benchmark", "-fuzz": "Fuzz"}[flagName]
		for _, pkg := range pkgs {
			if strings.HasSuffix(pkg, "...") {
				continue
			}
			names, err := testNames(filepath.Join(root, pkg))
			if err != nil {
				return err.Error()
			}
			if !slices.ContainsFunc(names, func(n string) bool {
				return strings.HasPrefix(n, prefix) && (prefix != "" || !strings.HasPrefix(n, "Benchmark")) && re.MatchString(n)
			}) {
				return fmt.Sprintf("%s %q matches no test of %s", flagName, pat, pkg)
			}
		}
	}
	return ""
}

// testNames returns the test, benchmark, fuzz and example functions of the
// _test.go files in dir.
func testNames(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s holds no tests", dir)
	}
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for _, m := range testFunc.FindAllStringSubmatch(string(b), -1) {
			names = append(names, m[1])
		}
	}
	return names, nil
}
