package workload

import (
	"testing"
	"time"
)

// Each model's requests come in its own part of every cycle (with no idle
// rate), the models' parts out of phase, as many as the rate says.
func TestModelsArrivals(t *testing.T) {
	c := Models{Models: 3, Layers: 2, KVHeads: 1, HeadDim: 64, DType: 2, Hidden: 64, BlockTokens: 16, Slots: 4,
		PromptMin: 16, PromptMax: 64, GenMin: 8, GenMax: 32, KVBudget: 64 << 20,
		Duration: 60 * time.Second, Period: 6 * time.Second, BurstRate: 50, Seed: 1}
	if err := c.Check(); err != nil {
		t.Fatal(err)
	}
	part := c.Period / time.Duration(c.Models)
	for m, as := range c.arrivals() {
		// 10 cycles of a 2 s burst at 50 a second: about 1,000.
		if n := len(as); n < 900 || n > 1100 {
			t.Errorf("model %d: %d requests, want about 1000", m, n)
		}
		for i, a := range as {
			if got := int(a.at/part) % c.Models; got != m {
				t.Fatalf("model %d: request %d at %v, in model %d's part", m, i, a.at, got)
			}
			if i > 0 && a.at < as[i-1].at {
				t.Fatalf("model %d: requests out of order at %d", m, i)
			}
			if a.req.prompt < c.PromptMin || a.req.prompt > c.PromptMax || a.req.gen < c.GenMin || a.req.gen > c.GenMax {
				t.Fatalf("model %d: request %+v outside the ranges", m, a.req)
			}
		}
	}
	c.IdleRate = 5
	for m, as := range c.arrivals() {
		off := 0
		for _, a := range as {
			if int(a.at/part)%c.Models != m {
				off++
			}
		}
		// 40 s outside the bursts at 5 a second: about 200.
		if off < 150 || off > 250 {
			t.Errorf("model %d: %d requests outside its bursts, want about 200", m, off)
		}
	}
	c.KVBudget = 1 << 20
	if err := c.CheckBudget(2 << 20); err == nil {
		t.Error("a KV budget whose share holds no sequence passed")
	}
}
