package leakgate

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vmarena/vmarena/internal/skip"
)

// childEnv makes the test binary the child of TestBinaryFails: its one test
// leaks a goroutine.
const childEnv = "VMARENA_LEAKGATE_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		g := Start()
		g.grace = 100 * time.Millisecond
		os.Exit(g.Finish(m.Run()))
	}
	Main(m)
}

// TestBinaryFails runs this test binary with one test that leaks: the
// binary's tests pass, and it exits with ExitLeak and the leak's stack.
func TestBinaryFails(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		go leakyWorker(make(chan struct{}))
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestBinaryFails$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitLeak {
		t.Fatalf("the child ended with %v, want exit status %d:\n%s", err, ExitLeak, out)
	}
	for _, want := range []string{"--- PASS: TestBinaryFails", "leakgate: the tests passed, but left this behind", "leakyWorker"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Fatalf("the child's output lacks %q:\n%s", want, out)
		}
	}
}

// start is Start with a short grace and the report kept.
func start(t *testing.T) (*Gate, *bytes.Buffer) {
	t.Helper()
	g := Start()
	var out bytes.Buffer
	g.out, g.grace = &out, 200*time.Millisecond
	return g, &out
}

func TestCleanPasses(t *testing.T) {
	g, out := start(t)
	done := make(chan struct{})
	go func() { <-done }()
	close(done) // it ends within the grace: not a leak
	f, err := os.CreateTemp(t.TempDir(), "gate")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if code := g.Finish(0); code != 0 {
		t.Fatalf("Finish = %d on a clean process:\n%s", code, out)
	}
}

func TestGoroutineLeak(t *testing.T) {
	g, out := start(t)
	stop := make(chan struct{})
	defer close(stop)
	go leakyWorker(stop)
	if code := g.Finish(0); code != ExitLeak {
		t.Fatalf("Finish = %d with a goroutine left, want %d", code, ExitLeak)
	}
	if !strings.Contains(out.String(), "leakyWorker") {
		t.Fatalf("the report does not show the goroutine's stack:\n%s", out)
	}
}

func leakyWorker(stop chan struct{}) { <-stop }

func TestDescriptorLeak(t *testing.T) {
	if runtime.GOOS != "linux" {
		skip.Unsupported(t, "descriptors are read from /proc/self/fd, on Linux")
	}
	g, out := start(t)
	f, err := os.CreateTemp(t.TempDir(), "leaked")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if code := g.Finish(0); code != ExitLeak {
		t.Fatalf("Finish = %d with a file left open, want %d", code, ExitLeak)
	}
	if !strings.Contains(out.String(), f.Name()) {
		t.Fatalf("the report does not name the file:\n%s", out)
	}
}

func TestCheckLeak(t *testing.T) {
	g, out := start(t)
	calls := 0
	c := Check{Name: "the books", Left: func() error {
		calls++
		if calls < 3 {
			return errors.New("2 reservations")
		}
		return nil
	}}
	if code := g.Finish(0, c); code != 0 {
		t.Fatalf("Finish = %d for a check that cleared within the grace:\n%s", code, out)
	}
	c.Left = func() error { return errors.New("2 reservations") }
	if code := g.Finish(0, c); code != ExitLeak || !strings.Contains(out.String(), "the books: 2 reservations") {
		t.Fatalf("Finish = %d, report:\n%s", code, out)
	}
}

// TestFailureWins: the tests failed, so the gate passes their status on and
// reports nothing.
func TestFailureWins(t *testing.T) {
	g, out := start(t)
	stop := make(chan struct{})
	defer close(stop)
	go leakyWorker(stop)
	if code := g.Finish(1); code != 1 || out.Len() != 0 {
		t.Fatalf("Finish(1) = %d, report %q", code, out)
	}
}

// The device files a vendor runtime keeps are the only descriptors allowed
// by name; a memory file or any other file is a leak.
func TestAllowedDescriptors(t *testing.T) {
	for target, want := range map[string]bool{
		"/dev/nvidiactl":                true,
		"/dev/nvidia-uvm":               true,
		"/dev/davinci0":                 true,
		"/dev/davinci_manager":          true,
		"/dev/devmm_svm":                true,
		"/dev/hisi_hdc":                 true,
		"/dev/null":                     false,
		"/memfd:vmarena-host (deleted)": false,
		"socket:[1234]":                 false,
		"/tmp/x/dev/nvidia0":            false,
	} {
		if got := allowedFD(target); got != want {
			t.Errorf("allowedFD(%q) = %v, want %v", target, got, want)
		}
	}
}
