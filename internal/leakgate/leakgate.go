// Package leakgate is the leak gate of the module's test binaries: every
// test package runs its tests through Main (or Run, from a TestMain that
// has more to do), which fails the binary when the tests passed but left
// something behind — a goroutine, an open descriptor, or whatever a Check
// finds (a driver's live objects, with package arenagate).
//
// The gate records the goroutines and the descriptors of the process before
// the tests run, runs them, and then compares. What the tests started must
// be gone: a goroutine of a pool's worker that Close did not stop, a stream
// of the host driver nobody destroyed, a socket or memory file a failed
// Share did not close. Things that end a little after the call that ends
// them (a goroutine on its way out) are waited for, up to Grace, with the
// comparison retried; what is still there then is printed — each leaked
// goroutine's stack, each descriptor's number and what it refers to
// (/proc/self/fd), each Check's complaint — and the binary exits with
// ExitLeak. When a test failed, the gate only passes the failure on: a
// failed test may leave anything behind.
//
// What the process keeps for its whole life by design is allowed, and
// listed here and nowhere else:
//
//   - the Go runtime's own goroutines and descriptors: the network poller's
//     (set up before the baseline is taken, so that a test that is the
//     first to use the poller does not look like a leak), and the signal
//     handler's goroutines that os/signal starts on first use (signal.Notify
//     keeps them for the process: the benchmark's calibration uses it);
//   - the device files a vendor runtime opens when it is initialised and
//     keeps for the process (/dev/nvidia*: CUDA cannot be de-initialised;
//     /dev/davinci*, /dev/devmm_svm, /dev/hisi_hdc: Ascend's), on a machine
//     with the device: what a test leaves on the device itself its own
//     checks see (a context, memory);
//   - the process's default driver (arena.DefaultDriver): package arenagate
//     opens it before the baseline, so its descriptor (the host driver's
//     memory file) and anything it started are part of the process as the
//     tests found it; what it holds for callers must be zero at the end
//     (acl/host's tests, which use no arena, do the same for
//     host.Default with Live).
//
// Descriptors are read from /proc/self/fd, on Linux only; elsewhere the
// gate checks goroutines and the Checks.
package leakgate

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmarena/vmarena/acl"
)

// Grace is how long the gate waits for what the tests started to end, once
// they have run, before it calls it a leak.
const Grace = 5 * time.Second

// ExitLeak is the exit status of a test binary whose tests passed but left
// something behind.
const ExitLeak = 3

// A Check reports what a package's tests must not leave behind beyond
// goroutines and descriptors: Left returns an error that says what is left,
// or nil. It is called after the tests, until it returns nil or Grace has
// passed.
type Check struct {
	Name string
	Left func() error
}

// Live is the Check of a driver that lives as long as the process (a
// default driver): after the tests, what it holds for callers must be
// zero. Open the driver before the gate's baseline, so that what it keeps
// for itself (its memory file, its default stream's goroutine) is part of
// the process as the tests found it.
func Live(name string, d acl.Counter) Check {
	return Check{Name: name, Left: func() error {
		if l := d.Live(); !l.Zero() {
			return fmt.Errorf("still holds %+v", l)
		}
		return nil
	}}
}

// Main runs m's tests, then the gate, and exits with the result: as
// os.Exit(m.Run()) does, but with ExitLeak when the tests passed and left
// something behind.
func Main(m *testing.M, checks ...Check) {
	os.Exit(Run(m, checks...))
}

// Run runs m's tests and the gate, and returns the exit status for
// os.Exit: m.Run's, or ExitLeak when the tests passed and left something
// behind, which it has then printed to standard error. A TestMain that
// cleans up after its tests (removing a test double it built, say) calls
// Run, cleans up, and exits with what Run returned.
func Run(m *testing.M, checks ...Check) int {
	g := Start()
	return g.Finish(m.Run(), checks...)
}

// A Gate is the state of the process before the tests: Start records it,
// Finish compares.
type Gate struct {
	goroutines map[uint64]bool
	fds        map[string]string // number → target
	self       uint64            // the goroutine that took the baseline
	out        io.Writer         // where Finish reports
	grace      time.Duration
}

// Start records the process's goroutines and descriptors. It sets up the
// runtime's network poller first, so that the poller's descriptors are in
// the record, not counted as the first test's leak.
func Start() *Gate {
	if r, w, err := os.Pipe(); err == nil { // a pipe goes through the poller
		r.Close()
		w.Close()
	}
	g := &Gate{goroutines: map[uint64]bool{}, fds: openFDs(), out: os.Stderr, grace: Grace}
	for i, gr := range goroutines() {
		if i == 0 {
			g.self = gr.id
		}
		g.goroutines[gr.id] = true
	}
	return g
}

// Finish compares the process with the record, waiting up to Grace for
// what is left to end, and returns code, or ExitLeak when code is 0 and
// something is left (which it prints).
func (g *Gate) Finish(code int, checks ...Check) int {
	if code != 0 {
		return code
	}
	deadline := time.Now().Add(g.grace)
	for wait := time.Millisecond; ; wait = min(2*wait, 100*time.Millisecond) {
		rep := g.left(checks)
		if rep == "" {
			return code
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(g.out, "leakgate: the tests passed, but left this behind (waited %v for it to end):\n%s", g.grace, rep)
			return ExitLeak
		}
		time.Sleep(wait)
	}
}

// left describes what is there now and was not before, or returns "".
func (g *Gate) left(checks []Check) string {
	var b strings.Builder
	for i, gr := range goroutines() {
		if i == 0 || g.goroutines[gr.id] || gr.id == g.self || allowedGoroutine(gr.stack) {
			continue // the caller's own goroutine is first
		}
		fmt.Fprintf(&b, "  a goroutine:\n    %s\n", strings.ReplaceAll(strings.TrimSpace(gr.stack), "\n", "\n    "))
	}
	now := openFDs()
	fds := make([]string, 0, len(now))
	for fd := range now {
		fds = append(fds, fd)
	}
	slices.SortFunc(fds, func(a, b string) int { return atoi(a) - atoi(b) })
	for _, fd := range fds {
		if target := now[fd]; g.fds[fd] != target && !allowedFD(target) {
			fmt.Fprintf(&b, "  descriptor %s → %s\n", fd, target)
		}
	}
	for _, c := range checks {
		if err := c.Left(); err != nil {
			fmt.Fprintf(&b, "  %s: %v\n", c.Name, err)
		}
	}
	return b.String()
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// allowedGoroutine reports whether a goroutine is one the process keeps by
// design (see the package doc).
func allowedGoroutine(stack string) bool {
	for _, f := range []string{
		"os/signal.signal_recv", // signal.Notify's loop, for the process's life
		"os/signal.loop",
		"runtime.ensureSigM", // started with it, to keep signal masks
	} {
		if strings.Contains(stack, "\n"+f) {
			return true
		}
	}
	return false
}

// allowedFD reports whether a descriptor is one a vendor runtime keeps for
// the process once initialised (see the package doc).
func allowedFD(target string) bool {
	for _, dev := range []string{
		"/dev/nvidia",    // CUDA: /dev/nvidiactl, /dev/nvidia0, /dev/nvidia-uvm, …; cuInit cannot be undone
		"/dev/davinci",   // Ascend: the NPU's device files, its manager's
		"/dev/devmm_svm", // Ascend: the shared virtual memory manager
		"/dev/hisi_hdc",  // Ascend: the host-device channel
	} {
		if strings.HasPrefix(target, dev) {
			return true
		}
	}
	return false
}

type goroutine struct {
	id    uint64
	stack string
}

// goroutines returns every goroutine's id and stack, the caller's first.
func goroutines() []goroutine {
	var out []goroutine
	for _, block := range Stacks() {
		head, _, _ := strings.Cut(block, "\n")
		rest, ok := strings.CutPrefix(head, "goroutine ")
		if !ok {
			continue
		}
		id, _, _ := strings.Cut(rest, " ")
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil {
			continue
		}
		out = append(out, goroutine{id: n, stack: block})
	}
	return out
}

// Stacks returns the dump of every goroutine, one string each (its
// "goroutine N [state]:" line, then its frames), the caller's first.
func Stacks() []string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	return strings.Split(string(buf), "\n\n")
}

// openFDs returns the process's open descriptors and what each refers to,
// from /proc/self/fd; nil where there is no such directory. The descriptor
// that reads the directory is left out.
func openFDs() map[string]string {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil
	}
	fds := make(map[string]string, len(ents))
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // closed since: the directory's own descriptor
		}
		fds[e.Name()] = target
	}
	return fds
}
