//go:build linux

package arena_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/acl/ipc/ipctest"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/arena/tensor"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/leakgate/arenagate"
)

// The sharing tests run real processes: the test binary starts itself again
// with $VMARENA_SHARE_PEER holding a peerSpec, and that process plays the
// producer or the consumer over a socketpair it inherits as descriptor 3,
// then obeys one-byte commands and answers with peerReply messages.

const sharePeerEnv = "VMARENA_SHARE_PEER"

func TestMain(m *testing.M) {
	ipctest.Child() // a process of the hand-on tests (share_handon_test.go)
	if s := os.Getenv(sharePeerEnv); s != "" {
		if err := runPeer(s); err != nil {
			fmt.Fprintln(os.Stderr, "share peer:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	arenagate.Main(m)
}

const shareChunk = 2 << 20

// peerSpec is what the other process does.
type peerSpec struct {
	Role      string // "producer" or "consumer"
	Chunks    int    // producer: chunks the shared buffer spans
	ReadOnly  bool   // producer: ShareOptions.ReadOnly; consumer: ImportConfig.ReadOnly
	PID       int    // producer: ShareOptions.PID (0: the parent's)
	UID       *int   // producer: ShareOptions.User (nil: the same user)
	Producer  int    // consumer: ImportConfig.ProducerPID (-1: the parent's)
	DieAt     string // the step of Share or Import at which to be killed
	Twice     bool   // share, or import, twice
	OnePool   bool   // consumer: both imports count against one pool
	Budget    int64  // consumer: ImportConfig.Budget
	Streams   bool   // consumer: import with a stream
	Ahead     int    // producer: bytes allocated before the shared buffer
	SharedLen int    // producer: the shared buffer's length (0: Chunks whole chunks less 2 KiB)
	ChunkSize int    // bench roles: the chunk size; producer: the pool's, with TailSize
	TailSize  int    // producer: a pool of two sizes, ChunkSize and TailSize (0: one size)
}

// peerReply is what the other process says.
type peerReply struct {
	Err      string
	Refused  bool // this side refused (ErrRefused)
	OOM      bool
	Peer     bool // the other side failed (ErrPeer)
	PeerSaid bool // and said it refused this side
	PeerCode int32
	Data     []byte
	ReadOnly bool
	Live     acl.LiveCounts
	Pool     chunk.Stats
	Copies   int64 // copies the driver made during Share or Import
}

// sharedBytes is the shared buffer's content.
func sharedBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

// The parent's end.

type peerProc struct {
	t    testing.TB
	cmd  *exec.Cmd
	conn *net.UnixConn
	done bool
}

func spawn(t testing.TB, spec peerSpec) *peerProc {
	t.Helper()
	js, err := json.Marshal(spec)
	require.NoError(t, err)
	conn, f, err := ipc.Socketpair()
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), sharePeerEnv+"="+string(js),
		"GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0") // a race-enabled peer exits at once
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	f.Close()
	require.NoError(t, conn.SetDeadline(time.Now().Add(time.Minute)), "no test waits forever")
	p := &peerProc{t: t, cmd: cmd, conn: conn}
	t.Cleanup(func() {
		conn.Close()
		if !p.done {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return p
}

func (p *peerProc) pid() int { return p.cmd.Process.Pid }

func (p *peerProc) send(c byte) {
	p.t.Helper()
	require.NoError(p.t, ipc.Send(p.conn, []byte{c}, nil, false))
}

func (p *peerProc) reply() peerReply {
	p.t.Helper()
	r, err := readReply(p.conn)
	require.NoError(p.t, err, "the peer's reply")
	return r
}

// wait waits for the peer to end and reports whether it was killed.
func (p *peerProc) wait() bool {
	p.t.Helper()
	err := p.cmd.Wait()
	p.done = true
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return true
		}
	}
	require.NoError(p.t, err, "the peer failed")
	return false
}

func writeReply(c *net.UnixConn, r peerReply) error {
	js, err := json.Marshal(r)
	if err != nil {
		return err
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(js)))
	return ipc.Send(c, append(b, js...), nil, false)
}

func readReply(c *net.UnixConn) (peerReply, error) {
	var r peerReply
	n := make([]byte, 4)
	if _, _, err := ipc.Recv(c, n, 0); err != nil {
		return r, err
	}
	js := make([]byte, binary.LittleEndian.Uint32(n))
	if _, _, err := ipc.Recv(c, js, 0); err != nil {
		return r, err
	}
	return r, json.Unmarshal(js, &r)
}

func result(err error) peerReply {
	if err == nil {
		return peerReply{}
	}
	r := peerReply{Err: err.Error(), Refused: errors.Is(err, arena.ErrRefused), OOM: errors.Is(err, arena.ErrOutOfMemory),
		Peer: errors.Is(err, arena.ErrPeer)}
	if pe, ok := errors.AsType[*arena.PeerError](err); ok {
		r.PeerSaid, r.PeerCode = pe.Refused, pe.Code
	}
	return r
}

// The other process.

func runPeer(js string) error {
	var spec peerSpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		return err
	}
	f := os.NewFile(3, "socket")
	conn, err := ipc.FileConn(f)
	if err != nil {
		return err
	}
	f.Close()
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(2 * time.Minute)); err != nil {
		return err
	}
	if spec.DieAt != "" {
		arena.SetStepHook(func(step string) {
			if step == spec.DieAt {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
		})
	}
	d, err := host.New(host.Config{Capacity: uintptr(spec.Chunks*spec.ChunkSize) + 256<<20})
	if err != nil {
		return err
	}
	fd := faultdriver.New(d) // to count the copies
	switch spec.Role {
	case "producer":
		return producer(spec, conn, d, fd)
	case "bench-producer":
		return benchProducer(spec, conn, d)
	case "bench-fds":
		return benchFDs(spec, conn, d)
	}
	return consumer(spec, conn, d, fd)
}

func copies(fd *faultdriver.Driver) int64 {
	return fd.Calls(faultdriver.MemcpyHtoD) + fd.Calls(faultdriver.MemcpyDtoH) + fd.Calls(faultdriver.MemcpyDtoD)
}

func producer(spec peerSpec, conn *net.UnixConn, d *host.Driver, fd *faultdriver.Driver) error {
	cc := chunk.Config{Shareable: true}
	if spec.TailSize != 0 {
		cc.Size, cc.TailSize = spec.ChunkSize, spec.TailSize
	}
	a, err := arena.New(arena.Config{Driver: fd, Reserve: 64 << 20, Chunk: cc})
	if err != nil {
		return err
	}
	ahead := spec.Ahead
	if ahead == 0 {
		ahead = 1000
	}
	if _, err := a.Alloc(ahead, 1); err != nil {
		return err
	}
	n := spec.SharedLen
	if n == 0 {
		n = spec.Chunks*shareChunk - 2048
	}
	b, err := a.Alloc(n, 1024)
	if err != nil {
		return err
	}
	if err := arena.CopyIn(b, sharedBytes(n)); err != nil {
		return err
	}
	pid := spec.PID
	if pid == 0 {
		pid = os.Getppid()
	}
	opt := arena.ShareOptions{PID: pid, ReadOnly: spec.ReadOnly}
	if spec.UID != nil {
		opt.User = arena.UserID(*spec.UID)
	}
	for range 1 + btoi(spec.Twice) {
		before := copies(fd)
		r := result(b.Share(conn, opt))
		r.Copies = copies(fd) - before
		if err := writeReply(conn, r); err != nil {
			return err
		}
	}
	closed := false
	for {
		cmd := []byte{'q'}
		if _, _, err := ipc.Recv(conn, cmd, 0); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		var r peerReply
		switch cmd[0] {
		case 'r': // read the start of the shared buffer
			r.Data = make([]byte, 32)
			if err := arena.CopyOut(r.Data, b); err != nil {
				r = result(err)
			}
		case 's': // drop everything and give the chunks back
			err := errors.Join(a.Reset(), a.Shrink())
			r = result(err)
			r.Pool, r.Live = a.Pool().Stats(), d.Live()
		case 'c': // close the arena
			r = result(a.Close())
			closed = true
			r.Live = d.Live()
		case 'k':
			return syscall.Kill(os.Getpid(), syscall.SIGKILL)
		case 'q':
			if !closed {
				if err := a.Close(); err != nil {
					return err
				}
			}
			if !d.Live().Zero() {
				return fmt.Errorf("the producer leaked: %+v", d.Live())
			}
			return d.Close()
		default:
			return fmt.Errorf("unknown command %q", cmd[0])
		}
		if err := writeReply(conn, r); err != nil {
			return err
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func consumer(spec peerSpec, conn *net.UnixConn, d *host.Driver, fd *faultdriver.Driver) error {
	cfg := arena.ImportConfig{Driver: fd, ReadOnly: spec.ReadOnly, Budget: int(spec.Budget), ProducerPID: spec.Producer}
	if spec.Producer < 0 {
		cfg.ProducerPID = os.Getppid()
	}
	var views []*arena.Imported
	for range 1 + btoi(spec.Twice) {
		before := copies(fd)
		v, err := arena.Import(conn, cfg)
		r := result(err)
		r.Copies = copies(fd) - before
		if err == nil {
			views = append(views, v)
			r.ReadOnly = v.ReadOnly()
			r.Data = make([]byte, 32)
			if err := arena.CopyOut(r.Data, v.Buffer()); err != nil {
				return err
			}
		}
		r.Live = d.Live()
		if err := writeReply(conn, r); err != nil {
			return err
		}
	}
	for {
		cmd := []byte{'q'}
		if _, _, err := ipc.Recv(conn, cmd, 0); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		var r peerReply
		switch cmd[0] {
		case 'w': // write into the view
			r = result(arena.CopyIn(views[0].Buffer(), []byte("the consumer wrote this")))
		case 'k':
			return syscall.Kill(os.Getpid(), syscall.SIGKILL)
		case 'q':
			for _, v := range views {
				if err := v.Close(); err != nil {
					return err
				}
			}
			if !d.Live().Zero() {
				return fmt.Errorf("the consumer leaked: %+v", d.Live())
			}
			return d.Close()
		default:
			return fmt.Errorf("unknown command %q", cmd[0])
		}
		if err := writeReply(conn, r); err != nil {
			return err
		}
	}
}

// The tests.

// requireOnePrefix checks that err names the package and the call once:
// "arena: import: …", never "arena: import: arena: import: …".
func requireOnePrefix(t *testing.T, err error) {
	t.Helper()
	first, _, _ := strings.Cut(err.Error(), "\n")
	require.True(t, strings.HasPrefix(first, "arena: "), "%q", first)
	assert.Equal(t, 1, strings.Count(first, "arena: "), "a doubled prefix: %q", first)
	for _, op := range []string{"import: import:", "share: share:"} {
		assert.NotContains(t, first, op)
	}
}

func newShareHost(t *testing.T) *host.Driver {
	t.Helper()
	d, err := host.New(host.Config{Capacity: 256 << 20})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.True(t, d.Live().Zero(), "leaked: %+v", d.Live())
		require.NoError(t, d.Close())
	})
	return d
}

// The producer hands a buffer over; the consumer maps the same memory, with
// no copy and O(chunks) driver calls, at a stable address of its own.
func TestShareHandoff(t *testing.T) {
	const chunks = 4
	p := spawn(t, peerSpec{Role: "producer", Chunks: chunks})
	d := newShareHost(t)
	fd := faultdriver.New(d)
	v, err := arena.Import(p.conn, arena.ImportConfig{Driver: fd})
	require.NoError(t, err)
	r := p.reply()
	require.Empty(t, r.Err)
	assert.Zero(t, r.Copies, "the producer copied nothing to share")

	b := v.Buffer()
	n := chunks*shareChunk - 2048
	assert.Equal(t, n, b.Len())
	assert.Equal(t, 1024, b.Offset(), "the buffer lies where it did in the producer's first chunk")
	assert.Equal(t, chunks*shareChunk, b.Arena().Cap(), "the view maps whole chunks")
	assert.Equal(t, chunks*shareChunk, b.Arena().Reserved(), "and reserves exactly them")
	assert.Zero(t, fd.Calls(faultdriver.MemcpyHtoD)+fd.Calls(faultdriver.MemcpyDtoH)+fd.Calls(faultdriver.MemcpyDtoD),
		"the consumer copied nothing to import")
	assert.Equal(t, int64(chunks), fd.Calls(faultdriver.MemImportFromShareableHandle))
	assert.Equal(t, int64(chunks), fd.Calls(faultdriver.MapMem))
	assert.Equal(t, int64(1), fd.Calls(faultdriver.ReserveMemAddress))
	assert.LessOrEqual(t, fd.Calls(faultdriver.Any), int64(3*chunks+4), "O(chunks) driver calls")
	l := d.Live()
	assert.Equal(t, chunks, l.Imported)
	assert.Equal(t, uintptr(chunks*shareChunk), l.ImportedBytes)

	got := make([]byte, n)
	require.NoError(t, arena.CopyOut(got, b))
	require.True(t, bytes.Equal(sharedBytes(n), got), "the view holds what the producer wrote")
	ptr := b.Ptr()

	// The same memory: a write here is read there.
	require.NoError(t, arena.CopyIn(b, []byte("the consumer wrote this")))
	p.send('r')
	assert.Equal(t, "the consumer wrote this", string(p.reply().Data[:23]))

	// An Imported has a fixed size.
	va := b.Arena()
	_, err = va.Alloc(1, 1)
	require.ErrorIs(t, err, arena.ErrImported)
	require.ErrorIs(t, va.Grow(shareChunk), arena.ErrImported)
	require.ErrorIs(t, va.Truncate(0), arena.ErrImported)
	require.ErrorIs(t, va.Reset(), arena.ErrImported)
	require.ErrorIs(t, va.Shrink(), arena.ErrImported)
	require.ErrorIs(t, va.GrowContext(context.Background(), shareChunk), arena.ErrImported)
	_, err = tensor.Alloc[float32](va, 16)
	require.ErrorIs(t, err, arena.ErrImported)
	kv, err := tensor.View[uint8](b, b.Len()) // a typed view of the shared bytes
	require.NoError(t, err)
	assert.Equal(t, b.Ptr(), kv.Buffer().Ptr())
	require.ErrorIs(t, b.Share(p.conn, arena.ShareOptions{PID: p.pid()}), arena.ErrImported)
	s, err := b.Slice(10, 20)
	require.NoError(t, err)
	assert.Equal(t, ptr.Add(10), s.Ptr())
	assert.False(t, v.ReadOnly())

	p.send('q')
	assert.False(t, p.wait())
	require.NoError(t, v.Close())
	require.NoError(t, v.Close(), "twice")
	require.ErrorIs(t, arena.CopyOut(got[:1], b), arena.ErrClosed)
}

// An import is registered as any arena is: a registrar attached to the
// Imported's arena is told the reservation and every imported mapping (cause
// BackingImport), and Close deregisters them before it unmaps and unsets
// the range before it releases it.
func TestShareImportRegistered(t *testing.T) {
	const chunks = 3
	p := spawn(t, peerSpec{Role: "producer", Chunks: chunks})
	d := newShareHost(t)
	reg := acltest.NewRegistrations(d, nil)
	v, err := arena.Import(p.conn, arena.ImportConfig{Driver: reg.Driver()})
	require.NoError(t, err)
	require.Empty(t, p.reply().Err)
	var causes []arena.BackingCause
	rw := arena.RegisterWith(reg)
	require.NoError(t, v.Buffer().Arena().OnBackingChange(func(ch arena.BackingChange) error {
		causes = append(causes, ch.Cause)
		return rw(ch)
	}))
	require.Equal(t, []arena.BackingCause{arena.BackingAttach, arena.BackingImport}, causes)
	require.NoError(t, reg.Check())
	require.Equal(t, acltest.RegistrationCounts{Ranges: 1, Mappings: chunks, Bytes: chunks * shareChunk}, reg.Live())
	p.send('q')
	assert.False(t, p.wait())
	require.NoError(t, v.Close())
	require.Empty(t, reg.Violations(), "nothing unmapped while registered")
	require.True(t, reg.Live().Zero(), "left registered: %+v", reg.Live())
	require.Equal(t, arena.BackingClose, causes[len(causes)-1])
}

// The producer shrinks, closes and dies after sharing: the consumer's view
// stays valid, and the shared chunks never reach the producer's cache.
func TestShareOutlivesProducer(t *testing.T) {
	const chunks = 3
	p := spawn(t, peerSpec{Role: "producer", Chunks: chunks})
	d := newShareHost(t)
	v, err := arena.Import(p.conn, arena.ImportConfig{Driver: d})
	require.NoError(t, err)
	defer func() { require.NoError(t, v.Close()) }()
	require.Empty(t, p.reply().Err)
	n := v.Buffer().Len()
	check := func(what string) {
		got := make([]byte, n)
		require.NoError(t, arena.CopyOut(got, v.Buffer()))
		require.True(t, bytes.Equal(sharedBytes(n), got), what)
	}

	p.send('s')
	r := p.reply()
	require.Empty(t, r.Err)
	assert.Zero(t, r.Pool.Cached, "a shared chunk is freed, not cached")
	assert.Equal(t, int64(chunks), r.Pool.Exported)
	assert.GreaterOrEqual(t, r.Pool.Frees, int64(chunks))
	assert.Zero(t, r.Pool.HeldBytes, "the producer's pool no longer counts what it gave back")
	check("after the producer shrank")

	p.send('c')
	r = p.reply()
	require.Empty(t, r.Err)
	assert.True(t, r.Live.Zero(), "the producer holds nothing: %+v", r.Live)
	check("after the producer closed")

	p.send('k')
	assert.True(t, p.wait())
	check("after the producer died")
	require.NoError(t, arena.CopyIn(v.Buffer(), []byte("still mine")))
}

// A consumer that dies frees nothing of the producer's: its arena, pool and
// driver are as before, and close cleanly.
func TestShareConsumerDies(t *testing.T) {
	d := newShareHost(t)
	a, err := arena.New(arena.Config{Driver: d, Reserve: 32 << 20, Chunk: chunk.Config{Shareable: true}})
	require.NoError(t, err)
	b, err := a.Alloc(3*shareChunk, shareChunk)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(b, sharedBytes(b.Len())))
	p := spawn(t, peerSpec{Role: "consumer"})
	require.ErrorIs(t, arena.Buffer{}.Share(p.conn, arena.ShareOptions{PID: p.pid()}), arena.ErrInvalid)
	require.NoError(t, b.Share(p.conn, arena.ShareOptions{PID: p.pid()}))
	r := p.reply()
	require.Empty(t, r.Err)
	assert.Equal(t, sharedBytes(32), r.Data)
	assert.Zero(t, r.Copies, "the consumer copied nothing to import")
	before, stats := d.Live(), a.Pool().Stats()

	requireConsumerWrites(t, p, b)

	p.send('k')
	assert.True(t, p.wait())
	assert.Equal(t, before, d.Live(), "the consumer's death freed nothing here")
	assert.Equal(t, stats.HeldBytes, a.Pool().Stats().HeldBytes, "the pool counts the shared chunks until it gives them back")
	require.NoError(t, arena.CopyOut(make([]byte, 23), b))
	require.NoError(t, a.Close())
}

// requireConsumerWrites has the consumer p write into its import of b, and
// checks that b reads what it wrote: one memory, two processes.
func requireConsumerWrites(t *testing.T, p *peerProc, b arena.Buffer) {
	t.Helper()
	p.send('w')
	require.Empty(t, p.reply().Err)
	got := make([]byte, 23)
	require.NoError(t, arena.CopyOut(got, b))
	assert.Equal(t, "the consumer wrote this", string(got), "one memory, two processes")
}

// Only the process named may import: another PID, UID, or a process the
// check refuses, is refused, and gets nothing; the error names the check.
func TestShareRefusesOthers(t *testing.T) {
	other := os.Getuid() + 4242
	if os.Getuid() != 0 {
		other = 0 // root can be named, and is not this user
	}
	for _, tc := range []struct {
		name, check string
		opt         func(pid int) arena.ShareOptions
	}{
		{"pid", "check pid", func(pid int) arena.ShareOptions { return arena.ShareOptions{PID: pid + 1000000} }},
		{"uid", "check user", func(pid int) arena.ShareOptions { return arena.ShareOptions{PID: pid, User: arena.UserID(other)} }},
		{"check", "check function", func(pid int) arena.ShareOptions {
			return arena.ShareOptions{PID: pid, Check: func(c ipc.Cred) error {
				if c.PID != pid {
					return errors.New("the kernel reported another process")
				}
				return errors.New("not this one")
			}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newShareHost(t)
			a, err := arena.New(arena.Config{Driver: d, Reserve: 32 << 20, Chunk: chunk.Config{Shareable: true}})
			require.NoError(t, err)
			defer func() { require.NoError(t, a.Close()) }()
			b, err := a.Alloc(shareChunk, shareChunk)
			require.NoError(t, err)
			p := spawn(t, peerSpec{Role: "consumer"})
			err = b.Share(p.conn, tc.opt(p.pid()))
			require.ErrorIs(t, err, arena.ErrRefused)
			assert.ErrorContains(t, err, tc.check)
			r := p.reply()
			assert.True(t, r.PeerSaid && r.Peer, "the consumer hears it was refused: %s", r.Err)
			assert.False(t, r.Refused, "as the producer's word, not its own refusal: %s", r.Err)
			// It hears which check, and not whom the producer expected.
			assert.Contains(t, r.Err, fmt.Sprintf("the producer refused: %q", tc.check))
			for _, secret := range []string{fmt.Sprint(p.pid() + 1000000), fmt.Sprintf("uid %d", other), "not this one"} {
				assert.NotContains(t, r.Err, secret)
			}
			assert.True(t, r.Live.Zero(), "and holds nothing: %+v", r.Live)
			assert.Zero(t, a.Pool().Stats().Exported, "nothing was exported")
			p.send('q')
			assert.False(t, p.wait())
		})
	}
}

// A buffer shared twice with one consumer: the chunks are exported once,
// and the consumer's two imports of the same memory are one handle, freed
// when the second view closes.
func TestShareTwice(t *testing.T) {
	d := newShareHost(t)
	a, err := arena.New(arena.Config{Driver: d, Reserve: 32 << 20, Chunk: chunk.Config{Shareable: true}})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	b, err := a.Alloc(2*shareChunk, shareChunk)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(b, sharedBytes(b.Len())))
	p := spawn(t, peerSpec{Role: "consumer", Twice: true})
	for i := range 2 {
		require.NoError(t, b.Share(p.conn, arena.ShareOptions{PID: p.pid()}))
		r := p.reply()
		require.Empty(t, r.Err, "import %d", i)
		assert.Equal(t, sharedBytes(32), r.Data)
		assert.Equal(t, 2, r.Live.Handles, "import %d: the same memory is the same handles", i)
		assert.Equal(t, 2, r.Live.Imported)
	}
	assert.Equal(t, int64(2), a.Pool().Stats().Exported, "each chunk exported once")
	p.send('q')
	assert.False(t, p.wait())
}

// Two imports of the same memory into one pool hold it, and count it, once.
func TestImportTwiceOnePool(t *testing.T) {
	d := newShareHost(t)
	pool, err := chunk.New(d, chunk.Config{MaxCached: -1, Budget: 8 * shareChunk})
	require.NoError(t, err)
	defer func() { require.NoError(t, pool.Close()) }()
	p := spawn(t, peerSpec{Role: "producer", Chunks: 2, Twice: true})
	v1, err := arena.Import(p.conn, arena.ImportConfig{Pool: pool})
	require.NoError(t, err)
	require.Empty(t, p.reply().Err)
	v2, err := arena.Import(p.conn, arena.ImportConfig{Pool: pool})
	require.NoError(t, err)
	require.Empty(t, p.reply().Err)
	assert.NotEqual(t, v1.Buffer().Ptr(), v2.Buffer().Ptr(), "two views, two reservations")
	st := pool.Stats()
	assert.Equal(t, int64(2*shareChunk), st.HeldBytes, "counted once")
	assert.Equal(t, 2, st.InUse)
	assert.Equal(t, int64(4), st.Imported)
	assert.Equal(t, 2, d.Live().Handles)
	require.NoError(t, v1.Close())
	got := make([]byte, 32)
	require.NoError(t, arena.CopyOut(got, v2.Buffer()))
	assert.Equal(t, sharedBytes(32), got, "the second view lives on")
	require.NoError(t, v2.Close())
	assert.Zero(t, pool.Stats().HeldBytes)
	assert.True(t, d.Live().Zero())
	p.send('q')
	assert.False(t, p.wait())
}

// A read-only view refuses writes through the API, and the host driver maps
// it read-only.
func TestShareReadOnly(t *testing.T) {
	for _, producerSays := range []bool{true, false} {
		t.Run(fmt.Sprintf("producer=%v", producerSays), func(t *testing.T) {
			p := spawn(t, peerSpec{Role: "producer", Chunks: 1, ReadOnly: producerSays})
			d := newShareHost(t)
			v, err := arena.Import(p.conn, arena.ImportConfig{Driver: d, ReadOnly: !producerSays})
			require.NoError(t, err)
			require.Empty(t, p.reply().Err)
			assert.True(t, v.ReadOnly())
			assert.True(t, v.DeviceReadOnly())
			b := v.Buffer()
			require.ErrorIs(t, arena.CopyIn(b, []byte{1}), arena.ErrReadOnly)
			require.ErrorIs(t, arena.Fill(b, 0), arena.ErrReadOnly)
			got := make([]byte, 32)
			require.NoError(t, arena.CopyOut(got, b))
			assert.Equal(t, sharedBytes(32), got)
			mem, err := d.Bytes(b.Ptr(), 1)
			require.NoError(t, err)
			assert.True(t, acltest.WriteFaults(mem, 0), "the device refuses the write too")
			require.NoError(t, v.Close())
			p.send('q')
			assert.False(t, p.wait())
		})
	}
}

// The consumer's budget: a share larger than it is refused before any
// import; the consumer says out of memory, and the producer hears the
// consumer's word for it (ErrPeer, with its code), which matches none of its
// own sentinels.
func TestShareBudget(t *testing.T) {
	d := newShareHost(t)
	a, err := arena.New(arena.Config{Driver: d, Reserve: 32 << 20, Chunk: chunk.Config{Shareable: true}})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	b, err := a.Alloc(3*shareChunk, shareChunk)
	require.NoError(t, err)
	p := spawn(t, peerSpec{Role: "consumer", Budget: 2 * shareChunk})
	err = b.Share(p.conn, arena.ShareOptions{PID: p.pid()})
	require.ErrorIs(t, err, arena.ErrPeer, "the consumer's out-of-memory reaches the producer")
	require.NotErrorIs(t, err, arena.ErrOutOfMemory, "as the consumer's word")
	pe, ok := errors.AsType[*arena.PeerError](err)
	require.True(t, ok)
	assert.Equal(t, acl.ErrCodeRTMemoryAllocation, pe.Code)
	assert.Contains(t, pe.Reason, "check budget")
	r := p.reply()
	assert.True(t, r.OOM, r.Err)
	assert.True(t, r.Live.Zero(), "%+v", r.Live)
	p.send('q')
	assert.False(t, p.wait())
}

// A view's Close waits for the work queued on its streams before it unmaps,
// like any arena's: a deadline that passes first leaves the view open.
func TestShareStreamOrderedClose(t *testing.T) {
	p := spawn(t, peerSpec{Role: "producer", Chunks: 2})
	d := newShareHost(t)
	s, err := d.CreateStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyStream(s)) }()
	v, err := arena.Import(p.conn, arena.ImportConfig{Driver: d, Streams: []acl.Stream{s}})
	require.NoError(t, err)
	require.Empty(t, p.reply().Err)
	done := make(chan struct{})
	require.NoError(t, d.Launch(s, v.Buffer().Ptr(), 4096, done))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, v.CloseContext(ctx), context.DeadlineExceeded)
	rest, err := v.Buffer().Slice(8192, 8192+32) // beside the work, which a copy would race
	require.NoError(t, err)
	got := make([]byte, 32)
	require.NoError(t, arena.CopyOut(got, rest), "still open")
	close(done)
	require.NoError(t, v.Close())
	require.NoError(t, d.SynchronizeStream(s))
	assert.Zero(t, d.Faults(), "nothing was unmapped under the work")
	p.send('q')
	assert.False(t, p.wait())
}

// Either process killed at each step of the hand-over: the survivor's call
// fails (or, after the consumer's acknowledgement, succeeds), and it holds
// nothing more than before.
func TestShareKilledAtEachStep(t *testing.T) {
	for _, step := range []string{"share:hello", "share:exported", "share:offered", "share:acked"} {
		t.Run(step, func(t *testing.T) {
			p := spawn(t, peerSpec{Role: "producer", Chunks: 2, DieAt: step})
			d := newShareHost(t)
			v, err := arena.Import(p.conn, arena.ImportConfig{Driver: d})
			switch {
			case step == "share:acked":
				require.NoError(t, err, "the consumer was done before the producer died")
				require.NoError(t, v.Close())
			case step == "share:offered" && err == nil:
				// The producer died after sending the memory: whether the
				// acknowledgement found it alive is a race. If it did, the
				// view is whole.
				got := make([]byte, 32)
				require.NoError(t, arena.CopyOut(got, v.Buffer()))
				assert.Equal(t, sharedBytes(32), got)
				require.NoError(t, v.Close())
			default:
				require.Error(t, err)
				assert.Nil(t, v)
			}
			assert.True(t, p.wait(), "killed")
			assert.True(t, d.Live().Zero(), "%+v", d.Live())
		})
	}
	for _, step := range []string{"import:hello", "import:offer", "import:imported", "import:mapped"} {
		t.Run(step, func(t *testing.T) {
			d := newShareHost(t)
			a, err := arena.New(arena.Config{Driver: d, Reserve: 32 << 20, Chunk: chunk.Config{Shareable: true}})
			require.NoError(t, err)
			b, err := a.Alloc(2*shareChunk, shareChunk)
			require.NoError(t, err)
			require.NoError(t, arena.CopyIn(b, sharedBytes(b.Len())))
			before := d.Live()
			p := spawn(t, peerSpec{Role: "consumer", DieAt: step})
			err = b.Share(p.conn, arena.ShareOptions{PID: p.pid()})
			require.Error(t, err, "the consumer never said it mapped the memory")
			assert.True(t, p.wait(), "killed")
			assert.Equal(t, before, d.Live(), "the arena is as it was")
			got := make([]byte, 32)
			require.NoError(t, arena.CopyOut(got, b))
			assert.Equal(t, sharedBytes(32), got)
			require.NoError(t, a.Close())
			assert.Zero(t, a.Pool().Stats().Cached, "exported chunks were freed, not cached")
		})
	}
}

// A consumer whose driver fails at each call of the import, and of the
// Imported's close: Import fails cleanly (and the producer hears of it), or the
// close fails and succeeds when tried again; nothing leaks.
func TestImportFaults(t *testing.T) {
	for pos := 1; ; pos++ {
		d := newShareHost(t)
		fd := faultdriver.New(d)
		fd.FailNth(faultdriver.Any, pos, 0)
		p := spawn(t, peerSpec{Role: "producer", Chunks: 2})
		v, err := arena.Import(p.conn, arena.ImportConfig{Driver: fd})
		if err != nil {
			// A failure before the hello leaves the producer waiting for
			// one: hang up.
			require.NoError(t, p.conn.CloseWrite())
		}
		r := p.reply()
		if err != nil {
			require.Equal(t, int64(1), fd.Injected(faultdriver.Any), "position %d: %v", pos, err)
			assert.NotEmpty(t, r.Err, "position %d: the producer hears the import failed", pos)
			requireOnePrefix(t, err)
			assert.NotRegexp(t, `0x[0-9a-f]|fd [0-9]`, r.Err, "position %d: the producer hears no address or descriptor", pos)
		} else {
			require.Empty(t, r.Err)
			got, err := d.Bytes(v.Buffer().Ptr(), 32) // not through fd, which counts the call
			require.NoError(t, err)
			assert.Equal(t, sharedBytes(32), got)
			if cerr := v.Close(); cerr != nil {
				require.NoError(t, v.Close(), "position %d: a second close", pos)
			}
		}
		assert.True(t, d.Live().Zero(), "position %d: %+v", pos, d.Live())
		if err == nil {
			p.send('q')
		}
		assert.False(t, p.wait())
		if fd.Injected(faultdriver.Any) == 0 {
			assert.Greater(t, pos, 8, "the import and close made calls")
			return
		}
	}
}

// A producer whose driver fails at each call of Share: it fails cleanly,
// the consumer hears of it, and the arena is usable and closes cleanly.
func TestShareFaults(t *testing.T) {
	for pos := 1; ; pos++ {
		d := newShareHost(t)
		fd := faultdriver.New(d)
		a, err := arena.New(arena.Config{Driver: fd, Reserve: 32 << 20, Chunk: chunk.Config{Shareable: true}})
		require.NoError(t, err)
		b, err := a.Alloc(2*shareChunk, shareChunk)
		require.NoError(t, err)
		require.NoError(t, arena.CopyIn(b, sharedBytes(b.Len())))
		p := spawn(t, peerSpec{Role: "consumer"})
		fd.FailNth(faultdriver.Any, pos, 0)
		err = b.Share(p.conn, arena.ShareOptions{PID: p.pid()})
		fd.Clear()
		r := p.reply()
		injected := fd.Injected(faultdriver.Any)
		if err != nil {
			require.Equal(t, int64(1), injected, "position %d: %v", pos, err)
			assert.NotEmpty(t, r.Err, "position %d: the consumer hears the share failed", pos)
			requireOnePrefix(t, err)
			assert.NotRegexp(t, `0x[0-9a-f]|fd [0-9]`, r.Err, "position %d: the consumer hears no address or descriptor", pos)
			assert.True(t, r.Live.Zero(), "position %d: the consumer holds nothing: %+v", pos, r.Live)
		} else {
			require.Empty(t, r.Err)
		}
		got := make([]byte, 32)
		require.NoError(t, arena.CopyOut(got, b))
		assert.Equal(t, sharedBytes(32), got)
		p.send('q')
		assert.False(t, p.wait())
		require.NoError(t, a.Close())
		assert.Zero(t, a.Pool().Stats().Cached, "position %d: exported chunks are freed, not cached", pos)
		if injected == 0 {
			return
		}
	}
}

// What cannot share: a driver without sharing, a pool whose chunks are not
// exportable, bad arguments.
func TestShareRefusals(t *testing.T) {
	d := newShareHost(t)
	a, err := arena.New(arena.Config{Driver: d, Reserve: 32 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	b, err := a.Alloc(shareChunk, shareChunk)
	require.NoError(t, err)
	c, f, err := ipc.Socketpair()
	require.NoError(t, err)
	defer c.Close()
	defer f.Close()
	require.ErrorIs(t, b.Share(nil, arena.ShareOptions{PID: 1}), arena.ErrInvalid)
	require.ErrorIs(t, b.Share(c, arena.ShareOptions{}), arena.ErrInvalid, "no PID")
	require.ErrorIs(t, arena.Buffer{}.Share(c, arena.ShareOptions{PID: 1}), arena.ErrInvalid)
	empty, err := b.Slice(0, 0)
	require.NoError(t, err)
	require.ErrorIs(t, empty.Share(c, arena.ShareOptions{PID: 1}), arena.ErrInvalid)
	_, err = arena.Import(nil, arena.ImportConfig{})
	require.ErrorIs(t, err, arena.ErrInvalid)
	_, err = arena.Import(c, arena.ImportConfig{Budget: -1})
	require.ErrorIs(t, err, arena.ErrInvalid)
	require.ErrorIs(t, b.Share(c, arena.ShareOptions{PID: 1, User: arena.UserID(-1)}), arena.ErrInvalid, "no such user")
	_, err = arena.Import(c, arena.ImportConfig{ProducerPID: -1})
	require.ErrorIs(t, err, arena.ErrInvalid)
	_, err = arena.Import(c, arena.ImportConfig{ProducerUser: arena.UserID(-3)})
	require.ErrorIs(t, err, arena.ErrInvalid)
	assert.Equal(t, "uid 0", arena.UserID(0).String(), "root can be named")
	assert.Equal(t, "same user", arena.SameUser.String())
	assert.Equal(t, "any user", arena.AnyUser.String())

	// Chunks not made exportable: the host driver refuses the export, and
	// the consumer hears why.
	p := spawn(t, peerSpec{Role: "consumer"})
	err = b.Share(p.conn, arena.ShareOptions{PID: p.pid()})
	require.ErrorIs(t, err, acl.ErrInvalidParam)
	r := p.reply()
	assert.Contains(t, r.Err, `"aclrtMemExportToShareableHandle failed" (ACL code 107000)`, "the call that failed, and its code")
	assert.NotContains(t, r.Err, "0x", "no handle or address")
	assert.True(t, r.Peer && !r.Refused, "the producer's word: %s", r.Err)
	p.send('q')
	assert.False(t, p.wait())

	// A driver that cannot share.
	_, err = chunk.New(newSparseNoShare(), chunk.Config{Shareable: true})
	require.ErrorIs(t, err, acl.ErrNotSupported)
}

// The consumer checks the producer as the kernel reports it: the process
// that made the socketpair here (SO_PEERCRED, pinned by SO_PEERPIDFD), which
// must be the one ImportConfig.ProducerPID names. Another is refused before
// the consumer says a word.
func TestImportChecksProducer(t *testing.T) {
	t.Run("named", func(t *testing.T) {
		d := newShareHost(t)
		a, err := arena.New(arena.Config{Driver: d, Reserve: 32 << 20, Chunk: chunk.Config{Shareable: true}})
		require.NoError(t, err)
		defer func() { require.NoError(t, a.Close()) }()
		b, err := a.Alloc(shareChunk, shareChunk)
		require.NoError(t, err)
		p := spawn(t, peerSpec{Role: "consumer", Producer: -1})
		require.NoError(t, b.Share(p.conn, arena.ShareOptions{PID: p.pid()}))
		r := p.reply()
		require.Empty(t, r.Err)
		p.send('q')
		assert.False(t, p.wait())
	})
	t.Run("another", func(t *testing.T) {
		p := spawn(t, peerSpec{Role: "consumer", Producer: 1})
		r := p.reply()
		assert.True(t, r.Refused, r.Err)
		assert.Contains(t, r.Err, "check pid")
		assert.Contains(t, r.Err, "SO_PEERCRED")
		assert.True(t, r.Live.Zero())
		p.send('q')
		assert.False(t, p.wait())
	})
}
