package workload

import (
	"math"
	"testing"
	"time"
)

// The weights estimate gives the published sizes of the shapes it follows,
// and the roofline turns weights and cache into a step time.
func TestRoofline(t *testing.T) {
	for _, c := range []struct {
		s    Shape
		want float64 // billions of parameters
	}{
		{Shape{Layers: 32, KVHeads: 8, HeadDim: 128, DType: 2, Hidden: 4096}, 8.03},  // Llama 3 8B
		{Shape{Layers: 80, KVHeads: 8, HeadDim: 128, DType: 2, Hidden: 8192}, 70.55}, // Llama 3 70B
	} {
		if got := float64(c.s.Params()) / 1e9; math.Abs(got-c.want) > 0.01 {
			t.Errorf("%+v: %.3f billion parameters, want %.2f", c.s, got, c.want)
		}
		if c.s.ReadBytes() >= c.s.WeightBytes() {
			t.Errorf("%+v: a step reads %d of %d bytes of weights: the input embedding is looked up, not read", c.s, c.s.ReadBytes(), c.s.WeightBytes())
		}
	}
	r := Roofline{Read: 4000e6, GBps: 4000}
	if got := r.Step(0); got != time.Millisecond {
		t.Errorf("4 GB at 4000 GB/s: %v, want 1ms", got)
	}
	if got := r.Step(2000e6); got != 1500*time.Microsecond {
		t.Errorf("4 GB of weights and 2 GB of cache at 4000 GB/s: %v, want 1.5ms", got)
	}
	if got := (Roofline{Fixed: time.Millisecond, Read: 1e12, GBps: 1}).Step(1e9); got != time.Millisecond {
		t.Errorf("a fixed step: %v, want 1ms", got)
	}
	kv := KV{Layers: 80, KVHeads: 8, HeadDim: 128, DType: 2, Hidden: 8192, Roofline: true, BandwidthGBps: 4000}
	if d := kv.Steps().Step(0); d < 30*time.Millisecond || d > 40*time.Millisecond {
		t.Errorf("a 70B-class decode step on an H200's bandwidth: %v, want tens of ms", d)
	}
}
