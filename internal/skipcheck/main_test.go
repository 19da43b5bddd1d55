package main

import (
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// goTestJSON runs go test -json on packages of testdata (fixtures the
// module's ./... leaves out) and returns its output; go test's own exit
// status is not the checker's business.
func goTestJSON(t *testing.T, env []string, args ...string) []byte {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, which runs this test: %v", err)
	}
	cmd := exec.Command(goBin, append([]string{"test", "-json", "-count=1"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if len(out) == 0 {
		t.Fatalf("go test %v: %v\n%s", args, err, stderr.String())
	}
	return out
}

func checked(t *testing.T, in []byte, ci bool) (*report, string) {
	t.Helper()
	var out bytes.Buffer
	r, err := check(bytes.NewReader(in), &out, ci, true)
	if err != nil {
		t.Fatal(err)
	}
	return r, out.String()
}

func badTests(r *report) []string {
	var names []string
	for _, sk := range r.bad {
		names = append(names, sk.test)
	}
	slices.Sort(names)
	return names
}

// TestSkips feeds the checker what go test -json prints for the fixture:
// tagged skips pass (gcc only outside CI), the untagged one does not.
func TestSkips(t *testing.T) {
	in := goTestJSON(t, []string{"CI=", "SAMPLE_FAIL="}, "-short", "./testdata/sample")

	r, out := checked(t, in, false)
	if r.ok() || len(r.failed) != 0 {
		t.Errorf("want only the untagged skip refused, got failures %v:\n%s", r.failed, out)
	}
	if got := badTests(r); !slices.Equal(got, []string{"TestUntagged"}) {
		t.Errorf("refused %v, want [TestUntagged]:\n%s", got, out)
	}
	if r.byReason["device"] != 1 || r.byReason["short"] != 1 || r.byReason["gcc"] != 1 {
		t.Errorf("allowed skips by reason %v, want device, short and gcc once each:\n%s", r.byReason, out)
	}
	if r.tests != 8 || r.pkgs != 1 {
		t.Errorf("%d tests in %d packages, want 8 in 1:\n%s", r.tests, r.pkgs, out)
	}
	for _, want := range []string{"8 tests: 4 passed, 4 skipped (device 1, gcc 1, short 1, untagged 1)",
		"skip TestNoDevice: [device] no NPU here", "TestUntagged: [untagged]", "our double did not build"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// The same run judged by CI's rules: no C compiler is no longer a
	// reason (the helper fails under CI=true; the checker refuses it too).
	r, out = checked(t, in, true)
	if got := badTests(r); !slices.Equal(got, []string{"TestNoGCC", "TestUntagged"}) {
		t.Errorf("under CI refused %v, want [TestNoGCC TestUntagged]:\n%s", got, out)
	}
}

// TestFailures: a failing test, a package that does not build and an empty
// input all make the check fail, and the failure's output is shown.
func TestFailures(t *testing.T) {
	in := goTestJSON(t, []string{"CI=", "SAMPLE_FAIL=1"}, "-run", "^TestFails$", "./testdata/sample", "./testdata/broken")
	r, out := checked(t, in, false)
	if r.ok() {
		t.Fatalf("passed:\n%s", out)
	}
	joined := strings.Join(r.failed, "\n")
	for _, want := range []string{"TestFails", "testdata/broken"} {
		if !strings.Contains(joined, want) {
			t.Errorf("failures %q lack %q:\n%s", r.failed, want, out)
		}
	}
	for _, want := range []string{"failed on purpose", "build failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	r, out = checked(t, []byte("not json\n"), false)
	if r.ok() || !strings.Contains(out, "no test ran") {
		t.Errorf("an input with no test passed:\n%s", out)
	}
}
