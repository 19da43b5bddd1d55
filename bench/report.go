package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vmarena/vmarena/bench/internal/counting"
	"github.com/vmarena/vmarena/bench/internal/workload"
	"github.com/vmarena/vmarena/chunk"
)

// row summarises one strategy on one workload over the repetitions: times
// are medians, grow latencies pool every run, the rest comes from the run
// with the median wall time.
type row struct {
	Workload string `json:"workload"`
	Strategy string `json:"strategy"`
	Runs     int    `json:"runs"`

	WallNS      float64 `json:"wall_ns"`        // the whole run
	MemNS       float64 `json:"in_strategy_ns"` // inside the strategy's calls during the steps: the caller's critical path
	SetupNS     int64   `json:"setup_ns"`       // opening and closing the regions
	DriverNS    int64   `json:"driver_ns"`      // inside the driver, every goroutine's calls
	WorkerNS    int64   `json:"worker_ns"`      // the arena pool's background worker at work: off the critical path
	CPUNS       int64   `json:"cpu_ns"`         // process CPU time during the run (user + system)
	WallVsArena float64 `json:"wall_vs_arena"`  // this wall ÷ the arena's; 0 without an arena row

	ThrottledNS int64 `json:"worker_throttled_ns"` // the worker's rounds held back by its CPU cap (-worker-cpu)

	// The caller's path against the no-driver floor: the paged pool's path
	// time on the same workload (kv), or static preallocation's.
	LaunchStallNS float64 `json:"launch_stall_ns"` // what the step compute's launches waited for the strategy's driver calls (median run)
	PathNS        float64 `json:"path_ns"`         // on path + launch stall (median over runs)
	Floor         string  `json:"floor,omitempty"` // the strategy that gives the floor
	VsFloor       float64 `json:"vs_floor"`        // PathNS ÷ the floor's PathNS
	OverFloorNS   float64 `json:"over_floor_ns"`   // PathNS − the floor's PathNS
	WarmPathNS    int64   `json:"warm_path_ns"`    // on path in the first step: every slot's first prefill (the median run)
	RestPathNS    int64   `json:"rest_path_ns"`    // on path after the first step
	StepP999NS    float64 `json:"step_p999_ns"`    // a step's whole path time (prefills included), after the first: p99.9
	StepMaxNS     float64 `json:"step_max_ns"`     // … and its maximum
	// The path time by call (the median run): Grow, Alloc, the release of
	// a finished sequence (Truncate and Idle), Trim, and Prefetch.
	PathGrowNS, PathAllocNS, PathReleaseNS, PathTrimNS, PathPrefetchNS int64

	// KV decode in steady state (after every slot served its first request).
	SteadyTokens   int64   `json:"steady_tokens,omitempty"`
	SteadyCalls    int64   `json:"steady_calls,omitempty"`    // memory driver calls inside the caller's calls (the caller's own with PathExact, else an upper bound)
	CallsPerToken  float64 `json:"calls_per_token,omitempty"` // SteadyCalls ÷ SteadyTokens
	StepP50NS      float64 `json:"step_p50_ns,omitempty"`     // the caller's allocator time per decode step
	StepP99NS      float64 `json:"step_p99_ns,omitempty"`     //
	Preempted      int64   `json:"preempted,omitempty"`       // sequences preempted for want of memory
	PeakCommitted  int64   `json:"peak_committed"`            // the most physical memory held and not free to take (cache, reclaimable arena memory excluded)
	PeakCommMapped int64   `json:"peak_committed_mapped"`     // the most mapped memory not free to take
	DeviceSyncs    int64   `json:"device_syncs"`              // SynchronizeDevice calls
	StreamSyncs    int64   `json:"stream_syncs"`              // SynchronizeStream calls
	EventWaits     int64   `json:"event_waits"`               // SynchronizeEvent calls
	Scrubs         int64   `json:"scrubs"`                    // chunks cleared for a new tenant (arena)
	ScrubsFresh    int64   `json:"scrubs_fresh"`              // of them, fresh from the driver
	ScrubsAsync    int64   `json:"scrubs_async"`              // of them, queued on the stream instead of waited for
	Reclaimed      int64   `json:"reclaimed"`                 // chunks reclaimed under pressure (arena)
	// With -register: the modelled library's registrations and
	// deregistrations over the run, and registrations per generated token.
	Tokens       int64   `json:"tokens,omitempty"` // tokens generated (kv)
	Registered   int64   `json:"registered,omitempty"`
	Deregistered int64   `json:"deregistered,omitempty"`
	RegsPerToken float64 `json:"registrations_per_token,omitempty"`

	GrowCalls    int64   `json:"grow_calls"`
	Grows        int     `json:"grows"` // Grows that called the driver, per run
	GrowP50NS    float64 `json:"grow_p50_ns"`
	GrowP99NS    float64 `json:"grow_p99_ns"`
	GrowMeanNS   float64 `json:"grow_mean_ns"`
	GrowOverhead float64 `json:"grow_overhead"` // Σ Grow time ÷ Σ driver time inside those Grows

	PeakPhysical  int64   `json:"peak_physical"`
	FinalPhysical int64   `json:"final_physical"`
	PeakMapped    int64   `json:"peak_mapped"`
	PeakLive      int64   `json:"peak_live"`
	Frag          float64 `json:"fragmentation"` // 1 − peak live ÷ peak committed mapped
	Waste         int64   `json:"waste"`         // peak committed mapped − peak live
	Regions       int     `json:"regions"`
	Copied        int64   `json:"copied"`
	Written       int64   `json:"written"`
	Denied        int64   `json:"denied"`
	FailedTrims   int64   `json:"failed_trims"`
	// The shape of the run's mappings (counting.Memory): what -quick must
	// exercise as the full run does.
	MaxMappings int64   `json:"max_mappings"`  // the most one reservation held at once
	MaxMapBatch int64   `json:"max_map_batch"` // the most mapped in a row before an access call
	Remaps      int64   `json:"remaps"`        // maps where a shrink had unmapped: regrowth
	Served      float64 `json:"served"`        // fraction of the demand held (budgeted workloads)

	// What a user of the server feels (KV; medians over the runs, but for
	// the times between tokens, from the median run): tokens generated per
	// second of serving, the first token from the process's start, the
	// setup before serving and the teardown after it, and the time between
	// a sequence's tokens.
	TokensPerS   float64 `json:"tokens_per_s,omitempty"`
	FirstTokenNS float64 `json:"first_token_ns,omitempty"`
	ServeNS      float64 `json:"serve_ns,omitempty"`
	OpenNS       int64   `json:"open_ns,omitempty"`
	TeardownNS   int64   `json:"teardown_ns,omitempty"`
	ComputeNS    int64   `json:"compute_ns,omitempty"`
	TBTP50NS     int64   `json:"tbt_p50_ns,omitempty"`
	TBTP99NS     int64   `json:"tbt_p99_ns,omitempty"`
	TBTMaxNS     int64   `json:"tbt_max_ns,omitempty"`
	// ClockNS is the run's wall time with every device wait as long as
	// modelled: WallNS less what other processes took from the host mid-wait
	// (median over the runs).
	ClockNS float64 `json:"clock_ns,omitempty"`
	// Several models: the time from a request's arrival to its first token,
	// the requests finished, the models' sleeps and wakes (the arena) and
	// the time they took on the serving loop.
	TTFTP50NS int64 `json:"ttft_p50_ns,omitempty"`
	TTFTP99NS int64 `json:"ttft_p99_ns,omitempty"`
	Finished  int64 `json:"finished,omitempty"`
	Sleeps    int64 `json:"sleeps,omitempty"`
	Wakes     int64 `json:"wakes,omitempty"`
	SleepNS   int64 `json:"sleep_ns,omitempty"`

	Calls     map[string][2]int64 `json:"driver_calls"`         // kind → [calls, ns]
	PathCalls map[string][2]int64 `json:"driver_calls_on_path"` // the same, made by the caller inside its strategy calls (PathExact; else every thread's, an upper bound)
	// BesideCalls are the calls other threads (the pool's worker) made
	// while the caller was inside a strategy call (with PathExact).
	BesideCalls map[string][2]int64 `json:"driver_calls_beside_path,omitempty"`
	PathExact   bool                `json:"path_exact"` // the calls on the path were told apart by thread (Linux)
	Pool        *chunk.Stats        `json:"pool,omitempty"`

	calls     counting.Calls
	pathCalls counting.Calls
	med       *workload.Result
	grows     []workload.GrowEvent
}

type target struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Met  bool   `json:"met"`
}

type microSummary struct {
	*microResult
	ColdP50NS, ColdP99NS, CacheP50NS, CacheP99NS float64
	CacheVsCold                                  float64 // cache p50 ÷ cold p50
	ColdOverhead, CacheOverhead                  float64
}

type report struct {
	s       *suite
	Command string `json:"command"`
	Date    string `json:"date"`
	Go      string `json:"go"`
	CPU     string `json:"cpu"`
	Procs   int    `json:"gomaxprocs"`
	Device  string `json:"device"`
	Reason  string `json:"reason"`
	// Modelled says, when the driver is the device model, that the times
	// are modelled and from which profile.
	Modelled string        `json:"modelled,omitempty"`
	Gran     int64         `json:"granularity"`
	Touch    bool          `json:"touch"`
	Seconds  float64       `json:"seconds"`
	Configs  any           `json:"workloads"`
	Rows     []*row        `json:"rows"`
	Micro    *microSummary `json:"micro,omitempty"`
	Swap     *swapSummary  `json:"swap,omitempty"`
	Targets  []target      `json:"targets"`
	Series   []series      `json:"series"`
	// ArenaChunk is the arena's chunk size per workload with a budget
	// (-chunk, or the pool's choice for the budget), and Budget the budget
	// every strategy ran under.
	ArenaChunk map[string]int64 `json:"arena_chunk"`
	Budget     map[string]int64 `json:"budget"`
}

// swapSummary is the swap workload's measurements and their ratios.
type swapSummary struct {
	workload.SwapResult
	Ratios workload.SwapRatios `json:"ratios"`
}

type series struct {
	Workload string            `json:"workload"`
	Strategy string            `json:"strategy"`
	Samples  []workload.Sample `json:"samples"` // at most 400, evenly picked
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func growStats(ev []workload.GrowEvent) (p50, p99, mean, overhead float64) {
	if len(ev) == 0 {
		return 0, 0, 0, 0
	}
	ns := make([]float64, len(ev))
	var sum, drv, wrap float64
	for i, e := range ev {
		ns[i] = float64(e.NS)
		sum += float64(e.NS)
		drv += float64(e.DriverNS)
		wrap += float64(e.WrapperNS)
	}
	slices.Sort(ns)
	if drv > 0 {
		// The counting wrapper's bookkeeping is neither the strategy's
		// time nor the driver's: take it out.
		overhead = (sum - wrap) / drv
	}
	return percentile(ns, 0.50), percentile(ns, 0.99), sum / float64(len(ev)), overhead
}

func (s *suite) report() *report {
	o := s.opts
	r := &report{s: s, Command: commandLine(os.Args), Date: time.Now().UTC().Format(time.RFC3339),
		Go: runtime.Version(), CPU: cpuModel(), Procs: runtime.GOMAXPROCS(0), Device: s.device, Reason: s.reason,
		Gran: s.gran, Touch: o.touch, Seconds: s.elapsed.Seconds()}
	if m, ok := s.drv.(interface{ Modelled() string }); ok {
		r.Modelled = m.Modelled()
	}
	cfgs := map[string]any{}
	r.ArenaChunk, r.Budget = map[string]int64{}, map[string]int64{}
	for _, w := range o.workloads {
		cfgs[w] = o.workload(w)
		if wl := o.workload(w); wl.Budget(s.gran) > 0 {
			r.ArenaChunk[w], r.Budget[w] = o.arenaChunk(wl, s.gran), o.budget(wl, s.gran)
		}
	}
	r.Configs = cfgs
	for _, w := range o.workloads {
		var rows []*row
		for _, st := range o.strategies {
			var runs []*workload.Result
			for _, res := range s.results {
				if res.Workload == w && res.Strategy == st {
					runs = append(runs, res)
				}
			}
			if len(runs) == 0 {
				continue
			}
			rows = append(rows, summarise(runs))
		}
		var arenaWall float64
		for _, x := range rows {
			if x.Strategy == "arena" {
				arenaWall = x.WallNS
			}
		}
		floor := floorOf(rows)
		for _, x := range rows {
			if arenaWall > 0 {
				x.WallVsArena = x.WallNS / arenaWall
			}
			if floor != nil && floor.PathNS > 0 {
				x.Floor, x.VsFloor, x.OverFloorNS = floor.Strategy, x.PathNS/floor.PathNS, x.PathNS-floor.PathNS
			}
			r.Series = append(r.Series, series{Workload: w, Strategy: x.Strategy, Samples: thin(x.med.Samples, 400)})
		}
		r.Rows = append(r.Rows, rows...)
	}
	if s.swap != nil {
		r.Swap = &swapSummary{SwapResult: *s.swap, Ratios: s.swap.Ratios()}
	}
	if s.micro != nil {
		m := &microSummary{microResult: s.micro}
		m.ColdP50NS, m.ColdP99NS, _, m.ColdOverhead = growStats(s.micro.Cold)
		m.CacheP50NS, m.CacheP99NS, _, m.CacheOverhead = growStats(s.micro.Cache)
		if m.ColdP50NS > 0 {
			m.CacheVsCold = m.CacheP50NS / m.ColdP50NS
		}
		r.Micro = m
	}
	r.Targets = r.targets()
	return r
}

func summarise(runs []*workload.Result) *row {
	walls := make([]float64, len(runs))
	mems := make([]float64, len(runs))
	paths := make([]float64, len(runs))
	var tps, first, serve, clock []float64
	for i, x := range runs {
		walls[i], mems[i], paths[i] = float64(x.WallNS), float64(x.MemNS), pathNS(x)
		clock = append(clock, clockOf(x))
		if x.ServeNS > 0 {
			tps = append(tps, tokensPerS(x))
			first = append(first, float64(x.FirstTokenNS))
			serve = append(serve, float64(x.ServeNS))
		}
	}
	// The run whose wall time is the median gives the other figures.
	byWall := slices.Clone(runs)
	slices.SortFunc(byWall, func(a, b *workload.Result) int { return int(a.WallNS - b.WallNS) })
	med := byWall[(len(byWall)-1)/2]
	x := &row{Workload: med.Workload, Strategy: med.Strategy, Runs: len(runs), WallNS: median(walls), MemNS: median(mems), med: med,
		PathNS: median(paths), LaunchStallNS: float64(launchStall(med))}
	x.WarmPathNS, x.RestPathNS, x.StepP999NS, x.StepMaxNS = stepPath(med)
	x.TokensPerS, x.FirstTokenNS, x.ServeNS, x.ClockNS = median(tps), median(first), median(serve), median(clock)
	x.OpenNS, x.TeardownNS, x.ComputeNS = med.OpenNS, med.SetupNS-med.OpenNS, med.ComputeNS
	x.TBTP50NS, x.TBTP99NS, x.TBTMaxNS = med.TBTP50NS, med.TBTP99NS, med.TBTMaxNS
	x.TTFTP50NS, x.TTFTP99NS, x.Finished = med.TTFTP50NS, med.TTFTP99NS, med.Finished
	x.Sleeps, x.Wakes, x.SleepNS = med.Sleeps, med.Wakes, med.SleepNS
	x.PathGrowNS, x.PathReleaseNS, x.PathTrimNS, x.PathPrefetchNS = med.GrowNS, med.ReleaseNS, med.TrimNS, med.PrefetchNS
	x.PathAllocNS = med.MemNS - med.GrowNS - med.ReleaseNS - med.TrimNS - med.PrefetchNS
	for _, r := range runs {
		x.grows = append(x.grows, r.Grows...)
	}
	x.GrowP50NS, x.GrowP99NS, x.GrowMeanNS, x.GrowOverhead = growStats(x.grows)
	x.Grows = len(med.Grows)
	x.GrowCalls = med.GrowCalls
	x.calls = med.Calls
	x.Calls = med.Calls.Map()
	x.PathCalls = med.WindowCalls.Map()
	x.pathCalls = med.WindowCalls
	x.PathExact = med.PathExact
	if med.PathExact {
		x.BesideCalls = med.BesideCalls.Map()
	}
	_, x.DriverNS = med.Calls.Total()
	x.PeakPhysical, x.FinalPhysical, x.PeakMapped = med.Mem.PeakPhysical, med.Final.Physical, med.Mem.PeakMapped
	x.PeakLive = med.PeakLive
	x.Regions = med.Regions
	x.Copied, x.Written = med.Mem.Copied, med.Mem.Written
	x.MaxMappings, x.MaxMapBatch, x.Remaps = med.Mem.MaxMappings, med.Mem.MaxMapBatch, med.Mem.Remaps
	x.Denied, x.FailedTrims = med.Denied, med.FailedTrims
	if med.Demand > 0 {
		x.Served = float64(med.Served) / float64(med.Demand)
	}
	x.Pool = med.Pool
	x.Tokens, x.Registered, x.Deregistered = med.Tokens, med.Registered, med.Deregistered
	if med.Tokens > 0 {
		x.RegsPerToken = float64(med.Registered) / float64(med.Tokens)
	}
	x.CPUNS = med.CPUNS
	x.SetupNS = med.SetupNS
	x.Preempted = med.Preempted
	x.DeviceSyncs, x.StreamSyncs, x.EventWaits = med.Calls.N[counting.SyncDevice], med.Calls.N[counting.SyncStream],
		med.Calls.N[counting.SyncEvent]
	if p := med.Pool; p != nil {
		x.WorkerNS, x.ThrottledNS = p.WorkerNS, p.WorkerThrottledNS
		x.Scrubs, x.ScrubsFresh, x.ScrubsAsync, x.Reclaimed = p.Scrubs, p.ScrubsFresh, p.ScrubsAsync, p.Reclaimed
	}
	x.PeakCommitted, x.PeakCommMapped, x.Frag, x.Waste = committed(med)
	// With the pool's worker at work beside the caller, the driver time inside
	// a Grow includes the worker's calls: the Grow's overhead over its own
	// calls cannot be told apart (the micro measure, with no worker, does).
	if p := med.Pool; p != nil && p.WorkerSpins > 0 {
		x.GrowOverhead = 0
	}
	if med.SteadyFrom >= 0 && med.SteadyFrom < len(med.StepNS) {
		steps := make([]float64, 0, len(med.StepNS)-med.SteadyFrom)
		for i := med.SteadyFrom; i < len(med.StepNS); i++ {
			steps = append(steps, float64(med.StepNS[i]))
			x.SteadyCalls += med.StepCalls[i]
		}
		slices.Sort(steps)
		x.StepP50NS, x.StepP99NS = percentile(steps, 0.50), percentile(steps, 0.99)
		// Tokens generated in steady state: one per active sequence per step;
		// counted as the decode appends after SteadyFrom.
		x.SteadyTokens = med.SteadyTokens()
		if x.SteadyTokens > 0 {
			x.CallsPerToken = float64(x.SteadyCalls) / float64(x.SteadyTokens)
		}
	}
	return x
}

// tokensPerS is a run's tokens generated per second of serving.
func tokensPerS(r *workload.Result) float64 {
	if r.ServeNS <= 0 {
		return 0
	}
	return float64(r.Tokens) / (float64(r.ServeNS) / 1e9)
}

// launchStall is what a run's step-compute launches waited for the
// strategy's driver calls on other threads (the pessimistic model counts
// it; the profile's reading has launches never wait).
func launchStall(r *workload.Result) int64 { return r.LaunchWaitNS }

// pathNS is a run's time on the caller's path: inside the strategy's calls,
// plus what its launches waited for the strategy's background driver calls.
func pathNS(r *workload.Result) float64 { return float64(r.MemNS + launchStall(r)) }

// stepPath splits a KV run's path time into its warm-up, the first step
// (every slot's first prefill at once, when the server starts, with nothing
// mapped ahead), and the rest, and gives the p99.9 and maximum of the whole
// path time of a step after the first.
func stepPath(r *workload.Result) (warm, rest int64, p999, most float64) {
	var st []float64
	for i, ns := range r.StepAllNS {
		if i == 0 {
			warm = ns
			continue
		}
		rest += ns
		st = append(st, float64(ns))
	}
	slices.Sort(st)
	if len(st) > 0 {
		p999, most = percentile(st, 0.999), st[len(st)-1]
	}
	return warm, rest, p999, most
}

// floorOf returns the no-driver floor of workload w's rows: the paged pool,
// or static preallocation.
func floorOf(rows []*row) *row {
	var f *row
	for _, x := range rows {
		switch {
		case x.Strategy == "paged":
			return x
		case x.Strategy == "prealloc":
			f = x
		}
	}
	return f
}

// thin picks at most n samples, evenly, keeping the last.
func thin(s []workload.Sample, n int) []workload.Sample {
	if len(s) <= n {
		return s
	}
	out := make([]workload.Sample, 0, n)
	for i := range n {
		out = append(out, s[i*(len(s)-1)/(n-1)])
	}
	return out
}

// pairs returns, for each repetition that has both, the results of
// strategies num and den on workload w.
func (r *report) pairs(w, num, den string) [][2]*workload.Result {
	var out [][2]*workload.Result
	for rep := range r.s.opts.count {
		var n, d *workload.Result
		for _, x := range r.s.results {
			if x.Workload == w && x.Rep == rep {
				switch x.Strategy {
				case num:
					n = x
				case den:
					d = x
				}
			}
		}
		if n != nil && d != nil {
			out = append(out, [2]*workload.Result{n, d})
		}
	}
	return out
}

// perRun returns, for each repetition, strategy num's time over strategy
// den's on workload w: on the caller's path (with the launch stall), and
// wall.
func (r *report) perRun(w, num, den string) (mem, wall []float64) {
	for _, p := range r.pairs(w, num, den) {
		n, d := p[0], p[1]
		if d.MemNS > 0 && d.WallNS > 0 {
			mem = append(mem, pathNS(n)/pathNS(d))
			wall = append(wall, float64(n.WallNS)/float64(d.WallNS))
		}
	}
	return mem, wall
}

// perRunLater returns, for each repetition, strategy num's path time over
// den's on workload w after the first step (launch stalls included), and
// over the whole run.
func (r *report) perRunLater(w, num, den string) (later, total []float64) {
	for _, p := range r.pairs(w, num, den) {
		n, d := p[0], p[1]
		if pathNS(d) <= 0 {
			continue
		}
		_, nr, _, _ := stepPath(n)
		_, dr, _, _ := stepPath(d)
		if dr+launchStall(d) > 0 {
			later = append(later, float64(nr+launchStall(n))/float64(dr+launchStall(d)))
		}
		total = append(total, pathNS(n)/pathNS(d))
	}
	return later, total
}

// perRunOf returns, for each repetition, f of strategy num's run over f of
// strategy den's, on workload w.
func (r *report) perRunOf(w, num, den string, f func(*workload.Result) float64) []float64 {
	var v []float64
	for _, p := range r.pairs(w, num, den) {
		if d := f(p[1]); d > 0 {
			v = append(v, f(p[0])/d)
		}
	}
	return v
}

func clockOf(x *workload.Result) float64 { return float64(x.WallNS - x.SkewNS) }
func cpuOf(x *workload.Result) float64   { return float64(x.CPUNS) }
func firstOf(x *workload.Result) float64 { return float64(x.FirstTokenNS) }

// servingTargets checks what a user of a server feels, the arena against the
// paged pool in the same run (per-run ratios, their median): with realistic
// (roofline) step times, tokens per second and process CPU; with a fixed
// stress step time, wall time, also against the caching allocator and
// realloc-and-copy; the first token from the start; and, when the arena is
// not told to warm the whole budget, its peak physical memory against the
// caching allocator's.
func (r *report) servingTargets() []target {
	a, p := r.row("kv", "arena"), r.row("kv", "paged")
	if a == nil || p == nil || a.ServeNS == 0 {
		return nil
	}
	o := r.s.opts
	var ts []target
	if o.kv.Roofline {
		v := r.perRunOf("kv", "arena", "paged", tokensPerS)
		ts = append(ts, target{"kv, realistic step times: arena's tokens per second of serving ÷ the paged pool's", "≥ 0.99",
			fmt.Sprintf("%.3f (%.0f vs %.0f tokens/s)%s", median(v), a.TokensPerS, p.TokensPerS, runs3(v)), median(v) >= 0.99})
		v = r.perRunOf("kv", "arena", "paged", cpuOf)
		ts = append(ts, target{"kv, realistic step times: arena's process CPU ÷ the paged pool's", "≤ 1.02",
			fmt.Sprintf("%.3f (%s vs %s)%s", median(v), workload.HumanNS(float64(a.CPUNS)), workload.HumanNS(float64(p.CPUNS)), runs3(v)),
			median(v) <= 1.02})
	} else {
		v := r.perRunOf("kv", "arena", "paged", clockOf)
		got := fmt.Sprintf("%.3f (%s vs %s)%s", median(v), workload.HumanNS(a.ClockNS), workload.HumanNS(p.ClockNS), runs3(v))
		ok := median(v) <= 1.03
		for _, other := range []string{"caching", "realloc"} {
			if r.row("kv", other) == nil {
				continue
			}
			w := r.perRunOf("kv", "arena", other, clockOf)
			got += fmt.Sprintf("; ÷ %s %.3f%s", other, median(w), runs3(w))
			ok = ok && median(w) <= 1
		}
		ts = append(ts, target{"kv, stress step times: arena's wall time (device waits as modelled) ÷ the paged pool's (and ÷ caching's and realloc-and-copy's)", "≤ 1.03 (≤ 1)", got, ok})
	}
	v := r.perRunOf("kv", "arena", "paged", firstOf)
	ts = append(ts, target{"kv: first token from the process's start (setup included), arena ÷ the paged pool", "≤ 1",
		fmt.Sprintf("%.3f (%s vs %s)%s", median(v), workload.HumanNS(a.FirstTokenNS), workload.HumanNS(p.FirstTokenNS), runs3(v)), median(v) <= 1})
	if c := r.row("kv", "caching"); c != nil && o.warm == 0 {
		ts = append(ts, target{"kv, the pool not warmed to the budget: arena's peak physical memory ÷ the caching allocator's", "≤ 1",
			fmt.Sprintf("%.3f (%s vs %s)", float64(a.PeakPhysical)/float64(c.PeakPhysical), workload.HumanBytes(a.PeakPhysical),
				workload.HumanBytes(c.PeakPhysical)), a.PeakPhysical <= c.PeakPhysical})
	}
	return ts
}

// modelsTargets checks several models on one device: the arena's shared
// pool against the paged pools' static partition, at equal budget, in
// goodput and in the p99 time between tokens.
func (r *report) modelsTargets() []target {
	a, p := r.row("models", "arena"), r.row("models", "paged")
	if a == nil || p == nil {
		return nil
	}
	v := r.perRunOf("models", "arena", "paged", tokensPerS)
	t := r.perRunOf("models", "arena", "paged", func(x *workload.Result) float64 { return float64(x.TBTP99NS) })
	return []target{
		{"models: arena's goodput ÷ the paged pools' static partition, at equal budget", "≥ 1.5",
			fmt.Sprintf("%.2f (%.0f vs %.0f tokens/s)%s", median(v), a.TokensPerS, p.TokensPerS, runs3(v)), median(v) >= 1.5},
		{"models: arena's p99 time between tokens ÷ the static partition's", "≤ 1",
			fmt.Sprintf("%.2f (%s vs %s)%s", median(t), workload.HumanNS(float64(a.TBTP99NS)), workload.HumanNS(float64(p.TBTP99NS)), runs3(t)),
			median(t) <= 1},
	}
}

// runs3 lists per-run ratios, to three places, when there is more than one.
func runs3(v []float64) string {
	if len(v) < 2 {
		return ""
	}
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.3f", x)
	}
	return "; per run " + strings.Join(s, ", ")
}

// runs lists per-run ratios when there is more than one.
func runs(v []float64) string {
	if len(v) < 2 {
		return ""
	}
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprintf("%.2f", x)
	}
	return "; per run " + strings.Join(s, ", ")
}

func (r *report) row(w, st string) *row {
	for _, x := range r.Rows {
		if x.Workload == w && x.Strategy == st {
			return x
		}
	}
	return nil
}

func yes(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

// noiseFloor describes, for the step-latency target, the same ratio for a
// strategy that makes no driver call in any step (prealloc), when it ran:
// what the machine's own jitter gives at that time scale.
func (r *report) noiseFloor() string {
	p := r.row("kv", "prealloc")
	if p == nil || p.StepP50NS == 0 {
		return ""
	}
	return fmt.Sprintf("; for reference, prealloc, with no driver call in any step: %.2f", p.StepP99NS/p.StepP50NS)
}

// host reports whether the run is on the host driver, whose targets differ
// from a device's.
func (r *report) host() bool { return r.Device == "host" }

// targets checks the figures the project promises (docs/benchmarks.md) for
// whatever this run measured: on the host driver, the host's; elsewhere
// (a device, or the device model), the device's.
func (r *report) targets() []target {
	ts := append(r.servingTargets(), r.modelsTargets()...)
	o := r.s.opts
	chunkSize := o.arenaChunk(o.kv, r.Gran)
	if a, c := r.row("kv", "arena"), r.row("kv", "realloc"); a != nil && c != nil {
		mem, wall := r.perRun("kv", "realloc", "arena")
		ratio := median(mem)
		want, ok := "≥ 1× (aim 3×)", ratio >= 1
		if r.host() {
			want, ok = "≥ 5× faster", ratio >= 5
		}
		ts = append(ts, target{"kv: arena vs realloc-and-copy, time on the caller's critical path", want,
			fmt.Sprintf("%.2f× (%s vs %s)%s", ratio, workload.HumanNS(a.PathNS), workload.HumanNS(c.PathNS), runs(mem)), ok})
		if r.Touch {
			ratio := median(wall)
			ts = append(ts, target{"kv: arena vs realloc-and-copy, wall time (with the data writes; for reference)", "—",
				fmt.Sprintf("%.2f× (%s vs %s)%s", ratio, workload.HumanNS(a.WallNS), workload.HumanNS(c.WallNS), runs(wall)), true})
		}
	}
	if a, p := r.row("kv", "arena"), r.row("kv", "paged"); a != nil && p != nil {
		later, total := r.perRunLater("kv", "arena", "paged")
		ratio := median(later)
		ts = append(ts, target{"kv: arena's time on the caller's path ÷ the paged pool's (the no-driver floor), after the first step (warm-up apart), with committed memory no larger",
			"≤ 1.25×", fmt.Sprintf("%.2f× (%s vs %s, launch stalls included)%s; with the first step: %.2f× (%s vs %s; first step %s vs %s); committed %s vs %s",
				ratio, workload.HumanNS(float64(a.RestPathNS)+a.LaunchStallNS), workload.HumanNS(float64(p.RestPathNS)+p.LaunchStallNS), runs(later),
				median(total), workload.HumanNS(a.PathNS), workload.HumanNS(p.PathNS),
				workload.HumanNS(float64(a.WarmPathNS)), workload.HumanNS(float64(p.WarmPathNS)),
				workload.HumanBytes(a.PeakCommitted), workload.HumanBytes(p.PeakCommitted)),
			ratio <= 1.25 && a.PeakCommitted <= p.PeakCommitted})
	}
	if a, c := r.row("kv", "arena"), r.row("kv", "realloc"); a != nil && c != nil && a.CPUNS > 0 && c.CPUNS > 0 {
		ratio := float64(a.CPUNS) / float64(c.CPUNS)
		ts = append(ts, target{"kv: arena's process CPU (user + system, worker included) ÷ realloc-and-copy's", "≤ 1.1×",
			fmt.Sprintf("%.2f× (%s vs %s)", ratio, workload.HumanNS(float64(a.CPUNS)), workload.HumanNS(float64(c.CPUNS))), ratio <= 1.1})
	}
	if a := r.row("kv", "arena"); a != nil {
		if a.SteadyTokens > 0 && (o.headroomFor(o.kv) > 0 || blocksAhead(o.kv)) {
			ts = append(ts,
				target{"kv: steady state, driver calls per generated token on the critical path", "≤ 0.01",
					fmt.Sprintf("%.4f (%d calls%s, over %d tokens)", a.CallsPerToken, a.SteadyCalls, boundNote(a.PathExact), a.SteadyTokens),
					a.CallsPerToken <= 0.01},
				target{"kv: steady state, per-step allocation p99 ÷ p50", "≤ 2",
					fmt.Sprintf("%.2f (p50 %s, p99 %s)%s", a.StepP99NS/max(a.StepP50NS, 1), workload.HumanNS(a.StepP50NS),
						workload.HumanNS(a.StepP99NS), r.noiseFloor()), a.StepP99NS <= 2*a.StepP50NS})
		}
		if o.register != "none" && a.Tokens > 0 {
			ts = append(ts, target{fmt.Sprintf("kv: registrations per generated token (-register %s, each call charged %v, an estimate)", o.register, o.registerCost),
				"≤ 0.01", fmt.Sprintf("%.4f (%d registrations and %d deregistrations over %d tokens)", a.RegsPerToken, a.Registered, a.Deregistered, a.Tokens),
				a.RegsPerToken <= 0.01})
		}
		headroom, ahead := o.aheadFor(o.kv, chunkSize)
		limit := a.PeakLive + int64(a.Regions)*(headroom+chunkSize)
		ts = append(ts, target{"kv: arena peak committed physical", "≤ peak live + (" + ahead + " + 1 chunk) per arena",
			fmt.Sprintf("%s vs %s + %d×(%s + %s) = %s; held with what is free to take: %s (budget %s)",
				workload.HumanBytes(a.PeakCommitted), workload.HumanBytes(a.PeakLive), a.Regions, workload.HumanBytes(headroom),
				workload.HumanBytes(chunkSize), workload.HumanBytes(limit), workload.HumanBytes(a.PeakPhysical),
				workload.HumanBytes(o.budget(o.kv, r.Gran))), a.PeakCommitted <= limit})
		if c := r.row("kv", "realloc"); c != nil && a.PeakLive > 0 {
			ts = append(ts, target{"kv: realloc-and-copy peak physical (for reference)", "≈ 2× peak live",
				fmt.Sprintf("%.2f× peak live (arena committed %.2f×)", float64(c.PeakPhysical)/float64(c.PeakLive),
					float64(a.PeakCommitted)/float64(a.PeakLive)), true})
		}
	}
	for _, w := range o.workloads {
		a := r.row(w, "arena")
		if a == nil {
			continue
		}
		if o.stream {
			ts = append(ts, target{w + ": device-wide synchronisations by the arena (streams given)", "0",
				fmt.Sprintf("%d", a.DeviceSyncs), a.DeviceSyncs == 0})
		}
		if w == "models" {
			continue // the slots of models that do not run hold memory other models reclaim on demand
		}
		// The headroom is mapped and unused by design: it is what the
		// caller asked to keep ready, on top of the one chunk of slack; so
		// is a block prefetched ahead of the growth it is for.
		wl := o.workload(w)
		chunkSize := o.arenaChunk(wl, r.Gran)
		limit, want := int64(a.Regions)*chunkSize, "waste ≤ 1 chunk per arena"
		if ahead, what := o.aheadFor(wl, chunkSize); ahead > 0 {
			limit, want = int64(a.Regions)*(ahead+chunkSize), "waste ≤ "+what+" + 1 chunk per arena"
		}
		ts = append(ts, target{w + ": arena fragmentation", want,
			fmt.Sprintf("%.2f%% (%s over %d arenas, limit %s)", 100*a.Frag, workload.HumanBytes(a.Waste), a.Regions,
				workload.HumanBytes(limit)), a.Waste <= limit})
		if a.GrowOverhead > 0 {
			ts = append(ts, target{w + ": arena Grow ÷ bare driver calls", "≤ 1.10",
				fmt.Sprintf("%.3f over %d grows", a.GrowOverhead, len(a.grows)), a.GrowOverhead <= 1.10})
		}
	}
	if sw := r.Swap; sw != nil {
		x := sw.Ratios
		ts = append(ts,
			target{"swap: Offload Wake ÷ raw HtoD of the same bytes", "≤ 1.30",
				fmt.Sprintf("%.3f (%s vs %s for %s)", x.OffloadWakeVsHtoD, workload.HumanNS(float64(sw.OffloadWakeNS)),
					workload.HumanNS(float64(sw.RawHtoDNS)), workload.HumanBytes(sw.Bytes)), x.OffloadWakeVsHtoD <= 1.30},
			target{"swap: Offload Sleep ÷ raw DtoH", "≤ 1.30",
				fmt.Sprintf("%.3f (%s vs %s)", x.OffloadSleepVsDtoH, workload.HumanNS(float64(sw.OffloadSleepNS)),
					workload.HumanNS(float64(sw.RawDtoHNS))), x.OffloadSleepVsDtoH <= 1.30},
			target{"swap: Discard Sleep + Wake ÷ bare driver calls", "≤ 1.10",
				fmt.Sprintf("%.3f (%s vs %s)", x.DiscardCycleVsBare, workload.HumanNS(float64(sw.DiscardSleepNS+sw.DiscardWakeNS)),
					workload.HumanNS(float64(sw.BareNS))), x.DiscardCycleVsBare <= 1.10},
		)
	}
	if m := r.Micro; m != nil {
		ts = append(ts,
			target{"micro: Alloc fast path", "< 20 ns/op, 0 allocs/op",
				fmt.Sprintf("%.1f ns/op, %.3g allocs/op", m.AllocNS, m.AllocAllocs), m.AllocNS < 20 && m.AllocAllocs == 0},
			target{"micro: Grow from the cache ÷ cold Grow (p50)", "≤ 0.25",
				fmt.Sprintf("%.3f (%s vs %s)", m.CacheVsCold, workload.HumanNS(m.CacheP50NS), workload.HumanNS(m.ColdP50NS)),
				m.CacheVsCold > 0 && m.CacheVsCold <= 0.25},
			target{"micro: cold and cached Grow ÷ bare driver calls", "≤ 1.10",
				fmt.Sprintf("cold %.3f, cache %.3f", m.ColdOverhead, m.CacheOverhead), m.ColdOverhead <= 1.10 && m.CacheOverhead <= 1.10},
		)
	}
	return ts
}

func dash(v float64, f func(float64) string) string {
	if v == 0 {
		return "—"
	}
	return f(v)
}

func (r *report) printTable(w io.Writer) {
	o := r.s.opts
	for _, wname := range o.workloads {
		rows := []*row{}
		for _, x := range r.Rows {
			if x.Workload == wname {
				rows = append(rows, x)
			}
		}
		if len(rows) == 0 {
			continue
		}
		fmt.Fprintf(w, "== %s: %s\n", wname, o.workload(wname).Describe())
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		budgeted := rows[0].med.Demand > 0
		hdr := "strategy\twall\t÷arena\ton path\toff path\tsetup\tin driver\tcpu\tgrows\tgrow p50\tgrow p99\tgrow÷drv\tpeak phys\tcommitted\tfinal phys\tpeak live\tfrag\tcopied"
		if budgeted {
			hdr += "\tdenied\tserved"
		}
		fmt.Fprintln(tw, hdr+"\t")
		for _, x := range rows {
			ratio := "—"
			if x.WallVsArena > 0 {
				ratio = fmt.Sprintf("%.2f×", x.WallVsArena)
			}
			line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t%s",
				x.Strategy, workload.HumanNS(x.WallNS), ratio, workload.HumanNS(x.MemNS),
				dash(float64(x.WorkerNS), workload.HumanNS), workload.HumanNS(float64(x.SetupNS)),
				workload.HumanNS(float64(x.DriverNS)), workload.HumanNS(float64(x.CPUNS)),
				x.Grows, dash(x.GrowP50NS, workload.HumanNS), dash(x.GrowP99NS, workload.HumanNS),
				dash(x.GrowOverhead, func(v float64) string { return fmt.Sprintf("%.3f", v) }),
				workload.HumanBytes(x.PeakPhysical), workload.HumanBytes(x.PeakCommitted), workload.HumanBytes(x.FinalPhysical),
				workload.HumanBytes(x.PeakLive), 100*x.Frag, workload.HumanBytes(x.Copied))
			if budgeted {
				line += fmt.Sprintf("\t%d\t%.1f%%", x.Denied, 100*x.Served)
			}
			fmt.Fprintln(tw, line+"\t")
		}
		tw.Flush()
		// The caller's path against the floor, the steps' tails, warm-up
		// apart, and the process's CPU.
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "caller's path\ton path\tlaunch stall\tpath\t÷floor\tover floor\tfirst step\tlater steps\tstep p99.9\tstep max\tcpu\t")
		for _, x := range rows {
			vs, over := "—", "—"
			if x.Floor != "" {
				vs, over = fmt.Sprintf("%.2f× %s", x.VsFloor, x.Floor), signedNS(x.OverFloorNS)
			}
			p999, most, warm, steady := "—", "—", "—", "—"
			if len(x.med.StepAllNS) > 0 {
				p999, most = workload.HumanNS(x.StepP999NS), workload.HumanNS(x.StepMaxNS)
				warm, steady = workload.HumanNS(float64(x.WarmPathNS)), workload.HumanNS(float64(x.RestPathNS))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", x.Strategy, workload.HumanNS(x.MemNS),
				workload.HumanNS(x.LaunchStallNS), workload.HumanNS(x.PathNS), vs, over, warm, steady, p999, most,
				workload.HumanNS(float64(x.CPUNS)))
		}
		tw.Flush()
		if wname == "models" {
			r.printModels(w, rows)
		} else {
			r.printServing(w, rows)
		}
		// Driver calls by kind: count and time.
		kinds := []counting.Op{counting.MallocPhysical, counting.FreePhysical, counting.Reserve, counting.Release,
			counting.Map, counting.Unmap, counting.SetAccess, counting.Memset, counting.MemsetAsync, counting.DtoD,
			counting.HtoD}
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		h := "driver calls"
		for _, k := range kinds {
			h += "\t" + k.String()
		}
		fmt.Fprintln(tw, h+"\tin driver\t")
		for _, x := range rows {
			line := x.Strategy
			for _, k := range kinds {
				line += "\t" + callCell(x.calls, k)
			}
			fmt.Fprintln(tw, line+"\t"+workload.HumanNS(float64(x.DriverNS))+"\t")
			if x.WorkerNS > 0 {
				// The same calls, only those made while a step was inside a
				// strategy call (setup excluded): the caller's path (told
				// apart by thread; without, plus any worker call that
				// overlapped it, so an upper bound).
				line := "  on path"
				if !x.PathExact {
					line = "  on path (≤)"
				}
				for _, k := range kinds {
					line += "\t" + callCell(x.pathCalls, k)
				}
				_, ns := x.pathCalls.Total()
				fmt.Fprintln(tw, line+"\t"+workload.HumanNS(float64(ns))+"\t")
			}
		}
		tw.Flush()
		// Ordering, scrubs and pressure: what waits for the device, what is
		// cleared for a new tenant, what is taken back, and the steady
		// state of KV decode.
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "waits and scrubs\tdevice syncs\tstream syncs\tevent waits\trecord\tquery\tscrubs\tfresh\tqueued\treclaimed\tpreempted\tsteady calls/token\tstep p50\tstep p99\t")
		for _, x := range rows {
			scrubs, fresh, queued, reclaimed := "—", "—", "—", "—"
			if x.Pool != nil {
				scrubs, fresh, queued = fmt.Sprint(x.Scrubs), fmt.Sprint(x.ScrubsFresh), fmt.Sprint(x.ScrubsAsync)
				reclaimed = fmt.Sprint(x.Reclaimed)
			} else if x.calls.N[counting.Memset]+x.calls.N[counting.MemsetAsync] == 0 {
				scrubs = "none" // the strategy never scrubs
			}
			steady, p50, p99 := "—", "—", "—"
			if x.SteadyTokens > 0 {
				steady = fmt.Sprintf("%.4f", x.CallsPerToken)
				p50, p99 = workload.HumanNS(x.StepP50NS), workload.HumanNS(x.StepP99NS)
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t\n", x.Strategy, x.DeviceSyncs, x.StreamSyncs,
				x.EventWaits, x.calls.N[counting.RecordEvent], x.calls.N[counting.QueryEvent], scrubs, fresh, queued, reclaimed,
				x.Preempted, steady, p50, p99)
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	if m := r.Micro; m != nil {
		fmt.Fprintf(w, "== micro: the arena alone\n")
		fmt.Fprintf(w, "  Alloc(256, 64) in mapped memory: %.1f ns/op, %.3g allocs/op (%d ops)\n", m.AllocNS, m.AllocAllocs, m.AllocIters)
		fmt.Fprintf(w, "  Grow by one %s chunk, cold (MallocPhysical+map+access): p50 %s, p99 %s, ÷ driver %.3f (%d grows)\n",
			workload.HumanBytes(int64(m.ChunkSize)), workload.HumanNS(m.ColdP50NS), workload.HumanNS(m.ColdP99NS), m.ColdOverhead, len(m.Cold))
		fmt.Fprintf(w, "  Grow by one chunk from the reuse cache (map+access):   p50 %s, p99 %s, ÷ driver %.3f; cache ÷ cold = %.3f\n\n",
			workload.HumanNS(m.CacheP50NS), workload.HumanNS(m.CacheP99NS), m.CacheOverhead, m.CacheVsCold)
	}
	if sw := r.Swap; sw != nil {
		h := func(ns int64) string { return workload.HumanNS(float64(ns)) }
		x := sw.Ratios
		fmt.Fprintf(w, "== swap: %s\n", o.swap.Describe())
		fmt.Fprintf(w, "  %s in %s chunks; raw copies of it (pinned host memory, touched device memory): HtoD %s, DtoH %s; in 16 MiB steps %s, %s\n",
			workload.HumanBytes(sw.Bytes), workload.HumanBytes(sw.ChunkSize), h(sw.RawHtoDNS), h(sw.RawDtoHNS), h(sw.StepHtoDNS), h(sw.StepDtoHNS))
		fmt.Fprintf(w, "  Offload: sleep %s (÷ DtoH %.3f, ÷ the steps %.3f; the first, which pins its host buffer, %s), wake %s (÷ HtoD %.3f, ÷ the steps %.3f)\n",
			h(sw.OffloadSleepNS), x.OffloadSleepVsDtoH, x.OffloadSleepVsSteps, h(sw.OffloadFirstSleepNS), h(sw.OffloadWakeNS),
			x.OffloadWakeVsHtoD, x.OffloadWakeVsSteps)
		fmt.Fprintf(w, "  Discard: sleep %s + wake %s, ÷ the bare unmap, free, malloc, map and access calls (%s) %.3f\n",
			h(sw.DiscardSleepNS), h(sw.DiscardWakeNS), h(sw.BareNS), x.DiscardCycleVsBare)
		fmt.Fprintf(w, "  a full reload (close, new, alloc, copy in from Go memory) %s, %.2f× an Offload wake\n",
			h(sw.ReloadNS), x.ReloadVsOffloadWake)
		fmt.Fprintf(w, "  device free memory: %s awake, %s asleep (%s given back)\n\n", workload.HumanBytes(sw.FreeAwake),
			workload.HumanBytes(sw.FreeAsleep), workload.HumanBytes(sw.FreeAsleep-sw.FreeAwake))
	}
	if len(r.Targets) > 0 {
		fmt.Fprintf(w, "== targets (ratios within this run, driver %s)\n", r.Device)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, t := range r.Targets {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", yes(t.Met), t.Name, t.Want, t.Got)
		}
		tw.Flush()
	}
}

// printServing prints what a user of the server feels, for a workload whose
// runs served tokens: tokens per second of serving, the first token from the
// process's start, the setup and teardown, the times between tokens, and
// the wall and CPU time, each against the paged pool's where it ran.
func (r *report) printServing(w io.Writer, rows []*row) {
	if rows[0].ServeNS <= 0 {
		return
	}
	wname := rows[0].Workload
	var p *row
	for _, x := range rows {
		if x.Strategy == "paged" {
			p = x
		}
	}
	vs := func(num, den *workload.Result, f func(*workload.Result) float64) float64 {
		if d := f(den); d > 0 {
			return f(num) / d
		}
		return 0
	}
	ratio := func(x *row, f func(*workload.Result) float64) string {
		switch {
		case p == nil:
			return "—"
		case x == p:
			return "1"
		}
		var v []float64
		for _, pr := range r.pairs(wname, x.Strategy, "paged") {
			v = append(v, vs(pr[0], pr[1], f))
		}
		return fmt.Sprintf("%.3f", median(v))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "serving\ttokens/s\t÷paged\tfirst token\t÷paged\tsetup\tteardown\tcompute\ttbt p50\ttbt p99\ttbt max\twall*\t÷paged\tcpu\t÷paged\t")
	for _, x := range rows {
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", x.Strategy, x.TokensPerS, ratio(x, tokensPerS),
			workload.HumanNS(x.FirstTokenNS), ratio(x, func(r *workload.Result) float64 { return float64(r.FirstTokenNS) }),
			workload.HumanNS(float64(x.OpenNS)), workload.HumanNS(float64(x.TeardownNS)), workload.HumanNS(float64(x.ComputeNS)),
			workload.HumanNS(float64(x.TBTP50NS)), workload.HumanNS(float64(x.TBTP99NS)), workload.HumanNS(float64(x.TBTMaxNS)),
			workload.HumanNS(x.ClockNS), ratio(x, clockOf),
			workload.HumanNS(float64(x.CPUNS)), ratio(x, func(r *workload.Result) float64 { return float64(r.CPUNS) }))
	}
	tw.Flush()
	fmt.Fprintln(w, "  (tokens/s over the serving time; wall*: the run's wall time; both with every device wait as long as modelled, whatever else ran on the host)")
	if r.s.opts.kv.Load && wname == "kv" && !rows[0].med.Loaded {
		fmt.Fprintln(w, "  (the weights were not loaded: the device lacks room for them beside the budget)")
	}
}

// printModels prints what the users of several models on one device feel:
// goodput (tokens a second), against the paged pools' static partition in
// the same run, preemptions and refused admissions, the time to the first
// token and between tokens, and the models' sleeps and wakes.
func (r *report) printModels(w io.Writer, rows []*row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "serving models\tgoodput tokens/s\t÷paged\tfinished\tpreempted\tadmissions refused\tttft p50\tttft p99\ttbt p50\ttbt p99\ttbt max\tsleeps\twakes\tsleep+wake\tcpu\t")
	for _, x := range rows {
		vs := "—"
		if x.Strategy == "paged" {
			vs = "1"
		} else if v := r.perRunOf("models", x.Strategy, "paged", tokensPerS); len(v) > 0 {
			vs = fmt.Sprintf("%.2f", median(v))
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t\n", x.Strategy, x.TokensPerS, vs, x.Finished,
			x.Preempted, x.Denied, workload.HumanNS(float64(x.TTFTP50NS)), workload.HumanNS(float64(x.TTFTP99NS)),
			workload.HumanNS(float64(x.TBTP50NS)), workload.HumanNS(float64(x.TBTP99NS)), workload.HumanNS(float64(x.TBTMaxNS)),
			x.Sleeps, x.Wakes, workload.HumanNS(float64(x.SleepNS)), workload.HumanNS(float64(x.CPUNS)))
	}
	tw.Flush()
}

// signedNS formats a duration that may be negative.
func signedNS(ns float64) string {
	if ns < 0 {
		return "−" + workload.HumanNS(-ns)
	}
	return workload.HumanNS(ns)
}

// callCell is "n × mean" for the calls of kind k, or "—".
func callCell(c counting.Calls, k counting.Op) string {
	if c.N[k] == 0 {
		return "—"
	}
	return fmt.Sprintf("%d × %s", c.N[k], workload.HumanNS(float64(c.NS[k])/float64(c.N[k])))
}

func (r *report) writeJSON(w io.Writer) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	b, err = snakeKeys(b, "driver_calls", "driver_calls_on_path", "driver_calls_beside_path")
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = out.WriteTo(w)
	return err
}

// committed returns a run's peaks of physical and mapped memory that is not
// free to take, and its fragmentation and waste over the latter. Memory held
// but free to take (a cache, dropped arena memory) is not committed. Without
// any, the exact peaks the driver wrapper kept hold; with some, the peaks of
// the samples at the end of each step, compared with the live bytes sampled
// at the same moments.
func committed(res *workload.Result) (phys, mapped int64, frag float64, waste int64) {
	idle := false
	var live int64
	for _, sm := range res.Samples {
		phys = max(phys, sm.Committed())
		mapped = max(mapped, sm.CommittedMapped())
		live = max(live, sm.Live)
		idle = idle || sm.Cached > 0 || sm.Reclaimable > 0
	}
	if !idle {
		phys, mapped, live = res.Mem.PeakPhysical, res.Mem.PeakMapped, res.PeakLive
	}
	// Fragmentation as GMLake defines it.
	if mapped > 0 {
		frag = 1 - float64(live)/float64(mapped)
	}
	return phys, mapped, frag, mapped - live
}

var benchNames = map[string]string{"kv": "KVDecode", "scratch": "Scratch", "churn": "Churn"}

// writeBench writes Go benchmark format: one line per run, so benchstat sees
// every repetition.
func (r *report) writeBench(w io.Writer) error {
	fmt.Fprintf(w, "goos: %s\ngoarch: %s\npkg: github.com/vmarena/vmarena/bench\ncpu: %s\ndriver: %s\n",
		runtime.GOOS, runtime.GOARCH, r.CPU, r.Device)
	if r.Modelled != "" {
		fmt.Fprintf(w, "note: %s\n", r.Modelled)
	}
	procs := runtime.GOMAXPROCS(0)
	for _, res := range r.s.results {
		p50, p99, _, ovh := growStats(res.Grows)
		_, drvNS := res.Calls.Total()
		committedPhys, _, frag, _ := committed(res)
		if res.Pool != nil && res.Pool.WorkerSpins > 0 {
			ovh = 0 // the worker's calls run inside the Grows too (see summarise)
		}
		memCalls, _ := res.Calls.Sum(counting.MemoryOps...)
		first, later, _, _ := stepPath(res)
		var workerNS, throttledNS int64
		if res.Pool != nil {
			workerNS, throttledNS = res.Pool.WorkerNS, res.Pool.WorkerThrottledNS
		}
		fmt.Fprintf(w, "Benchmark%s/strategy=%s-%d\t1\t%d ns/op\t%d alloc-ns/op\t%d setup-ns/op\t%d worker-ns/op\t%d worker-throttled-ns/op\t%d driver-ns/op\t%d cpu-ns/op\t%.0f grow-p50-ns\t%.0f grow-p99-ns\t%.4f grow/driver\t%d peak-phys-B\t%d committed-B\t%d final-phys-B\t%d peak-mapped-B\t%.4f frag\t%d copied-B\t%d driver-calls\t%d device-syncs\t%d launch-stall-ns\t%d first-step-ns\t%d later-steps-ns\t%.1f tokens/s\t%d first-token-ns\t%d tbt-p50-ns\t%d tbt-p99-ns\n",
			benchNames[res.Workload], res.Strategy, procs, res.WallNS, res.MemNS, res.SetupNS, workerNS, throttledNS, drvNS, res.CPUNS, p50, p99, ovh,
			res.Mem.PeakPhysical, committedPhys, res.Final.Physical, res.Mem.PeakMapped, frag, res.Mem.Copied, memCalls,
			res.Calls.N[counting.SyncDevice], launchStall(res), first, later, tokensPerS(res), res.FirstTokenNS, res.TBTP50NS, res.TBTP99NS)
	}
	if m := r.Micro; m != nil {
		fmt.Fprintf(w, "BenchmarkAlloc-%d\t%d\t%.2f ns/op\t%.3g allocs/op\n", procs, m.AllocIters, m.AllocNS, m.AllocAllocs)
		for _, g := range []struct {
			name string
			ev   []workload.GrowEvent
		}{{"cold", m.Cold}, {"cache", m.Cache}} {
			p50, p99, mean, ovh := growStats(g.ev)
			var drv float64
			for _, e := range g.ev {
				drv += float64(e.DriverNS)
			}
			fmt.Fprintf(w, "BenchmarkGrow/from=%s/chunks=1-%d\t%d\t%.0f ns/op\t%.0f p50-ns\t%.0f p99-ns\t%.0f driver-ns/op\t%.4f grow/driver\n",
				g.name, procs, len(g.ev), mean, p50, p99, drv/float64(max(len(g.ev), 1)), ovh)
		}
	}
	return nil
}

// boundNote says, after a count of calls on the caller's path, whether it
// is exact or an upper bound.
func boundNote(exact bool) string {
	if exact {
		return ""
	}
	return ", an upper bound"
}
