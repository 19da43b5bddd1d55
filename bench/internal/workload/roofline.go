package workload

import (
	"fmt"
	"time"
)

// The step time of decoding, by default, is a roofline: a decode step reads
// every weight of the model once and the whole KV cache of every running
// sequence once, and at the batch sizes of these workloads it is bound by
// the device's memory bandwidth, not by its arithmetic. So a step takes
// (weights read + live KV bytes) ÷ bandwidth.

// DefaultVocab is the vocabulary of the model shape the weights are
// estimated from (Llama 3's).
const DefaultVocab = 128256

// DefaultBandwidthGBps is the bandwidth the roofline uses on a driver that
// states none (the host driver, a real device): the H200 profile's local
// bandwidth, about 83% of the HBM3e's nominal 4.8 TB/s.
const DefaultBandwidthGBps = 4000

// Shape is a decoder-only transformer's shape, enough to estimate its
// weights: the Llama 3 layout, grouped-query attention and a gated MLP 3.5
// times the hidden size wide.
type Shape struct {
	Layers, KVHeads, HeadDim, DType, Hidden int
	Vocab                                   int // 0: DefaultVocab
}

func (s Shape) vocab() int64 {
	if s.Vocab > 0 {
		return int64(s.Vocab)
	}
	return DefaultVocab
}

// Params estimates the parameters: per layer the query and output
// projections (2·d²), the key and value projections (2·d·kv, kv = KV heads ×
// head dimension) and the MLP's three matrices (3·d·3.5d = 10.5·d²); and
// the input embedding and output head, vocabulary × d each. For the shapes of
// Llama 3 8B (32 layers, d 4096) and 70B (80 layers, d 8192) it gives 8.0
// and 70.6 billion.
func (s Shape) Params() int64 {
	d, kv := int64(s.Hidden), int64(s.KVHeads*s.HeadDim)
	perLayer := 2*d*d + 2*d*kv + 21*d*d/2
	return int64(s.Layers)*perLayer + 2*s.vocab()*d
}

// WeightBytes is the weights' size: Params × DType.
func (s Shape) WeightBytes() int64 { return s.Params() * int64(s.DType) }

// ReadBytes is what one decode step reads of the weights: all but the
// input embedding, whose rows are looked up, one per sequence.
func (s Shape) ReadBytes() int64 { return s.WeightBytes() - s.vocab()*int64(s.Hidden)*int64(s.DType) }

// Roofline is a decode step's time: weights read and KV bytes over a
// bandwidth in GB/s (10⁹ bytes a second, a byte a nanosecond per GB/s).
type Roofline struct {
	Read  int64   // weight bytes a step reads
	GBps  float64 // the bandwidth
	Fixed time.Duration
}

// Step returns the time of a step whose sequences hold kv bytes of cache:
// the fixed time when set, else the roofline's.
func (r Roofline) Step(kv int64) time.Duration {
	if r.Fixed > 0 || r.GBps <= 0 {
		return r.Fixed
	}
	return time.Duration(float64(r.Read+kv) / r.GBps)
}

// Describe says in a few words how a step's time is set.
func (r Roofline) Describe() string {
	if r.Fixed > 0 || r.GBps <= 0 {
		return fmt.Sprintf("%v of device compute per step", r.Fixed)
	}
	return fmt.Sprintf("decode steps bandwidth-bound: (%s of weights + the live KV) ÷ %g GB/s, %v with an empty cache",
		HumanBytes(r.Read), r.GBps, r.Step(0).Round(10*time.Microsecond))
}

// StepTime is how a decode step's device time is set: a fixed duration, or
// the roofline of the workload's model (Roofline true) over a bandwidth.
type StepTime struct {
	Fixed    time.Duration // when not Roofline: this per step (0: none)
	Roofline bool
	GBps     float64 // the roofline's bandwidth; 0 until the suite sets it from the driver
}

// String is the flag's value: "roofline" or a duration.
func (t StepTime) String() string {
	if t.Roofline {
		return "roofline"
	}
	return t.Fixed.String()
}
