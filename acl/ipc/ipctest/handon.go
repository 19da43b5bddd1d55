//go:build linux

package ipctest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/internal/skip"
)

// Handing a connected socket on.
//
// A process that connects to a listening Unix socket is what the listener's
// kernel records as the peer (SO_PEERCRED). It may then give the connected
// socket to another process (over a socket, or to a child), which writes
// with its own credentials. HandOn plays that: the test binary starts
// itself as the connector, which runs a script of steps on the socket, then
// starts itself again as another user, hands it the socket, and that process
// runs a script of its own. Pass plays it inside the test process: the
// connector hands the connected socket back to the test, which may then
// write on it with any credentials it can claim (root can claim any).
//
// A test binary that uses them calls Child first in its TestMain.

// childEnv holds a child's spec.
const childEnv = "VMARENA_IPCTEST_CHILD"

// A Step is one thing a scripted process does on the socket.
type Step struct {
	// Send is a message to send, with the process's credentials.
	Send []byte
	// Memfd, with Send, attaches a memory file of that many bytes, sealed
	// as the host driver's exports are.
	Memfd int64
	// Read is a message of that many bytes to read, with up to MaxFDs
	// descriptors.
	Read   int
	MaxFDs int
}

// Report is what a scripted process saw.
type Report struct {
	PID   int      // the process that ran the steps
	UID   int      // its user
	Read  [][]byte // the bytes of each Read step it completed
	FDs   int      // the descriptors it received
	Links []string // what they were (/proc/self/fd)
	Err   string   // the first step that failed, and why
}

type spec struct {
	Role   string // "connect", "speak" or "pass"
	Path   string
	Before []Step // the connector's steps
	After  []Step // the other process's
	UID    int
	GID    int
}

// HandOnSpec says what HandOn's processes do.
type HandOnSpec struct {
	Path     string // the listening socket to connect to
	Before   []Step // the connector's steps, before it hands the socket on
	After    []Step // the steps of the process it hands the socket to
	UID, GID int    // who that process runs as
}

// A HandOnProcs is the processes HandOn started.
type HandOnProcs struct {
	cmd  *exec.Cmd
	out  *os.File
	done bool
}

// HandOn starts the connector of s. Accept its connection, then Wait. The
// test fails if the processes cannot be started; it must run as root for
// the second process to run as another user.
func HandOn(t testing.TB, s HandOnSpec) *HandOnProcs {
	t.Helper()
	js, err := json.Marshal(spec{Role: "connect", Path: s.Path, Before: s.Before, After: s.After, UID: s.UID, GID: s.GID})
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(js))
	cmd.Stdout = w
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	p := &HandOnProcs{cmd: cmd, out: r}
	t.Cleanup(func() {
		r.Close()
		if !p.done {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return p
}

// PID returns the connector's process id.
func (p *HandOnProcs) PID() int { return p.cmd.Process.Pid }

// Wait waits for both processes and returns what each saw: the connector's
// report, then the other's.
func (p *HandOnProcs) Wait() (connector, other Report, err error) {
	var rs []Report
	dec := json.NewDecoder(p.out)
	for {
		var r Report
		if err := dec.Decode(&r); err != nil {
			if !errors.Is(err, io.EOF) {
				return connector, other, err
			}
			break
		}
		rs = append(rs, r)
	}
	err = p.cmd.Wait()
	p.done = true
	if len(rs) != 2 {
		return connector, other, errors.Join(err, fmt.Errorf("ipctest: %d reports from the hand-on, want 2", len(rs)))
	}
	return rs[0], rs[1], err
}

// Pass starts a process that connects to the listening socket at path and
// hands the connected socket back to the test, and returns the test's copy:
// on it the test writes as another process than the one the listener's
// kernel recorded. The connector stays alive until the test ends.
func Pass(t testing.TB, path string) *net.UnixConn {
	t.Helper()
	js, err := json.Marshal(spec{Role: "pass", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	mine, theirs, err := ipc.Socketpair()
	if err != nil {
		t.Fatal(err)
	}
	// Open until the test ends: the connector stays alive reading its end
	// (closed, it would exit at once, and a test that names it would meet
	// an exited process).
	t.Cleanup(func() { _ = mine.Close() })
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(js))
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	theirs.Close()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	_ = mine.SetDeadline(time.Now().Add(time.Minute))
	fds, _, err := ipc.Recv(mine, make([]byte, 1), 1)
	if err != nil || len(fds) != 1 {
		t.Fatalf("ipctest: the connector did not hand the socket over: %v", err)
	}
	f := os.NewFile(uintptr(fds[0]), "handed on")
	defer f.Close()
	c, err := ipc.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Cred is the credentials SendAs claims.
type Cred = ipc.Cred

// SendAs sends b on c with the credentials cred, which the kernel accepts
// only from a process allowed to claim them (root may claim any process
// that exists, and any user), and the descriptors fds.
func SendAs(c *net.UnixConn, b []byte, fds []int, cred Cred) error {
	oob := unix.UnixCredentials(&unix.Ucred{Pid: int32(cred.PID), Uid: uint32(cred.UID), Gid: uint32(cred.GID)})
	if len(fds) > 0 {
		oob = append(unix.UnixRights(fds...), oob...)
	}
	n, _, err := c.WriteMsgUnix(b, oob, nil)
	if err == nil && n != len(b) {
		err = io.ErrShortWrite
	}
	return err
}

// Child runs the process the test binary was started as by HandOn or Pass,
// and exits; otherwise it returns at once. Call it first in TestMain.
func Child() {
	js := os.Getenv(childEnv)
	if js == "" {
		return
	}
	var s spec
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		fmt.Fprintln(os.Stderr, "ipctest:", err)
		os.Exit(2)
	}
	if err := child(s); err != nil {
		fmt.Fprintln(os.Stderr, "ipctest:", s.Role+":", err)
		os.Exit(2)
	}
	os.Exit(0)
}

func child(s spec) error {
	switch s.Role {
	case "pass":
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: s.Path, Net: "unix"})
		if err != nil {
			return err
		}
		f, err := c.File()
		if err != nil {
			return err
		}
		back, err := ipc.FileConn(os.NewFile(3, "test"))
		if err != nil {
			return err
		}
		if err := ipc.Send(back, []byte{1}, []int{int(f.Fd())}, false); err != nil {
			return err
		}
		// Stay, so that the connector the listener recorded lives, until
		// the test ends (it kills this process).
		_, _ = back.Read(make([]byte, 1))
		return nil
	case "connect":
		c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: s.Path, Net: "unix"})
		if err != nil {
			return err
		}
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		if err := json.NewEncoder(os.Stdout).Encode(run(c, s.Before)); err != nil {
			return err
		}
		f, err := c.File()
		if err != nil {
			return err
		}
		js, err := json.Marshal(spec{Role: "speak", After: s.After})
		if err != nil {
			return err
		}
		cmd := exec.Command("/proc/self/exe", "-test.run=^$")
		cmd.Env = append(os.Environ(), childEnv+"="+string(js))
		cmd.ExtraFiles = []*os.File{f}
		cmd.Stdout = os.Stdout
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(s.UID), Gid: uint32(s.GID)}}
		// The connector keeps its copy and waits: the process the listener
		// recorded lives while the other speaks.
		return cmd.Run()
	case "speak":
		c, err := ipc.FileConn(os.NewFile(3, "handed on"))
		if err != nil {
			return err
		}
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		return json.NewEncoder(os.Stdout).Encode(run(c, s.After))
	}
	return fmt.Errorf("unknown role %q", s.Role)
}

// run runs the steps on c, until one fails.
func run(c *net.UnixConn, steps []Step) Report {
	r := Report{PID: os.Getpid(), UID: os.Getuid()}
	if err := ipc.EnableCredentials(c); err != nil {
		r.Err = err.Error()
		return r
	}
	for i, st := range steps {
		var err error
		switch {
		case st.Send != nil:
			var fds []int
			if st.Memfd > 0 {
				fd, merr := Memfd("vmarena-host", st.Memfd, Sealed)
				if merr != nil {
					err = merr
					break
				}
				defer unix.Close(fd)
				fds = []int{fd}
			}
			err = ipc.Send(c, st.Send, fds, true)
		case st.Read > 0:
			b := make([]byte, st.Read)
			var fds []int
			fds, _, err = ipc.Recv(c, b, st.MaxFDs)
			for _, fd := range fds {
				l, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
				r.Links = append(r.Links, l)
				_ = unix.Close(fd)
			}
			r.FDs += len(fds)
			if err == nil {
				r.Read = append(r.Read, b)
			}
		}
		if err != nil {
			r.Err = fmt.Sprintf("step %d: %v", i, err)
			return r
		}
	}
	return r
}

// NeedRoot skips the test unless it runs as root, which the hand-on tests
// need to run a process as another user.
func NeedRoot(t testing.TB) {
	t.Helper()
	skip.NotRoot(t, "the test must run the process the socket is handed to as another user")
}

// Listen returns a Unix socket listening in a directory of the test's, and
// its path; the test's cleanup closes it.
func Listen(t testing.TB) (*net.UnixListener, string) {
	t.Helper()
	path := t.TempDir() + "/s"
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	_ = l.SetDeadline(time.Now().Add(time.Minute))
	return l, path
}

// Accept accepts a connection on l, with a deadline a minute away; the
// test's cleanup closes it.
func Accept(t testing.TB, l *net.UnixListener) *net.UnixConn {
	t.Helper()
	c, err := l.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	return c
}
