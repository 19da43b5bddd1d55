package arena

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ipc"
)

// The messages of Share and Import. Every field has a fixed size and
// offset, little-endian, with no padding left to chance, so that both ends
// read the same bytes whatever their Go versions.
//
//	consumer → producer  hello (32 bytes), with the consumer's credentials
//	producer → consumer  offer (64 bytes), then the refusal's text, or the
//	                     shareable handles: tokens as uint64s, or descriptors
//	                     in batches (an 8-byte header carrying up to fdBatch)
//	consumer → producer  ack (24 bytes), then the failure's text

const (
	wireVersion = 1
	helloLen    = 32
	offerLen    = 64
	ackLen      = 24
	batchLen    = 8
	fdBatch     = 64   // descriptors per message, below ipc.MaxFDs
	maxText     = 4096 // the longest failure text either side sends
)

var (
	helloMagic = [8]byte{'V', 'M', 'A', 'H', 'E', 'L', 'O', '1'}
	offerMagic = [8]byte{'V', 'M', 'A', 'O', 'F', 'F', 'R', '1'}
	ackMagic   = [8]byte{'V', 'M', 'A', 'A', 'C', 'K', '0', '1'}
)

// Status of an offer or ack.
const (
	statusOK      = 0
	statusRefused = 1 // the peer is not the one named: ErrRefused
	statusFailed  = 2 // the sender failed: the text (and ACL code) say why
)

// Flags of a hello and an offer.
const flagReadOnly = 1

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

func decodeHello(b []byte) (hello, error) {
	if [8]byte(b[:8]) != helloMagic || le.Uint32(b[8:]) != wireVersion {
		return hello{}, fmt.Errorf("%w: the peer does not speak this protocol (version %d)", ErrRefused, wireVersion)
	}
	return hello{
		sharing: acl.Sharing(le.Uint32(b[12:])),
		tgid:    int32(le.Uint32(b[16:])),
		device:  int32(le.Uint32(b[20:])),
		flags:   le.Uint32(b[24:]),
	}, nil
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

// readOffer reads an offer and its text.
func readOffer(c *net.UnixConn) (offer, error) {
	b := make([]byte, offerLen)
	if _, _, err := ipc.Recv(c, b, 0); err != nil {
		return offer{}, err
	}
	if [8]byte(b[:8]) != offerMagic || le.Uint32(b[8:]) != wireVersion {
		return offer{}, fmt.Errorf("%w: the peer does not speak this protocol (version %d)", ErrRefused, wireVersion)
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
	text, err := readText(c, le.Uint32(b[60:]))
	o.text = text
	return o, err
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
	copy(b[ackLen:], t)
	return b
}

func readAck(c *net.UnixConn) (ack, error) {
	b := make([]byte, ackLen)
	if _, _, err := ipc.Recv(c, b, 0); err != nil {
		return ack{}, err
	}
	if [8]byte(b[:8]) != ackMagic {
		return ack{}, fmt.Errorf("%w: the peer does not speak this protocol (version %d)", ErrRefused, wireVersion)
	}
	a := ack{status: le.Uint32(b[8:]), code: int32(le.Uint32(b[12:]))}
	text, err := readText(c, le.Uint32(b[16:]))
	a.text = text
	return a, err
}

func readText(c *net.UnixConn, n uint32) (string, error) {
	if n == 0 {
		return "", nil
	}
	if n > maxText {
		return "", fmt.Errorf("%w: a message of %d bytes", ErrRefused, n)
	}
	b := make([]byte, n)
	if _, _, err := ipc.Recv(c, b, 0); err != nil {
		return "", err
	}
	return string(b), nil
}

func clip(s string) string {
	if len(s) > maxText {
		return s[:maxText]
	}
	return s
}

// failure turns an error into the status, ACL code and text that tell the
// peer about it.
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
	return status, code, err.Error()
}

// remote turns the status, ACL code and text the peer sent into an error
// that matches the sentinels it matched there.
func remote(who string, status uint32, code int32, text string) error {
	var cause error = errors.New(text)
	if code != 0 {
		cause = &acl.Error{Op: who, Code: code, Msg: text}
	}
	if status == statusRefused {
		return fmt.Errorf("%w by the %s: %w", ErrRefused, who, cause)
	}
	return fmt.Errorf("the %s failed: %w", who, cause)
}

var le = binary.LittleEndian
