package arena_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"runtime/trace"
	"time"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// Events: give the arena a logger and it reports its slow paths (growths,
// shrinks, reclaims, waits, failures with what was asked and held), and so
// does its private pool. Alloc within Cap logs nothing. Here the times and
// addresses are left out so that the output is the same on every run.
func ExampleConfig_logger() {
	drv, err := host.New(host.Config{Capacity: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer drv.Close()
	h := slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.TimeKey, "dur", "base", "err":
				return slog.Attr{}
			}
			return a
		}})
	a, err := arena.New(arena.Config{Driver: drv, Reserve: 32 << 20, Chunk: chunk.Config{Budget: 8 << 20},
		Logger: slog.New(h).With("arena", "kv")})
	if err != nil {
		log.Fatal(err)
	}

	if err := a.Grow(4 << 20); err != nil {
		log.Fatal(err)
	}
	if _, err := a.Alloc(4<<20, 1); err != nil { // within Cap: no event
		log.Fatal(err)
	}
	err = a.Grow(8 << 20) // past the budget: fails before any driver call
	fmt.Println(errors.Is(err, arena.ErrOutOfMemory), a.Activity().OOMs)
	if err := a.Close(); err != nil { // waits for the device, then unmaps
		log.Fatal(err)
	}
	// Output:
	// level=DEBUG msg=arena.grow arena=kv from=0 to=4194304 chunks=2
	// level=WARN msg=arena.oom arena=kv asked=8388608 len=4194304 cap=4194304 reserved=33554432 held=4194304 budget=8388608 in_use=2 cached=0
	// true 1
	// level=DEBUG msg=pool.device_sync arena=kv
}

// Tracing: the arena's slow paths and the driver calls under them run in
// runtime/trace regions ("vmarena.grow", "acl.MapMem", …), and a waiting
// growth in the caller's task, so `go tool trace` shows where a step waited
// on the allocator. A server records a trace with trace.Start to a file (or
// net/http/pprof's /debug/pprof/trace); here, to a buffer.
func Example_tracing() {
	a, err := arena.New(arena.Config{Reserve: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()

	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		log.Fatal(err)
	}
	ctx, step := trace.NewTask(context.Background(), "decode step")
	if _, err := a.AllocContext(ctx, 8<<20, 256); err != nil { // grows: regions
		log.Fatal(err)
	}
	step.End()
	trace.Stop()
	fmt.Println("trace recorded:", buf.Len() > 0)
	// Output: trace recorded: true
}

// Waiting for memory: a growth that finds the pool's budget spent waits for
// another tenant to give memory back, instead of failing; under a deadline
// that passes first, it fails as Grow would, the arena unchanged.
func ExampleArena_GrowContext() {
	pool, err := chunk.New(must(host.Default()), chunk.Config{Budget: 8 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close() // after the arenas: deferred first
	busy, err := arena.New(arena.Config{Pool: pool, Reserve: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer busy.Close()
	next, err := arena.New(arena.Config{Pool: pool, Reserve: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer next.Close()
	if _, err := busy.Alloc(8<<20, 1); err != nil { // the whole budget, in use
		log.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	err = next.GrowContext(ctx, 4<<20)
	fmt.Println("deadline:", errors.Is(err, context.DeadlineExceeded), errors.Is(err, arena.ErrOutOfMemory))

	done := make(chan error)
	go func() { done <- next.GrowContext(context.Background(), 4<<20) }()
	for pool.Lender().Waiters() == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := busy.Reset(); err != nil { // the sequence ends: its memory can be reclaimed
		log.Fatal(err)
	}
	fmt.Println("granted:", <-done, next.Cap())
	// Output:
	// deadline: true true
	// granted: <nil> 4194304
}

func must[T any](v T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return v
}
