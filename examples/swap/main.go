// Command swap runs two models that take turns on one device. Each model has
// a weights arena and a KV-cache arena, tagged arena.TagWeights and
// arena.TagKV, in a pool of its own. When a model yields the device, its
// weights go to sleep in Offload mode (copied to pinned host memory, then
// every chunk freed) and its KV cache in Discard mode (freed, contents
// dropped); when its turn comes back, Wake maps memory at the same
// addresses and copies the weights back. Every Buffer's device pointer is
// the same across the swap, so nothing that holds one (a captured graph, a
// kernel argument) needs telling.
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
// answers).
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
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
	if err := run(); err != nil {
		log.SetFlags(0)
		log.Fatal("swap: ", err)
	}
}

// model is one model's memory: its weights (and their host checkpoint, to
// check them and to reload them) and its KV cache.
type model struct {
	name       string
	pool       *chunk.Pool
	weights    *arena.Arena
	kv         *arena.Arena
	w          arena.Buffer
	checkpoint []byte
}

func run() error {
	choice, err := device.FromEnv()
	if err != nil {
		return err
	}
	drv := choice.Driver
	defer drv.Close()
	fmt.Printf("driver %s — %s\n", drv.Name(), choice.Reason)
	wBytes, kvBytes := *weightsMiB<<20, *kvMiB<<20
	ctx := context.Background()

	models := make([]*model, 2)
	for i := range models {
		m, err := load(drv, fmt.Sprintf("model-%c", 'A'+i), wBytes, kvBytes, byte(i+1))
		if err != nil {
			return err
		}
		defer m.close()
		models[i] = m
		// Only one model is on the device at a time: the other sleeps.
		if i > 0 {
			if err := models[i].sleep(ctx); err != nil {
				return err
			}
		}
	}
	free0, _, _ := drv.GetMemInfo(acl.HBMMem)
	fmt.Printf("two models of %s weights and %s KV cache; %s of the device free with one asleep\n",
		units.Bytes(int64(wBytes)), units.Bytes(int64(kvBytes)), units.IEC(int64(free0)))

	var slept, woke time.Duration
	for turn := 0; turn < *turns; turn++ {
		active, next := models[turn%2], models[(turn+1)%2]
		if err := active.work(); err != nil {
			return err
		}
		t0 := time.Now()
		if err := active.sleep(ctx); err != nil {
			return err
		}
		t1 := time.Now()
		if err := next.wake(ctx); err != nil {
			return err
		}
		t2 := time.Now()
		slept += t1.Sub(t0)
		woke += t2.Sub(t1)
		fmt.Printf("turn %d: %s sleeps in %v, %s wakes in %v\n", turn+1, active.name,
			t1.Sub(t0).Round(time.Microsecond), next.name, t2.Sub(t1).Round(time.Microsecond))
	}
	n := time.Duration(*turns)

	// A full reload instead of a wake: free the model's memory, make new
	// arenas, copy the weights in from host memory again.
	m := models[*turns%2]
	t0 := time.Now()
	if err := m.reload(wBytes, kvBytes); err != nil {
		return err
	}
	reload := time.Since(t0)
	fmt.Printf("on average a sleep took %v and a wake %v (a swap: %v); a full reload (free, allocate, copy from host) took %v, %.2f× the wake\n",
		(slept / n).Round(time.Microsecond), (woke / n).Round(time.Microsecond), ((slept + woke) / n).Round(time.Microsecond),
		reload.Round(time.Microsecond), float64(reload)/float64(woke/n))
	return nil
}

// load makes a model's arenas and loads its weights.
func load(drv acl.Driver, name string, wBytes, kvBytes int, seed byte) (*model, error) {
	pool, err := chunk.New(drv, chunk.Config{})
	if err != nil {
		return nil, err
	}
	m := &model{name: name, pool: pool, checkpoint: make([]byte, wBytes)}
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
	m.weights, err = arena.New(arena.Config{Pool: m.pool, Reserve: int64(wBytes), Tag: arena.TagWeights})
	if err != nil {
		return err
	}
	m.kv, err = arena.New(arena.Config{Pool: m.pool, Reserve: int64(kvBytes), Tag: arena.TagKV})
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
	if err := arena.SleepTag(ctx, m.pool, arena.TagWeights, arena.Offload); err != nil {
		return err
	}
	return arena.SleepTag(ctx, m.pool, arena.TagKV, arena.Discard)
}

// wake brings it back and checks the weights are where and what they were.
func (m *model) wake(ctx context.Context) error {
	ptr := m.w.Ptr()
	if err := arena.WakeTag(ctx, m.pool, arena.TagWeights); err != nil {
		return err
	}
	if err := arena.WakeTag(ctx, m.pool, arena.TagKV); err != nil {
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
	var errs []error
	for _, a := range []*arena.Arena{m.weights, m.kv} {
		errs = append(errs, a.Close())
	}
	return errors.Join(append(errs, m.pool.Close())...)
}
