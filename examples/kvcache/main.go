// Command kvcache runs a small transformer-style decode loop whose per-layer
// key and value caches grow token by token in arenas that share one chunk
// pool. Every few tokens it computes real attention (softmax(q·K)·V) for the
// new token, reading the whole cache back through the driver, and checks the
// result against a host-side reference: the check proves that every row the
// device holds is the row written, wherever growth put it, and that no
// growth moved or lost data. Between sequences it resets the caches and keeps
// their memory mapped: the next sequence reuses it with no driver call, and
// only grows past it.
//
// The caches are one tenant (chunk.Tenant: they all belong to one model), so
// chunks move between them without being cleared.
//
// It runs on the driver VMARENA_DEVICE names (the host driver when no device
// answers); -v says why auto passed over each device it tried.
package main

import (
	"errors"
	"flag"
	"fmt"
	"log"
	"math"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/device"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

var (
	layers = flag.Int("layers", 4, "transformer layers (one K and one V arena each)")
	dim    = flag.Int("dim", 1024, "float32s per key and per value row (KV heads × head dimension)")
	every  = flag.Int("every", 256, "compute attention every this many tokens")
	detail = flag.Bool("v", false, "say why auto passed over each device it tried")
)

func main() {
	flag.Parse()
	if err := run([]int{3000, 1200, 2600}); err != nil {
		log.SetFlags(0)
		log.Fatal("kvcache: ", err)
	}
}

// cache is one layer's keys or values: a device arena plus, for checking, the
// same rows on the host.
type cache struct {
	a     *arena.Arena
	first acl.DevicePtr // where row 0 lives; must never move
	host  []float32
}

func run(seqLens []int) (err error) {
	if *layers < 1 || *dim < 1 || *every < 1 {
		return fmt.Errorf("-layers %d, -dim %d, -every %d: each must be at least 1", *layers, *dim, *every)
	}
	choice, err := device.FromEnv()
	if err != nil {
		return err
	}
	drv := choice.Driver
	defer func() { err = errors.Join(err, drv.Close()) }()
	fmt.Printf("driver %s — %s\n", drv.Name(), choice.Reason)
	if *detail && choice.Detail != nil {
		fmt.Printf("passed over:\n%v\n", choice.Detail)
	}

	pool, err := chunk.New(drv, chunk.Config{})
	if err != nil {
		return err
	}
	caches := make([]*cache, 0, 2**layers) // K0 V0 K1 V1 ...
	defer func() {
		// The caches first, then their pool (and, above, the driver).
		for _, c := range caches {
			err = errors.Join(err, c.a.Close())
		}
		err = errors.Join(err, pool.Close())
	}()
	// One tenant for the model: its caches pass chunks to each other
	// uncleared; another model's arenas would get them cleared.
	model := chunk.NewTenant()
	fmt.Printf("%d K and V caches, one tenant (the model): chunks move between them without being cleared\n", 2**layers)
	for range 2 * *layers {
		a, err := arena.New(arena.Config{Pool: pool, Reserve: 256 << 20, Tenant: model})
		if err != nil {
			return err
		}
		caches = append(caches, &cache{a: a})
	}
	row := *dim * 4
	for s, n := range seqLens {
		var worst float64
		grows0, ps0 := grows(caches), pool.Stats()
		for tok := range n {
			for l := range *layers {
				k, v := caches[2*l], caches[2*l+1]
				for j, c := range []*cache{k, v} {
					x := vector(s, tok, l, j, *dim)
					b, err := c.a.Alloc(row, 64)
					if err != nil {
						return fmt.Errorf("sequence %d token %d layer %d: %w", s, tok, l, err)
					}
					if tok == 0 {
						c.first = b.Ptr()
					}
					if err := arena.CopyIn(b, x); err != nil {
						return err
					}
					c.host = append(c.host, x...)
				}
				if (tok+1)%*every == 0 || tok == n-1 {
					d, err := attend(k, v, vector(s, tok, l, 2, *dim), tok+1)
					if err != nil {
						return err
					}
					// The same arithmetic on the same numbers: any
					// difference is a row the device lost or moved.
					if d != 0 {
						return fmt.Errorf("sequence %d token %d layer %d: attention over the device's rows differs from the host's by %.3g",
							s, tok, l, d)
					}
					worst = max(worst, d)
				}
			}
		}
		// Pointers stayed put and the first rows survived every growth.
		for _, c := range caches {
			b, err := c.a.Slice(0, row)
			if err != nil {
				return err
			}
			if b.Ptr() != c.first {
				return fmt.Errorf("row 0 moved from %v to %v", c.first, b.Ptr())
			}
			got := make([]float32, *dim)
			if err := arena.CopyOut(got, b); err != nil {
				return err
			}
			for i := range got {
				if got[i] != c.host[i] {
					return fmt.Errorf("row 0 changed at %d: %v, want %v", i, got[i], c.host[i])
				}
			}
		}
		st := caches[0].a.Stats()
		ps := pool.Stats()
		fmt.Printf("sequence %d: %5d tokens  attention max |device−host| %.1e  layer-0 K: %.1f MiB used, %d MiB mapped  this sequence: %d grows, %d physical allocations, %d chunks from the pool's cache  pointers stable\n",
			s, n, worst, float64(st.Used)/(1<<20), st.Mapped>>20, grows(caches)-grows0, ps.Allocs-ps0.Allocs, ps.Hits-ps0.Hits)

		// The sequence is done: drop its rows. The memory stays mapped for
		// the next sequence (Shrink, or a pool under pressure, would give it
		// back).
		for _, c := range caches {
			if err := c.a.Reset(); err != nil {
				return err
			}
			c.host = c.host[:0]
		}
	}
	ps := pool.Stats()
	var mapped int
	for _, c := range caches {
		mapped += c.a.Cap()
	}
	fmt.Printf("done: %d physical allocations of %d MiB for %d sequences; %d MiB stay mapped for the next request\n",
		ps.Allocs, ps.ChunkSize>>20, len(seqLens), mapped>>20)
	return nil
}

// grows sums the growths of every cache that mapped memory.
func grows(caches []*cache) int64 {
	var n int64
	for _, c := range caches {
		n += c.a.Stats().Grows
	}
	return n
}

// attend computes softmax(q·Kᵀ/√d)·V over the first n rows, reading K and V
// back from the device, and returns the largest difference from the same
// computation on the host copies.
func attend(k, v *cache, q []float32, n int) (float64, error) {
	d := len(q)
	kb, err := k.a.Slice(0, n*d*4)
	if err != nil {
		return 0, err
	}
	vb, err := v.a.Slice(0, n*d*4)
	if err != nil {
		return 0, err
	}
	K, V := make([]float32, n*d), make([]float32, n*d)
	if err := arena.CopyOut(K, kb); err != nil {
		return 0, err
	}
	if err := arena.CopyOut(V, vb); err != nil {
		return 0, err
	}
	dev := attention(q, K, V, n)
	ref := attention(q, k.host[:n*d], v.host[:n*d], n)
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

// vector is a deterministic pseudo-random row for (sequence, token, layer, kind).
func vector(s, tok, l, kind, d int) []float32 {
	x := make([]float32, d)
	h := uint64(s)<<48 ^ uint64(tok)<<16 ^ uint64(l)<<8 ^ uint64(kind)
	for i := range x {
		h = h*6364136223846793005 + 1442695040888963407
		x[i] = float32(int64(h>>40)%2001-1000) / 1000
	}
	return x
}
