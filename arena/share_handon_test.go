//go:build linux

package arena_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/ipc/ipctest"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// A connected socket handed on: the process named connects (as the same
// user as this one, root), then hands the connected socket to a process of
// another user (nobody, 65534), which speaks. The kernel's SO_PEERCRED names
// the connector; the messages carry the other's credentials. Both sides
// refuse on the check of the sender, and nothing crosses.

const nobody = 65534

// shareable returns an arena of shareable chunks on a host driver of its
// own, and a two-chunk buffer of it to share; both close when t ends.
func shareable(t *testing.T) (*arena.Arena, arena.Buffer) {
	t.Helper()
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	a, err := arena.New(arena.Config{Driver: d, Reserve: 16 << 20, Chunk: chunk.Config{Shareable: true}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	b, err := a.Alloc(2*shareChunk, shareChunk)
	require.NoError(t, err)
	return a, b
}

// Share: the consumer named connects and hands the socket to nobody, who
// sends the hello. Before, Share checked the connector alone and sent the
// descriptors to nobody.
func TestShareRefusesHandedOnSocket(t *testing.T) {
	ipctest.NeedRoot(t)
	a, b := shareable(t)

	l, path := ipctest.Listen(t)
	p := ipctest.HandOn(t, ipctest.HandOnSpec{Path: path, UID: nobody, GID: nobody, After: []ipctest.Step{
		{Send: helloFrame(fdForm, 1, 0, 0)},
		{Read: 64},
		{Read: 8, MaxFDs: 64},
		{Send: ackFrame("VMAACK02", 0, 0, 0, 0, "")},
	}})
	c := ipctest.Accept(t, l)
	err := b.Share(c, arena.ShareOptions{PID: p.PID()})
	require.ErrorIs(t, err, arena.ErrRefused)
	assert.ErrorContains(t, err, "check sender")
	c.Close()
	conn, other, werr := p.Wait()
	require.NoError(t, werr)
	assert.Empty(t, conn.Err)
	assert.Equal(t, nobody, other.UID)
	assert.Zero(t, other.FDs, "nobody received descriptors: %v", other.Links)
	require.NotEmpty(t, other.Read, "nobody read the refusal: %s", other.Err)
	assert.Equal(t, uint32(1), binary.LittleEndian.Uint32(other.Read[0][12:]), "a refusal")
	assert.Zero(t, a.Pool().Stats().Exported, "nothing was exported")
}

// Share, when the consumer named handed the socket to nobody and both have
// exited before the hello is read: still a refusal on the sender (it was
// "no such process", as the connector was pinned before the message's
// credentials were compared).
func TestShareRefusesHandedOnSocketOnceGone(t *testing.T) {
	ipctest.NeedRoot(t)
	a, b := shareable(t)

	l, path := ipctest.Listen(t)
	p := ipctest.HandOn(t, ipctest.HandOnSpec{Path: path, UID: nobody, GID: nobody, After: []ipctest.Step{
		{Send: helloFrame(fdForm, 1, 0, 0)},
	}})
	c := ipctest.Accept(t, l)
	defer c.Close()
	conn, other, werr := p.Wait() // both processes have exited
	require.NoError(t, werr)
	assert.Empty(t, conn.Err)
	assert.Equal(t, nobody, other.UID)
	err := b.Share(c, arena.ShareOptions{PID: p.PID()})
	require.ErrorIs(t, err, arena.ErrRefused)
	assert.ErrorContains(t, err, "check sender")
	assert.Zero(t, a.Pool().Stats().Exported, "nothing was exported")
}

// Import: the producer named connects and hands the socket to nobody, who
// offers a memory file of its own; or speaks itself first, then hands the
// socket on for the descriptors, or for the sizes table. Before, Import checked the connector alone
// and mapped nobody's memory.
func TestImportRefusesHandedOnSocket(t *testing.T) {
	ipctest.NeedRoot(t)
	offer := good(1).bytes()
	batch := batchFrame(1, 0)
	for _, tc := range []struct {
		name          string
		before, after []ipctest.Step
	}{
		{"offer", nil, []ipctest.Step{{Read: 32}, {Send: offer}, {Send: batch, Memfd: shareChunk}, {Read: 24}}},
		{"descriptors", []ipctest.Step{{Read: 32}, {Send: offer}}, []ipctest.Step{{Send: batch, Memfd: shareChunk}, {Read: 24}}},
		{"sizes", []ipctest.Step{{Read: 32}, {Send: sized(0, shareChunk, 1).bytes()}},
			[]ipctest.Step{{Send: sizesFrame(1)}}}, // and no descriptors: the table alone is refused
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := host.New(host.Config{Capacity: 64 << 20})
			require.NoError(t, err)
			defer d.Close()
			l, path := ipctest.Listen(t)
			p := ipctest.HandOn(t, ipctest.HandOnSpec{Path: path, UID: nobody, GID: nobody, Before: tc.before, After: tc.after})
			c := ipctest.Accept(t, l)
			before := openFDs(t)
			v, err := arena.Import(c, arena.ImportConfig{Driver: d, ProducerPID: p.PID()})
			if v != nil {
				v.Close()
			}
			require.ErrorIs(t, err, arena.ErrRefused)
			assert.ErrorContains(t, err, "check sender")
			assert.True(t, d.Live().Zero(), "nothing imported: %+v", d.Live())
			sameFDs(t, before, "no descriptor kept")
			c.Close()
			_, other, werr := p.Wait()
			require.NoError(t, werr)
			assert.Equal(t, nobody, other.UID)
			if n := len(other.Read); n > 0 {
				ack := other.Read[n-1]
				if len(ack) == 24 {
					assert.Equal(t, uint32(1), binary.LittleEndian.Uint32(ack[8:]), "a refusal")
				}
			}
		})
	}
}
