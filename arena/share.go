package arena

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/sched"
)

// ShareOptions says who may import what Share offers, and how.
type ShareOptions struct {
	// PID is the consumer: the process id, as this process sees it, of the
	// one process allowed to import. Required.
	PID int
	// User is the user the consumer must run as: SameUser (the zero value,
	// this process's own user), UserID(uid) (UserID(0) is root), or
	// AnyUser.
	User User
	// Check, when set, is a further check of the consumer as the kernel
	// reports it; an error refuses it.
	Check func(ipc.Cred) error
	// ReadOnly gives the consumer a read-only view. Where the driver can
	// enforce it against the consumer (the host driver: the memory is
	// sealed against writes through the consumer's mappings), the shared
	// chunks can then only be shared read-only again.
	ReadOnly bool
}

// A User names the user a peer of Share or Import must run as. The zero
// value is SameUser.
type User struct {
	uid  int
	kind uint8 // sameUser, oneUser, anyUser
}

const (
	sameUser = iota
	oneUser
	anyUser
)

var (
	// SameUser is the user this process runs as (os.Geteuid(), which is
	// also what the kernel reports of a peer): the zero User.
	SameUser = User{}
	// AnyUser accepts a peer of any user: name the process another way
	// (its PID, a check).
	AnyUser = User{kind: anyUser}
)

// UserID names the user uid; UserID(0) is root.
func UserID(uid int) User { return User{uid: uid, kind: oneUser} }

// check checks that uid is the user u names.
func (u User) check(uid int) error {
	want := u.uid
	switch u.kind {
	case anyUser:
		return nil
	case sameUser:
		want = os.Geteuid()
	}
	if uid != want {
		return fmt.Errorf("runs as uid %d, not uid %d (%v)", uid, want, u)
	}
	return nil
}

// String returns "same user", "any user" or "uid N".
func (u User) String() string {
	switch u.kind {
	case sameUser:
		return "same user"
	case anyUser:
		return "any user"
	}
	return fmt.Sprintf("uid %d", u.uid)
}

// expect is who a side of the hand-over expects on the other end.
type expect struct {
	who   string // "consumer" or "producer"
	pid   int    // 0: any
	user  User
	check func(ipc.Cred) error
	pin   *ipc.Process // the process pid named, when Share or Import began
}

// begin pins the expected process, when one is named. A kernel without
// pidfds leaves it unpinned; a process that does not run is refused later,
// once the peer has spoken.
func (e *expect) begin() error {
	if e.pid == 0 {
		return nil
	}
	p, err := ipc.OpenProcess(e.pid)
	if err != nil {
		if errors.Is(err, ipc.ErrNoProcess) {
			return refused("check pid", "the %s named, process %d, does not run", e.who, e.pid)
		}
		return nil // no pidfds: the PID alone
	}
	e.pin = p
	return nil
}

func (e *expect) close() { _ = e.pin.Close() }

// verify checks the peer, as the kernel reports it, against e, and names
// the check that failed.
func (e *expect) verify(p *ipc.Peer) error {
	if e.pid != 0 && p.PID != e.pid {
		return refused("check pid", "the %s is %v, not process %d", e.who, p, e.pid)
	}
	if err := e.user.check(p.UID); err != nil {
		return refused("check user", "the %s %v %v", e.who, p, err)
	}
	if e.pin != nil && p.Proc != nil {
		// The PID is the one named, and both pidfds hold a live process:
		// the peer is the process named, not a later holder of its PID.
		if same, err := ipc.Same(e.pin, p.Proc); err != nil || !same {
			return refused("check pidfd", "the %s %v is not the process named, or has exited (%v)", e.who, p, err)
		}
	}
	if e.check != nil {
		if err := e.check(p.Cred); err != nil {
			return refused("check function", "the %s %v: %w", e.who, p, err)
		}
	}
	return nil
}

// notPeer is the refusal of a message whose sender is not the peer the
// kernel reports (ipc.ErrNotPeer): a connected socket handed on, say.
func notPeer(who string, err error) error {
	return refused("check sender", "the %s's message: %w", who, err)
}

// ImportConfig configures Import.
type ImportConfig struct {
	// Driver is the device to map the memory on. nil means the pool's
	// driver, or DefaultDriver (as for Config.Driver) when Pool is nil too.
	Driver acl.Driver
	// Pool is the pool whose budget the imported chunks count against,
	// from Import until the import is closed. Each chunk the producer
	// shares must be of one of its sizes (ChunkSize, TailSize). nil means
	// a private pool, closed with the import.
	Pool *chunk.Pool
	// Budget caps, in bytes, what a private pool accepts: the most memory
	// this process takes from the producer. 0 means no cap. It must be 0
	// with Pool.
	Budget int
	// Streams are the device streams whose work may read the import, as in
	// Config.Streams: Close unmaps once the work queued on them has run, or,
	// without streams, once the device is idle.
	Streams []acl.Stream
	// ReadOnly asks for a read-only view, whatever the producer allows.
	ReadOnly bool
	// Tenant is who may read the import's bytes (see Config.Tenant).
	Tenant chunk.Tenant
	// ProducerPID is the producer's process id, as this process sees it.
	// 0 accepts any process that passes ProducerUser and ProducerCheck.
	ProducerPID int
	// ProducerUser is the user the producer must run as: SameUser (the
	// zero value, this process's own user), UserID(uid), or AnyUser.
	ProducerUser User
	// ProducerCheck, when set, is a further check of the producer as the
	// kernel reports it; an error refuses it.
	ProducerCheck func(ipc.Cred) error
}

// An Imported is memory another process shared with this one (Import): the
// whole chunks of the producer's arena that hold the buffer it shared (of
// both sizes, from a pool of two), mapped side by side as they lay there, in
// a reservation of this process sized to them, at an address that never
// changes. No byte was copied: both processes map the same physical memory,
// and a write by either is seen by the other (unless the import is read-only).
//
// Its Buffer is a Buffer like any other (CopyOut, Slice, Copy into this
// process's arenas), of an arena whose size is fixed: Alloc, Grow, Truncate,
// Reset and Shrink fail with ErrImported, and a read-only import's writes
// (CopyIn, Copy and Fill into it) with ErrReadOnly. Close releases it.
//
// The memory stays valid until the import is closed, whatever the producer
// does: if it frees, shrinks, closes or dies, the device keeps the memory for
// this process. Closing it, or this process's death, frees only this
// process's reference.
//
// Import returns an Imported rather than an Arena because what the consumer
// holds is a buffer, not an allocator: the arena behind it exists so that
// the Buffer works like any other, and refuses everything that would change
// its size.
type Imported struct {
	a   *Arena
	buf Buffer
}

// importMode is what the arena of an Imported knows about its memory.
type importMode struct {
	readOnly bool // writes through the API are refused
	device   bool // and the device maps it read-only too
}

// stepHook, when set (by tests), is called at each step of Share and Import,
// so that a test can end the process there.
var stepHook func(step string)

func step(name string) {
	if stepHook != nil {
		stepHook(name)
	}
}

var errFixed = fmt.Errorf("arena: %w: an Imported cannot allocate, grow or shrink", ErrImported)

// checkWrite is check for a write: a read-only import refuses it.
func (b Buffer) checkWrite(op string) error {
	if err := b.check(op); err != nil {
		return err
	}
	if b.a.imp != nil && b.a.imp.readOnly {
		return fmt.Errorf("arena: %s: %w", op, ErrReadOnly)
	}
	return nil
}

// Buffer returns the buffer the producer shared.
func (v *Imported) Buffer() Buffer { return v.buf }

// ReadOnly reports whether writes through the import are refused.
func (v *Imported) ReadOnly() bool { return v.a.imp.readOnly }

// DeviceReadOnly reports whether the device maps the import read-only too
// (acl.Caps.ReadOnly), so that device work writing into it faults.
func (v *Imported) DeviceReadOnly() bool { return v.a.imp.device }

// Close releases the import: CloseContext with a context that is never done.
func (v *Imported) Close() error { return v.CloseContext(context.Background()) }

// CloseContext unmaps the import once the work queued on ImportConfig.Streams
// (or, without streams, on the device) has run, releases its reservation and
// frees this process's reference to the memory (and closes the private
// pool), as Arena.CloseContext does. The producer's memory is not touched.
// It is safe to call more than once, and on a nil *Imported.
func (v *Imported) CloseContext(ctx context.Context) error {
	if v == nil {
		return nil
	}
	return v.a.CloseContext(ctx)
}

// Share lends the whole chunks that hold b (large and tail chunks alike, on
// a pool of two sizes) to the one process opt names, over conn, with no
// copy: the consumer, calling Import on the other end, maps them into a
// reservation of its own. Share waits for the work queued on the arena's
// streams (or the device, without streams) so that the consumer sees what
// it wrote, then waits for the consumer to say that it has mapped the
// memory. Chunks of one size are offered as before pools had two sizes, so
// that a consumer of an older version imports them; chunks of two sizes
// are offered with their sizes, which such a consumer refuses.
//
// Who may import: the process on the other end must be opt.PID, running as
// opt.User, and pass opt.Check, as the kernel reports it: the process that
// connected (SO_PEERCRED), whose own the consumer's hello must be (its
// credentials and, where the kernel sends one, its pidfd: a connected
// socket handed on to another process is refused), or, over a socket this
// process made (a socketpair), the sender of the consumer's hello
// (SCM_CREDENTIALS, which only a privileged process can forge). Where the
// kernel has pidfds, the process named is pinned when Share begins, and the
// consumer must be that very process, not a later holder of its PID; its
// acknowledgement must come from it too. Anyone else is refused
// (ErrRefused, with the check that failed), before anything is exported,
// and is told only which check refused it. Where the device shares tokens
// (ACL), the chunks are exported with an allow-list holding only the
// consumer; where it shares descriptors (CUDA, the host driver), the
// descriptors are sent to the consumer alone. The arena must draw from a
// pool whose chunks are exportable (Config.Chunk.Shareable, or a
// chunk.Config.Shareable pool) where the device shares descriptors.
//
// Sharing is at chunk granularity: the consumer can read the rest of the
// chunks that hold b too, so allocate what you share chunk-aligned and
// alone (Alloc(n, a.ChunkSize())). A consumer given read-write access can
// write any byte of those chunks, zeros included, under the producer. The
// shared chunks are never reused by the arena's pool: once the arena lets
// them go (Truncate and Shrink, Reset, Close) they are freed, and the
// device keeps the memory for the consumer as long as it maps it. The
// producer's pool counts them until then. Keep b's bytes in use until Share
// returns: the descriptors sent are duplicates Share took while the arena
// held the chunks, so a chunk given back meanwhile still reaches the
// consumer as the memory that was exported (never as a file the
// descriptor's number names next), but on ACL a token of a freed chunk no
// longer imports.
//
// A failure the consumer reports is a *PeerError (matching ErrPeer, and
// none of this process's sentinels); what this side tells the consumer of a
// failure of its own is the check or driver call that failed, never an
// address or descriptor number. Share honours conn's deadlines; ShareContext
// takes a context too. An error leaves the arena as it was (chunks exported
// before the failure stay marked shared).
func (b Buffer) Share(conn *net.UnixConn, opt ShareOptions) error {
	return b.ShareContext(context.Background(), conn, opt)
}

// ShareContext is Share with a context, as net.Dialer.DialContext is Dial:
// when ctx is done before the hand-over completes, Share stops waiting for
// the consumer (conn's deadline is set in the past, and the connection is
// of no further use) and returns an error matching ctx.Err(); once
// ShareContext has returned, ctx no longer affects conn. A ctx done before
// the call fails it at once, before anything is read or sent.
func (b Buffer) ShareContext(ctx context.Context, conn *net.UnixConn, opt ShareOptions) error {
	const op = "arena: share"
	a := b.a
	switch {
	case a == nil:
		return fmt.Errorf("%s: %w: zero Buffer", op, ErrInvalid)
	case a.drv == nil:
		return errNotMade
	case conn == nil:
		return fmt.Errorf("%s: %w: no connection", op, ErrInvalid)
	case opt.PID <= 0:
		return fmt.Errorf("%s: %w: ShareOptions.PID must name the consumer's process", op, ErrInvalid)
	case opt.User.kind > anyUser || (opt.User.kind == oneUser && opt.User.uid < 0):
		return fmt.Errorf("%s: %w: ShareOptions.User %v", op, ErrInvalid, opt.User)
	case b.n == 0:
		return fmt.Errorf("%s: %w: empty buffer", op, ErrInvalid)
	case a.imp != nil:
		return fmt.Errorf("%s: %w: an Imported cannot be shared again", op, ErrImported)
	}
	if err := b.check("share"); err != nil {
		return err
	}
	sharing := a.drv.Caps().Sharing
	if sharing == acl.SharingNone {
		return fmt.Errorf("%s: %w: %s does not share memory between processes", op, acl.ErrNotSupported, a.drv.Name())
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	end := watch(ctx, conn)
	err := a.share(ctx, conn, b, opt, sharing)
	if err = end(err); err != nil {
		return wrapOp(op, err)
	}
	return nil
}

// share is the hand-over of ShareContext, whose arguments it checked.
func (a *Arena) share(ctx context.Context, conn *net.UnixConn, b Buffer, opt ShareOptions, sharing acl.Sharing) error {
	want := expect{who: "consumer", pid: opt.PID, user: opt.User, check: opt.Check}
	notRunning := want.begin()
	defer want.close()

	// Who is on the other end?
	if err := ipc.EnableCredentials(conn); err != nil {
		return err
	}
	hb := make([]byte, helloLen)
	refuse := func(err error) error {
		status, code, text := failure(err)
		_ = ipc.Send(conn, offer{status: status, code: code, text: text}.encode(), nil, true)
		return err
	}
	peer, err := ipc.RecvPeer(conn, hb)
	if errors.Is(err, ipc.ErrNotPeer) {
		return refuse(notPeer("consumer", err))
	}
	if err != nil {
		return fmt.Errorf("read the consumer's hello: %w", err)
	}
	defer peer.Close()
	step("share:hello")
	if notRunning != nil {
		return refuse(notRunning)
	}
	if err := want.verify(peer); err != nil {
		return refuse(err)
	}
	h, err := decodeHello(hb)
	switch {
	case err != nil:
		return refuse(err)
	case h.sharing != sharing:
		return refuse(failed("check sharing form", fmt.Errorf("%w: the consumer shares memory as %v, this driver as %v", acl.ErrNotSupported, h.sharing, sharing)))
	}
	if sharing == acl.SharingToken {
		if err := a.checkTgid(h.tgid, peer.PID); err != nil {
			return refuse(err)
		}
	}

	// What the consumer will see was written before it looks.
	if err := a.lend.WaitStreams(ctx, a.streams); err != nil {
		return refuse(err)
	}
	from, handles, sizes, err := a.export(b, h.tgid, opt.ReadOnly)
	if err != nil {
		return refuse(err)
	}
	// The descriptors are this call's own copies: the arena may give the
	// chunks back from here on, and the driver close its descriptors.
	defer closeHandles(handles)
	step("share:exported")
	sched.At(sched.ShareExported, a)
	o, table := offerOf(sharing, sizes, a.unit, uint64(b.off)-from, uint64(b.n))
	if opt.ReadOnly {
		o.flags |= flagReadOnly
	}
	if err := sendHandles(conn, o, table, handles); err != nil {
		return err
	}
	step("share:offered")
	k, err := readAck(conn, peer)
	if errors.Is(err, ipc.ErrNotPeer) {
		return notPeer("consumer", err)
	}
	if err != nil {
		return fmt.Errorf("the consumer did not say it mapped the memory: %w", err)
	}
	if k.status != statusOK {
		return remote("consumer", k.status, k.code, k.text)
	}
	step("share:acked")
	return nil
}

// aLongTimeAgo is a deadline that has passed: setting it makes a blocked
// read or write return at once.
var aLongTimeAgo = time.Unix(1, 0)

// watch makes conn's reads and writes fail once ctx is done, for the
// hand-over under way. The function it returns ends the watch: given the
// hand-over's error, it returns it wrapped in ctx's when ctx ended it. A
// ctx done just as the hand-over succeeded leaves conn without a deadline.
func watch(ctx context.Context, conn *net.UnixConn) (end func(error) error) {
	if ctx.Done() == nil {
		return func(err error) error { return err }
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = conn.SetDeadline(aLongTimeAgo)
	})
	return func(err error) error {
		if stop() {
			return err // ctx had no part in it
		}
		<-fired
		if err == nil {
			_ = conn.SetDeadline(time.Time{})
			return nil
		}
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
}

// wrapOp prefixes err with op, the call that failed ("arena: share"),
// unless err names the package already, which it then says once.
func wrapOp(op string, err error) error { return &opError{op: op, err: err} }

type opError struct {
	op  string
	err error
}

func (e *opError) Error() string { return e.op + ": " + strings.TrimPrefix(e.err.Error(), "arena: ") }
func (e *opError) Unwrap() error { return e.err }

// checkTgid checks the id the consumer's hello asks to put on the chunks'
// allow-list (its driver's DeviceGetBareTgid) against the consumer the
// kernel vouched for (pid, in this process's PID namespace): where this
// process's driver sees process ids as this process does (its own bare
// tgid is its PID), they must be the same, or the verified consumer could
// name a process nobody checked, which the device would then let import.
// Where they differ (a container whose ids the driver translates), the id
// cannot be checked here; the consumer, trusted with every byte it is
// offered, is trusted with it too (docs/sharing.md, threat model).
func (a *Arena) checkTgid(tgid int32, pid int) error {
	own, err := a.drv.DeviceGetBareTgid()
	if err != nil || int(own) != os.Getpid() {
		return nil
	}
	if int(tgid) != pid {
		return refused("check pid", "the consumer's hello names process %d for the allow-list, not the consumer", tgid)
	}
	return nil
}

// export exports the chunks that hold b for the process tgid, and returns
// the offset of the first in the arena, their shareable handles and their
// sizes (a pool of two sizes lends both). A descriptor is
// returned as a duplicate, taken while the arena's mutex still holds the
// chunk: the driver's own is the driver's, closed when the chunk is freed,
// which may happen as soon as the mutex is released, and its number then
// names the next file this process opens. The caller closes the duplicates
// (closeHandles).
func (a *Arena) export(b Buffer, tgid int32, readOnly bool) (_ uint64, hs []acl.ShareableHandle, sizes []uint64, err error) {
	if a.ev.owner.Load() != 0 && a.inCallback() {
		return 0, nil, nil, errCallback
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := b.check("share"); err != nil { // the arena may have changed meanwhile
		return 0, nil, nil, err
	}
	if err := a.lifeNow().err(); err != nil { // closing or going to sleep
		return 0, nil, nil, err
	}
	first := a.geo.index(uint64(b.off))
	last := a.geo.index(uint64(b.off) + uint64(b.n) - 1)
	hs = make([]acl.ShareableHandle, 0, last-first+1)
	sizes = make([]uint64, 0, last-first+1)
	defer func() {
		if err != nil {
			closeHandles(hs)
		}
	}()
	export := a.lend.Export
	if readOnly {
		export = a.lend.ExportReadOnly
	}
	for i, c := range a.geo.cs[first : last+1] {
		s, err := export(c, tgid)
		if err != nil {
			return 0, hs, nil, err
		}
		if fd, ok := s.FD(); ok {
			dup, err := ipc.Dup(fd)
			if err != nil {
				return 0, hs, nil, fmt.Errorf("duplicate the descriptor of chunk %d: %w", len(hs), err)
			}
			s.Value = uint64(dup)
		}
		hs = append(hs, s)
		sizes = append(sizes, a.geo.size(first+i))
	}
	return a.geo.off(first), hs, sizes, nil
}

// closeHandles closes the descriptors among hs, which export duplicated.
func closeHandles(hs []acl.ShareableHandle) {
	for _, s := range hs {
		if fd, ok := s.FD(); ok {
			_ = ipc.Close(fd)
		}
	}
}

// sendHandles sends the offer, with this process's credentials, its sizes
// table (offerOf's, none for chunks of one size), and the shareable handles
// after them.
func sendHandles(c *net.UnixConn, o offer, table []byte, hs []acl.ShareableHandle) error {
	if err := ipc.Send(c, o.encode(), nil, true); err != nil {
		return err
	}
	if len(table) > 0 {
		if err := ipc.Send(c, table, nil, true); err != nil {
			return err
		}
	}
	if o.sharing == acl.SharingToken {
		for len(hs) > 0 {
			n := min(len(hs), tokenSlice)
			b := make([]byte, 8*n)
			for i, s := range hs[:n] {
				le.PutUint64(b[8*i:], s.Value)
			}
			if err := ipc.Send(c, b, nil, true); err != nil {
				return err
			}
			hs = hs[n:]
		}
		return nil
	}
	for len(hs) > 0 {
		n := min(len(hs), fdBatch)
		fds := make([]int, n)
		for i, s := range hs[:n] {
			fds[i] = int(s.Value)
		}
		if err := ipc.Send(c, encodeBatch(n), fds, true); err != nil {
			return err
		}
		hs = hs[n:]
	}
	return nil
}

// readOffer reads an offer and its text, and the producer as the kernel
// reports it; the caller closes the peer. The text must come from the
// producer too.
func readOffer(c *net.UnixConn) (offer, *ipc.Peer, error) {
	b := make([]byte, offerLen)
	peer, err := ipc.RecvPeer(c, b)
	if err != nil {
		return offer{}, nil, err
	}
	o, n, err := decodeOffer(b)
	if err == nil {
		o.text, err = readText(c, n, peer)
	}
	return o, peer, err
}

// readAck reads an ack and its text, which must come from peer.
func readAck(c *net.UnixConn, peer *ipc.Peer) (ack, error) {
	b := make([]byte, ackLen)
	if _, err := ipc.RecvFrom(c, b, 0, peer); err != nil {
		return ack{}, err
	}
	a, n, err := decodeAck(b)
	if err != nil {
		return ack{}, err
	}
	a.text, err = readText(c, n, peer)
	return a, err
}

// readSizes reads the sizes table of an offer with flagSizes from peer, a
// slice at a time (limits.shape bounds it at 4 bytes a chunk, and what it
// keeps grows only with what the peer sent); nil without flagSizes.
func readSizes(c *net.UnixConn, o offer, peer *ipc.Peer) ([]uint32, error) {
	if o.flags&flagSizes == 0 {
		return nil, nil
	}
	n := int(o.chunks)
	b := make([]byte, 4*min(n, sizeSlice))
	var sizes []uint32
	for len(sizes) < n {
		k := min(n-len(sizes), sizeSlice)
		if _, err := ipc.RecvFrom(c, b[:4*k], 0, peer); err != nil {
			return nil, err
		}
		sizes = decodeSizes(b[:4*k], sizes)
	}
	return sizes, nil
}

// readText reads a text of n bytes, which decodeOffer or decodeAck bounded,
// from peer.
func readText(c *net.UnixConn, n uint32, peer *ipc.Peer) (string, error) {
	if n == 0 {
		return "", nil
	}
	b := make([]byte, n)
	if _, err := ipc.RecvFrom(c, b, 0, peer); err != nil {
		return "", err
	}
	return string(b), nil
}

// Import maps the memory the producer on the other end of conn shares with
// Buffer.Share, and returns it as an Imported. It tells the producer who it is
// (its credentials, checked by the kernel, and for an ACL allow-list the id
// DeviceGetBareTgid gives), checks who the producer is (cfg.ProducerPID,
// ProducerUser and ProducerCheck, as the kernel reports it, as Share checks
// the consumer: a producer that connected must be the sender of the offer
// and of every message after it, so that a connected socket handed on to
// another process is refused), checks the offer (and the size of each
// chunk, when they differ) against the device's granularity, the largest
// reservation, the budget and the pool's sizes before it allocates or reads
// anything more for it, reserves address space for exactly the shared
// chunks, imports and maps them, and tells the producer it is done.
//
// It fails with an error matching ErrRefused when this process refused the
// producer or its offer (the error names the check that failed; the
// producer is told the check's name and nothing more),
// acl.ErrNotSupported when the driver cannot share or shares in another
// form than the producer's, ErrOutOfMemory (chunk.ErrBudget) past the
// budget, the driver's errors, and a *PeerError (ErrPeer) when the producer
// reported a failure or refused this process. A failed Import holds
// nothing; the connection is then of no further use. Import honours conn's
// deadlines; ImportContext takes a context too.
func Import(conn *net.UnixConn, cfg ImportConfig) (*Imported, error) {
	return ImportContext(context.Background(), conn, cfg)
}

// ImportContext is Import with a context, as net.Dialer.DialContext is
// Dial: when ctx is done before the hand-over completes, Import stops
// waiting for the producer (conn's deadline is set in the past, and the
// connection is of no further use), gives back what it imported, and
// returns an error matching ctx.Err(); once ImportContext has returned, ctx
// no longer affects conn. A ctx done before the call fails it at once.
func ImportContext(ctx context.Context, conn *net.UnixConn, cfg ImportConfig) (*Imported, error) {
	const op = "arena: import"
	if conn == nil {
		return nil, fmt.Errorf("%s: %w: no connection", op, ErrInvalid)
	}
	if cfg.Budget < 0 || (cfg.Pool != nil && cfg.Budget != 0) {
		return nil, fmt.Errorf("%s: %w: budget %d (with a pool, the pool's budget counts)", op, ErrInvalid, cfg.Budget)
	}
	if cfg.ProducerPID < 0 || cfg.ProducerUser.kind > anyUser || (cfg.ProducerUser.kind == oneUser && cfg.ProducerUser.uid < 0) {
		return nil, fmt.Errorf("%s: %w: ImportConfig.ProducerPID %d, ProducerUser %v", op, ErrInvalid, cfg.ProducerPID, cfg.ProducerUser)
	}
	drv := cfg.Driver
	switch {
	case cfg.Pool != nil && cfg.Pool.Driver() == nil:
		return nil, fmt.Errorf("%s: %w: ImportConfig.Pool was not made by chunk.New", op, ErrInvalid)
	case drv != nil && nilPointer(drv):
		return nil, fmt.Errorf("%s: %w: nil driver", op, ErrInvalid)
	case cfg.Pool != nil && drv != nil && cfg.Pool.Driver() != drv:
		return nil, fmt.Errorf("%s: %w: ImportConfig.Driver differs from the pool's driver", op, ErrInvalid)
	case cfg.Pool != nil:
		drv = cfg.Pool.Driver()
	case drv == nil:
		d, err := DefaultDriver()
		if err != nil {
			return nil, wrapOp(op, err)
		}
		drv = d
	}
	sharing := drv.Caps().Sharing
	if sharing == acl.SharingNone {
		return nil, fmt.Errorf("%s: %w: %s does not share memory between processes", op, acl.ErrNotSupported, drv.Name())
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	end := watch(ctx, conn)
	v, err := importOver(conn, cfg, drv, sharing)
	if err = end(err); err != nil {
		return nil, wrapOp(op, err)
	}
	return v, nil
}

// nilPointer reports whether d is a nil pointer in an interface (a typed
// nil), which New refuses through chunk.New and Import here.
func nilPointer(d acl.Driver) bool {
	v := reflect.ValueOf(d)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// importOver is the hand-over of ImportContext, whose arguments it checked.
func importOver(conn *net.UnixConn, cfg ImportConfig, drv acl.Driver, sharing acl.Sharing) (*Imported, error) {
	lim, err := importLimits(drv, cfg)
	if err != nil {
		return nil, err
	}
	tgid, err := drv.DeviceGetBareTgid()
	if err != nil {
		return nil, err
	}
	want := expect{who: "producer", pid: cfg.ProducerPID, user: cfg.ProducerUser, check: cfg.ProducerCheck}
	if err := want.begin(); err != nil {
		return nil, err
	}
	defer want.close()
	// A peer that connected is known before it speaks: an impostor is
	// refused before it learns anything of this process. Over a socket this
	// process made, the producer's offer says who it is.
	if early, err := ipc.Identify(conn, nil); err == nil {
		verr := want.verify(early)
		_ = early.Close()
		if verr != nil {
			return nil, verr
		}
	}
	if err := ipc.EnableCredentials(conn); err != nil {
		return nil, err
	}
	h := hello{sharing: sharing, tgid: tgid, device: drv.Device()}
	if cfg.ReadOnly {
		h.flags |= flagReadOnly
	}
	if err := ipc.Send(conn, h.encode(), nil, true); err != nil {
		return nil, err
	}
	step("import:hello")
	o, peer, err := readOffer(conn)
	defer peer.Close()
	fail := func(err error) (*Imported, error) {
		status, code, text := failure(err)
		_ = ipc.Send(conn, ack{status: status, code: code, text: text}.encode(), nil, true)
		return nil, err
	}
	if peer == nil {
		if errors.Is(err, ipc.ErrNotPeer) {
			return fail(notPeer("producer", err))
		}
		return nil, fmt.Errorf("read the producer's offer: %w", err)
	}
	// Who sent the offer comes before what it says.
	if verr := want.verify(peer); verr != nil {
		return fail(verr)
	}
	if errors.Is(err, ipc.ErrNotPeer) {
		return fail(notPeer("producer", err))
	}
	if err != nil {
		return fail(fmt.Errorf("read the producer's offer: %w", err))
	}
	if o.status != statusOK {
		return nil, remote("producer", o.status, o.code, o.text)
	}
	step("import:offer")
	if err := lim.shape(o); err != nil {
		return fail(err)
	}
	// The table comes before the handles: read it whole, bounded by the
	// shape, so that a refusal of a sound offer can drain the handles.
	sizes, err := readSizes(conn, o, peer)
	if err != nil {
		if errors.Is(err, ipc.ErrNotPeer) {
			return fail(notPeer("producer", err))
		}
		return fail(fmt.Errorf("read the producer's sizes: %w", err))
	}
	if fits, err := lim.check(o, sizes); err != nil {
		if fits {
			drainHandles(conn, o, 0, peer)
		}
		return fail(err)
	}
	pool, own, err := importPool(drv, cfg, o, sizes)
	if err != nil {
		drainHandles(conn, o, 0, peer)
		return fail(err)
	}
	tenant := cfg.Tenant
	if tenant == 0 {
		tenant = chunk.NewTenant()
	}
	chunks, err := importHandles(conn, o, sizes, pool, tenant, peer)
	if err != nil {
		if own {
			err = errors.Join(err, pool.Close())
		}
		if errors.Is(err, ipc.ErrNotPeer) {
			err = notPeer("producer", err)
		}
		return fail(err)
	}
	step("import:imported")
	imp := &importMode{readOnly: cfg.ReadOnly || o.flags&flagReadOnly != 0}
	imp.device = imp.readOnly && drv.Caps().ReadOnly
	v, err := newImported(drv, pool, own, tenant, cfg.Streams, chunks, imp, o.off, o.n)
	if err != nil {
		return fail(err)
	}
	step("import:mapped")
	if err := ipc.Send(conn, ack{status: statusOK}.encode(), nil, true); err != nil {
		// The producer cannot know the memory is mapped: give it back, so
		// that both ends agree the hand-over failed.
		return nil, errors.Join(fmt.Errorf("tell the producer: %w", err), v.Close())
	}
	return v, nil
}

// importLimits returns what an offer must fit: the driver's granularity,
// the largest reservation, the budget and the pool's chunk sizes.
func importLimits(drv acl.Driver, cfg ImportConfig) (limits, error) {
	prop := acl.DeviceProp(drv.Device(), 0)
	prop.HandleType = drv.Caps().Sharing.HandleType()
	gran, err := drv.MemGetAllocationGranularity(&prop, acl.GranularityMinimum)
	if err != nil {
		return limits{}, err
	}
	lim := limits{sharing: drv.Caps().Sharing, gran: uint64(gran), maxReserve: MaxReserve, budget: uint64(cfg.Budget)}
	if cfg.Pool != nil {
		lim.sizes = [2]uint64{uint64(cfg.Pool.ChunkSize()), uint64(cfg.Pool.TailSize())}
	}
	return lim, nil
}

// importHandles receives the offer's handles from peer, checked by
// limits.check with its sizes table, and imports them into pool for tenant,
// a slice at a time. On failure it gives back what it imported, and closes
// every descriptor it received.
func importHandles(c *net.UnixConn, o offer, sizes []uint32, pool *chunk.Pool, t chunk.Tenant, peer *ipc.Peer) (cs []chunk.Chunk, err error) {
	defer func() {
		if err != nil {
			for _, ch := range cs {
				err = errors.Join(err, pool.Lender().Put(ch))
			}
			cs = nil
		}
	}()
	n := int(o.chunks)
	if o.sharing == acl.SharingToken {
		b := make([]byte, 8*min(n, tokenSlice))
		for len(cs) < n {
			k := min(n-len(cs), tokenSlice)
			if _, err := ipc.RecvFrom(c, b[:8*k], 0, peer); err != nil {
				return cs, err
			}
			hs := make([]acl.ShareableHandle, k)
			for i := range hs {
				hs[i] = acl.ShareableHandle{Type: acl.MemHandleTypeNone, Value: le.Uint64(b[8*i:])}
			}
			got := len(cs) + k
			if cs, err = importAll(pool, t, hs, o, sizes, cs); err != nil {
				drainHandles(c, o, got, peer)
				return cs, err
			}
		}
		return cs, nil
	}
	for len(cs) < n {
		fds, err := recvBatch(c, n-len(cs), peer)
		if err != nil {
			return cs, err
		}
		hs := make([]acl.ShareableHandle, len(fds))
		for i, fd := range fds {
			hs[i] = acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(fd)}
		}
		got := len(cs) + len(fds)
		cs, err = importAll(pool, t, hs, o, sizes, cs)
		// The driver keeps what it needs of each descriptor.
		err = errors.Join(err, ipc.CloseAll(fds))
		if err != nil {
			drainHandles(c, o, got, peer)
			return cs, err
		}
	}
	return cs, nil
}

// importAll imports hs, the next chunks of offer o (whose sizes table is
// sizes) after cs, into pool for t, appending them to cs. It stops at the
// first failure.
func importAll(pool *chunk.Pool, t chunk.Tenant, hs []acl.ShareableHandle, o offer, sizes []uint32, cs []chunk.Chunk) ([]chunk.Chunk, error) {
	for _, s := range hs {
		ch, err := pool.Lender().Import(t, s, uintptr(sizeOf(o, sizes, uint64(len(cs)))))
		if err != nil {
			return cs, fmt.Errorf("import handle %d (%v): %w", len(cs), s, err)
		}
		cs = append(cs, ch)
	}
	return cs, nil
}

// drainHandles reads the handles of an offer whose shape was checked
// (limits.shape), and whose sizes table was read, off the connection, after
// the first got, a slice at a time,
// and closes any descriptors among them, so that the connection is left at
// a message's start. It stops at the first failure, or the first message
// that is not peer's.
func drainHandles(c *net.UnixConn, o offer, got int, peer *ipc.Peer) {
	left := int(o.chunks) - got
	if o.sharing == acl.SharingToken {
		b := make([]byte, 8*min(max(left, 0), tokenSlice))
		for left > 0 {
			k := min(left, tokenSlice)
			if _, err := ipc.RecvFrom(c, b[:8*k], 0, peer); err != nil {
				return
			}
			left -= k
		}
		return
	}
	for left > 0 {
		fds, err := recvBatch(c, left, peer)
		if err != nil {
			return
		}
		_ = ipc.CloseAll(fds)
		left -= len(fds)
	}
}

// recvBatch receives one batch of at most left descriptors from peer.
func recvBatch(c *net.UnixConn, left int, peer *ipc.Peer) ([]int, error) {
	b := make([]byte, batchLen)
	fds, err := ipc.RecvFrom(c, b, fdBatch, peer)
	if err != nil {
		return nil, err
	}
	if _, err := decodeBatch(b, len(fds), left); err != nil {
		return nil, errors.Join(err, ipc.CloseAll(fds))
	}
	return fds, nil
}

// importPool returns the pool an Imported's chunks come into: cfg.Pool, or a
// private one (own) for the chunks of offer o, checked with its sizes table:
// of the largest size, with the offer's unit for tail size when the chunks
// are not all one size, and of one size, said so (not the pool's default
// tails, chunk.DefaultTailSize), when they are (the chunks are imported as
// their own sizes, never cached).
func importPool(drv acl.Driver, cfg ImportConfig, o offer, sizes []uint32) (pool *chunk.Pool, own bool, err error) {
	if cfg.Pool != nil {
		return cfg.Pool, false, nil
	}
	most := uint64(0)
	for i := range o.chunks {
		most = max(most, sizeOf(o, sizes, i))
	}
	pc := chunk.Config{Size: int(most), TailSize: int(o.chunkSize), MaxCached: -1, Budget: int64(cfg.Budget), Scrub: chunk.ScrubNever}
	p, err := chunk.New(drv, pc)
	if err != nil {
		return nil, false, err
	}
	return p, true, nil
}

// newImported makes an Imported of the imported chunks, whose buffer is [off, off+n)
// of them: an arena with a reservation of exactly the chunks, mapped in
// order, with Len = Cap fixed. On failure it gives back the chunks and
// everything else it made.
func newImported(drv acl.Driver, pool *chunk.Pool, own bool, t chunk.Tenant, streams []acl.Stream,
	chunks []chunk.Chunk, imp *importMode, off, n uint64) (*Imported, error) {
	a, err := newImportedArena(drv, pool, own, t, streams, chunks, imp)
	if err != nil {
		return nil, err
	}
	return &Imported{a: a, buf: Buffer{a: a, off: uintptr(off), n: uintptr(n)}}, nil
}

// newImportedArena makes the arena of an Imported. Its chunks lie as the
// producer's did, of the sizes they were imported as (multiples of the
// pool's TailSize, its unit), each after the last: not on blocks of the
// pool's ChunkSize, so its layout marks no chunk large (an import never
// grows, gives nothing back to the pool, and is never asked where a chunk
// ends).
func newImportedArena(drv acl.Driver, pool *chunk.Pool, own bool, t chunk.Tenant, streams []acl.Stream,
	chunks []chunk.Chunk, imp *importMode) (*Arena, error) {
	a := &Arena{drv: drv, pool: pool, lend: pool.Lender(), ownPool: own, chunkSize: uint64(pool.ChunkSize()), unit: uint64(pool.TailSize()),
		tenant: t, streams: slices.Clone(streams), imp: imp}
	size := uint64(0)
	for _, c := range chunks {
		size += uint64(c.Size)
	}
	giveBack := func(err error) (*Arena, error) {
		for _, c := range chunks {
			err = errors.Join(err, pool.Lender().Put(c))
		}
		if own {
			err = errors.Join(err, pool.Close())
		}
		return nil, err
	}
	if err := a.reserve(size); err != nil {
		return giveBack(err)
	}
	a.geo.sizes(a.unit, a.unit, a.reserved)
	m, err := pool.Lender().Join(client{a}, false)
	if err != nil {
		return giveBack(errors.Join(joinErr(err), a.releaseReservation()))
	}
	a.member = m
	a.maxAlign = 1 << min(bits.TrailingZeros64(uint64(a.base)), 30)
	a.life.state.Store(uint32(lifeImported)) // no Alloc takes the lock-free path: the word stays frozen
	a.state.Store(frozen)
	if err := pool.Lender().MapImported(a.base, chunks, imp.device); err != nil {
		var left *chunk.LeftMappedError
		if errors.As(err, &left) {
			// Chunks the undo could not unmap: strays, for Close to unmap.
			for _, l := range left.Left {
				a.maps++
				a.strays = append(a.strays, stray{l.At, l.C})
				chunks = slices.DeleteFunc(chunks, func(c chunk.Chunk) bool { return c == l.C })
			}
		}
		for _, c := range chunks {
			err = errors.Join(err, pool.Lender().Put(c))
		}
		return nil, errors.Join(fmt.Errorf("map the import: %w", err), a.Close())
	}
	for _, c := range chunks {
		a.geo.push(c, uint64(c.Size))
	}
	a.maps = uint64(len(chunks))
	a.grows = 1
	a.cap.Store(size)
	a.peak = size
	a.state.Store(frozen | size)
	return a, nil
}
