// Command skipcheck reads the output of go test -json and says, for each
// package as it finishes, how many tests passed, failed and skipped, and why
// they skipped. It fails (exit status 1) when a test or a package failed,
// when the input holds no test at all, and when a test skipped without the
// tag of internal/skip or for a reason that is not allowed — "gcc" under
// CI=true (or -ci). The output of every failed test, and of a package that
// failed to build or crashed, is printed in full.
//
//	go test -race -json ./... | go run ./internal/skipcheck
//	go test -json ./acl/ascend | go run ./internal/skipcheck -v   # also list each skip
//
// Test binaries run directly (as .ci/arm64.sh runs them under qemu) give the
// same events through go tool test2json:
//
//	./ascend.test -test.v=test2json | go tool test2json -p acl/ascend | go run ./internal/skipcheck
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vmarena/vmarena/internal/skip"
)

func main() {
	ci := flag.Bool("ci", skip.InCI(), "apply CI's rules: no C compiler is a failure (default: $CI is true)")
	verbose := flag.Bool("v", false, "list every skip, not only the counts")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: go test -json [packages] | go run ./internal/skipcheck [-ci] [-v]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	r, err := check(os.Stdin, os.Stdout, *ci, *verbose)
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipcheck:", err)
		os.Exit(1)
	}
	if !r.ok() {
		os.Exit(1)
	}
}

// event is one line of go test -json (cmd/test2json's TestEvent).
type event struct {
	Time        time.Time
	Action      string
	Package     string
	ImportPath  string // build-output and build-fail
	Test        string
	Elapsed     float64
	Output      string
	FailedBuild string
}

// skipped is one skip, with its reason.
type skipped struct {
	pkg, test string
	reason    skip.Reason // "" when untagged
	why       string      // the tag's text, or the test's whole output when untagged
}

// pkgStats counts one package's tests.
type pkgStats struct {
	passed, failed int
	skips          []skipped
}

// report is what check found.
type report struct {
	pkgs      int            // packages with tests that finished
	tests     int            // tests (subtests included) that finished
	failed    []string       // "pkg: test" of every failure, packages' included
	bad       []skipped      // skips that are not allowed
	byReason  map[string]int // allowed skips by reason
	malformed int            // input lines that were not events
}

func (r *report) ok() bool { return len(r.failed) == 0 && len(r.bad) == 0 && r.tests > 0 }

// check reads events from in, writes the per-package lines and the verdict
// to out, and returns what it found.
func check(in io.Reader, out io.Writer, ci, verbose bool) (*report, error) {
	r := &report{byReason: map[string]int{}}
	type key struct{ pkg, test string }
	output := map[key]*strings.Builder{} // of tests (and packages, Test "") not finished yet
	stats := map[string]*pkgStats{}
	build := map[string]*strings.Builder{} // build output by import path
	st := func(pkg string) *pkgStats {
		if stats[pkg] == nil {
			stats[pkg] = &pkgStats{}
		}
		return stats[pkg]
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// go test writes what is not an event (a build error of an
			// older toolchain, a crash of go itself) as it is.
			r.malformed++
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		switch e.Action {
		case "build-output":
			if build[e.ImportPath] == nil {
				build[e.ImportPath] = &strings.Builder{}
			}
			build[e.ImportPath].WriteString(e.Output)
			continue
		case "build-fail":
			r.failed = append(r.failed, e.ImportPath+": build failed")
			fmt.Fprintf(out, "FAIL %s: build failed\n%s", e.ImportPath, text(build[e.ImportPath]))
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			if output[k] == nil {
				output[k] = &strings.Builder{}
			}
			output[k].WriteString(e.Output)
			continue
		case "pass", "fail", "skip":
		default:
			continue // start, run, pause, cont, bench
		}
		o := text(output[k])
		delete(output, k)
		if e.Test == "" {
			r.finishPackage(out, e, st(e.Package), o, verbose)
			delete(stats, e.Package)
			continue
		}
		s := st(e.Package)
		r.tests++
		switch e.Action {
		case "pass":
			s.passed++
		case "fail":
			s.failed++
			r.failed = append(r.failed, e.Package+": "+e.Test)
			fmt.Fprintf(out, "--- FAIL: %s: %s (%.2fs)\n%s", e.Package, e.Test, e.Elapsed, indent(o))
		case "skip":
			sk := skipped{pkg: e.Package, test: e.Test}
			if reason, why, ok := skip.Parse(o); ok {
				sk.reason, sk.why = reason, firstLine(why)
			} else {
				sk.why = o
			}
			s.skips = append(s.skips, sk)
			if skip.Allowed(sk.reason, ci) {
				r.byReason[string(sk.reason)]++
			} else {
				r.bad = append(r.bad, sk)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return r, err
	}
	// Packages that never finished: go test was killed, or a binary died
	// without test2json seeing its end.
	for pkg, s := range stats {
		if s.passed+s.failed+len(s.skips) > 0 {
			r.failed = append(r.failed, pkg+": did not finish")
			fmt.Fprintf(out, "FAIL %s: the package's tests did not finish\n", pkg)
		}
	}
	r.verdict(out, ci)
	return r, nil
}

// finishPackage prints a package's line when its test binary ends.
func (r *report) finishPackage(out io.Writer, e event, s *pkgStats, o string, verbose bool) {
	n := s.passed + s.failed + len(s.skips)
	name := strings.TrimPrefix(e.Package, "github.com/vmarena/vmarena/")
	switch {
	case e.Action == "skip" && n == 0:
		return // no test files
	case e.Action == "fail":
		r.failed = append(r.failed, e.Package)
		if s.failed == 0 {
			// Failed outside any test: a TestMain, a crash, a timeout.
			fmt.Fprintf(out, "FAIL %s (outside a test)\n%s", e.Package, indent(o))
		}
	}
	r.pkgs++
	status := "ok  "
	if e.Action == "fail" {
		status = "FAIL"
	}
	line := fmt.Sprintf("%s %-34s %6.1fs  %4d tests: %d passed", status, name, e.Elapsed, n, s.passed)
	if s.failed > 0 {
		line += fmt.Sprintf(", %d FAILED", s.failed)
	}
	if len(s.skips) > 0 {
		counts := map[string]int{}
		for _, sk := range s.skips {
			counts[label(sk.reason)]++
		}
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(counts)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, counts[k]))
		}
		line += fmt.Sprintf(", %d skipped (%s)", len(s.skips), strings.Join(parts, ", "))
	}
	fmt.Fprintln(out, line)
	if verbose {
		for _, sk := range s.skips {
			fmt.Fprintf(out, "       skip %s: [%s] %s\n", sk.test, label(sk.reason), firstLine(sk.why))
		}
	}
}

// verdict prints the totals and every skip that is not allowed.
func (r *report) verdict(out io.Writer, ci bool) {
	var parts []string
	for _, reason := range skip.Reasons {
		if n := r.byReason[string(reason)]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", reason, n))
		}
	}
	allowed := "none"
	if len(parts) > 0 {
		allowed = strings.Join(parts, ", ")
	}
	fmt.Fprintf(out, "skipcheck: %d packages, %d tests; allowed skips: %s\n", r.pkgs, r.tests, allowed)
	if len(r.bad) > 0 {
		rules := "allowed"
		if ci {
			rules = "allowed under CI=true"
		}
		fmt.Fprintf(out, "skipcheck: %d skips for a reason that is not %s (see internal/skip):\n", len(r.bad), rules)
		for _, sk := range r.bad {
			fmt.Fprintf(out, "  %s %s: [%s] %s\n", strings.TrimPrefix(sk.pkg, "github.com/vmarena/vmarena/"), sk.test, label(sk.reason), strings.TrimSpace(firstLine(sk.why)))
		}
	}
	if r.tests == 0 {
		fmt.Fprintln(out, "skipcheck: no test ran: is the input go test -json output?")
	}
	if len(r.failed) > 0 {
		fmt.Fprintf(out, "skipcheck: %d failures: %s\n", len(r.failed), strings.Join(r.failed, "; "))
	}
}

func label(r skip.Reason) string {
	if r == "" {
		return "untagged"
	}
	return string(r)
}

func text(b *strings.Builder) string {
	if b == nil {
		return ""
	}
	return b.String()
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "=== ") && !strings.HasPrefix(l, "--- ") {
			return l
		}
	}
	return s
}

func indent(s string) string {
	if s == "" {
		return ""
	}
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString("    " + l)
		}
	}
	if !strings.HasSuffix(s, "\n") {
		b.WriteString("\n")
	}
	return b.String()
}
