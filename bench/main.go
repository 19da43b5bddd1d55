// Command bench measures vmarena's arena against the other ways of giving
// tensors device memory, on the driver that acl/device picks
// ($VMARENA_DEVICE: host, ascend[:N], cuda[:N]; default auto).
//
// Three workloads mirror inference memory patterns (KV-cache decode under
// continuous batching, per-step activation scratch with spikes, tenants
// churning under one budget). Each runs on the strategies of
// bench/internal/strategy (the arena; a PagedAttention-style block pool and a
// PyTorch-style caching allocator, the allocators servers and frameworks use;
// realloc-and-copy, preallocate-worst-case, allocate-per-tensor) through a
// driver wrapper that counts and times every call, each run in a fresh
// process of its own (this program started again; -fresh=false keeps them in
// one). A further workload, swap, runs on the arena alone: it puts an arena
// to sleep and wakes it (Offload and Discard) and compares the times with the
// raw copies, the bare driver calls and a full reload. On the device model
// every run is made under both readings of the model's unmeasured
// coefficients (-readings). The suite prints a table, and writes
// results.json, bench.txt (Go benchmark format, for benchstat) and PNG plots
// to -out (the pessimistic reading's under -out/pessimistic).
//
//	go run ./bench                  # the full suite, about a minute on the host driver
//	go run ./bench -quick           # seconds: small sizes
//	go run ./bench -workloads kv -strategies arena,realloc -count 3
//	VMARENA_DEVICE=ascend go run ./bench
//	go run ./bench -device model:h200     # on the device model: modelled times
//	go run ./bench -calibrate -device cuda -profile-out h200.json
//
// See docs/benchmarks.md.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/device"
	"github.com/vmarena/vmarena/acl/model"
	"github.com/vmarena/vmarena/bench/internal/counting"
	"github.com/vmarena/vmarena/bench/internal/strategy"
	"github.com/vmarena/vmarena/bench/internal/workload"
	"github.com/vmarena/vmarena/chunk"
)

// options is everything the flags set.
type options struct {
	quick      bool
	workloads  []string
	chosen     bool // -workloads was given: a workload the device cannot hold is an error, not skipped
	strategies []string
	count      int
	out, img   string
	touch      bool
	verify     bool
	micro      bool
	microIters int
	allocIters int
	spec       string
	seed       uint64
	progress   string
	fresh      bool     // each run in a fresh process (fresh.go)
	readings   string   // on the device model: "profile", "pessimistic" or "both"
	cpuProfile string   // write a CPU profile of the in-process runs (-fresh=false) here
	args       []string // the flags as given, for the fresh processes

	chunk        int64
	kvTail       int64 // -kv-tail
	maxCached    int
	growth       float64
	scrub        string
	headroom     int           // arena: chunks of headroom per region; -1: the workload's (headroomFor)
	maxHead      int           // arena: chunks the learnt headroom may reach; 0: the arena's default
	tokenHead    bool          // kv, token growth: the arena keeps the tokens ahead as headroom instead of being told them
	ahead        int           // arena: fresh chunks the pool keeps ahead
	warm         int           // arena: fresh chunks allocated at start (-1: the budget)
	stream       bool          // arena: order unmaps and scrubs on the workload's stream
	register     string        // arena: registration mode (-register)
	registerCost time.Duration // arena: a registration call's modelled cost

	workerCPU float64 // arena: the pool worker's share of one CPU (0: no cap)

	kv      workload.KV
	models  workload.Models
	scratch workload.Scratch
	churn   workload.Churn
	swap    workload.Swap

	skipped []string // workloads left out of a default run, and why

	calibrate   bool   // measure the driver and write a model profile instead (calibrate.go)
	profileOut  string // where -calibrate writes the profile
	profileBase string // the profile -calibrate carries estimates over from
}

var workloadNames = []string{"kv", "models", "scratch", "churn", "swap"}

// replayed are the workloads that replay on the strategies (runsOn says
// which); swap runs on the arena alone, once.
var replayed = []string{"kv", "models", "scratch", "churn"}

// runsOn reports whether workload w runs on strategy name: kv on every
// strategy, models on those made for several models (strategy.Splits), the
// others on every strategy but the paged pool, which holds KV blocks only.
func runsOn(w, name string) bool {
	switch w {
	case "kv":
		return true
	case "models":
		return strategy.Splits(name)
	}
	return !strategy.KVOnly(name)
}

var scrubs = map[string]chunk.Scrub{"reuse": chunk.ScrubOnReuse, "release": chunk.ScrubOnRelease, "never": chunk.ScrubNever}

// quickValues are the flag values -quick uses, for flags not set explicitly:
// small sizes that still exercise what the full run does (TestQuick checks
// it): regions of several mappings, growths that map several at once,
// shrinks and regrowth, reliefs under the churn budget.
var quickValues = map[string]string{
	"kv-layers":          "4",
	"kv-block":           "128",
	"kv-slots":           "4",
	"kv-requests":        "8",
	"kv-prompt":          "32:1536", // a prefill over 20 MiB: caching-expandable maps several pages at once, as in the full run
	"kv-gen":             "32:512",
	"kv-hidden":          "512", // a small model: 43 MiB of weights, roofline steps of about 10 µs
	"kv-vocab":           "8192",
	"scratch-steps":      "80", // enough trims and spikes that an arena shrinks and grows back
	"scratch-bufs":       "2:8",
	"scratch-size":       "64KiB:2MiB",
	"scratch-spike":      "0.05",
	"scratch-spike-size": "16MiB:48MiB", // spikes over a 20 MiB page, as in the full run
	"churn-steps":        "30",
	"churn-period":       "15",
	"churn-demand":       "8MiB:32MiB",
	"micro-iters":        "20",
	"swap-size":          "64MiB",
	"mm-models":          "2",
	"mm-slots":           "8",
	"mm-prompt":          "32:512",
	"mm-gen":             "16:256",
	"mm-kv-budget":       "32MiB",
	"mm-duration":        "600ms",
	"mm-period":          "300ms",
	"mm-burst-rate":      "200",
	"mm-sleep-after":     "40ms",
	"alloc-iters":        "1048576",
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{
		workloads:  append([]string(nil), workloadNames...),
		strategies: append([]string(nil), strategy.Default...),
		kv: workload.KV{Layers: 32, KVHeads: 8, HeadDim: 128, DType: 2, BlockTokens: 16, PrefetchSteps: 8,
			Slots: 16, Requests: 24, PromptMin: 64, PromptMax: 1536, GenMin: 64, GenMax: 1536, BudgetFactor: 1.5,
			Roofline: true, Hidden: 4096},
		models: workload.Models{Models: 3, Slots: 128, PromptMin: 64, PromptMax: 1024, GenMin: 32, GenMax: 256,
			KVBudget: 8 << 30, Duration: 12 * time.Second, Period: 6 * time.Second, BurstRate: 80, IdleRate: 0,
			SleepAfter: 500 * time.Millisecond},
		scratch: workload.Scratch{Steps: 200, MinBufs: 4, MaxBufs: 16, MinSize: 128 << 10, MaxSize: 4 << 20,
			SpikeProb: 0.03, SpikeMin: 16 << 20, SpikeMax: 64 << 20, Window: 8},
		churn: workload.Churn{Tenants: 4, Steps: 160, Period: 40, Lo: 64 << 20, Hi: 512 << 20,
			Tensor: 4 << 20, Jitter: 0.05},
		swap: workload.Swap{Size: 1 << 30, Reps: 3},
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	// The flag package prints its error and the whole usage on a bad flag;
	// parseFlags reports the error itself, with the one flag's help, and
	// prints the usage only for -h.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	usage := func() {
		fs.SetOutput(stderr)
		fmt.Fprintf(stderr, "usage: go run ./bench [flags]\n\n"+
			"Runs the workloads on every strategy and prints a table; writes results.json,\n"+
			"bench.txt (benchstat) and PNG plots to -out. The driver comes from $%s\n"+
			"(host, ascend[:N], cuda[:N], model:NAME; default auto) or -device.\n\nflags:\n", acl.DeviceEnv)
		fs.PrintDefaults()
	}
	fs.BoolVar(&o.quick, "quick", false, "small sizes: the whole suite in seconds")
	fs.Var(listFlag{&o.workloads, workloadNames}, "workloads", "workloads to run: kv, models, scratch, churn, swap, or all (by default all, less models where the device cannot hold its budget)")
	fs.Var(listFlag{&o.strategies, strategy.Names}, "strategies", "strategies to compare: arena, arena-eager, realloc, prealloc, pertensor, or all")
	fs.IntVar(&o.count, "count", 1, "repetitions; each runs the strategies in a rotated order")
	fs.StringVar(&o.out, "out", filepath.Join("bench", "out"), "directory for results.json, bench.txt and the plots")
	fs.StringVar(&o.img, "img", "", "directory for the PNG plots (default -out)")
	fs.BoolVar(&o.touch, "touch", true, "write every tensor's bytes through the driver (MemcpyHtoD), as kernels would; -touch=false measures allocation alone")
	fs.BoolVar(&o.verify, "verify", false, "with -touch: read data back after growth and check no strategy lost it")
	fs.BoolVar(&o.micro, "micro", true, "also measure the arena's Alloc fast path and cold vs cached Grow")
	fs.IntVar(&o.microIters, "micro-iters", 200, "Grows of each kind in the cold/cache micro-measure")
	fs.IntVar(&o.allocIters, "alloc-iters", 1<<24, "Allocs in the fast-path micro-measure")
	fs.StringVar(&o.spec, "device", "", "driver spec, overriding $"+acl.DeviceEnv+" (host, ascend[:N], cuda[:N], model:NAME or model:PATH with ,nodata to keep no device bytes, auto)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the workloads' random choices")
	fs.StringVar(&o.progress, "progress", "auto", "progress bar: auto (when stdout is a terminal), on, off")
	fs.StringVar(&o.readings, "readings", "both", "on the device model: run under the profile's readings of the unmeasured coefficients (profile), their pessimistic bounds (pessimistic: model:NAME,pessimistic), or both, one after the other")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "with -fresh=false: write a CPU profile of the runs to this file")
	fs.BoolVar(&o.fresh, "fresh", true, "run each strategy's run in a fresh process (this program started again), so that no run finds the device state another left; false: all in this process")
	fs.Var(sizeFlag{&o.chunk}, "chunk", "arena chunk `size`: a multiple of the driver's granularity (2MiB on ACL, CUDA and the host driver), e.g. 4MiB or 64MiB; 0, the default: the pool's own choice for the workload's budget (chunk.SizeFor), the granularity where it has none")
	fs.IntVar(&o.maxCached, "cache", 0, "arena pool reuse cache, in chunks (0: the pool's default; -1: none)")
	fs.Float64Var(&o.growth, "growth", 2, "realloc growth factor, above 1")
	fs.StringVar(&o.scrub, "scrub", "reuse", "arena pool scrub policy: reuse (the default), release, never")
	fs.IntVar(&o.headroom, "headroom", -1, "arena: chunks of mapped headroom the pool's worker keeps above each region's Len (0: none; -1, the default: none for kv with -kv-prefetch-blocks, whose regions are told what they will grow into, 2 elsewhere)")
	fs.IntVar(&o.maxHead, "max-headroom", 0, "arena: chunks the headroom each region learns may grow to (0: the arena's default, 8 × -headroom; equal to -headroom: fixed)")
	fs.IntVar(&o.ahead, "ahead", 4, "arena: fresh chunks the pool's worker keeps allocated ahead, within the budget (0: none)")
	fs.Float64Var(&o.workerCPU, "worker-cpu", 0, "arena: cap the pool's worker at this share of one CPU, e.g. 0.25 (0: no cap; else 0.01 to 1)")
	fs.IntVar(&o.warm, "warm", 0, "arena: fresh chunks the pool allocates at start, timed as setup (-1: as many as a budgeted workload's budget allows; 0, the default: none, the arenas allocate as they grow and an empty slot keeps only what its next request needs)")
	fs.StringVar(&o.register, "register", "none", "arena: register every arena with a modelled collective library, as acl/hccl and acl/nccl do: chunk (one registration per chunk mapping: HCCL, NCCL's default), run (each run of adjacent chunks as one, re-registered at each change: NCCL with Coalesce), or none; the report gives registrations per generated token")
	fs.DurationVar(&o.registerCost, "register-cost", 100*time.Microsecond, "with -register: the host time charged for each registration or deregistration, on the goroutine that changes the arena's backing (an estimate: no device here has measured it)")
	fs.BoolVar(&o.stream, "stream", true, "arena: give the arenas the workload's stream, so unmaps wait for it alone (false: a device-wide wait before each unmap)")

	fs.IntVar(&o.kv.Layers, "kv-layers", o.kv.Layers, "kv: layers")
	fs.IntVar(&o.kv.KVHeads, "kv-heads", o.kv.KVHeads, "kv: KV heads")
	fs.IntVar(&o.kv.HeadDim, "kv-headdim", o.kv.HeadDim, "kv: head dimension")
	fs.IntVar(&o.kv.DType, "kv-dtype", o.kv.DType, "kv: bytes per element")
	fs.IntVar(&o.kv.BlockTokens, "kv-block", o.kv.BlockTokens, "kv: tokens per Grow while decoding")
	fs.IntVar(&o.kv.Slots, "kv-slots", o.kv.Slots, "kv: sequences decoded at once")
	fs.IntVar(&o.kv.Requests, "kv-requests", o.kv.Requests, "kv: sequences served in all")
	fs.Var(rangeFlag{&o.kv.PromptMin, &o.kv.PromptMax}, "kv-prompt", "kv: prompt tokens, lo:hi")
	fs.Var(rangeFlag{&o.kv.GenMin, &o.kv.GenMax}, "kv-gen", "kv: generated tokens, lo:hi")
	fs.Var(sizeFlag{&o.kv.BudgetBytes}, "kv-budget", "kv: physical budget every strategy runs under (0: -kv-budget-factor × peak live + 2 chunks per slot)")
	fs.Float64Var(&o.kv.BudgetFactor, "kv-budget-factor", o.kv.BudgetFactor, "kv: budget as a multiple of the peak of live KV bytes (0 with -kv-budget 0: no budget)")
	fs.Var(computeFlag{&o.kv.StepCompute, &o.kv.Roofline}, "kv-compute", "kv: device compute per decode step, waited for between steps (not allocator time): roofline (the model's weights and live KV cache read at the device's bandwidth, -kv-hidden, -kv-bandwidth) or a duration, e.g. 1ms (the stress setting)")
	fs.IntVar(&o.kv.Hidden, "kv-hidden", o.kv.Hidden, "kv: the model's hidden size, for its weights (Llama 3's shape: 4096 with 32 layers is 8B, 8192 with 80 layers 70B)")
	fs.IntVar(&o.kv.Vocab, "kv-vocab", 0, "kv: the model's vocabulary, for its weights (0: Llama 3's, 128256)")
	fs.Float64Var(&o.kv.BandwidthGBps, "kv-bandwidth", 0, "kv: with -kv-compute roofline, the device's memory bandwidth in GB/s (0: the device model's local bandwidth, else 4000, the H200 profile's)")
	fs.IntVar(&o.kv.Launches, "kv-launches", 0, "kv: kernel launches per decode step on a driver that can launch (the device model): 0 one per layer (eager), 1 a graph")
	fs.BoolVar(&o.kv.Prefetch, "kv-prefetch", true, "kv: tell each slot the prompt size of its next request ahead of its prefill (the arena maps it in the background: Arena.Prefetch)")
	fs.BoolVar(&o.kv.Load, "kv-load", true, "kv: copy the model's weights (-kv-hidden, -kv-vocab) into device memory before serving, from pinned host memory, as a server loads its model (the first prompts are prefetched first, so an arena maps them meanwhile); skipped where the device lacks room for them beside the budget")
	fs.BoolVar(&o.kv.PerToken, "kv-per-token", false, "kv: one Alloc per token for every layer's K and V (a token-outermost layout) instead of one per layer's K and V")
	fs.BoolVar(&o.kv.PrefetchBlocks, "kv-prefetch-blocks", true, "kv: with -kv-prefetch, also tell each running sequence the KV block it will grow into, -kv-prefetch-steps tokens ahead, as a scheduler that knows each sequence's length can")
	fs.Var(sizeFlag{&o.kvTail}, "kv-tail", "kv and models: the arena pool's tail chunk `size` (chunk.Config.TailSize): each growth's whole -chunk blocks in chunks of -chunk, the rest in chunks of this size, a multiple of the granularity that divides -chunk; one as large as the chunk: one size; 0: the pool's choice, a quarter of the chunk where that is a multiple of the granularity, else one size (chunk.DefaultTailSize)")
	fs.IntVar(&o.kv.PrefetchSteps, "kv-prefetch-steps", 8, "kv: with -kv-prefetch, how many steps ahead of the prefill, at most")
	fs.BoolVar(&o.kv.TokenGrowth, "kv-token-growth", true, "kv: grow the arena's regions by the tokens they append instead of in -kv-block blocks (a prefill maps its prompt's tokens, a decode step its token), and with -kv-prefetch-blocks tell each running sequence its next -kv-token-ahead tokens instead of its next block; the other strategies still grow in blocks")
	fs.BoolVar(&o.tokenHead, "kv-token-headroom", false, "kv: with -kv-token-growth, -kv-prefetch-blocks and -headroom -1, each arena keeps its sequence's next -kv-token-ahead tokens mapped as headroom (arena Config.Headroom, in bytes, fixed) instead of being told them with a Prefetch every step")
	fs.IntVar(&o.kv.TokenAhead, "kv-token-ahead", 0, "kv: with -kv-token-growth and -kv-prefetch-blocks, the tokens each running sequence's arena is told ahead (0: those of 4ms of steps at the shortest step time, at least 1: one at realistic 70B-class steps, four at -kv-compute 1ms)")

	fs.IntVar(&o.models.Models, "mm-models", o.models.Models, "models: models on the device (their shape is kv's: -kv-layers, -kv-heads, -kv-headdim, -kv-dtype, -kv-hidden, -kv-block)")
	fs.IntVar(&o.models.Slots, "mm-slots", o.models.Slots, "models: sequences each model decodes at once, at most")
	fs.Var(rangeFlag{&o.models.PromptMin, &o.models.PromptMax}, "mm-prompt", "models: prompt tokens, lo:hi")
	fs.Var(rangeFlag{&o.models.GenMin, &o.models.GenMax}, "mm-gen", "models: generated tokens, lo:hi")
	fs.Var(sizeFlag{&o.models.KVBudget}, "mm-kv-budget", "models: device memory for KV caches beyond every model's weights (the budget is both; the paged pools split it evenly)")
	fs.DurationVar(&o.models.Duration, "mm-duration", o.models.Duration, "models: how long the run serves")
	fs.DurationVar(&o.models.Period, "mm-period", o.models.Period, "models: a load cycle: each model bursts for its share of it, out of phase with the others")
	fs.Float64Var(&o.models.BurstRate, "mm-burst-rate", o.models.BurstRate, "models: requests a second to a model during its burst (Poisson)")
	fs.Float64Var(&o.models.IdleRate, "mm-idle-rate", o.models.IdleRate, "models: requests a second to a model outside its burst")
	fs.DurationVar(&o.models.SleepAfter, "mm-sleep-after", o.models.SleepAfter, "models: the arena puts a model idle this long to sleep (0: never)")

	fs.IntVar(&o.scratch.Steps, "scratch-steps", o.scratch.Steps, "scratch: steps")
	fs.Var(rangeFlag{&o.scratch.MinBufs, &o.scratch.MaxBufs}, "scratch-bufs", "scratch: buffers per step, lo:hi")
	fs.Var(sizeRangeFlag{&o.scratch.MinSize, &o.scratch.MaxSize}, "scratch-size", "scratch: buffer size, lo:hi (log-uniform)")
	fs.Float64Var(&o.scratch.SpikeProb, "scratch-spike", o.scratch.SpikeProb, "scratch: probability that a step is a spike")
	fs.Var(sizeRangeFlag{&o.scratch.SpikeMin, &o.scratch.SpikeMax}, "scratch-spike-size", "scratch: buffer size in a spike, lo:hi")
	fs.IntVar(&o.scratch.Window, "scratch-window", o.scratch.Window, "scratch: steps the trim policy looks back")

	fs.IntVar(&o.churn.Tenants, "churn-tenants", o.churn.Tenants, "churn: tenants sharing the budget")
	fs.IntVar(&o.churn.Steps, "churn-steps", o.churn.Steps, "churn: steps")
	fs.IntVar(&o.churn.Period, "churn-period", o.churn.Period, "churn: steps per demand cycle")
	fs.Var(sizeRangeFlag{&o.churn.Lo, &o.churn.Hi}, "churn-demand", "churn: demand per tenant, lo:hi")
	fs.Var(sizeFlag{&o.churn.Tensor}, "churn-tensor", "churn: tensor size")
	fs.Var(sizeFlag{&o.swap.Size}, "swap-size", "swap: bytes in the arena that sleeps and wakes")
	fs.IntVar(&o.swap.Reps, "swap-reps", o.swap.Reps, "swap: repetitions of each measurement (the median is reported)")
	fs.Float64Var(&o.churn.Jitter, "churn-jitter", o.churn.Jitter, "churn: demand noise, a fraction")
	fs.Var(sizeFlag{&o.churn.BudgetBytes}, "churn-budget", "churn: physical budget (0: the most asked at once, ×(1+jitter), +5%, + 2 chunks per tenant)")

	fs.BoolVar(&o.calibrate, "calibrate", false, "measure every driver call on -device and write a device-model profile (acl/model) instead of running the suite")
	fs.StringVar(&o.profileOut, "profile-out", "", "with -calibrate: the profile's path (default -out/profile-<driver>.json)")
	fs.StringVar(&o.profileBase, "profile-base", "h200", "with -calibrate: the profile (name or path) whose estimates fill in what cannot be measured")

	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
			return nil, err
		}
		return nil, &flagError{err: err, help: flagHelp(fs, err)}
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.args = append([]string(nil), args...)
	fs.Visit(func(f *flag.Flag) { o.chosen = o.chosen || f.Name == "workloads" })
	if o.quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for name, v := range quickValues {
			if !set[name] {
				if err := fs.Set(name, v); err != nil {
					return nil, fmt.Errorf("quick value of -%s: %w", name, err)
				}
			}
		}
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.img == "" {
		o.img = o.out
	}
	o.kv.Seed, o.scratch.Seed, o.churn.Seed, o.models.Seed = o.seed, o.seed, o.seed, o.seed
	o.syncModels()
	o.swap.Chunk = o.chunk
	return o, nil
}

// syncModels gives the models workload kv's model shape: the models are
// shaped as -kv-layers, -kv-heads, -kv-headdim, -kv-dtype, -kv-hidden and
// -kv-block say.
func (o *options) syncModels() {
	k, m := o.kv, &o.models
	m.Layers, m.KVHeads, m.HeadDim, m.DType, m.Hidden, m.Vocab, m.BlockTokens = k.Layers, k.KVHeads, k.HeadDim, k.DType, k.Hidden, k.Vocab, k.BlockTokens
}

// check checks every flag that needs no driver, before anything runs: each
// error names the flag and what it accepts. (checkChunk and checkBudgets
// check the rest once the driver is open, checkDirs the directories.)
func (o *options) check() error {
	switch {
	case o.count < 1:
		return fmt.Errorf("-count %d: want at least 1", o.count)
	case o.microIters < 1:
		return fmt.Errorf("-micro-iters %d: want at least 1", o.microIters)
	case o.allocIters < 1:
		return fmt.Errorf("-alloc-iters %d: want at least 1", o.allocIters)
	case !(o.growth > 1) || math.IsInf(o.growth, 0):
		return fmt.Errorf("-growth %v: want a factor above 1, e.g. 1.5 or 2", o.growth)
	case o.progress != "auto" && o.progress != "on" && o.progress != "off":
		return fmt.Errorf("-progress %q: want auto, on or off", o.progress)
	case o.readings != "profile" && o.readings != "pessimistic" && o.readings != "both":
		return fmt.Errorf("-readings %q: want profile, pessimistic or both", o.readings)
	case o.verify && !o.touch:
		return errors.New("-verify needs -touch")
	case !slices.Contains(strategy.RegisterModes, o.register):
		return fmt.Errorf("-register %q: want none, chunk or run", o.register)
	case o.registerCost < 0:
		return fmt.Errorf("-register-cost %v: want a duration of 0 or more", o.registerCost)
	case o.headroom < -1:
		return fmt.Errorf("-headroom %d: want -1 (the workload's choice), 0 or more", o.headroom)
	case o.maxHead < 0:
		return fmt.Errorf("-max-headroom %d: want 0 (the arena's default) or more", o.maxHead)
	case o.maxHead > 0 && o.maxHead < max(o.headroom, 0):
		return fmt.Errorf("-max-headroom %d is below -headroom %d: the learnt headroom lies between them", o.maxHead, o.headroom)
	case o.ahead < 0:
		return fmt.Errorf("-ahead %d: want 0 or more", o.ahead)
	case o.workerCPU != 0 && !(o.workerCPU >= 0.01 && o.workerCPU <= 1):
		return fmt.Errorf("-worker-cpu %v: want 0 (no cap) or a share of one CPU from 0.01 to 1", o.workerCPU)
	case o.warm < -1:
		return fmt.Errorf("-warm %d: want -1 (the budget), 0 (none) or more", o.warm)
	case o.maxCached < -1:
		return fmt.Errorf("-cache %d: want -1 (none), 0 (the pool's default) or more", o.maxCached)
	case o.chunk < 0:
		return fmt.Errorf("-chunk %d: want 0 or a multiple of the driver's granularity", o.chunk)
	}
	if _, ok := scrubs[o.scrub]; !ok {
		return fmt.Errorf("-scrub %q: want reuse, release or never", o.scrub)
	}
	if o.calibrate {
		return nil // the workloads do not run
	}
	for _, w := range o.workloads {
		var err error
		switch w {
		case "kv":
			err = o.kv.Check()
		case "models":
			o.syncModels()
			err = o.models.Check()
		case "scratch":
			err = o.scratch.Check()
		case "churn":
			err = o.churn.Check()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// checkDirs checks that the directories the suite writes to at the end can
// be written, so that a bad -out fails before the run, not after it.
func checkDirs(flags ...string) error {
	for i := 0; i+1 < len(flags); i += 2 {
		flag, dir := flags[i], flags[i+1]
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("%s %s: want a directory this user can write: %w", flag, dir, err)
		}
		f, err := os.CreateTemp(dir, ".vmarena-bench-*")
		if err != nil {
			return fmt.Errorf("%s %s: want a directory this user can write: %w", flag, dir, err)
		}
		name := f.Name()
		err = errors.Join(f.Close(), os.Remove(name))
		if err != nil {
			return fmt.Errorf("%s %s: %w", flag, dir, err)
		}
	}
	return nil
}

// checkBudgets checks the budgets the workloads were given against what
// their longest requests need on a driver of granularity gran.
func (o *options) checkBudgets(gran int64) error {
	if slices.Contains(o.workloads, "kv") {
		if err := o.kv.CheckBudget(o.arenaChunk(o.kv, gran)); err != nil {
			return err
		}
	}
	if slices.Contains(o.workloads, "models") {
		return o.models.CheckBudget(o.arenaChunk(o.models, gran))
	}
	return nil
}

// headroomFor is the arena's headroom for workload w, in chunks: -headroom,
// or with -headroom -1 (the default) none for a kv workload that tells each
// running sequence's region what it will grow into, its next block or
// tokens (-kv-prefetch with -kv-prefetch-blocks: the scheduler knows how
// every sequence grows, so nothing needs mapping on speculation, and the mapped
// slack is memory the other sequences do not get), and 2 for the others,
// whose regions grow without notice.
func (o *options) headroomFor(w workload.Workload) int {
	if o.headroom >= 0 {
		return o.headroom
	}
	if blocksAhead(w) {
		return 0
	}
	return 2
}

// blocksAhead reports whether workload w tells each running sequence's
// region what it will grow into (its next block, or its next tokens with
// -kv-token-growth) before it grows (kv with -kv-prefetch-blocks).
func blocksAhead(w workload.Workload) bool {
	kv, ok := w.(workload.KV)
	return ok && kv.Prefetch && kv.PrefetchBlocks
}

// tokenHeadroom is the headroom, in bytes, that keeps a kv sequence's next
// tokens mapped (-kv-token-headroom): the tokens told ahead (KV.TokensAhead),
// where the workload grows the arena by its tokens and tells each running
// sequence what it will grow into, and -headroom leaves the choice to the
// workload; else 0.
func (o *options) tokenHeadroom(w workload.Workload) int64 {
	kv, ok := w.(workload.KV)
	if !ok || !o.tokenHead || o.headroom >= 0 || !blocksAhead(kv) || !kv.TokenGrowth {
		return 0
	}
	return int64(kv.TokensAhead()) * kv.TokenBytes()
}

// aheadFor is what an arena of workload w may hold mapped above its Len
// besides its partial chunk, in bytes, and what that is: its headroom, or a
// block prefetched where that is larger.
func (o *options) aheadFor(w workload.Workload, chunkSize int64) (int64, string) {
	h := int64(o.headroomFor(w)) * chunkSize
	if kv, ok := w.(workload.KV); ok && blocksAhead(kv) {
		if kv.TokenGrowth {
			if t := o.tokenHeadroom(kv); t > h {
				return t, "the tokens kept ahead"
			}
			if t := int64(kv.TokensAhead()) * kv.TokenBytes(); t > h {
				return t, "the tokens prefetched"
			}
			return h, "headroom"
		}
		if kv.BlockBytes() > h {
			return kv.BlockBytes(), "the block prefetched"
		}
	}
	return h, "headroom"
}

// arenaChunk is the arena's chunk size for workload w on a driver of
// granularity gran: -chunk, or with -chunk 0 the size the pool chooses
// (chunk.SizeFor) for the workload's budget with its slack counted in
// granules. The budget's slack (two chunks per slot) is then counted in
// these chunks (budget), and the arena's pool is given this size: the
// pool's rule applied to the budget it would have before that slack, so
// that the size and the budget do not define each other.
func (o *options) arenaChunk(w workload.Workload, gran int64) int64 {
	if o.chunk > 0 {
		return o.chunk
	}
	return int64(chunk.SizeFor(w.Budget(gran), int(gran)))
}

// tailFor returns the arena pool's Config.TailSize for workload w on chunks
// of size bytes: -kv-tail for the kv and models workloads, where one as
// large as the chunk, or larger, asks for one size (size); else 0, the
// pool's choice (chunk.DefaultTailSize).
func (o *options) tailFor(w workload.Workload, size int64) int64 {
	switch w.(type) {
	case workload.KV, workload.Models:
		return min(o.kvTail, size)
	}
	return 0
}

// tailShown says, for a run's header, the tail size of the arena's pool for
// workload w on chunks of size bytes, and where it comes from.
func (o *options) tailShown(w workload.Workload, size, gran int64) string {
	tail, from := o.tailFor(w, size), "-kv-tail"
	if tail == 0 {
		tail, from = int64(chunk.DefaultTailSize(int(size), int(gran))), "the pool's choice"
	}
	if tail == size {
		return ", one size (" + from + ")"
	}
	return ", tails " + workload.HumanBytes(tail) + " (" + from + ")"
}

// chunkSource says where arenaChunk's size comes from.
func (o *options) chunkSource() string {
	if o.chunk > 0 {
		return "-chunk"
	}
	return "the pool's choice for the budget"
}

// budget is workload w's budget, its slack in the arena's chunks.
func (o *options) budget(w workload.Workload, gran int64) int64 {
	return w.Budget(o.arenaChunk(w, gran))
}

func (o *options) workload(name string) workload.Workload {
	switch name {
	case "kv":
		return o.kv
	case "models":
		return o.models
	case "scratch":
		return o.scratch
	case "swap":
		return o.swap
	}
	return o.churn
}

func main() {
	if childMode(os.Args[1:]) {
		return
	}
	o, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		fmt.Fprintln(os.Stderr, "run 'go run ./bench -h' for all flags")
		os.Exit(2)
	}
	run := run
	if o.calibrate {
		run = runCalibrate
	}
	if err := run(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// suite is one invocation's results.
type suite struct {
	opts    *options
	drv     acl.Driver
	device  string
	reason  string
	gran    int64
	results []*workload.Result
	micro   *microResult
	swap    *workload.SwapResult
	started time.Time
	elapsed time.Duration
	child   bool // this process makes one run (-fresh): it started for it
}

// openSuite opens the driver the flags ask for and checks the flags that
// depend on it; close closes the driver.
func openSuite(o *options) (s *suite, close func() error, err error) {
	spec := o.spec
	if spec == "" {
		spec = os.Getenv(acl.DeviceEnv)
	}
	spec = modelSpec(spec, o.verify)
	choice, err := device.Open(spec)
	if err == nil {
		o.spec = spec // the fresh processes open the same
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open the device: %w", err)
	}
	s = &suite{opts: o, drv: choice.Driver, device: choice.Driver.Name(), reason: choice.Reason, started: time.Now()}
	prop := acl.DeviceProp(choice.Driver.Device(), 0)
	g, err := choice.Driver.MemGetAllocationGranularity(&prop, acl.GranularityMinimum)
	if err == nil {
		s.gran = int64(g)
		err = checkChunk(o.chunk, s.gran)
		if err == nil && o.kvTail%s.gran != 0 {
			err = fmt.Errorf("-kv-tail %s: want a multiple of the driver's granularity, %s, or 0 for the pool's choice", formatSize(o.kvTail), formatSize(s.gran))
		}
	} else {
		err = fmt.Errorf("granularity: %w", err)
	}
	if err == nil {
		err = o.fitModels(choice.Driver, s.gran)
	}
	if err == nil {
		err = o.checkBudgets(s.gran)
	}
	if o.kv.Roofline && o.kv.BandwidthGBps == 0 {
		o.kv.BandwidthGBps = bandwidthOf(choice.Driver)
	}
	o.syncModels()
	if o.models.BandwidthGBps == 0 {
		o.models.BandwidthGBps = bandwidthOf(choice.Driver)
	}
	if err != nil {
		return nil, nil, errors.Join(err, choice.Driver.Close())
	}
	return s, choice.Driver.Close, nil
}

// fitModels checks that the device can hold the models workload's budget
// (every model's weights and the KV budget): where it cannot, the workload is
// left out of a default run with a note in s.skipped, and is an error when
// -workloads asked for it.
func (o *options) fitModels(d acl.Driver, gran int64) error {
	if !slices.Contains(o.workloads, "models") {
		return nil
	}
	_, total, err := d.GetMemInfo(acl.HBMMem)
	if err != nil {
		return fmt.Errorf("device memory: %w", err)
	}
	need := o.budget(o.models, gran)
	if uint64(need) <= uint64(total) {
		return nil
	}
	msg := fmt.Sprintf("models: its budget, %s (the weights of %d models and -mm-kv-budget), exceeds the device's %s; scale it down with -mm-models, -mm-kv-budget, -kv-hidden, -kv-layers",
		workload.HumanBytes(need), o.models.Models, workload.HumanBytes(int64(total)))
	if o.chosen {
		return errors.New(msg)
	}
	o.workloads = slices.DeleteFunc(o.workloads, func(w string) bool { return w == "models" })
	o.skipped = append(o.skipped, msg)
	return nil
}

// bandwidthOf returns the device-local bandwidth the driver states, in
// GB/s: the device model's profile's; elsewhere the H200 profile's figure
// (workload.DefaultBandwidthGBps), since a real driver states none.
func bandwidthOf(d acl.Driver) float64 {
	if m, ok := d.(interface{ Profile() *model.Profile }); ok {
		if p := m.Profile(); p != nil && p.Device.LocalGBps.Value > 0 {
			return p.Device.LocalGBps.Value
		}
	}
	return workload.DefaultBandwidthGBps
}

// processStart is when this program started (its package variables are
// initialised before main runs): a fresh run times its first token from it.
var processStart = time.Now()

// reading is one pass of the suite: on the device model, under the
// profile's readings of the unmeasured coefficients or their pessimistic
// bounds.
type reading struct {
	name     string // "", "profile" or "pessimistic"
	spec     string // the device spec
	out, img string
}

// readings returns the passes the flags ask for: one, except on the device
// model with -readings both.
func (o *options) readingList() []reading {
	spec := o.spec
	if spec == "" {
		spec = os.Getenv(acl.DeviceEnv)
	}
	kind, arg, _ := strings.Cut(strings.TrimSpace(spec), ":")
	if !strings.EqualFold(kind, "model") {
		return []reading{{spec: o.spec, out: o.out, img: o.img}}
	}
	already := false
	for _, opt := range strings.Split(arg, ",")[1:] {
		already = already || strings.EqualFold(strings.TrimSpace(opt), "pessimistic")
	}
	// modelSpec adds nodata to a bare model spec: keep it for either reading
	// (once ",pessimistic" is added the spec is no longer bare, and the
	// model would keep every byte written, the weights' gigabytes included).
	base := modelSpec(spec, o.verify)
	prof := reading{name: "profile", spec: base, out: o.out, img: o.img}
	pess := reading{name: "pessimistic", spec: base + ",pessimistic", out: filepath.Join(o.out, "pessimistic"),
		img: filepath.Join(o.img, "pessimistic")}
	switch {
	case already:
		return []reading{{name: "pessimistic", spec: spec, out: o.out, img: o.img}}
	case o.readings == "profile":
		return []reading{prof}
	case o.readings == "pessimistic":
		pess.out, pess.img = o.out, o.img
		return []reading{pess}
	}
	return []reading{prof, pess}
}

func run(o *options, stdout io.Writer) error {
	if err := checkDirs("-out", o.out, "-img", o.img); err != nil {
		return err
	}
	rs := o.readingList()
	if len(rs) > 1 {
		// A bad spec fails before anything is printed.
		for _, rd := range rs {
			choice, err := device.Open(rd.spec)
			if err != nil {
				return fmt.Errorf("open the device: %w", err)
			}
			if err := choice.Driver.Close(); err != nil {
				return err
			}
		}
	}
	for i, rd := range rs {
		oo := *o
		oo.spec, oo.out, oo.img = rd.spec, rd.out, rd.img
		if len(rs) > 1 {
			if i > 0 {
				fmt.Fprintln(stdout)
			}
			fmt.Fprintf(stdout, "######## reading %d of %d: %s\n", i+1, len(rs), readingNote[rd.name])
		}
		if err := runReading(&oo, stdout); err != nil {
			return err
		}
	}
	return nil
}

var readingNote = map[string]string{
	"profile":     "profile — the profile's figures as they stand",
	"pessimistic": "pessimistic — an access over k mappings costs k calls, and launches wait for the serial calls of other threads (model:NAME,pessimistic)",
}

func runReading(o *options, stdout io.Writer) error {
	if err := checkDirs("-out", o.out, "-img", o.img); err != nil {
		return err
	}
	s, closeDrv, err := openSuite(o)
	if err != nil {
		return err
	}
	defer closeDrv()

	reason := s.reason
	if len(reason) > 100 {
		reason = reason[:97] + "..."
	}
	fmt.Fprintf(stdout, "vmarena bench: driver %s (%s)\n", s.device, reason)
	if m, ok := s.drv.(interface{ Modelled() string }); ok {
		fmt.Fprintln(stdout, "NOTE:", m.Modelled())
	}
	fmt.Fprintf(stdout, "%s, %s/%s, GOMAXPROCS=%d, %s\n", cpuModel(), runtime.GOOS, runtime.GOARCH, runtime.GOMAXPROCS(0), runtime.Version())
	for _, m := range o.skipped {
		fmt.Fprintln(stdout, "NOTE: skipped", m)
	}
	for _, w := range o.workloads {
		fmt.Fprintf(stdout, "  %-8s %s\n", w+":", o.workload(w).Describe())
		if wl := o.workload(w); wl.Budget(s.gran) > 0 {
			size := o.arenaChunk(wl, s.gran)
			fmt.Fprintf(stdout, "  %-8s arena chunk %s (%s)%s, budget %s\n", "", workload.HumanBytes(size),
				o.chunkSource(), o.tailShown(wl, size, s.gran), workload.HumanBytes(o.budget(wl, s.gran)))
		}
	}
	fmt.Fprintln(stdout)

	if o.cpuProfile != "" && !o.fresh {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return errors.Join(fmt.Errorf("-cpuprofile: %w", err), f.Close())
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	swap := slices.Contains(o.workloads, "swap")
	units := 0
	for _, w := range o.workloads {
		if w == "swap" {
			continue
		}
		for _, name := range o.strategies {
			if runsOn(w, name) {
				units += o.count
			}
		}
	}
	if swap {
		units++ // once, on the arena alone
	}
	if o.micro {
		units++
	}
	if o.fresh {
		fmt.Fprintln(stdout, "each run in a fresh process (-fresh)")
	}
	bar := newProgress(stdout, o.progress, units)
	done := 0
	for rep := range o.count {
		for wi, wname := range o.workloads {
			if wname == "swap" {
				continue // below, once
			}
			w := o.workload(wname)
			// Rotate the order every repetition and workload, so no strategy
			// always runs first (or right after the most memory-hungry one).
			for k := range o.strategies {
				name := o.strategies[(k+rep+wi)%len(o.strategies)]
				if !runsOn(wname, name) {
					continue // a paged pool holds KV blocks only; models runs on the strategies Split makes
				}
				label := fmt.Sprintf("%s/%s", wname, name)
				if o.count > 1 {
					label += fmt.Sprintf(" (run %d/%d)", rep+1, o.count)
				}
				var res *workload.Result
				var err error
				if o.fresh {
					bar.set(done, 0.5, label)
					res, err = s.runFresh(wname, name, rep)
				} else {
					res, err = s.runOne(w, name, rep, func(f float64) { bar.set(done, f, label) })
				}
				done++
				bar.set(done, 0, label)
				if err != nil {
					bar.clear()
					return err
				}
				s.results = append(s.results, res)
			}
		}
	}
	if o.micro {
		bar.set(done, 0, "micro: alloc, grow cold/cache")
		m, err := runMicro(s.drv, o, func(f float64) { bar.set(done, f, "micro: alloc, grow cold/cache") })
		if err != nil {
			bar.clear()
			return err
		}
		s.micro = m
	}
	if swap {
		bar.set(done, 0, "swap: sleep and wake")
		r, err := s.measureSwap()
		if err != nil {
			bar.clear()
			return fmt.Errorf("swap: %w", err)
		}
		s.swap = &r
		done++
	}
	bar.clear()
	s.elapsed = time.Since(s.started)

	rep := s.report()
	rep.printTable(stdout)
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(o.img, 0o755); err != nil {
		return err
	}
	var files []string
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{
		{"results.json", rep.writeJSON},
		{"bench.txt", rep.writeBench},
	} {
		p := filepath.Join(o.out, f.name)
		if err := writeFile(p, f.write); err != nil {
			return err
		}
		files = append(files, p)
	}
	pngs, err := s.plot(rep, o.img)
	if err != nil {
		return fmt.Errorf("plots: %w", err)
	}
	files = append(files, pngs...)
	fmt.Fprintf(stdout, "\nwrote %s\n", strings.Join(files, ", "))
	fmt.Fprintf(stdout, "suite took %.1fs\n", s.elapsed.Seconds())
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", path, err)
	}
	return f.Close()
}

// runOne runs workload w on a fresh strategy through a fresh counting
// wrapper, and checks that everything was given back.
func (s *suite) runOne(w workload.Workload, name string, rep int, progress func(float64)) (*workload.Result, error) {
	o := s.opts
	chunkSize := o.arenaChunk(w, s.gran)
	budget := w.Budget(chunkSize)
	cd := counting.New(s.drv, budget)
	cfg := strategy.Config{Driver: cd, Chunk: chunkSize, MaxCached: o.maxCached,
		Budget: budget, Growth: o.growth, Scrub: scrubs[o.scrub], Headroom: int64(o.headroomFor(w)) * chunkSize,
		MaxHeadroom: int64(o.maxHead) * chunkSize, Ahead: o.ahead,
		WorkerCPU: o.workerCPU, Warm: o.warm, RegisterCost: o.registerCost}
	if h := o.tokenHeadroom(w); h > 0 {
		cfg.Headroom, cfg.MaxHeadroom = h, h // fixed: a prompt's Grow past Cap is no sign that the tokens need more
	}
	if o.register != "none" {
		cfg.Register = o.register
	}
	cfg.Tail = o.tailFor(w, chunkSize)
	switch w := w.(type) {
	case workload.KV:
		cfg.Block = w.BlockBytes() // the paged pool's block: one KV block
	case workload.Models:
		cfg.Block = w.BlockBytes()
	}
	if budget == 0 && cfg.Warm < 0 {
		cfg.Warm = 0 // no budget to warm to
	}
	// The workload's device work runs on one stream, which the arena is told
	// about; the other strategies wait for the whole device before they
	// unmap, as engines without stream ordering do.
	var stream acl.Stream
	if o.stream && name == "arena" {
		var err error
		if stream, err = cd.CreateStream(); err != nil {
			return nil, fmt.Errorf("create the workload's stream: %w", err)
		}
		cfg.Stream = stream
	}
	st, err := strategy.New(name, cfg)
	if err != nil {
		return nil, errors.Join(err, destroyStream(cd, stream))
	}
	env := workload.NewEnv(cd, st, w.Name())
	if s.child {
		env.Start = processStart // the whole process serves this one run
	}
	env.Touch, env.Verify, env.Progress = o.touch, o.verify, progress
	env.Res.Rep = rep
	runtime.GC()
	// The workload runs on this goroutine, which holds its thread while it
	// is inside a strategy call, so that the driver calls on the caller's
	// path are told from the worker's by the thread that makes them.
	env.Res.PathExact = cd.ByThread(threadID)
	cpu0 := cpuTime()
	start := time.Now()
	if _, ok := w.(workload.Models); !ok {
		err = env.Prepare() // Models prepares each model's part itself
	}
	if err == nil {
		err = w.Run(env)
	}
	if p := strategy.Pool(st); p != nil {
		ps := p.Stats()
		env.Res.Pool = &ps
	}
	if rs, ok := strategy.RegistrationsOf(st); ok {
		env.Res.Registered, env.Res.Deregistered = rs.Register, rs.Deregister
	}
	err = errors.Join(err, st.Close(), destroyStream(cd, stream))
	env.Res.WallNS = int64(time.Since(start))
	env.Res.CPUNS = cpuTime() - cpu0
	env.Res.WindowCalls = cd.WindowCalls()
	env.Res.BesideCalls = cd.BesideCalls()
	env.Res.Calls = cd.Calls()
	env.Res.Mem = cd.Memory()
	if c, ok := s.drv.(acl.Counter); ok && !c.Live().Zero() {
		err = errors.Join(err, fmt.Errorf("driver objects still live after the run: %+v", c.Live()))
	}
	if err != nil {
		return nil, fmt.Errorf("%s on %s: %w", w.Name(), name, err)
	}
	return env.Res, nil
}

// destroyStream destroys the workload's stream, once its work is done.
func destroyStream(d acl.Driver, s acl.Stream) error {
	if s == 0 {
		return nil
	}
	return errors.Join(d.SynchronizeStream(s), d.DestroyStream(s))
}

// measureSwap runs the swap workload on the suite's driver or, when that is
// the device model without bytes, on a model of the same spec that keeps
// them: an Offload reads the device's bytes back to host memory.
func (s *suite) measureSwap() (workload.SwapResult, error) {
	spec := s.opts.spec
	if !strings.Contains(spec, ",nodata") {
		return s.opts.swap.Measure(s.drv)
	}
	c, err := device.Open(strings.Replace(spec, ",nodata", "", 1))
	if err != nil {
		return workload.SwapResult{}, fmt.Errorf("open the model with bytes: %w", err)
	}
	r, err := s.opts.swap.Measure(c.Driver)
	return r, errors.Join(err, c.Driver.Close())
}

// modelSpec returns spec, with ",nodata" added when it names the device
// model without options and the run reads nothing back (no -verify): at
// the suite's sizes the model's bytes would cost host memory and time that
// no device spends.
func modelSpec(spec string, verify bool) string {
	kind, arg, _ := strings.Cut(strings.TrimSpace(spec), ":")
	if !strings.EqualFold(kind, "model") || verify || strings.Contains(arg, ",") {
		return spec
	}
	return spec + ",nodata"
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				return strings.TrimSpace(v)
			}
		}
	}
	return runtime.GOARCH
}
