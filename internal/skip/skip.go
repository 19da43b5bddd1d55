// Package skip is the only way a vmarena test skips. A skip is allowed only
// for a limit of the machine or of how go test was run, never for something
// the repository ships: each helper here names its reason with a tag
// ("skip[device]: no Ascend NPU …") that go run ./internal/skipcheck reads
// from go test -json and checks against [Allowed]. A direct t.Skip, t.Skipf
// or t.SkipNow anywhere else in the module fails TestOnlyThisPackageSkips.
//
// The reasons:
//
//   - [NoDevice]: no NPU or GPU, no vendor runtime, or a device or runtime
//     that lacks what the test needs (an older runtime, too little free
//     memory, a real device where the test needs a double's stand-in work);
//   - [Unsupported]: an operating system or architecture the code under test
//     does not support;
//   - [IfShort]: go test -short;
//   - [ByFlag]: another go test flag that takes what the test needs (-trace);
//   - [NoGCC]: no C compiler (or its binutils) to build a test double; under
//     CI=true this fails instead, since CI's machine has one;
//   - [NotRoot]: the test must act as another user (run a process under
//     another uid, claim another process's credentials), which only root
//     may; under CI=true this fails instead, since CI runs as root.
//
// Anything else is a failure: a double or fixture of ours that does not
// build, a file we ship that does not parse, a helper that is missing. Such a
// test calls t.Fatal. A test that is the second process of another is not a
// test of its own: the first starts it as itself, with an environment
// variable that says which part to play.
package skip

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"testing"
)

// Reason is the tag of an allowed skip.
type Reason string

// The reasons a test may skip for.
const (
	Device   Reason = "device"   // no device or vendor runtime, or one that lacks what the test needs
	Platform Reason = "platform" // an OS or architecture the code does not support
	Short    Reason = "short"    // go test -short
	Flag     Reason = "flag"     // a go test flag that takes what the test needs
	GCC      Reason = "gcc"      // no C toolchain to build a test double
	Root     Reason = "root"     // not root, and the test must act as another user
)

// Reasons lists every reason, in the order the checker reports them.
var Reasons = []Reason{Device, Platform, Short, Flag, GCC, Root}

// CIEnv is the variable CI sets (to "true"). Under it, NoGCC fails.
const CIEnv = "CI"

// InCI reports whether the tests run under CI (CI=true).
func InCI() bool { return os.Getenv(CIEnv) == "true" }

// Allowed reports whether a skip tagged r is allowed: every reason is,
// except GCC and Root under CI.
func Allowed(r Reason, ci bool) bool {
	switch r {
	case Device, Platform, Short, Flag:
		return true
	case GCC, Root:
		return !ci
	}
	return false
}

// tag matches the tag the helpers write and captures the reason.
var tag = regexp.MustCompile(`skip\[([a-z]+)\]: `)

// Parse finds a skip's tag in a line of its test's output and returns its
// reason and the text after it.
func Parse(line string) (r Reason, why string, ok bool) {
	loc := tag.FindStringSubmatchIndex(line)
	if loc == nil {
		return "", "", false
	}
	return Reason(line[loc[2]:loc[3]]), line[loc[1]:], true
}

func skipf(t testing.TB, r Reason, format string, args []any) {
	t.Helper()
	t.Skipf("skip[%s]: %s", r, fmt.Sprintf(format, args...))
}

// NoDevice skips t because the device, or the vendor runtime, it needs is
// not here or lacks what it needs; the message says what was looked for.
func NoDevice(t testing.TB, format string, args ...any) {
	t.Helper()
	skipf(t, Device, format, args)
}

// Unsupported skips t on an operating system or architecture the code under
// test does not support.
func Unsupported(t testing.TB, format string, args ...any) {
	t.Helper()
	skipf(t, Platform, format, args)
}

// IfShort skips t under go test -short; why says what makes it long.
func IfShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		skipf(t, Short, "%s", []any{why})
	}
}

// ByFlag skips t because a go test flag took what it needs (for example
// -trace, which holds the only execution tracer).
func ByFlag(t testing.TB, format string, args ...any) {
	t.Helper()
	skipf(t, Flag, format, args)
}

// NoGCC skips t because err says the C toolchain is missing (see CC). Under
// CI=true it fails t instead: CI's machine has gcc, so a test double that
// did not build there is a failure.
func NoGCC(t testing.TB, err error) {
	t.Helper()
	if InCI() {
		t.Fatalf("%v (%s=true: CI has a C toolchain, so this is a failure, not a skip)", err, CIEnv)
	}
	skipf(t, GCC, "%v", []any{err})
}

// NotRoot skips t unless the process runs as root (effective uid 0); why
// says what the test must do as another user. Under CI=true it fails
// instead: CI runs as root, so there the test must run.
func NotRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if InCI() {
		t.Fatalf("not root, and %s (%s=true: CI runs as root, so this is a failure, not a skip)", why, CIEnv)
	}
	skipf(t, Root, "not root, and %s", []any{why})
}

// CC returns the C compiler the tests build their doubles with: $CC, else
// gcc. The error, when it is not on the PATH, is for NoGCC.
func CC() (string, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return cc, fmt.Errorf("no C compiler to build the test double (%s: %v); install gcc or set CC", cc, err)
	}
	return cc, nil
}
