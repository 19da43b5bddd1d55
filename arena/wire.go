package arena

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
)

// The messages of Share and Import. Every field has a fixed size and
// offset, little-endian, with no padding left to chance, so that both ends
// read the same bytes whatever their Go versions. Reserved fields are zero,
// and a message with an unknown flag, status or form is refused.
//
//	consumer → producer  hello (32 bytes), with the consumer's credentials
//	producer → consumer  offer (64 bytes), with the producer's credentials,
//	                     then the refusal's text, or, with flagSizes, the
//	                     sizes table (a uint32 per chunk), and the shareable
//	                     handles: tokens as uint64s, or descriptors in
//	                     batches (an 8-byte header carrying up to fdBatch)
//	consumer → producer  ack (24 bytes), then the failure's text
//
// The parsers below are pure functions of the bytes (and of the limits the
// reader sets), so that they can be fuzzed on their own.

const (
	wireVersion = 2
	helloLen    = 32
	offerLen    = 64
	ackLen      = 24
	batchLen    = 8
	fdBatch     = 64   // descriptors per message, below ipc.MaxFDs
	tokenSlice  = 512  // tokens read per message piece: 4 KiB
	sizeSlice   = 1024 // sizes read per message piece: 4 KiB
	maxText     = 1024 // the longest failure text either side sends or reads
	maxReason   = 512  // the most of a peer's text an error keeps
)

var (
	helloMagic = [8]byte{'V', 'M', 'A', 'H', 'E', 'L', 'O', '2'}
	offerMagic = [8]byte{'V', 'M', 'A', 'O', 'F', 'F', 'R', '2'}
	ackMagic   = [8]byte{'V', 'M', 'A', 'A', 'C', 'K', '0', '2'}
)

// Status of an offer or ack.
const (
	statusOK      = 0
	statusRefused = 1 // the peer is not the one named
	statusFailed  = 2 // the sender failed: the text (and ACL code) say why
)

// Flags of a hello and an offer.
const (
	flagReadOnly = 1
	// flagSizes marks an offer whose chunks are not all one size: its
	// chunkSize is then a unit, and a sizes table follows the offer, before
	// the handles: one uint32 per chunk, its size in units. An offer of
	// chunks of one size never carries it, so that it reads as it did
	// before two sizes. A hello never carries it.
	flagSizes = 2

	helloFlags = flagReadOnly             // the flags a hello may carry
	offerFlags = flagReadOnly | flagSizes // and an offer
)

// errProtocol is the refusal of a message that breaks the protocol.
func errProtocol(what string, args ...any) error {
	return &checkError{check: "check protocol",
		err: fmt.Errorf("%w: the peer broke the protocol: %s", ErrRefused, fmt.Sprintf(what, args...))}
}

// checkError is a check of the hand-over that failed. The peer is told the
// check's name (check pid, check budget, check protocol, …) and nothing
// more: not whom this side expected, nor any address or descriptor number;
// the error this process returns says it all.
type checkError struct {
	check string
	err   error
}

func (e *checkError) Error() string { return e.err.Error() }
func (e *checkError) Unwrap() error { return e.err }

// refused returns the refusal of the peer by check, matching ErrRefused,
// with what this process says of it.
func refused(check, format string, args ...any) error {
	return &checkError{check: check, err: fmt.Errorf("%w: %s: %w", ErrRefused, check, fmt.Errorf(format, args...))}
}

// failed returns the failure of check, err (which says what it matches).
func failed(check string, err error) error { return &checkError{check: check, err: err} }

// hello is the consumer's first message.
type hello struct {
	sharing acl.Sharing
	tgid    int32 // DeviceGetBareTgid: the PID for an ACL allow-list
	device  int32
	flags   uint32
}

func (h hello) encode() []byte {
	b := make([]byte, helloLen)
	copy(b, helloMagic[:])
	le.PutUint32(b[8:], wireVersion)
	le.PutUint32(b[12:], uint32(h.sharing))
	le.PutUint32(b[16:], uint32(h.tgid))
	le.PutUint32(b[20:], uint32(h.device))
	le.PutUint32(b[24:], h.flags)
	return b
}

// decodeHello parses a hello.
func decodeHello(b []byte) (hello, error) {
	if err := checkHead(b, helloLen, helloMagic, "hello"); err != nil {
		return hello{}, err
	}
	h := hello{
		sharing: acl.Sharing(le.Uint32(b[12:])),
		tgid:    int32(le.Uint32(b[16:])),
		device:  int32(le.Uint32(b[20:])),
		flags:   le.Uint32(b[24:]),
	}
	switch {
	case h.sharing != acl.SharingToken && h.sharing != acl.SharingFD:
		return hello{}, errProtocol("hello: sharing form %d is none this side knows", uint32(h.sharing))
	case h.flags&^helloFlags != 0:
		return hello{}, errProtocol("hello: unknown flags %#x", h.flags)
	case le.Uint32(b[28:]) != 0:
		return hello{}, errProtocol("hello: reserved field %#x is not zero", le.Uint32(b[28:]))
	case h.tgid < 0 || h.device < 0:
		return hello{}, errProtocol("hello: process id %d, device %d", h.tgid, h.device)
	}
	return h, nil
}

// checkHead checks a fixed-size message's length, magic and version.
func checkHead(b []byte, n int, magic [8]byte, what string) error {
	switch {
	case len(b) != n:
		return errProtocol("%s of %d bytes, want %d", what, len(b), n)
	case [8]byte(b[:8]) != magic:
		return errProtocol("%s: bad magic %q: not this protocol", what, b[:8])
	case le.Uint32(b[8:]) != wireVersion:
		return errProtocol("%s: version %d, this side speaks %d", what, le.Uint32(b[8:]), wireVersion)
	}
	return nil
}

// offer is the producer's answer: what it shares, or why not.
type offer struct {
	status    uint32
	sharing   acl.Sharing
	flags     uint32
	chunkSize uint64
	chunks    uint64
	off, n    uint64 // the shared buffer, from the first chunk's start
	code      int32  // the ACL code of a failure, or 0
	text      string
}

func (o offer) encode() []byte {
	t := clip(o.text)
	b := make([]byte, offerLen+len(t))
	copy(b, offerMagic[:])
	le.PutUint32(b[8:], wireVersion)
	le.PutUint32(b[12:], o.status)
	le.PutUint32(b[16:], uint32(o.sharing))
	le.PutUint32(b[20:], o.flags)
	le.PutUint64(b[24:], o.chunkSize)
	le.PutUint64(b[32:], o.chunks)
	le.PutUint64(b[40:], o.off)
	le.PutUint64(b[48:], o.n)
	le.PutUint32(b[56:], uint32(o.code))
	le.PutUint32(b[60:], uint32(len(t)))
	copy(b[offerLen:], t)
	return b
}

// decodeOffer parses an offer's fixed part, and returns the length of the
// text that follows it.
func decodeOffer(b []byte) (offer, uint32, error) {
	if err := checkHead(b, offerLen, offerMagic, "offer"); err != nil {
		return offer{}, 0, err
	}
	o := offer{
		status:    le.Uint32(b[12:]),
		sharing:   acl.Sharing(le.Uint32(b[16:])),
		flags:     le.Uint32(b[20:]),
		chunkSize: le.Uint64(b[24:]),
		chunks:    le.Uint64(b[32:]),
		off:       le.Uint64(b[40:]),
		n:         le.Uint64(b[48:]),
		code:      int32(le.Uint32(b[56:])),
	}
	text := le.Uint32(b[60:])
	switch {
	case o.status > statusFailed:
		return offer{}, 0, errProtocol("offer: unknown status %d", o.status)
	case text > maxText:
		return offer{}, 0, errProtocol("offer: a text of %d bytes, at most %d", text, maxText)
	case o.flags&^offerFlags != 0:
		return offer{}, 0, errProtocol("offer: unknown flags %#x", o.flags)
	case o.status == statusOK && (text != 0 || o.code != 0):
		return offer{}, 0, errProtocol("offer: a share with code %d and a text of %d bytes", o.code, text)
	case o.status != statusOK && (o.chunks != 0 || o.chunkSize != 0 || o.off != 0 || o.n != 0 || o.flags&flagSizes != 0):
		return offer{}, 0, errProtocol("offer: a refusal offering %d chunks (flags %#x)", o.chunks, o.flags)
	}
	return o, text, nil
}

// limits is what an offer must fit in the consumer.
type limits struct {
	sharing    acl.Sharing
	gran       uint64    // the driver's allocation granularity
	maxReserve uint64    // the largest reservation
	budget     uint64    // the most bytes the import may take, or 0
	sizes      [2]uint64 // the pool's chunk sizes (ChunkSize, TailSize), or zeros for any
}

// check checks a share's offer, and its sizes table (nil without
// flagSizes), against the consumer's limits, before anything is allocated
// for it, and names the check that failed. An offer whose shape is sound
// but does not fit (a chunk size the pool does not lend, past the budget)
// fails with fits set: its handles may be read off the connection and
// dropped.
func (lim limits) check(o offer, sizes []uint32) (fits bool, err error) {
	if err := lim.shape(o); err != nil {
		return false, err
	}
	total, err := lim.shapeSizes(o, sizes)
	if err != nil {
		return false, err
	}
	if lim.sizes[0] != 0 {
		n := o.chunks
		if o.flags&flagSizes == 0 {
			n = 1 // one size: the first's
		}
		for i := range n {
			if cs := sizeOf(o, sizes, i); cs != lim.sizes[0] && cs != lim.sizes[1] {
				return true, failed("check chunk size", fmt.Errorf("%w: check chunk size: the producer's chunk %d is %d bytes, the pool's chunks %d or %d",
					ErrInvalid, i, cs, lim.sizes[0], lim.sizes[1]))
			}
		}
	}
	if lim.budget != 0 && total > lim.budget {
		return true, failed("check budget", fmt.Errorf("%w: %w: check budget: the producer shares %d bytes, the budget is %d", chunk.ErrBudget, ErrOutOfMemory, total, lim.budget))
	}
	return true, nil
}

// shape checks the sizes and counts of an offer; with flagSizes, the buffer
// is checked against the chunks' sizes by shapeSizes.
func (lim limits) shape(o offer) error {
	cs := o.chunkSize
	switch {
	case o.sharing != lim.sharing:
		return failed("check sharing form", fmt.Errorf("%w: the producer shares memory as %v, this driver as %v", acl.ErrNotSupported, o.sharing, lim.sharing))
	case cs == 0 || lim.gran == 0 || cs%lim.gran != 0:
		return refused("check chunk size", "%d bytes is not a multiple of the device's granularity %d", cs, lim.gran)
	case cs > lim.maxReserve:
		return refused("check chunk size", "%d bytes, more than the largest reservation %d", cs, lim.maxReserve)
	case o.chunks == 0 || o.chunks > lim.maxReserve/cs:
		return refused("check chunk count", "%d chunks of %d bytes do not fit the largest reservation %d", o.chunks, cs, lim.maxReserve)
	case o.flags&flagSizes != 0:
		return nil
	case o.n == 0 || o.off >= cs || o.n > o.chunks*cs-o.off:
		return refused("check buffer", "[%d, +%d) does not lie in %d chunks of %d bytes from the first", o.off, o.n, o.chunks, cs)
	case o.off+o.n <= (o.chunks-1)*cs:
		return refused("check buffer", "[%d, +%d) leaves the last of %d chunks of %d bytes empty", o.off, o.n, o.chunks, cs)
	}
	return nil
}

// shapeSizes checks the sizes table of an offer that shape passed (nil
// without flagSizes), each chunk's size in units of o.chunkSize, and
// returns the chunks' bytes: every size at least a unit, their sum (added
// up a chunk at a time, so that nothing overflows) within the largest
// reservation, and the buffer starting in the first chunk and ending in the
// last.
func (lim limits) shapeSizes(o offer, sizes []uint32) (uint64, error) {
	u := o.chunkSize
	if o.flags&flagSizes == 0 {
		return o.chunks * u, nil
	}
	if uint64(len(sizes)) != o.chunks {
		return 0, refused("check chunk count", "%d sizes for %d chunks", len(sizes), o.chunks)
	}
	most, units := lim.maxReserve/u, uint64(0) // in units
	for i, s := range sizes {
		switch {
		case s == 0:
			return 0, refused("check chunk size", "chunk %d of 0 units", i)
		case uint64(s) > most:
			return 0, refused("check chunk size", "chunk %d of %d units of %d bytes, more than the largest reservation %d", i, s, u, lim.maxReserve)
		case uint64(s) > most-units:
			return 0, refused("check chunk count", "chunks 0 to %d, of %d units of %d bytes and more, do not fit the largest reservation %d", i, units+uint64(s), u, lim.maxReserve)
		}
		units += uint64(s)
	}
	total, first, last := units*u, uint64(sizes[0])*u, uint64(sizes[len(sizes)-1])*u
	switch {
	case o.n == 0 || o.off >= first || o.n > total-o.off:
		return 0, refused("check buffer", "[%d, +%d) does not lie in %d chunks of %d bytes from the first, of %d", o.off, o.n, o.chunks, total, first)
	case o.off+o.n <= total-last:
		return 0, refused("check buffer", "[%d, +%d) leaves the last of %d chunks of %d bytes, of %d, empty", o.off, o.n, o.chunks, total, last)
	}
	return total, nil
}

// sizeOf returns the bytes of chunk i of offer o, whose sizes table is
// sizes (nil without flagSizes).
func sizeOf(o offer, sizes []uint32, i uint64) uint64 {
	if o.flags&flagSizes == 0 {
		return o.chunkSize
	}
	return uint64(sizes[i]) * o.chunkSize
}

// offerOf returns the offer of chunks of sizes bytes (multiples of unit)
// that hold the buffer [off, +n) from the first's start, and its sizes
// table: none when the chunks are all one size (the offer's chunkSize
// theirs, as before two sizes), else flagSizes, a chunkSize of unit and
// each chunk's size in units.
func offerOf(sharing acl.Sharing, sizes []uint64, unit, off, n uint64) (offer, []byte) {
	o := offer{sharing: sharing, chunkSize: sizes[0], chunks: uint64(len(sizes)), off: off, n: n}
	for _, s := range sizes {
		if s != sizes[0] {
			o.flags, o.chunkSize = flagSizes, unit
			return o, encodeSizes(sizes, unit)
		}
	}
	return o, nil
}

// decodeSizes appends the sizes in b, little-endian uint32s, to sizes.
func decodeSizes(b []byte, sizes []uint32) []uint32 {
	for ; len(b) >= 4; b = b[4:] {
		sizes = append(sizes, le.Uint32(b))
	}
	return sizes
}

// encodeSizes returns the sizes table of an offer whose chunks are of sizes
// bytes, in units of unit.
func encodeSizes(sizes []uint64, unit uint64) []byte {
	b := make([]byte, 0, 4*len(sizes))
	for _, s := range sizes {
		b = le.AppendUint32(b, uint32(s/unit))
	}
	return b
}

// decodeBatch parses a batch's header, which came with nfds descriptors,
// when at most left more are expected, and returns its count.
func decodeBatch(b []byte, nfds, left int) (int, error) {
	if len(b) != batchLen {
		return 0, errProtocol("batch of %d bytes, want %d", len(b), batchLen)
	}
	n := le.Uint32(b)
	switch {
	case le.Uint32(b[4:]) != 0:
		return 0, errProtocol("batch: reserved field %#x is not zero", le.Uint32(b[4:]))
	case n == 0 || n > fdBatch:
		return 0, errProtocol("batch: %d descriptors, want 1 to %d", n, fdBatch)
	case int64(n) > int64(left):
		return 0, errProtocol("batch: %d descriptors, only %d more expected", n, left)
	case int(n) != nfds:
		return 0, errProtocol("batch: says %d descriptors, %d came", n, nfds)
	}
	return int(n), nil
}

func encodeBatch(n int) []byte {
	b := make([]byte, batchLen)
	le.PutUint32(b, uint32(n))
	return b
}

// ack is the consumer's last message: whether it mapped the memory.
type ack struct {
	status uint32
	code   int32
	text   string
}

func (a ack) encode() []byte {
	t := clip(a.text)
	b := make([]byte, ackLen+len(t))
	copy(b, ackMagic[:])
	le.PutUint32(b[8:], a.status)
	le.PutUint32(b[12:], uint32(a.code))
	le.PutUint32(b[16:], uint32(len(t)))
	return append(b[:ackLen], t...)
}

// decodeAck parses an ack's fixed part, and returns the length of the text
// that follows it.
func decodeAck(b []byte) (ack, uint32, error) {
	switch {
	case len(b) != ackLen:
		return ack{}, 0, errProtocol("ack of %d bytes, want %d", len(b), ackLen)
	case [8]byte(b[:8]) != ackMagic:
		return ack{}, 0, errProtocol("ack: bad magic %q: not this protocol", b[:8])
	}
	a := ack{status: le.Uint32(b[8:]), code: int32(le.Uint32(b[12:]))}
	text := le.Uint32(b[16:])
	switch {
	case a.status > statusFailed:
		return ack{}, 0, errProtocol("ack: unknown status %d", a.status)
	case text > maxText:
		return ack{}, 0, errProtocol("ack: a text of %d bytes, at most %d", text, maxText)
	case a.status == statusOK && (text != 0 || a.code != 0):
		return ack{}, 0, errProtocol("ack: success with code %d and a text of %d bytes", a.code, text)
	case le.Uint32(b[20:]) != 0:
		return ack{}, 0, errProtocol("ack: reserved field %#x is not zero", le.Uint32(b[20:]))
	}
	return a, text, nil
}

func clip(s string) string {
	if len(s) > maxText {
		return s[:maxText]
	}
	return s
}

// sanitize makes a peer's text safe to show: printable characters only
// (others become '?', invalid UTF-8 too), cut to maxReason bytes.
func sanitize(s string) string {
	var b strings.Builder
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n <= 1 {
				r = '?'
			}
		}
		if !unicode.IsPrint(r) {
			r = '?'
		}
		if b.Len()+utf8.RuneLen(r) > maxReason {
			b.WriteString("…")
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// failure turns an error into the status, ACL code and text that tell the
// peer about it: the text says which check or call failed, in words that
// carry nothing of this process (no address, descriptor number, or whom a
// check expected).
func failure(err error) (status uint32, code int32, text string) {
	status = statusFailed
	if errors.Is(err, ErrRefused) {
		status = statusRefused
	}
	code, _ = acl.CodeOf(err)
	if code == 0 {
		switch {
		case errors.Is(err, acl.ErrOutOfMemory):
			code = acl.ErrCodeRTMemoryAllocation
		case errors.Is(err, acl.ErrNotSupported):
			code = acl.ErrCodeRTFeatureNotSupport
		case errors.Is(err, acl.ErrInvalidParam):
			code = acl.ErrCodeInvalidParam
		}
	}
	return status, code, describe(err)
}

// describe names what failed: the check, the ACL call, or the kind of
// failure.
func describe(err error) string {
	if ce, ok := errors.AsType[*checkError](err); ok {
		return ce.check
	}
	if ae, ok := errors.AsType[*acl.Error](err); ok {
		return ae.Op + " failed"
	}
	for _, k := range []struct {
		err  error
		what string
	}{
		{context.Canceled, "cancelled"},
		{context.DeadlineExceeded, "timed out"},
		{os.ErrDeadlineExceeded, "timed out"},
		{ErrStale, "the buffer is stale"},
		{ErrClosed, "closed"},
		{ErrOutOfMemory, "out of memory"},
		{acl.ErrNotSupported, "not supported"},
		{ErrInvalid, "invalid argument"},
	} {
		if errors.Is(err, k.err) {
			return k.what
		}
	}
	return "failed"
}

// A PeerError is a failure the other process of a Share or Import reported.
// Its fields are what the peer said: the peer may say anything, so they
// only inform (and Reason is cut and stripped of unprintable characters).
type PeerError struct {
	// Who is "producer" or "consumer".
	Who string
	// Refused is set when the peer said it refused this process.
	Refused bool
	// Code is the ACL code the peer gave for its failure, or 0.
	Code int32
	// Reason is the peer's text, sanitised: printable characters, at most
	// 512 bytes.
	Reason string
}

// Error says who failed, and what it said.
func (e *PeerError) Error() string {
	what := "failed"
	if e.Refused {
		what = "refused"
	}
	s := fmt.Sprintf("the %s %s: %q", e.Who, what, e.Reason)
	if e.Code != 0 {
		s += fmt.Sprintf(" (ACL code %d)", e.Code)
	}
	return s
}

// Is matches ErrPeer.
func (e *PeerError) Is(target error) bool { return target == ErrPeer }

// remote turns the status, ACL code and text the peer sent into a
// *PeerError.
func remote(who string, status uint32, code int32, text string) error {
	return &PeerError{Who: who, Refused: status == statusRefused, Code: code, Reason: sanitize(text)}
}

var le = binary.LittleEndian
