//go:build linux

package arena_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/acl/model"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// privateKey is what the producer keeps in files of its own.
const privateKey = "producer's private key"

// received is what a consumer found behind a descriptor it was sent.
type received struct {
	link string // /proc/self/fd's name of it
	size int64
	head []byte
}

// recycleConsumer is a consumer on the other end of c that says hello,
// takes the offer, and looks at each descriptor it is sent before closing
// it; then it acknowledges.
func recycleConsumer(c *net.UnixConn, form uint32) ([]received, error) {
	defer c.Close()
	send(c, helloFrame(form, uint32(os.Getpid()), 0, 0))
	o := make([]byte, 64)
	if _, _, err := ipc.Recv(c, o, 0); err != nil {
		return nil, err
	}
	chunks := binary.LittleEndian.Uint64(o[32:])
	if n := binary.LittleEndian.Uint32(o[60:]); n > 0 {
		t := make([]byte, n)
		_, _, _ = ipc.Recv(c, t, 0)
		return nil, fmt.Errorf("refused: %s", t)
	}
	var got []received
	for uint64(len(got)) < chunks {
		fds, _, err := ipc.Recv(c, make([]byte, 8), 64)
		if err != nil {
			return got, err
		}
		for _, fd := range fds {
			r := received{}
			r.link, _ = os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
			if _, size, err := ipc.Stat(fd); err == nil {
				r.size = size
			}
			f := os.NewFile(uintptr(fd), "received")
			r.head = make([]byte, len(privateKey))
			n, _ := f.ReadAt(r.head, 0)
			r.head = r.head[:n]
			f.Close()
			got = append(got, r)
		}
	}
	send(c, ackFrame("VMAACK02", 0, 0, 0, 0, ""))
	return got, nil
}

// shareGivenBack shares a two-chunk buffer of an arena on drv while, between
// the export and the send, the arena gives the chunks back (Reset and
// Shrink) and the producer opens files of its own, which take the lowest
// free descriptor numbers. It returns what the consumer received.
func shareGivenBack(t *testing.T, drv acl.Driver, giveBackByClose bool) []received {
	t.Helper()
	a, err := arena.New(arena.Config{Driver: drv, Reserve: 16 << 20, Chunk: chunk.Config{Shareable: true}})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	cs := a.ChunkSize()
	b, err := a.Alloc(2*cs, cs)
	require.NoError(t, err)
	require.NoError(t, arena.Fill(b, 0x5a))

	dir := t.TempDir()
	var keys []*os.File
	defer func() {
		for _, f := range keys {
			f.Close()
		}
	}()
	restore := sched.Set(func(p sched.Point, who any) {
		if p != sched.ShareExported || who != a {
			return
		}
		if giveBackByClose {
			require.NoError(t, a.Close())
		} else {
			require.NoError(t, a.Reset())
			require.NoError(t, a.Shrink())
			require.Zero(t, a.Cap(), "the chunks went back")
		}
		for i := range 8 {
			path := filepath.Join(dir, fmt.Sprintf("key%d", i))
			require.NoError(t, os.WriteFile(path, []byte(privateKey), 0o600))
			f, err := os.Open(path)
			require.NoError(t, err)
			keys = append(keys, f)
		}
	})
	defer restore()

	mine, theirs := peerConns(t, 10*time.Second)
	defer mine.Close()
	type result struct {
		got []received
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := recycleConsumer(theirs, fdForm)
		done <- result{got, err}
	}()
	err = b.Share(mine, arena.ShareOptions{PID: os.Getpid()})
	r := <-done
	require.NoError(t, err)
	require.NoError(t, r.err)
	return r.got
}

// The descriptors Share sends are its own from the export to the send: a
// chunk given back in between (another goroutine's Reset and Shrink, or a
// Close) cannot turn the number sent into a file of the producer's that
// the next open() got. Before, the consumer received "producer's private
// key".
func TestShareSendsWhatItExported(t *testing.T) {
	for _, tc := range []struct {
		name string
		open func(t *testing.T) acl.Driver
	}{
		{"host", func(t *testing.T) acl.Driver {
			d, err := host.New(host.Config{Capacity: 64 << 20})
			require.NoError(t, err)
			return d
		}},
		{"model", func(t *testing.T) acl.Driver {
			d, err := model.New(model.Config{Untimed: true})
			require.NoError(t, err)
			return d
		}},
	} {
		for _, byClose := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/close=%v", tc.name, byClose), func(t *testing.T) {
				before := openFDs(t)
				drv := tc.open(t)
				got := shareGivenBack(t, drv, byClose)
				require.Len(t, got, 2)
				for i, r := range got {
					assert.NotEqual(t, privateKey, string(r.head), "descriptor %d (%s) is the producer's file", i, r.link)
					assert.True(t, strings.HasPrefix(r.link, "/memfd:"), "descriptor %d is %q, not the exported memory", i, r.link)
					assert.Equal(t, int64(2<<20), r.size, "descriptor %d", i)
					if drv.Name() == "host" {
						assert.Equal(t, bytes.Repeat([]byte{0x5a}, len(privateKey)), r.head, "descriptor %d holds the shared bytes", i)
					}
				}
				require.NoError(t, drv.Close())
				sameFDs(t, before, "no descriptor left open")
			})
		}
	}
}
