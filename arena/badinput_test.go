package arena_test

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// badEnv is what the bad-input cases act on: an arena holding data, a
// buffer dropped by Truncate, a closed arena and its buffer, and a second
// driver.
type badEnv struct {
	hd, other *host.Driver
	pool      *chunk.Pool
	a         *arena.Arena
	buf       arena.Buffer // live, 3000 bytes at offset 0, holds data
	data      []byte
	stale     arena.Buffer // above Len since a Truncate
	closed    *arena.Arena
	closedBuf arena.Buffer
	otherA    *arena.Arena // on the other driver
	otherBuf  arena.Buffer // in otherA
	c         chunk.Chunk  // a chunk out of pool, unmapped
}

// badCase is one bad input: fn returns the error, which must match want;
// afterwards nothing may have changed.
type badCase struct {
	name string
	fn   func(e *badEnv) error
	want error
}

const maxInt = math.MaxInt

// errDriver stands for "the driver's *acl.Error", for the cases ACL answers
// with a code of no class (507899 for an unmap of no mapping).
var errDriver = errors.New("an *acl.Error")

func badCases() []badCase {
	newArena := func(cfg arena.Config) error {
		a, err := arena.New(cfg)
		if err == nil {
			a.Close()
		}
		return err
	}
	alloc := func(size, align int) func(e *badEnv) error {
		return func(e *badEnv) error { _, err := e.a.Alloc(size, align); return err }
	}
	slice := func(i, j int) func(e *badEnv) error {
		return func(e *badEnv) error { _, err := e.a.Slice(i, j); return err }
	}
	bslice := func(i, j int) func(e *badEnv) error {
		return func(e *badEnv) error { _, err := e.buf.Slice(i, j); return err }
	}
	var nilArena *arena.Arena
	zeroArena := &arena.Arena{}
	var zeroBuf arena.Buffer
	cases := []badCase{
		// Config.
		{"Config.Reserve=-1", func(e *badEnv) error { return newArena(arena.Config{Driver: e.hd, Reserve: -1}) }, arena.ErrInvalid},
		{"Config.Reserve=MaxReserve+1", func(e *badEnv) error {
			return newArena(arena.Config{Driver: e.hd, Reserve: arena.MaxReserve + 1})
		}, arena.ErrInvalid},
		{"Config.Reserve=MaxInt64", func(e *badEnv) error { return newArena(arena.Config{Driver: e.hd, Reserve: math.MaxInt64}) }, arena.ErrInvalid},
		{"Config.Reserve=200GiB(over the driver's limit)", func(e *badEnv) error {
			return newArena(arena.Config{Driver: e.hd, Reserve: 200 << 30})
		}, arena.ErrInvalid},
		{"Chunk.Size=-1", func(e *badEnv) error { return newArena(arena.Config{Driver: e.hd, Chunk: chunk.Config{Size: -1}}) }, arena.ErrInvalid},
		{"Chunk.Size=3MiB(not a granularity multiple)", func(e *badEnv) error {
			return newArena(arena.Config{Driver: e.hd, Chunk: chunk.Config{Size: 3 << 20}})
		}, arena.ErrInvalid},
		{"Chunk.Size=2^62", func(e *badEnv) error {
			return newArena(arena.Config{Driver: e.hd, Chunk: chunk.Config{Size: 1 << 62}})
		}, arena.ErrInvalid},
		{"Chunk.Size=2^62,Reserve=1", func(e *badEnv) error {
			return newArena(arena.Config{Driver: e.hd, Reserve: 1, Chunk: chunk.Config{Size: 1 << 62}})
		}, arena.ErrInvalid},
		{"Chunk.Budget=-1", func(e *badEnv) error {
			return newArena(arena.Config{Driver: e.hd, Chunk: chunk.Config{Budget: -1}})
		}, arena.ErrInvalid},
		{"Chunk.MemAttr=99", func(e *badEnv) error {
			return newArena(arena.Config{Driver: e.hd, Chunk: chunk.Config{MemAttr: 99}})
		}, arena.ErrInvalid},
		{"Chunk.MemAttr=HBMMem(not physical)", func(e *badEnv) error {
			return newArena(arena.Config{Driver: e.hd, Chunk: chunk.Config{MemAttr: acl.HBMMem}})
		}, arena.ErrInvalid},
		{"Chunk.Scrub=7", func(e *badEnv) error {
			return newArena(arena.Config{Driver: e.hd, Chunk: chunk.Config{Scrub: 7}})
		}, arena.ErrInvalid},
		{"Config.Driver!=Pool.Driver", func(e *badEnv) error {
			return newArena(arena.Config{Driver: e.other, Pool: e.pool})
		}, arena.ErrInvalid},
		{"Config.Driver=typed-nil", func(e *badEnv) error {
			return newArena(arena.Config{Driver: (*host.Driver)(nil)})
		}, arena.ErrInvalid},
		{"chunk.New(nil)", func(e *badEnv) error { _, err := chunk.New(nil, chunk.Config{}); return err }, acl.ErrInvalidParam},

		// Alloc: sizes and alignments.
		{"Alloc(-1,1)", alloc(-1, 1), arena.ErrInvalid},
		{"Alloc(MinInt,1)", alloc(math.MinInt, 1), arena.ErrInvalid},
		{"Alloc(1,0)", alloc(1, 0), arena.ErrInvalid},
		{"Alloc(1,-1)", alloc(1, -1), arena.ErrInvalid},
		{"Alloc(1,3)", alloc(1, 3), arena.ErrInvalid},
		{"Alloc(1,96)", alloc(1, 96), arena.ErrInvalid},
		{"Alloc(1,MinInt)", alloc(1, math.MinInt), arena.ErrInvalid},
		{"Alloc(1,MaxInt)", alloc(1, maxInt), arena.ErrInvalid},
		{"Alloc(1,2^31>base alignment)", alloc(1, 1<<31), arena.ErrInvalid},
		{"Alloc(1,2^62)", alloc(1, 1<<62), arena.ErrInvalid},
		{"Alloc(MaxInt,1)", alloc(maxInt, 1), arena.ErrExhausted},
		{"Alloc(MaxInt-7,16)(size+align wraps)", alloc(maxInt-7, 16), arena.ErrExhausted},
		{"Alloc(2^63-2^21,2^21)(size+align wraps)", alloc(maxInt-(1<<21)+1, 1<<21), arena.ErrExhausted},
		{"Alloc(Reserved+1,1)", func(e *badEnv) error { _, err := e.a.Alloc(e.a.Reserved()+1, 1); return err }, arena.ErrExhausted},
		{"Alloc(Reserved-Len+1,1)", func(e *badEnv) error {
			_, err := e.a.Alloc(e.a.Reserved()-e.a.Len()+1, 1)
			return err
		}, arena.ErrExhausted},
		{"Alloc(MaxReserve,1)", alloc(arena.MaxReserve, 1), arena.ErrExhausted},

		// Grow.
		{"Grow(-1)", func(e *badEnv) error { return e.a.Grow(-1) }, arena.ErrInvalid},
		{"Grow(MinInt)", func(e *badEnv) error { return e.a.Grow(math.MinInt) }, arena.ErrInvalid},
		{"Grow(MaxInt)", func(e *badEnv) error { return e.a.Grow(maxInt) }, arena.ErrExhausted},
		{"Grow(Reserved-Len+1)", func(e *badEnv) error { return e.a.Grow(e.a.Reserved() - e.a.Len() + 1) }, arena.ErrExhausted},

		// Truncate.
		{"Truncate(-1)", func(e *badEnv) error { return e.a.Truncate(-1) }, arena.ErrRange},
		{"Truncate(Len+1)", func(e *badEnv) error { return e.a.Truncate(e.a.Len() + 1) }, arena.ErrRange},
		{"Truncate(MaxInt)", func(e *badEnv) error { return e.a.Truncate(maxInt) }, arena.ErrRange},
		{"Truncate(MinInt)", func(e *badEnv) error { return e.a.Truncate(math.MinInt) }, arena.ErrRange},

		// Slices out of range.
		{"Slice(-1,0)", slice(-1, 0), arena.ErrRange},
		{"Slice(0,-1)", slice(0, -1), arena.ErrRange},
		{"Slice(2,1)", slice(2, 1), arena.ErrRange},
		{"Slice(Len,Len+1)", func(e *badEnv) error { _, err := e.a.Slice(e.a.Len(), e.a.Len()+1); return err }, arena.ErrRange},
		{"Slice(1,Len+1)", func(e *badEnv) error { _, err := e.a.Slice(1, e.a.Len()+1); return err }, arena.ErrRange},
		{"Slice(MaxInt,MaxInt)", slice(maxInt, maxInt), arena.ErrRange},
		{"Slice(1,MaxInt)", slice(1, maxInt), arena.ErrRange},
		{"Slice(MinInt,MinInt)", slice(math.MinInt, math.MinInt), arena.ErrRange},
		{"Buffer.Slice(-1,1)", bslice(-1, 1), arena.ErrRange},
		{"Buffer.Slice(2,1)", bslice(2, 1), arena.ErrRange},
		{"Buffer.Slice(0,Len+1)", bslice(0, 3001), arena.ErrRange},
		{"Buffer.Slice(MaxInt,MaxInt)", bslice(maxInt, maxInt), arena.ErrRange},
		{"Buffer.Slice(MinInt,0)", bslice(math.MinInt, 0), arena.ErrRange},

		// Copies.
		{"CopyIn(too long)", func(e *badEnv) error { return arena.CopyIn(e.buf, make([]byte, 3001)) }, arena.ErrRange},
		{"CopyIn([]float64 too long)", func(e *badEnv) error { return arena.CopyIn(e.buf, make([]float64, 376)) }, arena.ErrRange},
		{"CopyOut(too long)", func(e *badEnv) error { return arena.CopyOut(make([]uint32, 751), e.buf) }, arena.ErrRange},
		{"CopyIn(zero Buffer)", func(e *badEnv) error { return arena.CopyIn(zeroBuf, []byte{1}) }, arena.ErrInvalid},
		{"CopyOut(zero Buffer)", func(e *badEnv) error { return arena.CopyOut(make([]byte, 1), zeroBuf) }, arena.ErrInvalid},
		{"Fill(zero Buffer)", func(e *badEnv) error { return arena.Fill(zeroBuf, 1) }, arena.ErrInvalid},
		{"Copy(zero dst)", func(e *badEnv) error { return arena.Copy(zeroBuf, e.buf) }, arena.ErrInvalid},
		{"Copy(zero src)", func(e *badEnv) error { return arena.Copy(e.buf, zeroBuf) }, arena.ErrInvalid},
		{"Copy(src longer than dst)", func(e *badEnv) error {
			d, _ := e.buf.Slice(0, 10)
			s, _ := e.buf.Slice(100, 111)
			return arena.Copy(d, s)
		}, arena.ErrRange},
		{"Copy(overlapping, forward)", func(e *badEnv) error {
			d, _ := e.buf.Slice(10, 110)
			s, _ := e.buf.Slice(0, 100)
			return arena.Copy(d, s)
		}, arena.ErrInvalid},
		{"Copy(overlapping, backward)", func(e *badEnv) error {
			d, _ := e.buf.Slice(0, 100)
			s, _ := e.buf.Slice(99, 199)
			return arena.Copy(d, s)
		}, arena.ErrInvalid},
		{"Copy(onto itself)", func(e *badEnv) error { return arena.Copy(e.buf, e.buf) }, arena.ErrInvalid},
		{"Copy(across drivers)", func(e *badEnv) error { return arena.Copy(e.otherBuf, e.buf) }, arena.ErrInvalid},

		// Buffers dropped by Truncate.
		{"CopyIn(stale Buffer)", func(e *badEnv) error { return arena.CopyIn(e.stale, []byte{1}) }, arena.ErrStale},
		{"CopyOut(stale Buffer)", func(e *badEnv) error { return arena.CopyOut(make([]byte, 1), e.stale) }, arena.ErrStale},
		{"Fill(stale Buffer)", func(e *badEnv) error { return arena.Fill(e.stale, 1) }, arena.ErrStale},
		{"Copy(from stale Buffer)", func(e *badEnv) error { return arena.Copy(e.buf, e.stale) }, arena.ErrStale},
		{"Copy(into stale Buffer)", func(e *badEnv) error { return arena.Copy(e.stale, e.buf) }, arena.ErrStale},
		{"Slice(stale Buffer)", func(e *badEnv) error { _, err := e.stale.Slice(0, 1); return err }, arena.ErrStale},

		// Use after Close, Close twice, Close with buffers still referenced.
		{"closed.Alloc", func(e *badEnv) error { _, err := e.closed.Alloc(1, 1); return err }, arena.ErrClosed},
		{"closed.Alloc(bad args)", func(e *badEnv) error { _, err := e.closed.Alloc(-1, 1); return err }, arena.ErrInvalid},
		{"closed.Grow", func(e *badEnv) error { return e.closed.Grow(1) }, arena.ErrClosed},
		{"closed.Truncate", func(e *badEnv) error { return e.closed.Truncate(0) }, arena.ErrClosed},
		{"closed.Reset", func(e *badEnv) error { return e.closed.Reset() }, arena.ErrClosed},
		{"closed.Shrink", func(e *badEnv) error { return e.closed.Shrink() }, arena.ErrClosed},
		{"closed.Slice", func(e *badEnv) error { _, err := e.closed.Slice(0, 0); return err }, arena.ErrClosed},
		{"closed.Close(twice)", func(e *badEnv) error { return e.closed.Close() }, nil},
		{"CopyIn(buffer of closed arena)", func(e *badEnv) error { return arena.CopyIn(e.closedBuf, []byte{1}) }, arena.ErrClosed},
		{"CopyOut(buffer of closed arena)", func(e *badEnv) error { return arena.CopyOut(make([]byte, 1), e.closedBuf) }, arena.ErrClosed},
		{"Copy(to buffer of closed arena)", func(e *badEnv) error { return arena.Copy(e.closedBuf, e.buf) }, arena.ErrClosed},
		{"Fill(buffer of closed arena)", func(e *badEnv) error { return arena.Fill(e.closedBuf, 1) }, arena.ErrClosed},

		// A nil *Arena, and an Arena not made by New.
		{"nil.Alloc", func(e *badEnv) error { _, err := nilArena.Alloc(1, 1); return err }, arena.ErrClosed},
		{"nil.Grow", func(e *badEnv) error { return nilArena.Grow(1) }, arena.ErrClosed},
		{"nil.Truncate", func(e *badEnv) error { return nilArena.Truncate(0) }, arena.ErrClosed},
		{"nil.Shrink", func(e *badEnv) error { return nilArena.Shrink() }, arena.ErrClosed},
		{"nil.Slice", func(e *badEnv) error { _, err := nilArena.Slice(0, 0); return err }, arena.ErrClosed},
		{"nil.Close", func(e *badEnv) error { return nilArena.Close() }, nil},
		{"zero.Alloc", func(e *badEnv) error { _, err := zeroArena.Alloc(1, 1); return err }, arena.ErrInvalid},
		{"zero.Grow", func(e *badEnv) error { return zeroArena.Grow(1) }, arena.ErrInvalid},
		{"zero.Truncate", func(e *badEnv) error { return zeroArena.Truncate(0) }, arena.ErrInvalid},
		{"zero.Shrink", func(e *badEnv) error { return zeroArena.Shrink() }, arena.ErrInvalid},
		{"zero.Slice", func(e *badEnv) error { _, err := zeroArena.Slice(0, 0); return err }, arena.ErrInvalid},
		{"zero.Close", func(e *badEnv) error { return zeroArena.Close() }, arena.ErrInvalid},

		// The pool.
		{"Pool.Put(zero Chunk)", func(e *badEnv) error { return e.pool.Lender().Put(chunk.Chunk{}) }, acl.ErrInvalidParam},
		{"Pool.Put(chunk of another pool)", func(e *badEnv) error {
			p, err := chunk.New(e.other, chunk.Config{})
			if err != nil {
				return err
			}
			defer p.Close()
			c, err := p.Lender().Get()
			if err != nil {
				return err
			}
			defer p.Lender().Put(c)
			return e.pool.Lender().Put(chunk.Chunk{Handle: c.Handle + 1<<40})
		}, acl.ErrInvalidParam},
		{"Pool.Map(chunk not out)", func(e *badEnv) error {
			return e.pool.Lender().Map(e.a.Base().Add(uintptr(e.a.Reserved()-e.a.ChunkSize())), chunk.Chunk{Handle: 12345})
		}, acl.ErrInvalidParam},
		{"Pool.Release(chunk not out)", func(e *badEnv) error { return e.pool.Lender().Release(e.a.Base(), chunk.Chunk{Handle: 12345}) }, acl.ErrInvalidParam},
		{"Pool.Map(chunk out, over a mapping)", func(e *badEnv) error { return e.pool.Lender().Map(e.a.Base(), e.c) }, acl.ErrInvalidParam},
		{"Pool.Unmap(not a mapping)", func(e *badEnv) error { return e.pool.Lender().Unmap(e.a.Base().Add(1)) }, errDriver},
	}
	return cases
}

func newBadEnv(t *testing.T) *badEnv {
	e := &badEnv{}
	var err error
	e.hd, err = host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	e.other, err = host.New(host.Config{Capacity: 16 << 20})
	require.NoError(t, err)
	e.pool, err = chunk.New(e.hd, chunk.Config{FreshZeroed: true})
	require.NoError(t, err)
	e.a, err = arena.New(arena.Config{Pool: e.pool, Reserve: 16 << 20})
	require.NoError(t, err)
	e.buf, err = e.a.Alloc(3000, 64)
	require.NoError(t, err)
	e.data = bytes.Repeat([]byte("vmarena "), 375)
	require.NoError(t, arena.CopyIn(e.buf, e.data))
	e.stale, err = e.a.Alloc(5000, 1)
	require.NoError(t, err)
	require.NoError(t, e.a.Truncate(e.buf.Len()))
	e.closed, err = arena.New(arena.Config{Pool: e.pool, Reserve: 4 << 20})
	require.NoError(t, err)
	e.closedBuf, err = e.closed.Alloc(100, 1)
	require.NoError(t, err)
	require.NoError(t, e.closed.Close(), "Close with a buffer still referenced")
	e.otherA, err = arena.New(arena.Config{Driver: e.other, Reserve: 4 << 20})
	require.NoError(t, err)
	e.otherBuf, err = e.otherA.Alloc(3000, 1)
	require.NoError(t, err)
	e.c, err = e.pool.Lender().Get()
	require.NoError(t, err)
	return e
}

// snapshot is everything a bad input must leave as it was.
type snapshot struct {
	stats           arena.Stats
	pool            chunk.Stats
	live, otherLive acl.LiveCounts
	data            []byte
	closed          bool
}

func (e *badEnv) snapshot(t *testing.T) snapshot {
	data := make([]byte, len(e.data))
	require.NoError(t, arena.CopyOut(data, e.buf))
	return snapshot{stats: e.a.Stats(), pool: e.pool.Stats(), live: e.hd.Live(), otherLive: e.other.Live(), data: data,
		closed: e.closed.Stats().Closed}
}

// TestBadInput tries every bad input in the table on one arena and checks
// each is refused with the documented error, a message that names the
// package, and no change to the arena, its data, the pool or the driver.
func TestBadInput(t *testing.T) {
	e := newBadEnv(t)
	cases := badCases()
	before := e.snapshot(t)
	require.Equal(t, e.data, before.data)
	refused := 0
	for _, tc := range cases {
		err := tc.fn(e)
		if err != nil {
			refused++
		}
		var ae *acl.Error
		switch {
		case tc.want == nil:
			require.NoError(t, err, tc.name)
		case tc.want == errDriver:
			require.ErrorAs(t, err, &ae, tc.name)
		default:
			require.ErrorIs(t, err, tc.want, tc.name)
			msg := err.Error()
			require.True(t, strings.HasPrefix(msg, "arena: ") || strings.HasPrefix(msg, "chunk: "),
				"%s: error %q does not say where it comes from", tc.name, msg)
		}
		require.Equal(t, before, e.snapshot(t), "%s changed something", tc.name)
	}
	// Everything still works, and nothing leaks.
	b, err := e.a.Alloc(100, 1)
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(b, e.data[:100]))
	require.NoError(t, e.pool.Lender().Put(e.c))
	require.ErrorIs(t, e.pool.Lender().Put(e.c), acl.ErrInvalidParam, "a second Put of one chunk is refused")
	require.NoError(t, e.a.Close())
	require.NoError(t, e.pool.Close())
	require.True(t, e.hd.Live().Zero(), "%+v", e.hd.Live())
	require.NoError(t, e.hd.Close())
	require.NoError(t, e.otherA.Close())
	require.True(t, e.other.Live().Zero(), "%+v", e.other.Live())
	require.NoError(t, e.other.Close())
	t.Logf("bad input: %d kinds of bad input, each answered as documented (%d refused with an error), none changed anything", len(cases)+1, refused+1)
}

// A zero Config works: the process's host driver, a private pool.
func TestZeroConfig(t *testing.T) {
	a, err := arena.New(arena.Config{})
	require.NoError(t, err)
	require.Positive(t, a.Reserved())
	b, err := a.Alloc(1<<20, 4096)
	require.NoError(t, err)
	require.NoError(t, arena.Fill(b, 1))
	require.NoError(t, a.Close())
}
