//go:build linux

package arena_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/acl/ipc/ipctest"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
	"github.com/vmarena/vmarena/internal/skip"
)

// The sharing fuzzers that run a whole hand-over against a peer in this
// process: on a connected socket handed on (the process that connected,
// another one, hands it back to the test, which writes each message with
// credentials the fuzzer picks), and with the producer's chunks given back
// between the export and the send while it opens files of its own.

// Whose credentials a message of the hand-on fuzzer carries.
const (
	asConnector    = iota // the connector's own: the one the kernel recorded
	asThis                // this process's (the socket was handed to it)
	asOtherUser           // the connector's PID with another user
	asOtherGroup          // the connector's PID and user with another group
	asOtherProcess        // another live process's PID with the connector's user
	credChoices
)

// FuzzShareHandOn runs Share (side 0) or Import (side 1) on a connected
// socket that its connector handed to this process, which speaks each of
// the peer's two messages (the hello and the ack; the offer and the
// descriptors) as the fuzzer says. Whatever the choice, the hand-over
// succeeds only when both came with the connector's credentials, and is
// otherwise refused on the check of the sender, with nothing imported or
// left open. Claiming another process's credentials needs root: root is
// trusted (docs/sharing.md), and this fuzzer plays every other claim.
func FuzzShareHandOn(f *testing.F) {
	for side := range 2 {
		for first := range credChoices {
			f.Add(uint8(side), uint8(first), uint8(asConnector))
		}
		f.Add(uint8(side), uint8(asConnector), uint8(asThis))
		f.Add(uint8(side), uint8(asConnector), uint8(asOtherUser))
	}
	f.Fuzz(func(t *testing.T, side, first, later uint8) {
		skip.NotRoot(t, "the fuzzer must claim the credentials of the process that connected")
		side, first, later = side%2, first%credChoices, later%credChoices
		l, path := ipctest.Listen(t)
		c := ipctest.Pass(t, path)
		defer c.Close()
		srv := ipctest.Accept(t, l)
		who, err := ipc.Identify(srv, nil)
		if err != nil {
			t.Fatal(err)
		}
		connector := who.Cred
		who.Close()
		other := exec.Command("sleep", "60")
		if err := other.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
		as := func(choice uint8) ipctest.Cred {
			cr := connector
			switch choice {
			case asThis:
				cr = ipctest.Cred{PID: os.Getpid(), UID: os.Geteuid(), GID: os.Getegid()}
			case asOtherUser:
				cr.UID = nobody
			case asOtherGroup:
				cr.GID = nobody
			case asOtherProcess:
				cr.PID = other.Process.Pid
			}
			return cr
		}
		ok := first == asConnector && later == asConnector

		before := openFDs(t)
		d, err := host.New(host.Config{Capacity: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_ = srv.SetDeadline(time.Now().Add(10 * time.Second))
		done := make(chan error, 1)
		if side == 0 {
			a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20, Chunk: chunk.Config{Shareable: true}})
			if err != nil {
				t.Fatal(err)
			}
			b, err := a.Alloc(2*shareChunk, shareChunk)
			if err != nil {
				t.Fatal(err)
			}
			go func() { done <- playConsumerAs(c, as(first), as(later)) }()
			err = b.Share(srv, arena.ShareOptions{PID: connector.PID})
			c.Close()
			<-done
			checkHandOn(t, err, ok)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
		} else {
			memfd, err := ipctest.Memfd("vmarena-host", shareChunk, ipctest.Sealed)
			if err != nil {
				t.Fatal(err)
			}
			go func() { done <- playProducerAs(c, memfd, as(first), as(later)) }()
			v, err := arena.Import(srv, arena.ImportConfig{Driver: d, ProducerPID: connector.PID})
			c.Close()
			<-done
			_ = ipctest.Close(memfd)
			checkHandOn(t, err, ok)
			if v != nil {
				if err := v.Close(); err != nil {
					t.Fatal(err)
				}
			}
		}
		srv.Close()
		if !d.Live().Zero() {
			t.Fatalf("leaked: %+v", d.Live())
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if now := openFDs(t); len(now) != len(before)-2 { // less the two ends of the socket
			t.Fatalf("%d descriptors open, %d before (and the socket's two ends): %s", len(now), len(before), ipctest.FDChanges(before, now))
		}
	})
}

func checkHandOn(t *testing.T, err error, ok bool) {
	t.Helper()
	switch {
	case ok && err != nil:
		t.Fatalf("the connector's own messages were refused: %v", err)
	case !ok && err == nil:
		t.Fatal("a message from another than the connector was taken")
	case !ok && (!errors.Is(err, arena.ErrRefused) || !strings.Contains(err.Error(), "check sender")):
		t.Fatalf("refused, but not on the check of the sender: %v", err)
	}
}

// playConsumerAs is a consumer whose hello carries hello's credentials and
// whose acknowledgement carries ack's.
func playConsumerAs(c *net.UnixConn, hello, ack ipctest.Cred) error {
	if err := ipctest.SendAs(c, helloFrame(fdForm, uint32(hello.PID), 0, 0), nil, hello); err != nil {
		return err
	}
	if !readOfferAndHandles(c) {
		return errors.New("refused")
	}
	return ipctest.SendAs(c, ackFrame("VMAACK02", 0, 0, 0, 0, ""), nil, ack)
}

// playProducerAs is a producer whose offer carries offer's credentials and
// whose descriptor (memfd) batch carries batch's.
func playProducerAs(c *net.UnixConn, memfd int, offer, batch ipctest.Cred) error {
	if _, _, err := ipc.Recv(c, make([]byte, 32), 0); err != nil {
		return err
	}
	if err := ipctest.SendAs(c, good(1).bytes(), nil, offer); err != nil {
		return err
	}
	if err := ipctest.SendAs(c, batchFrame(1, 0), []int{memfd}, batch); err != nil {
		return err
	}
	drainPeer(c)
	return nil
}

// FuzzShareRecycled shares a buffer of chunks chunks while, between the
// export and the send, the producer's arena gives chunks back (give: none,
// Reset and Shrink, a Truncate into the buffer and Shrink, or Close) and the
// producer opens files files of its own, which take the lowest free
// descriptor numbers. Whatever it does, the consumer receives the exported
// memory files and nothing else, and nothing is left open.
func FuzzShareRecycled(f *testing.F) {
	for give := range 4 {
		f.Add(uint8(give), uint8(8), uint8(2), false)
	}
	f.Add(uint8(1), uint8(0), uint8(1), true)
	f.Add(uint8(3), uint8(40), uint8(4), true)
	f.Fuzz(func(t *testing.T, give, files, chunks uint8, readOnly bool) {
		give, files, chunks = give%4, files%64, chunks%4+1
		before := openFDs(t)
		d, err := host.New(host.Config{Capacity: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20, Chunk: chunk.Config{Shareable: true}})
		if err != nil {
			t.Fatal(err)
		}
		b, err := a.Alloc(int(chunks)*shareChunk, shareChunk)
		if err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		var keys []*os.File
		restore := sched.Set(func(p sched.Point, who any) {
			if p != sched.ShareExported || who != a {
				return
			}
			var err error
			switch give {
			case 1:
				err = errors.Join(a.Reset(), a.Shrink())
			case 2:
				err = errors.Join(a.Truncate(b.Offset()+shareChunk/2), a.Shrink())
			case 3:
				err = a.Close()
			}
			if err != nil {
				t.Error(err)
			}
			for i := range int(files) {
				path := filepath.Join(dir, fmt.Sprint(i))
				if err := os.WriteFile(path, []byte(privateKey), 0o600); err != nil {
					t.Error(err)
					return
				}
				f, err := os.Open(path)
				if err != nil {
					t.Error(err)
					return
				}
				keys = append(keys, f)
			}
		})
		mine, theirs := peerConns(t, 10*time.Second)
		done := make(chan []received, 1)
		go func() {
			got, _ := recycleConsumer(theirs, fdForm)
			done <- got
		}()
		err = b.Share(mine, arena.ShareOptions{PID: os.Getpid(), ReadOnly: readOnly})
		got := <-done
		restore()
		mine.Close()
		for _, k := range keys {
			k.Close()
		}
		if err != nil {
			t.Fatalf("share: %v", err)
		}
		if len(got) != int(chunks) {
			t.Fatalf("%d descriptors received, %d chunks shared", len(got), chunks)
		}
		for i, r := range got {
			if string(r.head) == privateKey || !strings.HasPrefix(r.link, "/memfd:") || r.size != shareChunk {
				t.Fatalf("descriptor %d is %s (%d bytes, %q), not the exported memory", i, r.link, r.size, r.head)
			}
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if !d.Live().Zero() {
			t.Fatalf("leaked: %+v", d.Live())
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if ch := ipctest.FDChanges(before, openFDs(t)); ch != "" {
			t.Fatalf("descriptors: %s", ch)
		}
	})
}
