// Command handoff hands a prefilled KV cache from one process to another
// without copying it, as a disaggregated server does between its prefill and
// decode stages on one node.
//
// The prefill process writes every layer's keys and values for a prompt into
// arenas whose chunks can be exported, starts the decode process (this same
// binary, run with -decode) with one end of a socketpair, and shares each
// cache with it (Buffer.Share): the decoder, and no other process, maps the
// very chunks the prefill process wrote (arena.Import) into reservations of
// its own. The prefill process then closes its arenas and ends: the device
// keeps the memory for the decoder. The decoder generates more tokens,
// appending their keys and values to arenas of its own, and every few tokens
// computes attention (softmax(q·K)·V) over the prompt's rows, read from the
// shared memory, and its own rows, and checks the result against a host
// reference. Both count the copies their drivers made: handing over copied
// no byte.
//
// It runs on the driver VMARENA_DEVICE names (the host driver when no device
// answers); the device must share memory between processes.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"math"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/device"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

var (
	decode  = flag.Bool("decode", false, "be the decode process (the prefill process starts it with its socket as descriptor 3)")
	layers  = flag.Int("layers", 4, "transformer layers (one K and one V cache each)")
	dim     = flag.Int("dim", 1024, "float32s per key and per value row")
	prompt  = flag.Int("prompt", 1500, "prompt tokens the prefill process writes")
	newToks = flag.Int("tokens", 600, "tokens the decode process generates")
	every   = flag.Int("every", 150, "compute attention every this many generated tokens")
)

func main() {
	flag.Parse()
	run := prefill
	if *decode {
		run = decodeMain
	}
	if err := run(); err != nil {
		log.SetFlags(0)
		log.Fatal("handoff: ", err)
	}
}

// openDriver opens the device, wrapped to count the copies each process
// makes.
func openDriver() (*copyCounter, string, error) {
	choice, err := device.FromEnv()
	if err != nil {
		return nil, "", err
	}
	if choice.Driver.Caps().Sharing == acl.SharingNone {
		choice.Driver.Close()
		return nil, "", fmt.Errorf("%s cannot share memory between processes", choice.Driver.Name())
	}
	return &copyCounter{Driver: choice.Driver}, choice.Reason, nil
}

// copyCounter is a driver that counts the copies made through it: every
// call that moves bytes between host and device or within the device.
type copyCounter struct {
	acl.Driver
	n atomic.Int64
}

func (c *copyCounter) MemcpyHtoD(dst acl.DevicePtr, src []byte) error {
	c.n.Add(1)
	return c.Driver.MemcpyHtoD(dst, src)
}

func (c *copyCounter) MemcpyDtoH(dst []byte, src acl.DevicePtr) error {
	c.n.Add(1)
	return c.Driver.MemcpyDtoH(dst, src)
}

func (c *copyCounter) MemcpyDtoD(dst, src acl.DevicePtr, n uintptr) error {
	c.n.Add(1)
	return c.Driver.MemcpyDtoD(dst, src, n)
}

// Live reports the driver's live objects, where it counts them.
func (c *copyCounter) Live() acl.LiveCounts {
	if lc, ok := c.Driver.(acl.Counter); ok {
		return lc.Live()
	}
	return acl.LiveCounts{}
}

func copies(d *copyCounter) int64 { return d.n.Load() }

// copied says what n driver copy calls mean.
func copied(n int64) string {
	if n == 0 {
		return "no byte copied (0 driver copy calls)"
	}
	return fmt.Sprintf("%d driver copy calls", n)
}

// prefill writes the prompt's caches, starts the decoder and hands them over.
// checkFlags refuses flag values the processes cannot work with, in both
// processes (the decode process gets the prefill's flags).
func checkFlags() error {
	if *layers < 1 || *dim < 1 || *prompt < 1 || *newToks < 0 || *every < 1 {
		return fmt.Errorf("-layers %d, -dim %d, -prompt %d, -tokens %d, -every %d: want layers, dim, prompt and every at least 1, tokens at least 0",
			*layers, *dim, *prompt, *newToks, *every)
	}
	return nil
}

func prefill() (err error) {
	if err := checkFlags(); err != nil {
		return err
	}
	drv, reason, err := openDriver()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, drv.Close()) }()
	fmt.Printf("prefill: driver %s — %s\n", drv.Name(), reason)

	pool, err := chunk.New(drv, chunk.Config{Shareable: true})
	if err != nil {
		return err
	}
	row := *dim * 4
	var caches []*arena.Arena
	var bufs []arena.Buffer
	defer func() {
		for _, a := range caches {
			err = errors.Join(err, a.Close())
		}
		err = errors.Join(err, pool.Close())
	}()
	for l := range *layers {
		for kind := range 2 {
			a, err := arena.New(arena.Config{Pool: pool, Reserve: *prompt*row + 64<<20})
			if err != nil {
				return err
			}
			caches = append(caches, a)
			// One buffer per cache, chunk-aligned: sharing is by whole chunks.
			b, err := a.Alloc(*prompt*row, a.ChunkSize())
			if err != nil {
				return err
			}
			for tok := range *prompt {
				r, err := b.Slice(tok*row, (tok+1)*row)
				if err != nil {
					return err
				}
				if err := arena.CopyIn(r, vector(tok, l, kind, *dim)); err != nil {
					return err
				}
			}
			bufs = append(bufs, b)
		}
	}
	fmt.Printf("prefill: wrote %d prompt tokens × %d layers × K,V: %.1f MiB in %d chunks of %d MiB\n",
		*prompt, *layers, float64(len(bufs)*(*prompt)*row)/(1<<20), pool.Stats().InUse, pool.ChunkSize()>>20)

	// Start the decoder with one end of a socketpair, and hand it the caches.
	conn, peer, err := ipc.Socketpair()
	if err != nil {
		return err
	}
	defer conn.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "-decode", "-layers="+strconv.Itoa(*layers), "-dim="+strconv.Itoa(*dim),
		"-tokens="+strconv.Itoa(*newToks), "-every="+strconv.Itoa(*every))
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{peer}
	if err := cmd.Start(); err != nil {
		peer.Close()
		return err
	}
	peer.Close()
	defer func() {
		if werr := cmd.Wait(); werr != nil {
			err = errors.Join(err, fmt.Errorf("the decode process: %w", werr))
		}
	}()
	before := copies(drv)
	for _, b := range bufs {
		if err := b.Share(conn, arena.ShareOptions{PID: cmd.Process.Pid, ReadOnly: true}); err != nil {
			cmd.Process.Kill()
			return err
		}
	}
	st := pool.Stats()
	fmt.Printf("prefill: handed %d caches to process %d: %d chunks exported, %s\n",
		len(bufs), cmd.Process.Pid, st.Exported, copied(copies(drv)-before))

	// Done: give everything back. The shared chunks are freed, not cached;
	// the device keeps their memory while the decoder maps it.
	for _, a := range caches {
		if err := a.Close(); err != nil {
			return err
		}
	}
	caches = nil
	st = pool.Stats()
	fmt.Printf("prefill: closed its caches: %d chunks freed, %d cached, %d bytes held\n", st.Frees, st.Cached, st.HeldBytes)
	return nil
}

// decodeMain maps the prompt's caches and decodes on from them.
func decodeMain() (err error) {
	if err := checkFlags(); err != nil {
		return err
	}
	f := os.NewFile(3, "socket")
	conn, err := ipc.FileConn(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("decode: the prefill process's socket: %w", err)
	}
	defer conn.Close()
	drv, _, err := openDriver()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, drv.Close()) }()

	views := make([]*arena.Imported, 0, 2**layers)
	defer func() {
		for _, v := range views {
			err = errors.Join(err, v.Close())
		}
	}()
	for range 2 * *layers {
		// The producer started this process: it is the parent, as the kernel
		// says (it made the socketpair).
		v, err := arena.Import(conn, arena.ImportConfig{Driver: drv, ProducerPID: os.Getppid()})
		if err != nil {
			return err
		}
		views = append(views, v)
	}
	row := *dim * 4
	promptToks := views[0].Buffer().Len() / row
	l := drv.Live()
	fmt.Printf("decode: mapped %d caches of %d prompt tokens: %d chunks imported, %.1f MiB, read-only %v, %s\n",
		len(views), promptToks, l.Imported, float64(l.ImportedBytes)/(1<<20), views[0].ReadOnly(), copied(copies(drv)))

	pool, err := chunk.New(drv, chunk.Config{})
	if err != nil {
		return err
	}
	own := make([]*arena.Arena, len(views))
	defer func() {
		for _, a := range own {
			err = errors.Join(err, a.Close())
		}
		err = errors.Join(err, pool.Close())
	}()
	for i := range own {
		a, err := arena.New(arena.Config{Pool: pool, Reserve: *newToks*row + 64<<20})
		if err != nil {
			return err
		}
		own[i] = a
	}
	var worst float64
	checks := 0
	for t := range *newToks {
		tok := promptToks + t
		for l := range *layers {
			for kind := range 2 {
				b, err := own[2*l+kind].Alloc(row, 64)
				if err != nil {
					return fmt.Errorf("decode: token %d layer %d: %w", tok, l, err)
				}
				if err := arena.CopyIn(b, vector(tok, l, kind, *dim)); err != nil {
					return err
				}
			}
			if (t+1)%*every == 0 || t == *newToks-1 {
				d, err := attend(views[2*l].Buffer(), views[2*l+1].Buffer(), own[2*l], own[2*l+1], l, tok+1)
				if err != nil {
					return err
				}
				worst = max(worst, d)
				checks++
			}
		}
	}
	if worst > 1e-4 {
		return fmt.Errorf("decode: attention differs from the host reference by %.1e", worst)
	}
	fmt.Printf("decode: generated %d tokens after the %d-token prompt, appended to its own arenas; %d attention checks, max |device−host| %.1e\n",
		*newToks, promptToks, checks, worst)
	return nil
}

// attend computes softmax(q·Kᵀ/√d)·V over the first n tokens, reading the
// prompt's rows from the shared views and the rest from the decoder's own
// arenas, and returns the largest difference from the host reference.
func attend(kShared, vShared arena.Buffer, kOwn, vOwn *arena.Arena, l, n int) (float64, error) {
	d := *dim
	row := d * 4
	p := kShared.Len() / row
	K, V := make([]float32, n*d), make([]float32, n*d)
	for _, part := range []struct {
		dst []float32
		src arena.Buffer
	}{{K[:p*d], kShared}, {V[:p*d], vShared}} {
		if err := arena.CopyOut(part.dst, part.src); err != nil {
			return 0, err
		}
	}
	for i, a := range []*arena.Arena{kOwn, vOwn} {
		b, err := a.Slice(0, (n-p)*row)
		if err != nil {
			return 0, err
		}
		dst := K[p*d:]
		if i == 1 {
			dst = V[p*d:]
		}
		if err := arena.CopyOut(dst, b); err != nil {
			return 0, err
		}
	}
	q := vector(n-1, l, 2, d)
	dev := attention(q, K, V, n)
	refK, refV := make([]float32, 0, n*d), make([]float32, 0, n*d)
	for tok := range n {
		refK = append(refK, vector(tok, l, 0, d)...)
		refV = append(refV, vector(tok, l, 1, d)...)
	}
	ref := attention(q, refK, refV, n)
	var worst float64
	for i := range dev {
		worst = max(worst, math.Abs(float64(dev[i]-ref[i])))
	}
	return worst, nil
}

func attention(q, K, V []float32, n int) []float32 {
	d := len(q)
	scores := make([]float64, n)
	top := math.Inf(-1)
	for t := range n {
		var s float64
		for i := range d {
			s += float64(q[i] * K[t*d+i])
		}
		scores[t] = s / math.Sqrt(float64(d))
		top = max(top, scores[t])
	}
	var sum float64
	for t := range scores {
		scores[t] = math.Exp(scores[t] - top)
		sum += scores[t]
	}
	out := make([]float32, d)
	for t := range n {
		w := float32(scores[t] / sum)
		for i := range d {
			out[i] += w * V[t*d+i]
		}
	}
	return out
}

// vector is a deterministic pseudo-random row for (token, layer, kind):
// kind 0 a key, 1 a value, 2 a query.
func vector(tok, l, kind, d int) []float32 {
	x := make([]float32, d)
	h := uint64(tok)<<16 ^ uint64(l)<<8 ^ uint64(kind)
	for i := range x {
		h = h*6364136223846793005 + 1442695040888963407
		x[i] = float32(int64(h>>40)%2001-1000) / 1000
	}
	return x
}
