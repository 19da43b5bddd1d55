//go:build linux

package arena_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/acl/ipc/ipctest"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// The hostile-peer suite: each side of a hand-over against a peer that
// sends what it likes, frame by frame, in this process (the peer is a
// goroutine on the other end of a socketpair, whose credentials are this
// process's, so that the frames reach every check after the identity's).
// Each case must fail with an error naming the check that failed, and leave
// no descriptor open and no driver object live.

// Frames, written by hand from the wire layout (docs/sharing.md), so that
// the suite checks the layout too.

const (
	wireV     = 2
	tokenForm = uint32(acl.SharingToken)
	fdForm    = uint32(acl.SharingFD)
)

func frame(magic string, n int) []byte {
	b := make([]byte, n)
	copy(b, magic)
	return b
}

func helloFrame(sharing, tgid, flags, reserved uint32) []byte {
	b := frame("VMAHELO2", 32)
	binary.LittleEndian.PutUint32(b[8:], wireV)
	binary.LittleEndian.PutUint32(b[12:], sharing)
	binary.LittleEndian.PutUint32(b[16:], tgid)
	binary.LittleEndian.PutUint32(b[24:], flags)
	binary.LittleEndian.PutUint32(b[28:], reserved)
	return b
}

type offerF struct {
	magic                     string
	version, status, sharing  uint32
	flags                     uint32
	chunkSize, chunks, off, n uint64
	code                      int32
	textLen                   uint32 // of text, unless set
	text                      string
}

func (o offerF) bytes() []byte {
	if o.magic == "" {
		o.magic = "VMAOFFR2"
	}
	if o.version == 0 {
		o.version = wireV
	}
	b := frame(o.magic, 64)
	le := binary.LittleEndian
	le.PutUint32(b[8:], o.version)
	le.PutUint32(b[12:], o.status)
	le.PutUint32(b[16:], o.sharing)
	le.PutUint32(b[20:], o.flags)
	le.PutUint64(b[24:], o.chunkSize)
	le.PutUint64(b[32:], o.chunks)
	le.PutUint64(b[40:], o.off)
	le.PutUint64(b[48:], o.n)
	le.PutUint32(b[56:], uint32(o.code))
	if o.textLen == 0 {
		o.textLen = uint32(len(o.text))
	}
	le.PutUint32(b[60:], o.textLen)
	return append(b, o.text...)
}

// good is a sound offer of n chunks of shareChunk bytes.
func good(n uint64) offerF {
	return offerF{sharing: fdForm, chunkSize: shareChunk, chunks: n, off: 0, n: n * shareChunk}
}

// sized is an offer of chunks of the sizes given, in units of shareChunk
// (flag 2), holding [off, +n); sizesFrame is its table.
func sized(off, n uint64, sizes ...uint32) offerF {
	return offerF{sharing: fdForm, flags: 2, chunkSize: shareChunk, chunks: uint64(len(sizes)), off: off, n: n}
}

func sizesFrame(sizes ...uint32) []byte {
	var b []byte
	for _, s := range sizes {
		b = binary.LittleEndian.AppendUint32(b, s)
	}
	return b
}

func batchFrame(n, reserved uint32) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint32(b, n)
	binary.LittleEndian.PutUint32(b[4:], reserved)
	return b
}

func ackFrame(magic string, status uint32, code int32, textLen, reserved uint32, text string) []byte {
	b := frame(magic, 24)
	binary.LittleEndian.PutUint32(b[8:], status)
	binary.LittleEndian.PutUint32(b[12:], uint32(code))
	binary.LittleEndian.PutUint32(b[16:], textLen)
	binary.LittleEndian.PutUint32(b[20:], reserved)
	return append(b, text...)
}

// hostileKit makes the descriptors a hostile peer sends, and closes them.
type hostileKit struct {
	t   *testing.T
	fds []int
}

func (k *hostileKit) keep(fd int, err error) int {
	require.NoError(k.t, err)
	k.fds = append(k.fds, fd)
	return fd
}

func (k *hostileKit) memfd(size int64, seals int) int {
	return k.keep(ipctest.Memfd("vmarena-host", size, seals))
}

func (k *hostileKit) file(f *os.File, err error) int {
	require.NoError(k.t, err)
	fd, err := ipctest.Reopen(int(f.Fd()), ipctest.ReadOnly)
	f.Close()
	return k.keep(fd, err)
}

func (k *hostileKit) close() {
	for _, fd := range k.fds {
		_ = ipctest.Close(fd)
	}
}

// kinds of descriptors a hostile producer sends in place of memory.
func (k *hostileKit) pipe() int {
	r, w, err := os.Pipe()
	require.NoError(k.t, err)
	defer w.Close()
	return k.file(r, nil)
}

func (k *hostileKit) socket() int {
	c, f, err := ipc.Socketpair()
	require.NoError(k.t, err)
	c.Close()
	fd, err := ipctest.Reopen(int(f.Fd()), ipctest.ReadOnly)
	if err != nil { // a socket cannot be reopened: send a duplicate of it
		fd, err = ipc.Dup(int(f.Fd()))
	}
	f.Close()
	return k.keep(fd, err)
}

func (k *hostileKit) regular() int {
	f, err := os.CreateTemp(k.t.TempDir(), "f")
	require.NoError(k.t, err)
	require.NoError(k.t, f.Truncate(shareChunk))
	return k.file(f, nil)
}

func (k *hostileKit) readOnly() int {
	return k.keep(ipctest.Reopen(k.memfd(shareChunk, ipctest.Sealed), ipctest.ReadOnly))
}

// peerConns returns this side's end and the hostile peer's of a socketpair,
// with deadlines.
func peerConns(t *testing.T, deadline time.Duration) (mine, theirs *net.UnixConn) {
	t.Helper()
	mine, f, err := ipc.Socketpair()
	require.NoError(t, err)
	theirs, err = ipc.FileConn(f)
	require.NoError(t, err)
	f.Close()
	require.NoError(t, mine.SetDeadline(time.Now().Add(deadline)))
	require.NoError(t, theirs.SetDeadline(time.Now().Add(deadline)))
	return mine, theirs
}

// drainPeer reads what comes until the other end closes, and closes any
// descriptor that came with it.
func drainPeer(c *net.UnixConn) {
	for {
		fds, _, err := ipc.Recv(c, make([]byte, 1), ipc.MaxFDs)
		_ = ipc.CloseAll(fds)
		if err != nil {
			return
		}
	}
}

// openFDs returns this process's open descriptors, each with what it is.
func openFDs(t *testing.T) map[int]string {
	t.Helper()
	fds, err := ipctest.FDs()
	require.NoError(t, err)
	return fds
}

// sameFDs checks that the descriptors open now are those open before,
// naming the ones opened or closed since. A test that counts descriptors
// must join the goroutines it started that close some: a close landing in
// the next test reads as that test's.
func sameFDs(t *testing.T, before map[int]string, msg string) bool {
	t.Helper()
	return assert.Empty(t, ipctest.FDChanges(before, openFDs(t)), msg)
}

// otherProcesses returns a process that runs (killed at the end) and one
// that has exited.
func otherProcesses(t *testing.T) (running, exited int) {
	t.Helper()
	s := exec.Command("sleep", "60")
	require.NoError(t, s.Start())
	t.Cleanup(func() { _ = s.Process.Kill(); _ = s.Wait() })
	e := exec.Command("true")
	require.NoError(t, e.Run())
	return s.Process.Pid, e.Process.Pid
}

func otherUser() int {
	if os.Getuid() != 0 {
		return 0 // root can be named
	}
	return 4242
}

// sanitised reports whether s is what an error may carry of a peer's text.
func sanitised(s string) bool {
	return len(s) <= 600 && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0
}

var controlText = strings.Repeat("\x1b[2J\x00\r\nforged: ", 80) // 1200 bytes of control characters and lies

type producerCase struct {
	name  string
	check string // what the error says
	is    error  // what it matches, when set
	cfg   func(*arena.ImportConfig)
	// play is the hostile producer, once it has read the hello.
	play func(c *net.UnixConn, k *hostileKit)
}

func send(c *net.UnixConn, b []byte, fds ...int) { _ = ipc.Send(c, b, fds, true) }

func producerCases(t *testing.T) []producerCase {
	running, exited := otherProcesses(t)
	offerThen := func(o offerF, then func(c *net.UnixConn, k *hostileKit)) func(*net.UnixConn, *hostileKit) {
		return func(c *net.UnixConn, k *hostileKit) {
			send(c, o.bytes())
			if then != nil {
				then(c, k)
			}
		}
	}
	batch := func(fd func(k *hostileKit) int) func(*net.UnixConn, *hostileKit) {
		return offerThen(good(1), func(c *net.UnixConn, k *hostileKit) { send(c, batchFrame(1, 0), fd(k)) })
	}
	return []producerCase{
		// Frames.
		{"bad magic", "bad magic", arena.ErrRefused, nil, offerThen(offerF{magic: "VMAOFFR1"}, nil)},
		{"old version", "version 1", arena.ErrRefused, nil, offerThen(offerF{version: 1}, nil)},
		{"offer cut short", "unexpected EOF", io.ErrUnexpectedEOF, nil, func(c *net.UnixConn, k *hostileKit) { send(c, good(1).bytes()[:40]) }},
		{"no offer", "EOF", io.EOF, nil, func(c *net.UnixConn, k *hostileKit) {}},
		{"unknown status", "unknown status 7", arena.ErrRefused, nil, offerThen(offerF{status: 7}, nil)},
		{"unknown flags", "unknown flags 0x80", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, flags: 0x80}, nil)},
		{"text too long", "a text of 4096 bytes", arena.ErrRefused, nil, offerThen(offerF{status: 2, textLen: 4096}, nil)},
		{"text with a share", "a share with code 0 and a text of 2 bytes", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: shareChunk, chunks: 1, n: 1, text: "hi"}, nil)},
		{"code with a share", "a share with code 207001", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: shareChunk, chunks: 1, n: 1, code: 207001}, nil)},
		{"refusal offering chunks", "a refusal offering", arena.ErrRefused, nil, offerThen(offerF{status: 1, chunks: 5}, nil)},
		{"forged out-of-memory", "the producer failed", arena.ErrPeer, nil,
			offerThen(offerF{status: 2, code: acl.ErrCodeRTMemoryAllocation, text: controlText[:1000]}, nil)},
		{"forged refusal", "the producer refused", arena.ErrPeer, nil, offerThen(offerF{status: 1, code: acl.ErrCodeRTDrvInternal, text: "go away"}, nil)},
		{"token form", "shares memory as token", acl.ErrNotSupported, nil, offerThen(offerF{sharing: tokenForm, chunkSize: shareChunk, chunks: 1, n: 1}, nil)},
		{"unknown form", "shares memory as acl.Sharing(9)", acl.ErrNotSupported, nil, offerThen(offerF{sharing: 9, chunkSize: shareChunk, chunks: 1, n: 1}, nil)},
		// Sizes and counts.
		{"chunk size 0", "check chunk size", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunks: 1, n: 1}, nil)},
		{"1-byte chunks × 2⁴⁰", "check chunk size", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: 1, chunks: 1 << 40, n: 1 << 40}, nil)},
		{"chunk size off the granularity", "granularity", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: shareChunk + 4096, chunks: 1, n: 1}, nil)},
		{"chunk size past any reservation", "largest reservation", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: 1 << 41, chunks: 1, n: 1}, nil)},
		{"no chunks", "check chunk count", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: shareChunk, n: 1}, nil)},
		{"2⁴⁰ chunks", "check chunk count", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: shareChunk, chunks: 1 << 40, n: 1}, nil)},
		{"count overflowing the size", "check chunk count", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: shareChunk, chunks: 1 << 63, n: 1}, nil)},
		{"buffer starting past the first chunk", "check buffer", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: shareChunk, chunks: 1, off: shareChunk, n: 1}, nil)},
		{"empty buffer", "check buffer", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: shareChunk, chunks: 1}, nil)},
		{"buffer past the chunks", "check buffer", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: shareChunk, chunks: 1, off: 10, n: shareChunk}, nil)},
		{"chunk beyond the buffer", "leaves the last", arena.ErrRefused, nil, offerThen(offerF{sharing: fdForm, chunkSize: shareChunk, chunks: 3, n: 10}, nil)},
		{"past the budget", "check budget", arena.ErrOutOfMemory, func(c *arena.ImportConfig) { c.Budget = shareChunk },
			offerThen(good(2), func(c *net.UnixConn, k *hostileKit) {
				send(c, batchFrame(2, 0), k.memfd(shareChunk, ipctest.Sealed), k.memfd(shareChunk, ipctest.Sealed))
			})},
		// Sizes tables (flag 2).
		{"sizes with a refusal", "a refusal offering", arena.ErrRefused, nil, offerThen(offerF{status: 1, flags: 2}, nil)},
		{"no sizes table", "EOF", io.EOF, nil, offerThen(sized(0, shareChunk+1, 1, 1), nil)},
		{"sizes table cut short", "unexpected EOF", io.ErrUnexpectedEOF, nil,
			offerThen(sized(0, shareChunk+1, 1, 1, 1), func(c *net.UnixConn, k *hostileKit) { send(c, sizesFrame(1, 1)[:6]) })},
		{"a chunk of 0 units", "check chunk size", arena.ErrRefused, nil,
			offerThen(sized(0, shareChunk+1, 1, 0), func(c *net.UnixConn, k *hostileKit) { send(c, sizesFrame(1, 0)) })},
		{"a chunk past the largest reservation", "check chunk size", arena.ErrRefused, nil,
			offerThen(sized(0, shareChunk+1, 1, 0xffffffff), func(c *net.UnixConn, k *hostileKit) { send(c, sizesFrame(1, 0xffffffff)) })},
		{"sizes adding up past the largest reservation", "check chunk count", arena.ErrRefused, nil,
			offerThen(sized(0, shareChunk+1, 65535, 1, 1), func(c *net.UnixConn, k *hostileKit) { send(c, sizesFrame(65535, 1, 1)) })},
		{"sized buffer starting past the first chunk", "check buffer", arena.ErrRefused, nil,
			offerThen(sized(shareChunk, 1, 1, 4), func(c *net.UnixConn, k *hostileKit) { send(c, sizesFrame(1, 4)) })},
		{"sized buffer past the chunks", "check buffer", arena.ErrRefused, nil,
			offerThen(sized(10, 5*shareChunk, 1, 4), func(c *net.UnixConn, k *hostileKit) { send(c, sizesFrame(1, 4)) })},
		{"sized buffer leaving the last chunk empty", "leaves the last", arena.ErrRefused, nil,
			offerThen(sized(0, 4*shareChunk, 4, 1), func(c *net.UnixConn, k *hostileKit) { send(c, sizesFrame(4, 1)) })},
		{"sizes past the budget", "check budget", arena.ErrOutOfMemory, func(c *arena.ImportConfig) { c.Budget = 2 * shareChunk },
			offerThen(sized(0, shareChunk+1, 1, 2), func(c *net.UnixConn, k *hostileKit) {
				send(c, sizesFrame(1, 2))
				send(c, batchFrame(2, 0), k.memfd(shareChunk, ipctest.Sealed), k.memfd(2*shareChunk, ipctest.Sealed))
			})},
		{"memory file smaller than its size in the table", "differs from the physical allocation", acl.ErrInvalidParam, nil,
			offerThen(sized(0, shareChunk+1, 1, 2), func(c *net.UnixConn, k *hostileKit) {
				send(c, sizesFrame(1, 2))
				send(c, batchFrame(2, 0), k.memfd(shareChunk, ipctest.Sealed), k.memfd(shareChunk, ipctest.Sealed))
			})},
		// Batches.
		{"batch of 0", "batch: 0 descriptors", arena.ErrRefused, nil, offerThen(good(1), func(c *net.UnixConn, k *hostileKit) { send(c, batchFrame(0, 0)) })},
		{"batch of 65", "batch: 65 descriptors", arena.ErrRefused, nil, offerThen(good(100), func(c *net.UnixConn, k *hostileKit) { send(c, batchFrame(65, 0)) })},
		{"batch past the offer", "only 1 more expected", arena.ErrRefused, nil,
			offerThen(good(1), func(c *net.UnixConn, k *hostileKit) {
				send(c, batchFrame(2, 0), k.memfd(shareChunk, ipctest.Sealed), k.memfd(shareChunk, ipctest.Sealed))
			})},
		{"batch saying more than came", "says 2 descriptors, 1 came", arena.ErrRefused, nil,
			offerThen(good(2), func(c *net.UnixConn, k *hostileKit) { send(c, batchFrame(2, 0), k.memfd(shareChunk, ipctest.Sealed)) })},
		{"batch without descriptors", "says 1 descriptors, 0 came", arena.ErrRefused, nil, offerThen(good(1), func(c *net.UnixConn, k *hostileKit) { send(c, batchFrame(1, 0)) })},
		{"batch's reserved field", "reserved field", arena.ErrRefused, nil,
			offerThen(good(1), func(c *net.UnixConn, k *hostileKit) { send(c, batchFrame(1, 7), k.memfd(shareChunk, ipctest.Sealed)) })},
		{"gone between batches", "EOF", io.EOF, nil,
			offerThen(good(2), func(c *net.UnixConn, k *hostileKit) { send(c, batchFrame(1, 0), k.memfd(shareChunk, ipctest.Sealed)) })},
		{"descriptors with the offer", "control data was cut", nil, nil,
			func(c *net.UnixConn, k *hostileKit) { send(c, good(1).bytes(), k.memfd(shareChunk, ipctest.Sealed)) }},
		{"too many descriptors in a batch", "control data was cut", nil, nil,
			offerThen(good(100), func(c *net.UnixConn, k *hostileKit) {
				fds := make([]int, 65)
				for i := range fds {
					fds[i] = k.memfd(shareChunk, ipctest.Sealed)
				}
				send(c, batchFrame(65, 0), fds...)
			})},
		// Descriptors.
		{"unsealed memory file", "seals", acl.ErrInvalidHandle, nil, batch(func(k *hostileKit) int { return k.memfd(shareChunk, 0) })},
		{"memory file sealed against shrinking only", "seals", acl.ErrInvalidHandle, nil,
			batch(func(k *hostileKit) int { return k.memfd(shareChunk, ipctest.SealShrink|ipctest.SealSeal) })},
		{"memory file with its seals open", "seals", acl.ErrInvalidHandle, nil,
			batch(func(k *hostileKit) int { return k.memfd(shareChunk, ipctest.SealShrink|ipctest.SealGrow) })},
		{"memory file larger than a chunk", "differs from the physical allocation", acl.ErrInvalidParam, nil,
			batch(func(k *hostileKit) int { return k.memfd(2*shareChunk, ipctest.Sealed) })},
		{"memory file of a page", "not a whole physical allocation", acl.ErrInvalidHandle, nil,
			batch(func(k *hostileKit) int { return k.memfd(4096, ipctest.Sealed) })},
		{"pipe", "not a memory file", acl.ErrInvalidHandle, nil, batch((*hostileKit).pipe)},
		{"socket", "not a memory file", acl.ErrInvalidHandle, nil, batch((*hostileKit).socket)},
		{"/dev/zero", "not a memory file", acl.ErrInvalidHandle, nil, batch(func(k *hostileKit) int { return k.file(os.Open("/dev/zero")) })},
		{"regular file", "seals", acl.ErrInvalidHandle, nil, batch((*hostileKit).regular)},
		{"read-only memory offered read-write", "read-only", acl.ErrInvalidParam, nil, batch((*hostileKit).readOnly)},
		// Who.
		{"another process expected", "check pid", arena.ErrRefused, func(c *arena.ImportConfig) { c.ProducerPID = running }, offerThen(good(1), nil)},
		{"an exited process expected", "does not run", arena.ErrRefused, func(c *arena.ImportConfig) { c.ProducerPID = exited }, offerThen(good(1), nil)},
		{"another user expected", "check user", arena.ErrRefused, func(c *arena.ImportConfig) { c.ProducerUser = arena.UserID(otherUser()) }, offerThen(good(1), nil)},
		{"the check refuses", "check function", arena.ErrRefused,
			func(c *arena.ImportConfig) { c.ProducerCheck = func(ipc.Cred) error { return errors.New("not today") } }, offerThen(good(1), nil)},
		{"silence", "i/o timeout", os.ErrDeadlineExceeded, nil, func(c *net.UnixConn, k *hostileKit) { time.Sleep(time.Second) }},
	}
}

// Import against a hostile producer.
func TestHostileProducer(t *testing.T) {
	cases := producerCases(t)
	require.GreaterOrEqual(t, len(cases), 30)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := openFDs(t)
			d, err := host.New(host.Config{Capacity: 64 << 20})
			require.NoError(t, err)
			mine, theirs := peerConns(t, 300*time.Millisecond)
			k := &hostileKit{t: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				if _, _, err := ipc.Recv(theirs, make([]byte, 32), 0); err != nil {
					return
				}
				tc.play(theirs, k)
				_ = theirs.CloseWrite()
				drainPeer(theirs)
			}()
			cfg := arena.ImportConfig{Driver: d}
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			v, err := arena.Import(mine, cfg)
			if v != nil {
				v.Close()
			}
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.check)
			if tc.is != nil {
				assert.ErrorIs(t, err, tc.is)
			}
			if errors.Is(tc.is, arena.ErrPeer) {
				assert.NotErrorIs(t, err, arena.ErrOutOfMemory, "the producer's word is not this process's out-of-memory")
				assert.NotErrorIs(t, err, arena.ErrRefused, "nor its refusal")
				pe, ok := errors.AsType[*arena.PeerError](err)
				require.True(t, ok)
				assert.True(t, sanitised(pe.Reason), "%q", pe.Reason)
				assert.True(t, sanitised(err.Error()), "%q", err.Error())
			}
			mine.Close()
			<-done
			theirs.Close()
			k.close()
			assert.True(t, d.Live().Zero(), "leaked: %+v", d.Live())
			require.NoError(t, d.Close())
			sameFDs(t, before, "descriptors leaked")
		})
	}
}

// The harness can succeed: a sound offer of sealed memory files is mapped.
func TestHostileHarnessSucceeds(t *testing.T) {
	before := openFDs(t)
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	mine, theirs := peerConns(t, 5*time.Second)
	k := &hostileKit{t: t}
	go func() {
		if _, _, err := ipc.Recv(theirs, make([]byte, 32), 0); err != nil {
			return
		}
		send(theirs, good(2).bytes())
		send(theirs, batchFrame(2, 0), k.memfd(shareChunk, ipctest.Sealed), k.memfd(shareChunk, ipctest.Sealed))
		drainPeer(theirs)
	}()
	v, err := arena.Import(mine, arena.ImportConfig{Driver: d})
	require.NoError(t, err)
	assert.Equal(t, 2*shareChunk, v.Buffer().Len())
	require.NoError(t, arena.CopyIn(v.Buffer(), []byte("mapped")))
	require.NoError(t, v.Close())
	mine.Close()
	theirs.Close()
	k.close()
	assert.True(t, d.Live().Zero())
	require.NoError(t, d.Close())
	sameFDs(t, before, "descriptors leaked")
}

// A sound offer with a sizes table is mapped chunk by chunk at its sizes;
// one the consumer's pool cannot take (a size it does not lend) is refused
// with its table and handles read and dropped, so that the connection stays
// in step: a second Import on it maps the next offer.
func TestHostileSizes(t *testing.T) {
	before := openFDs(t)
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	pool, err := chunk.New(d, chunk.Config{Size: 4 * shareChunk, TailSize: shareChunk, MaxCached: -1})
	require.NoError(t, err)
	mine, theirs := peerConns(t, 5*time.Second)
	k := &hostileKit{t: t}
	played := make(chan error, 1)
	go func() {
		played <- func() error {
			for _, sizes := range [][]uint32{{1, 2, 1}, {1, 4, 1}} {
				if _, _, err := ipc.Recv(theirs, make([]byte, 32), 0); err != nil {
					return err
				}
				units := uint64(0)
				for _, u := range sizes {
					units += uint64(u)
				}
				send(theirs, sized(100, units*shareChunk-200, sizes...).bytes())
				send(theirs, sizesFrame(sizes...))
				fds := make([]int, len(sizes))
				for i, u := range sizes {
					fds[i] = k.memfd(int64(u)*shareChunk, ipctest.Sealed)
				}
				send(theirs, batchFrame(uint32(len(fds)), 0), fds...)
				if _, err := readAck(theirs); err != nil {
					return err
				}
			}
			return nil
		}()
		drainPeer(theirs)
	}()
	_, err = arena.Import(mine, arena.ImportConfig{Pool: pool})
	require.ErrorIs(t, err, arena.ErrInvalid)
	assert.ErrorContains(t, err, "check chunk size")
	assert.Zero(t, pool.Stats().HeldBytes, "nothing imported")
	v, err := arena.Import(mine, arena.ImportConfig{Pool: pool})
	require.NoError(t, err, "the connection is in step")
	assert.Equal(t, []int{shareChunk, 4 * shareChunk, shareChunk}, arena.Layout(v.Buffer().Arena()))
	assert.Equal(t, 100, v.Buffer().Offset())
	assert.Equal(t, 6*shareChunk-200, v.Buffer().Len())
	assert.Equal(t, int64(6*shareChunk), pool.Stats().HeldBytes)
	require.NoError(t, arena.CopyIn(v.Buffer(), bytes.Repeat([]byte{7}, v.Buffer().Len())))
	require.NoError(t, v.Close())
	mine.Close()
	require.NoError(t, <-played)
	theirs.Close()
	k.close()
	require.NoError(t, pool.Close())
	assert.True(t, d.Live().Zero(), "leaked: %+v", d.Live())
	require.NoError(t, d.Close())
	sameFDs(t, before, "descriptors leaked")
}

// readAck reads an ack and its text, and returns its status.
func readAck(c *net.UnixConn) (uint32, error) {
	b := make([]byte, 24)
	if _, _, err := ipc.Recv(c, b, 0); err != nil {
		return 0, err
	}
	if n := binary.LittleEndian.Uint32(b[16:]); n > 0 {
		if _, _, err := ipc.Recv(c, make([]byte, n), 0); err != nil {
			return 0, err
		}
	}
	return binary.LittleEndian.Uint32(b[8:]), nil
}

type consumerCase struct {
	name  string
	check string
	is    error
	opt   func(*arena.ShareOptions)
	// play is the hostile consumer, from its first message.
	play func(c *net.UnixConn, k *hostileKit)
	ok   bool // the hand-over succeeds
}

// readOffer reads the offer and whatever handles follow it, closing them.
func readOfferAndHandles(c *net.UnixConn) bool {
	b := make([]byte, 64)
	if _, _, err := ipc.Recv(c, b, 0); err != nil {
		return false
	}
	chunks := binary.LittleEndian.Uint64(b[32:])
	if n := binary.LittleEndian.Uint32(b[60:]); n > 0 {
		_, _, _ = ipc.Recv(c, make([]byte, n), 0)
		return false
	}
	for got := uint64(0); got < chunks; {
		h := make([]byte, 8)
		fds, _, err := ipc.Recv(c, h, 64)
		_ = ipc.CloseAll(fds)
		if err != nil {
			return false
		}
		got += uint64(len(fds))
	}
	return true
}

func consumerCases(t *testing.T) []consumerCase {
	running, exited := otherProcesses(t)
	hello := helloFrame(fdForm, uint32(os.Getpid()), 0, 0)
	then := func(ack []byte) func(*net.UnixConn, *hostileKit) {
		return func(c *net.UnixConn, k *hostileKit) {
			send(c, hello)
			if readOfferAndHandles(c) {
				send(c, ack)
			}
		}
	}
	helloOnly := func(b []byte) func(*net.UnixConn, *hostileKit) {
		return func(c *net.UnixConn, k *hostileKit) { send(c, b) }
	}
	bad := func(f func(b []byte)) []byte {
		b := bytes.Clone(hello)
		f(b)
		return b
	}
	return []consumerCase{
		{name: "bad magic", check: "bad magic", is: arena.ErrRefused, play: helloOnly(bad(func(b []byte) { b[7] = '1' }))},
		{name: "old version", check: "version 1", is: arena.ErrRefused, play: helloOnly(bad(func(b []byte) { b[8] = 1 }))},
		{name: "hello cut short", check: "unexpected EOF", is: io.ErrUnexpectedEOF, play: helloOnly(hello[:20])},
		{name: "no hello", check: "EOF", is: io.EOF, play: func(c *net.UnixConn, k *hostileKit) {}},
		{name: "unknown form", check: "sharing form 9", is: arena.ErrRefused, play: helloOnly(helloFrame(9, 1, 0, 0))},
		{name: "token form", check: "shares memory as token", is: acl.ErrNotSupported, play: helloOnly(helloFrame(tokenForm, 1, 0, 0))},
		{name: "unknown flags", check: "unknown flags", is: arena.ErrRefused, play: helloOnly(helloFrame(fdForm, 1, 6, 0))},
		{name: "the sizes flag", check: "unknown flags 0x2", is: arena.ErrRefused, play: helloOnly(helloFrame(fdForm, 1, 2, 0))},
		{name: "reserved field", check: "reserved field", is: arena.ErrRefused, play: helloOnly(helloFrame(fdForm, 1, 0, 3))},
		{name: "negative process id", check: "process id -5", is: arena.ErrRefused, play: helloOnly(helloFrame(fdForm, uint32(0xfffffffb), 0, 0))},
		{name: "descriptors with the hello", check: "control data was cut",
			play: func(c *net.UnixConn, k *hostileKit) { send(c, hello, k.memfd(shareChunk, ipctest.Sealed)) }},
		{name: "another process named", check: "check pid", is: arena.ErrRefused, opt: func(o *arena.ShareOptions) { o.PID = running }, play: helloOnly(hello)},
		{name: "an exited process named", check: "does not run", is: arena.ErrRefused, opt: func(o *arena.ShareOptions) { o.PID = exited }, play: helloOnly(hello)},
		{name: "another user named", check: "check user", is: arena.ErrRefused,
			opt: func(o *arena.ShareOptions) { o.User = arena.UserID(otherUser()) }, play: helloOnly(hello)},
		{name: "the check refuses", check: "check function", is: arena.ErrRefused,
			opt: func(o *arena.ShareOptions) { o.Check = func(ipc.Cred) error { return errors.New("not today") } }, play: helloOnly(hello)},
		{name: "ack with bad magic", check: "bad magic", is: arena.ErrRefused, play: then(ackFrame("VMAACK01", 0, 0, 0, 0, ""))},
		{name: "ack with unknown status", check: "unknown status 9", is: arena.ErrRefused, play: then(ackFrame("VMAACK02", 9, 0, 0, 0, ""))},
		{name: "ack text too long", check: "a text of 5000 bytes", is: arena.ErrRefused, play: then(ackFrame("VMAACK02", 2, 0, 5000, 0, ""))},
		{name: "success with a text", check: "success with code", is: arena.ErrRefused, play: then(ackFrame("VMAACK02", 0, 0, 2, 0, "ok"))},
		{name: "success with a code", check: "success with code", is: arena.ErrRefused, play: then(ackFrame("VMAACK02", 0, acl.ErrCodeRTMemoryAllocation, 0, 0, ""))},
		{name: "ack's reserved field", check: "reserved field", is: arena.ErrRefused, play: then(ackFrame("VMAACK02", 0, 0, 0, 1, ""))},
		{name: "forged out-of-memory", check: "the consumer failed", is: arena.ErrPeer,
			play: then(ackFrame("VMAACK02", 2, acl.ErrCodeRTMemoryAllocation, 1000, 0, controlText[:1000]))},
		{name: "forged refusal", check: "the consumer refused", is: arena.ErrPeer, play: then(ackFrame("VMAACK02", 1, 0, 5, 0, "no\xff\xfe!"))},
		{name: "ack cut short", check: "unexpected EOF", is: io.ErrUnexpectedEOF, play: then(ackFrame("VMAACK02", 0, 0, 0, 0, "")[:10])},
		{name: "ack's text cut short", check: "unexpected EOF", is: io.ErrUnexpectedEOF, play: then(ackFrame("VMAACK02", 2, 0, 100, 0, "only this"))},
		{name: "descriptors with the ack", check: "control data was cut", play: func(c *net.UnixConn, k *hostileKit) {
			send(c, hello)
			if readOfferAndHandles(c) {
				send(c, ackFrame("VMAACK02", 0, 0, 0, 0, ""), k.pipe())
			}
		}},
		// The socket's failure, whichever comes first: a broken pipe, a reset, an EOF.
		{name: "gone after the hello", check: "unix", play: helloOnly(hello)},
		{name: "gone mid-offer", check: "unix", play: func(c *net.UnixConn, k *hostileKit) {
			send(c, hello)
			_, _, _ = ipc.Recv(c, make([]byte, 10), 0)
		}},
		{name: "silence after the offer", check: "i/o timeout", is: os.ErrDeadlineExceeded, play: func(c *net.UnixConn, k *hostileKit) {
			send(c, hello)
			readOfferAndHandles(c)
			time.Sleep(time.Second)
		}},
		{name: "silence", check: "i/o timeout", is: os.ErrDeadlineExceeded, play: func(c *net.UnixConn, k *hostileKit) { time.Sleep(time.Second) }},
		{name: "an offer in place of the ack", check: "bad magic", is: arena.ErrRefused, play: then(good(1).bytes())},
		{name: "a second hello in place of the ack", check: "bad magic", is: arena.ErrRefused, play: then(hello)},
		{name: "a flood", check: "bad magic", is: arena.ErrRefused, play: func(c *net.UnixConn, k *hostileKit) {
			_ = ipc.Send(c, bytes.Repeat([]byte{0xa5}, 1<<20), nil, true)
		}},
		{name: "forged invalid argument", check: "the consumer failed", is: arena.ErrPeer,
			play: then(ackFrame("VMAACK02", 2, acl.ErrCodeInvalidParam, 12, 0, "bad argument"))},
		{name: "hello byte by byte", ok: true, play: func(c *net.UnixConn, k *hostileKit) {
			for i := range hello {
				send(c, hello[i:i+1])
			}
			if readOfferAndHandles(c) {
				send(c, ackFrame("VMAACK02", 0, 0, 0, 0, ""))
			}
		}},
	}
}

// Share against a hostile consumer.
func TestHostileConsumer(t *testing.T) {
	cases := consumerCases(t)
	require.GreaterOrEqual(t, len(cases), 30)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := openFDs(t)
			d, err := host.New(host.Config{Capacity: 64 << 20})
			require.NoError(t, err)
			a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20, Chunk: chunk.Config{Shareable: true}})
			require.NoError(t, err)
			b, err := a.Alloc(2*shareChunk, shareChunk)
			require.NoError(t, err)
			mine, theirs := peerConns(t, 300*time.Millisecond)
			k := &hostileKit{t: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				tc.play(theirs, k)
				theirs.Close()
			}()
			opt := arena.ShareOptions{PID: os.Getpid()}
			if tc.opt != nil {
				tc.opt(&opt)
			}
			err = b.Share(mine, opt)
			<-done
			mine.Close()
			k.close()
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
				assert.ErrorContains(t, err, tc.check)
				if tc.is != nil {
					assert.ErrorIs(t, err, tc.is)
				}
				if errors.Is(tc.is, arena.ErrPeer) {
					assert.NotErrorIs(t, err, arena.ErrOutOfMemory, "the consumer's word is not this process's out-of-memory")
					assert.NotErrorIs(t, err, arena.ErrRefused, "nor its refusal")
					assert.NotErrorIs(t, err, acl.ErrOutOfMemory)
					assert.NotErrorIs(t, err, acl.ErrInvalidParam)
					assert.NotErrorIs(t, err, arena.ErrInvalid)
					assert.True(t, sanitised(err.Error()), "%q", err.Error())
				}
			}
			got := make([]byte, 8)
			require.NoError(t, arena.CopyOut(got, b), "the producer's buffer is unharmed")
			require.NoError(t, a.Close())
			assert.True(t, d.Live().Zero(), "leaked: %+v", d.Live())
			require.NoError(t, d.Close())
			sameFDs(t, before, "descriptors leaked")
		})
	}
}

// The token path bounds an offer before it allocates: 1-byte chunks × 2⁴⁰
// (8 TiB of tokens' books, before the fix) is refused with a few KiB
// allocated, and a sound offer of many chunks, and its sizes table, is read
// a slice at a time.
func TestHostileTokenOffer(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	drv := tokenDriver{d}
	for _, tc := range []struct {
		name, check string
		o           offerF
		tokens      int
	}{
		{"1-byte chunks × 2⁴⁰", "check chunk size", offerF{sharing: tokenForm, chunkSize: 1, chunks: 1 << 40, n: 1 << 40}, 0},
		{"2⁴⁰ chunks", "check chunk count", offerF{sharing: tokenForm, chunkSize: shareChunk, chunks: 1 << 40, n: 1}, 0},
		{"2¹⁶ chunks (the largest reservation), then silence", "EOF", offerF{sharing: tokenForm, chunkSize: shareChunk, chunks: 1 << 16, n: 1<<16*shareChunk - 1}, 3},
		{"2¹⁹ chunks, past the largest reservation", "check chunk count", offerF{sharing: tokenForm, chunkSize: shareChunk, chunks: 1 << 19, n: 1<<19*shareChunk - 1}, 0},
		{"2¹⁶ chunks of sizes, part of the table, then silence", "EOF", offerF{sharing: tokenForm, flags: 2, chunkSize: shareChunk, chunks: 1 << 16, n: 1}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mine, theirs := peerConns(t, 2*time.Second)
			played := make(chan struct{})
			defer func() {
				mine.Close()
				<-played // its close is this test's, not the next one's
			}()
			go func() {
				defer close(played)
				defer theirs.Close()
				if _, _, err := ipc.Recv(theirs, make([]byte, 32), 0); err != nil {
					return
				}
				send(theirs, tc.o.bytes())
				if tc.tokens > 0 {
					send(theirs, make([]byte, 8*tc.tokens))
				}
			}()
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			_, err := arena.Import(mine, arena.ImportConfig{Driver: drv})
			runtime.ReadMemStats(&ms1)
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.check)
			// The largest sound offer's tokens are 512 KiB and its sizes
			// table 256 KiB: a consumer that allocated either ahead of
			// what the peer sent would pass 64 KiB (it takes under 8 KiB).
			assert.Less(t, ms1.TotalAlloc-ms0.TotalAlloc, uint64(64<<10), "allocated ahead of what the peer sent")
			assert.True(t, d.Live().Zero(), "%+v", d.Live())
		})
	}
}

// tokenDriver is the host driver claiming to share tokens, as ACL does, so
// that the consumer takes the token path; importing a token fails.
type tokenDriver struct{ *host.Driver }

func (d tokenDriver) Caps() acl.Caps {
	c := d.Driver.Caps()
	c.Sharing = acl.SharingToken
	return c
}
