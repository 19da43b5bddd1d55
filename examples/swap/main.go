// Command swap runs two models that take turns on one device. Each model has
// a weights arena and a KV-cache arena, tagged with the model's name and
// arena.TagWeights or arena.TagKV, in one pool whose budget holds one model
// at a time. When a model yields the device, its weights go to sleep in
// Offload mode (copied to pinned host memory, then every chunk freed) and
// its KV cache in Discard mode (freed, contents dropped); when its turn
// comes back, Wake maps memory at the same addresses and copies the weights
// back, both arenas at once, all or nothing (WakeAll): a model never wakes
// with half its memory. Every Buffer's device pointer is the same across the
// swap, so nothing that holds one (a captured graph, a kernel argument)
// needs telling.
//
// A model whose turn is asked for while the other still holds the budget
// waits for the memory, as a growth does (Wake waits until its ctx is
// done): the example asks for the second model's wake while the first is
// serving, and the wake proceeds when the first one sleeps.
//
// It checks after every wake that the weights are byte for byte what was
// loaded and at the same address, reports the device's free memory while a
// model sleeps, and times sleep and wake against a full reload: closing the
// arenas, making new ones, and copying the weights in from host memory again.
// The reload here reads a checkpoint already in host memory; a real one reads
// it from storage and rebuilds what the model derived from its weights, which
// is where a wake saves most.
//
// It runs on the driver VMARENA_DEVICE names (the host driver when no device
// answers). On a device, and on the host driver, the times are the wall
// clock's. On the device model (model:NAME) they are the modelled times of
// the calls (the model's ChargedNS, summed over goroutines, so that a sleep's
// or wake's pipeline, which overlaps its copies with its unmaps or maps, is
// counted at most): the model keeps every byte, so the wall clock there
// mostly measures the model's own work on the host, moving and clearing bytes
// that a device would move without the caller.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/device"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/units"
)

var (
	weightsMiB = flag.Int("weights", 256, "MiB of weights per model")
	kvMiB      = flag.Int("kv", 128, "MiB of KV cache per model")
	turns      = flag.Int("turns", 6, "turns the models take, in all")
)

func main() {
	flag.Parse()
	if _, err := run(os.Stdout); err != nil {
		log.SetFlags(0)
		log.Fatal("swap: ", err)
	}
}

// clock is what the example times with: the wall clock, or, on a driver
// that models time, the time it charged the calls.
type clock struct {
	model interface{ ChargedNS() int64 }
	start time.Time
}

func newClock(drv acl.Driver) clock {
	c := clock{start: time.Now()}
	c.model, _ = drv.(interface{ ChargedNS() int64 })
	return c
}

func (c clock) now() time.Duration {
	if c.model != nil {
		return time.Duration(c.model.ChargedNS())
	}
	return time.Since(c.start)
}

// result is what the example measured, on average over the turns.
type result struct {
	sleep, wake, reload time.Duration
	modelled            bool // the device model's modelled times, not the wall clock's
}

// model is one model's memory: its weights (and their host checkpoint, to
// check them and to reload them) and its KV cache.
type model struct {
	name       string
	pool       *chunk.Pool // the device's, shared by the models
	wtag, ktag arena.Tag   // its weights' tag and its KV cache's
	weights    *arena.Arena
	kv         *arena.Arena
	w          arena.Buffer
	checkpoint []byte
}

func run(w io.Writer) (res result, err error) {
	if *weightsMiB < 1 || *kvMiB < 0 || *turns < 1 {
		return res, fmt.Errorf("-weights %d, -kv %d, -turns %d: want weights and turns at least 1, kv at least 0", *weightsMiB, *kvMiB, *turns)
	}
	choice, err := device.FromEnv()
	if err != nil {
		return res, err
	}
	drv := choice.Driver
	defer drv.Close()
	fmt.Fprintf(w, "driver %s — %s\n", drv.Name(), choice.Reason)
	clk := newClock(drv)
	res.modelled = clk.model != nil
	wBytes, kvBytes := *weightsMiB<<20, *kvMiB<<20
	ctx := context.Background()

	// One pool for the device, whose budget holds one model (and a quarter
	// more): only one model is on the device at a time.
	pool, err := chunk.New(drv, chunk.Config{Budget: int64(wBytes+kvBytes) * 5 / 4})
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, pool.Close()) }()
	models := make([]*model, 2)
	for i := range models {
		if i > 0 { // the model before yields the budget
			if err := models[i-1].sleep(ctx); err != nil {
				return res, err
			}
		}
		m, lerr := load(pool, fmt.Sprintf("model-%c", 'A'+i), wBytes, kvBytes, byte(i+1))
		if lerr != nil {
			return res, lerr
		}
		defer func() { err = errors.Join(err, m.close()) }()
		models[i] = m
	}
	// model-B serves; model-A's turn is asked for meanwhile, and its wake
	// waits for the memory model-B holds, until model-B sleeps.
	a, b := models[0], models[1]
	if err := b.work(); err != nil {
		return res, err
	}
	waited, err := wakeWhileHeld(ctx, a, b)
	if err != nil {
		return res, err
	}
	fmt.Fprintf(w, "%s's wake, asked while %s held the budget, waited %v for its memory, until %s slept\n",
		a.name, b.name, waited.Round(time.Millisecond), b.name)
	free0, _, _ := drv.GetMemInfo(acl.HBMMem)
	fmt.Fprintf(w, "two models of %s weights and %s KV cache; %s of the device free with one asleep\n",
		units.Bytes(int64(wBytes)), units.Bytes(int64(kvBytes)), units.IEC(int64(free0)))

	var slept, woke, wallWake time.Duration
	for turn := 0; turn < *turns; turn++ {
		active, next := models[turn%2], models[(turn+1)%2]
		if err := active.work(); err != nil {
			return res, err
		}
		t0 := clk.now()
		if err := active.sleep(ctx); err != nil {
			return res, err
		}
		t1, w1 := clk.now(), time.Now()
		if err := next.wake(ctx); err != nil {
			return res, err
		}
		t2 := clk.now()
		wallWake += time.Since(w1)
		if err := next.verify(); err != nil { // outside the timing: a server would not check
			return res, err
		}
		slept += t1 - t0
		woke += t2 - t1
		fmt.Fprintf(w, "turn %d: %s sleeps in %v, %s wakes in %v\n", turn+1, active.name,
			(t1 - t0).Round(time.Microsecond), next.name, (t2 - t1).Round(time.Microsecond))
	}
	n := time.Duration(*turns)

	// A full reload instead of a wake: free the model's memory, make new
	// arenas, copy the weights in from host memory again.
	m := models[*turns%2]
	t0, w0 := clk.now(), time.Now()
	if err := m.reload(wBytes, kvBytes); err != nil {
		return res, err
	}
	res.sleep, res.wake, res.reload = slept/n, woke/n, clk.now()-t0
	wallReload := time.Since(w0)
	times := "wall-clock times"
	if res.modelled {
		times = fmt.Sprintf("modelled times (what %s charges the calls, whatever the host's load; summed over the "+
			"goroutines of the sleep's and wake's pipelines, which overlap copies with unmaps and maps, so an upper bound of theirs)", drv.Name())
	}
	fmt.Fprintf(w, "%s: on average a sleep took %v and a wake %v (a swap: %v); a full reload (free, allocate, copy from Go memory) took %v, %.2f× the wake\n",
		times, res.sleep.Round(time.Microsecond), res.wake.Round(time.Microsecond), (res.sleep + res.wake).Round(time.Microsecond),
		res.reload.Round(time.Microsecond), res.ratio())
	if res.modelled {
		fmt.Fprintf(w, "(wall clock here: a wake %v, the reload %v, %.2f×: mostly the model's own work on the host, which keeps every byte)\n",
			(wallWake / n).Round(time.Microsecond), wallReload.Round(time.Microsecond), float64(wallReload)/float64(wallWake/n))
	}
	return res, nil
}

// ratio is a full reload's time over a wake's.
func (r result) ratio() float64 { return float64(r.reload) / float64(r.wake) }

// wakeWhileHeld asks for a's wake while b holds the memory a needs: the
// wake waits in the pool's queue until b sleeps, then restores a's weights,
// which it checks. It returns how long the wake waited.
func wakeWhileHeld(ctx context.Context, a, b *model) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	done := make(chan struct{})
	var werr error
	var took time.Duration
	go func() {
		defer close(done)
		werr = a.wake(ctx)
		took = time.Since(t0)
	}()
	// Once the wake waits for memory, b yields the device.
	for a.pool.Stats().Waiters == 0 {
		select {
		case <-done:
			return 0, errors.Join(werr, fmt.Errorf("%s woke while %s held the budget: it did not wait", a.name, b.name))
		case <-time.After(time.Millisecond):
		}
	}
	serr := b.sleep(ctx)
	<-done
	if err := errors.Join(werr, serr); err != nil {
		return 0, err
	}
	return took, a.verify()
}

// load makes a model's arenas and loads its weights.
func load(pool *chunk.Pool, name string, wBytes, kvBytes int, seed byte) (*model, error) {
	m := &model{name: name, pool: pool, checkpoint: make([]byte, wBytes),
		wtag: arena.Tag(name + "/" + string(arena.TagWeights)), ktag: arena.Tag(name + "/" + string(arena.TagKV))}
	for i := range m.checkpoint {
		m.checkpoint[i] = byte(i*131+i>>13) ^ seed
	}
	if err := m.alloc(wBytes, kvBytes); err != nil {
		return nil, errors.Join(err, m.close())
	}
	return m, nil
}

// alloc makes the arenas and copies the checkpoint in.
func (m *model) alloc(wBytes, kvBytes int) error {
	var err error
	m.weights, err = arena.New(arena.Config{Pool: m.pool, Reserve: wBytes, Tag: m.wtag})
	if err != nil {
		return err
	}
	m.kv, err = arena.New(arena.Config{Pool: m.pool, Reserve: kvBytes, Tag: m.ktag})
	if err != nil {
		return err
	}
	if m.w, err = m.weights.Alloc(wBytes, 1); err != nil {
		return err
	}
	if err := arena.CopyIn(m.w, m.checkpoint); err != nil {
		return err
	}
	return m.kv.Grow(kvBytes)
}

// work stands in for a turn of inference: it fills the KV cache and checks
// the weights.
func (m *model) work() error {
	if err := m.kv.Reset(); err != nil {
		return err
	}
	kv, err := m.kv.Alloc(m.kv.Cap(), 1)
	if err != nil {
		return err
	}
	if err := arena.Fill(kv, 0x5A); err != nil {
		return err
	}
	return m.verify()
}

// verify checks that the weights are byte for byte the checkpoint.
func (m *model) verify() error {
	got := make([]byte, m.w.Len())
	if err := arena.CopyOut(got, m.w); err != nil {
		return err
	}
	if !bytes.Equal(got, m.checkpoint) {
		return fmt.Errorf("%s: the weights changed", m.name)
	}
	return nil
}

// sleep gives the model's memory back: weights offloaded, KV discarded.
func (m *model) sleep(ctx context.Context) error {
	if err := arena.SleepTag(ctx, m.pool, m.wtag, arena.Offload); err != nil {
		return err
	}
	return arena.SleepTag(ctx, m.pool, m.ktag, arena.Discard)
}

// wake brings it back, weights and KV cache together or not at all (each
// waiting for memory until ctx is done), and checks the weights are where
// they were.
func (m *model) wake(ctx context.Context) error {
	ptr := m.w.Ptr()
	if err := arena.WakeAll(ctx, append(arena.Tagged(m.pool, m.wtag), arena.Tagged(m.pool, m.ktag)...)); err != nil {
		return err
	}
	if m.w.Ptr() != ptr {
		return fmt.Errorf("%s: the weights moved", m.name)
	}
	return nil
}

// reload is the alternative to a swap: free everything, allocate again and
// copy the weights in from host memory.
func (m *model) reload(wBytes, kvBytes int) error {
	if err := errors.Join(m.weights.Close(), m.kv.Close()); err != nil {
		return err
	}
	if err := m.pool.Trim(); err != nil {
		return err
	}
	return m.alloc(wBytes, kvBytes)
}

func (m *model) close() error {
	return errors.Join(m.weights.Close(), m.kv.Close())
}
