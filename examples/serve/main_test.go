package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/vmarena/vmarena/acl/device"
	"github.com/vmarena/vmarena/arena"
)

// TestServe runs the server on the host driver and on the device model and
// checks what it claims: every accepted request finished, those preempted
// included; the request after the stop was refused; the idle model slept and
// woke with its weights intact; the metrics count the arenas left; and once
// it has shut down the driver holds nothing. The output is the same on both
// drivers, but for the driver's name: it depends on nothing but the trace;
// and it is the output docs/serving.md shows.
func TestServe(t *testing.T) {
	outs := map[string]string{}
	for _, dev := range []string{"host", "model:h200"} {
		t.Run(dev, func(t *testing.T) {
			o := defaults()
			o.spec = dev
			var out bytes.Buffer
			rep, err := run(context.Background(), &out, o)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if rep.accepted != o.requests-1 || rep.refused != 1 || rep.finished != rep.accepted {
				t.Errorf("accepted %d, refused %d, finished %d of a trace of %d whose last request comes after the stop",
					rep.accepted, rep.refused, rep.finished, o.requests)
			}
			if len(rep.preempted) == 0 {
				t.Error("no request was preempted: the trace no longer exercises preemption")
			}
			for id, n := range rep.preempted {
				if !rep.done[id] {
					t.Errorf("request %d was preempted %d× and never finished", id, n)
				}
			}
			if rep.sleeps == 0 || rep.wakes == 0 || rep.wokenBytes != rep.wakes*o.weights {
				t.Errorf("sleeps %d, wakes %d, %d weights bytes checked after them", rep.sleeps, rep.wakes, rep.wokenBytes)
			}
			if len(rep.snapshot.Pools) != 1 || len(rep.snapshot.Arenas) != 2 {
				t.Fatalf("the snapshot has %d pools and %d arenas, want 1 and 2", len(rep.snapshot.Pools), len(rep.snapshot.Arenas))
			}
			// After the drain only the weights are left, awake.
			if ps := rep.snapshot.Pools[0].Stats; ps.Members != 2 || ps.UsedBytes != int64(2*o.weights) || ps.Budget != o.budget {
				t.Errorf("the pool's snapshot after the drain: %d arenas using %d bytes, budget %d", ps.Members, ps.UsedBytes, ps.Budget)
			}
			if !rep.live.Zero() {
				t.Errorf("the driver holds %+v after shutdown", rep.live)
			}
			_, outs[dev], _ = strings.Cut(out.String(), "\n")
		})
	}
	if outs["host"] != outs["model:h200"] {
		t.Errorf("the output differs between the drivers:\nhost:\n%s\nmodel:\n%s", outs["host"], outs["model:h200"])
	}
	// docs/serving.md shows the output, the first line on the host driver.
	if got, want := guideOutput(t), "driver host\n"+outs["host"]; got != want {
		gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("docs/serving.md's output differs from the program's at line %d:\ndoc: %q\nrun: %q\n"+
					"(paste the output of go run ./examples/serve -device host into the block)", i+1, gl[i], wl[i])
			}
		}
		t.Fatalf("docs/serving.md shows %d lines of output, the program prints %d", len(gl), len(wl))
	}
}

// guideOutput is the output docs/serving.md shows: the block that starts
// with the line "$ go run ./examples/serve", less that line.
func guideOutput(t *testing.T) string {
	doc, err := os.ReadFile("../../docs/serving.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "\n```text\n$ go run ./examples/serve\n")
	if !ok {
		t.Fatal("docs/serving.md has no ```text block that starts with the line $ go run ./examples/serve")
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatal("the output's block is not closed")
	}
	return block + "\n"
}

// testServer is a server on the host driver with nothing running.
func testServer(t *testing.T) *server {
	t.Helper()
	o := defaults()
	c, err := device.Open("host")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Driver.Close() })
	s, err := newServer(c.Driver, o, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.shutdown(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// The checks the server makes are not taken on trust: a row overwritten in
// a finished sequence's cache fails it.
func TestFinishCatchesAChangedRow(t *testing.T) {
	s := testServer(t)
	r := &request{id: 7, model: s.models[0], prompt: 40, output: 1, generated: 1}
	q, err := s.newSequence(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := q.grow(41, s.row); err != nil {
		t.Fatal(err)
	}
	if err := q.appendTokens(0, 41, s.row); err != nil {
		t.Fatal(err)
	}
	all, err := q.v.Slice(0, 41*s.row) // the whole V cache
	if err != nil {
		t.Fatal(err)
	}
	b, err := all.Slice(30*s.row+8, 30*s.row+12) // a float32 of token 30's row
	if err != nil {
		t.Fatal(err)
	}
	if err := arena.Fill(b, 0x7f); err != nil {
		t.Fatal(err)
	}
	err = s.finish(q)
	if err == nil || !strings.Contains(err.Error(), "V row of token 30") {
		t.Fatalf("finish of a cache with a changed row: %v", err)
	}
	if err := q.close(); err != nil {
		t.Fatal(err)
	}
}

// A woken model whose weights differ from what was loaded fails the wake.
func TestWakeCatchesChangedWeights(t *testing.T) {
	s := testServer(t)
	m := s.models[1]
	s.step = s.o.idle
	s.models[0].lastUsed = s.step // only m is idle
	if err := s.sleepIdle(context.Background()); err != nil || !m.asleep || s.models[0].asleep {
		t.Fatalf("sleepIdle: %v; asleep: %v, %v", err, s.models[0].asleep, m.asleep)
	}
	s.waiting = []*request{{id: 3, model: m}}
	m.checkpoint[12345] ^= 1 // what the host remembers no longer matches what was loaded
	if err := s.wake(context.Background(), m); err == nil || !strings.Contains(err.Error(), "woken weights moved or changed") {
		t.Fatalf("wake with changed weights: %v", err)
	}
	m.checkpoint[12345] ^= 1
}

// A request that cannot fit the budget on its own is an error, not a
// request that waits forever.
func TestRequestLargerThanTheBudget(t *testing.T) {
	s := testServer(t)
	if err := s.pool.SetBudget(int64(2*s.o.weights) + 4<<20); err != nil {
		t.Fatal(err)
	}
	s.waiting = []*request{{id: 0, model: s.models[0], prompt: s.o.maxToks - 1, output: 1}}
	if err := s.admit(context.Background()); err == nil || !errors.Is(err, arena.ErrOutOfMemory) {
		t.Fatalf("admit of a request larger than the budget: %v", err)
	}
}

// A pool given no budget (-budget 0) is bounded by the device alone, and the
// output says so instead of a budget of 0 MiB.
func TestNoBudgetSaysSo(t *testing.T) {
	o := defaults()
	o.spec, o.budget = "host", 0
	var out bytes.Buffer
	if _, err := run(context.Background(), &out, o); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	text := out.String()
	if strings.Contains(text, "0 MiB budget") || strings.Contains(text, "of 0 MiB") {
		t.Errorf("a budget of 0 MiB reported:\n%s", text)
	}
	if !strings.Contains(text, "pool: (no budget) in ") || !strings.Contains(text, "held (no budget)") {
		t.Errorf("no word of the missing budget:\n%s", text)
	}
}
