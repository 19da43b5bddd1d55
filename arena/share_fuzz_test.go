package arena

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/vmarena/vmarena/acl"
)

// The parsers of Share and Import, fuzzed on both sides: whatever the bytes,
// no panic, and what a parser accepts keeps the invariants the code after
// it relies on. The seed corpora (testdata/fuzz) hold hostile frames.

func hostileSeeds(magic string, n int) [][]byte {
	b := make([]byte, n)
	copy(b, magic)
	binary.LittleEndian.PutUint32(b[8:], wireVersion)
	var seeds [][]byte
	seeds = append(seeds, nil, b[:7], bytes.Clone(b))
	for _, off := range []int{8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 60} {
		if off+4 > n {
			continue
		}
		x := bytes.Clone(b)
		binary.LittleEndian.PutUint32(x[off:], 0xffffffff)
		seeds = append(seeds, x)
	}
	return seeds
}

func FuzzHello(f *testing.F) {
	for _, s := range hostileSeeds(string(helloMagic[:]), helloLen) {
		f.Add(s)
	}
	f.Add(hello{sharing: acl.SharingFD, tgid: 1234, flags: flagReadOnly}.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHello(b)
		if err != nil {
			if h != (hello{}) {
				t.Fatalf("a refused hello returned %+v", h)
			}
			return
		}
		switch {
		case h.sharing != acl.SharingFD && h.sharing != acl.SharingToken:
			t.Fatalf("accepted form %v", h.sharing)
		case h.flags&^helloFlags != 0, h.tgid < 0, h.device < 0:
			t.Fatalf("accepted %+v", h)
		case !bytes.Equal(h.encode(), b):
			t.Fatalf("accepted a hello that does not encode back: %x", b)
		}
	})
}

func FuzzOffer(f *testing.F) {
	for _, s := range hostileSeeds(string(offerMagic[:]), offerLen) {
		f.Add(s, uint64(0))
	}
	ok := offer{sharing: acl.SharingFD, chunkSize: 2 << 20, chunks: 3, off: 100, n: 5 << 20}
	f.Add(ok.encode(), uint64(0))
	f.Add(ok.encode(), uint64(4<<20))
	bomb := ok
	bomb.chunkSize, bomb.chunks, bomb.n = 1, 1<<40, 1<<40
	f.Add(bomb.encode(), uint64(0))
	f.Fuzz(func(t *testing.T, b []byte, budget uint64) {
		o, text, err := decodeOffer(b)
		if err != nil {
			return
		}
		if text > maxText || (o.status == statusOK && (text != 0 || o.code != 0)) || o.status > statusFailed || o.flags&^offerFlags != 0 {
			t.Fatalf("accepted %+v with a text of %d bytes", o, text)
		}
		if o.status != statusOK {
			return
		}
		lim := limits{sharing: acl.SharingFD, gran: 2 << 20, maxReserve: MaxReserve, budget: budget}
		if _, err := lim.check(o, nil); err != nil {
			return
		}
		cs := o.chunkSize
		switch {
		case cs == 0 || cs%lim.gran != 0 || cs > MaxReserve:
			t.Fatalf("accepted chunks of %d bytes", cs)
		case o.chunks == 0 || o.chunks > MaxReserve/cs:
			t.Fatalf("accepted %d chunks of %d bytes", o.chunks, cs)
		case o.off >= cs || o.n == 0 || o.off+o.n > o.chunks*cs || o.off+o.n <= (o.chunks-1)*cs:
			t.Fatalf("accepted [%d, +%d) in %d chunks of %d bytes", o.off, o.n, o.chunks, cs)
		case budget != 0 && o.chunks*cs > budget:
			t.Fatalf("accepted %d bytes past a budget of %d", o.chunks*cs, budget)
		case !bytes.Equal(o.encode(), b):
			t.Fatalf("accepted an offer that does not encode back: %x", b)
		}
	})
}

// FuzzOfferSizes fuzzes an offer with the sizes table that follows it, as
// Import reads them: the table only once the offer's shape is sound, 4 bytes
// a chunk (a table cut short is a connection closed mid-table), then the
// check against the budget and, with pool set, a pool of 8 MiB chunks with
// 2 MiB tails. What it accepts lies within the largest reservation, starts
// in the first chunk and ends in the last, fits the budget and the pool, and
// is what the producer (offerOf) would have sent for those chunks.
func FuzzOfferSizes(f *testing.F) {
	const u, c = 2 << 20, 8 << 20
	mixed := offer{sharing: acl.SharingFD, flags: flagSizes, chunkSize: u, chunks: 4, off: 100, n: 12 << 20}
	table := encodeSizes([]uint64{u, c, u, u}, u)
	f.Add(mixed.encode(), table, uint64(0), true)
	f.Add(mixed.encode(), table, uint64(12<<20), false)
	f.Add(mixed.encode(), table[:10], uint64(0), false)
	f.Add(mixed.encode(), encodeSizes([]uint64{u, 0, u, u}, u), uint64(0), false)
	f.Add(mixed.encode(), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 1, 0, 0, 0}, uint64(0), false)
	f.Fuzz(func(t *testing.T, b, table []byte, budget uint64, pool bool) {
		o, _, err := decodeOffer(b)
		if err != nil || o.status != statusOK {
			return
		}
		lim := limits{sharing: acl.SharingFD, gran: u, maxReserve: MaxReserve, budget: budget}
		if pool {
			lim.sizes = [2]uint64{c, u}
		}
		if lim.shape(o) != nil {
			return
		}
		var sizes []uint32
		if o.flags&flagSizes != 0 {
			if uint64(len(table)) < 4*o.chunks {
				return // the connection closed mid-table
			}
			sizes = decodeSizes(table[:4*o.chunks], nil)
		}
		if _, err := lim.check(o, sizes); err != nil {
			return
		}
		// Every size in bytes, and their sum, without overflow: each is
		// below 2³², a unit at most MaxReserve (2³⁷).
		sz := make([]uint64, o.chunks)
		total := uint64(0)
		for i := range sz {
			sz[i] = sizeOf(o, sizes, uint64(i))
			if sz[i] == 0 || sz[i]%lim.gran != 0 || sz[i] > MaxReserve || total > MaxReserve-sz[i] {
				t.Fatalf("accepted chunk %d of %d bytes after %d", i, sz[i], total)
			}
			if pool && sz[i] != c && sz[i] != u {
				t.Fatalf("accepted chunk %d of %d bytes into a pool of %d and %d", i, sz[i], c, u)
			}
			total += sz[i]
		}
		last := sz[len(sz)-1]
		switch {
		case o.n == 0 || o.off >= sz[0] || o.off+o.n > total || o.off+o.n <= total-last:
			t.Fatalf("accepted [%d, +%d) in chunks of %v", o.off, o.n, sz)
		case budget != 0 && total > budget:
			t.Fatalf("accepted %d bytes past a budget of %d", total, budget)
		}
		// The producer sends the same for those chunks: a table only when
		// they differ.
		want, wantTable := offerOf(o.sharing, sz, o.chunkSize, o.off, o.n)
		want.flags |= o.flags & flagReadOnly
		want.code = o.code // a success's code is not read
		if slices.Min(sz) == slices.Max(sz) {
			if wantTable != nil || want.flags&flagSizes != 0 {
				t.Fatalf("a table for chunks of one size: %v", sz)
			}
			return
		}
		if want != o || !bytes.Equal(wantTable, table[:4*o.chunks]) {
			t.Fatalf("accepted %+v with table %x; the producer sends %+v with %x", o, table[:4*o.chunks], want, wantTable)
		}
	})
}

func FuzzBatch(f *testing.F) {
	f.Add(encodeBatch(1), 1, 1)
	f.Add(encodeBatch(64), 64, 1000)
	f.Add(encodeBatch(0), 0, 5)
	f.Add(encodeBatch(65), 65, 100)
	f.Add(encodeBatch(2), 1, 2)
	f.Add([]byte{1, 0, 0, 0, 1, 0, 0, 0}, 1, 1)
	f.Add([]byte{1, 0, 0}, 1, 1)
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, 64, -1)
	f.Fuzz(func(t *testing.T, b []byte, nfds, left int) {
		n, err := decodeBatch(b, nfds, left)
		if err != nil {
			return
		}
		if n < 1 || n > fdBatch || n != nfds || n > left {
			t.Fatalf("accepted a batch of %d with %d descriptors, %d left", n, nfds, left)
		}
	})
}

func FuzzAck(f *testing.F) {
	for _, s := range hostileSeeds(string(ackMagic[:]), ackLen) {
		f.Add(s, "")
	}
	f.Add(ack{status: statusFailed, code: acl.ErrCodeRTMemoryAllocation, text: "out of memory"}.encode()[:ackLen], "\x1b[2J\x00forged\xff\xfe")
	f.Add(ack{}.encode(), strings.Repeat("é\u200b\u2028", 400))
	f.Fuzz(func(t *testing.T, b []byte, text string) {
		if a, n, err := decodeAck(b); err == nil {
			if n > maxText || a.status > statusFailed || (a.status == statusOK && (n != 0 || a.code != 0)) {
				t.Fatalf("accepted %+v with a text of %d bytes", a, n)
			}
		}
		// Whatever the peer's text, the error shows it printable and short,
		// and it matches no sentinel of this process.
		err := remote("peer", statusFailed, acl.ErrCodeRTMemoryAllocation, text)
		pe := err.(*PeerError)
		s := pe.Reason
		if !utf8.ValidString(s) || len(s) > maxReason+len("…") || strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			t.Fatalf("reason %q", s)
		}
		if !strings.Contains(err.Error(), "peer") || isLocal(err) {
			t.Fatalf("%v", err)
		}
	})
}

// isLocal reports whether err matches a sentinel of this process.
func isLocal(err error) bool {
	for _, s := range []error{ErrOutOfMemory, ErrRefused, ErrInvalid, ErrClosed, acl.ErrOutOfMemory, acl.ErrInvalidParam, acl.ErrNotSupported} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
