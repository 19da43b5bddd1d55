// Package metrics exports the counters and gauges of arenas and chunk pools
// that a program chooses, by name: through expvar (standard library) here,
// and through Prometheus with package metrics/prom, which only programs that
// want it link.
//
// Nothing is registered at import. A program makes a Registry, adds the
// arenas and pools it wants to watch under names of its choosing (the
// "arena" and "pool" labels), and publishes it:
//
//	reg := metrics.NewRegistry()
//	reg.AddPool("kv", pool)
//	reg.AddArena("weights", weights)
//	reg.Publish("vmarena")                      // expvar: /debug/vars
//	prometheus.MustRegister(prom.New(reg))      // Prometheus: package prom
//
// Watch pools by default and name arenas on request. A pool's series are
// the pool's alone, however many arenas draw on it (about 20, among them
// the bytes its arenas use, pool-wide, and how many there are), so a
// server with a sequence per request exports a fixed set; AddArena adds
// some 40 series for one arena, for the long-lived ones worth a line of
// their own (the weights), never per request.
//
// Snapshot returns everything the registry exports in one struct, for a
// dashboard or a status page; Collect, the expvar form and package prom
// read the registry through it. Values are read then (a scrape, an expvar
// read, a Snapshot), from chunk.Stats, arena.Stats and arena.Activity;
// nothing is kept in between, and the allocator's paths pay nothing for it. Reading an arena's Stats
// takes its lock, so a scrape waits for a growth under way on it. Remove an
// arena from the registry when it is closed; a closed arena still reports
// its last values.
//
// Metrics lists every series with its help text; the names follow
// Prometheus's conventions (base units, _total for counters), and the
// expvar form uses the same names without the vmarena_arena_ or
// vmarena_pool_ prefix.
package metrics

import (
	"encoding/json"
	"expvar"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// Kind is what a metric measures.
type Kind int

const (
	// Gauge is a value that goes up and down (bytes mapped, say).
	Gauge Kind = iota
	// Counter is a value that only grows (growths so far).
	Counter
	// Histogram is a distribution of durations, in seconds.
	Histogram
)

// Metric describes one metric, for every exporter alike.
type Metric struct {
	Name  string // the Prometheus name, e.g. "vmarena_arena_mapped_bytes"
	Help  string
	Kind  Kind
	Owner string // the label that names the arena or pool: "arena" or "pool"
	Label string // a second label, or "": "kind" for the scrubs
}

// key is the metric's name in the expvar form: without its prefix.
func (m *Metric) key() string {
	return strings.TrimPrefix(m.Name, "vmarena_"+m.Owner+"_")
}

// Sample is a metric's value for one arena or pool.
type Sample struct {
	Metric *Metric
	Name   string     // the arena's or pool's name in the registry
	Label  string     // the value of Metric.Label, if it has one
	Value  float64    // for gauges and counters
	Hist   *Durations // for histograms
}

// Durations is a histogram of durations in seconds, in the cumulative form
// Prometheus uses.
type Durations struct {
	Count   uint64
	Sum     float64   // seconds
	Bounds  []float64 // upper bounds of the buckets, seconds
	Buckets []uint64  // Buckets[i]: durations ≤ Bounds[i]
}

// row is a metric and how to read it.
type row[S any] struct {
	m     *Metric
	label string
	value func(S) float64
}

type arenaView struct {
	s   arena.Stats
	act arena.Activity
}

func am(name, help string, kind Kind) *Metric {
	return &Metric{Name: "vmarena_arena_" + name, Help: help, Kind: kind, Owner: "arena"}
}

func pm(name, help string, kind Kind) *Metric {
	return &Metric{Name: "vmarena_pool_" + name, Help: help, Kind: kind, Owner: "pool"}
}

var growSeconds = am("grow_seconds", "Time taken by growths that mapped memory on callers' paths (Grow, Alloc beyond Cap), failed ones included.", Histogram)

var arenaRows = []row[*arenaView]{
	{am("reserved_bytes", "Address space reserved.", Gauge), "", func(v *arenaView) float64 { return float64(v.s.Reserved) }},
	{am("mapped_bytes", "Bytes mapped (Cap).", Gauge), "", func(v *arenaView) float64 { return float64(v.s.Mapped) }},
	{am("used_bytes", "Bytes in use (Len).", Gauge), "", func(v *arenaView) float64 { return float64(v.s.Used) }},
	{am("reclaimable_bytes", "Bytes mapped above Len and what Grow promised: what a pool under pressure may take back.", Gauge), "", func(v *arenaView) float64 { return float64(v.s.Reclaimable) }},
	{am("peak_bytes", "The most bytes in use at once.", Gauge), "", func(v *arenaView) float64 { return float64(v.s.Peak) }},
	{am("grows_total", "Growths that mapped at least one chunk, the worker's refills included.", Counter), "", func(v *arenaView) float64 { return float64(v.s.Grows) }},
	{am("refills_total", "Growths the pool's worker made to refill the headroom.", Counter), "", func(v *arenaView) float64 { return float64(v.s.Refills) }},
	{am("headroom_bytes", "The headroom the pool's worker keeps above Len now, as learnt (0 without Config.Headroom).", Gauge), "", func(v *arenaView) float64 { return float64(v.s.Headroom) }},
	{am("headroom_misses_total", "Growths that mapped on callers' paths although the arena keeps headroom.", Counter), "", func(v *arenaView) float64 { return float64(v.s.Misses) }},
	{am("shrinks_total", "Shrinks that gave chunks back.", Counter), "", func(v *arenaView) float64 { return float64(v.act.Shrinks) }},
	{am("reclaimed_chunks_total", "Chunks the pool took back under pressure.", Counter), "", func(v *arenaView) float64 { return float64(v.s.Reclaimed) }},
	{am("maps_total", "Chunks placed in the arena's range.", Counter), "", func(v *arenaView) float64 { return float64(v.s.Maps) }},
	{am("unmaps_total", "Chunks taken out of the arena's range.", Counter), "", func(v *arenaView) float64 { return float64(v.s.Unmaps) }},
	{am("ooms_total", "Growths on callers' paths that failed for want of memory (a wait that gave up counts once).", Counter), "", func(v *arenaView) float64 { return float64(v.act.OOMs) }},
	{am("waits_total", "GrowContext and AllocContext calls that waited for memory.", Counter), "", func(v *arenaView) float64 { return float64(v.act.Waits) }},
	{am("wait_seconds_total", "Time spent waiting for memory.", Counter), "", func(v *arenaView) float64 { return v.act.WaitTime.Seconds() }},
	{growSeconds, "", nil},
}

var scrubs = &Metric{Name: "vmarena_pool_scrubs_total", Owner: "pool", Kind: Counter, Label: "kind",
	Help: "Chunks cleared so that no tenant reads another's bytes, by kind: fresh from the driver, or moved between tenants."}

var poolRows = []row[*chunk.Stats]{
	{pm("held_bytes", "Physical bytes held: in use, waiting for the device, cached.", Gauge), "", func(s *chunk.Stats) float64 { return float64(s.HeldBytes) }},
	{pm("in_use_bytes", "Bytes of chunks handed out (mapped, or waiting for the device).", Gauge), "", func(s *chunk.Stats) float64 { return float64(s.InUseBytes) }},
	{pm("cached_bytes", "Bytes of chunks in the reuse cache.", Gauge), "", func(s *chunk.Stats) float64 { return float64(s.CachedBytes) }},
	{pm("pending_bytes", "Bytes of chunks released and waiting for the device before they are unmapped.", Gauge), "", func(s *chunk.Stats) float64 { return float64(s.PendingBytes) }},
	{pm("budget_bytes", "The pool's budget; 0 when none.", Gauge), "", func(s *chunk.Stats) float64 { return float64(s.Budget) }},
	{pm("used_bytes", "Bytes in use in the pool's arenas: the sum of their Len, while awake.", Gauge), "", func(s *chunk.Stats) float64 { return float64(s.UsedBytes) }},
	{pm("arenas", "Arenas drawing on the pool (its members).", Gauge), "", func(s *chunk.Stats) float64 { return float64(s.Members) }},
	{pm("hits_total", "Chunks handed out from the cache.", Counter), "", func(s *chunk.Stats) float64 { return float64(s.Hits) }},
	{pm("allocs_total", "Physical allocations.", Counter), "", func(s *chunk.Stats) float64 { return float64(s.Allocs) }},
	{pm("frees_total", "Physical frees.", Counter), "", func(s *chunk.Stats) float64 { return float64(s.Frees) }},
	{pm("ooms_total", "Acquires that failed for want of memory (budget or device).", Counter), "", func(s *chunk.Stats) float64 { return float64(s.Failures) }},
	{scrubs, "fresh", func(s *chunk.Stats) float64 { return float64(s.ScrubsFresh) }},
	{scrubs, "moved", func(s *chunk.Stats) float64 { return float64(s.Scrubs - s.ScrubsFresh) }},
	{pm("scrubs_queued_total", "Scrubs queued on the tenant's stream instead of waited for.", Counter), "", func(s *chunk.Stats) float64 { return float64(s.ScrubsAsync) }},
	{pm("reclaimed_chunks_total", "Chunks taken back from members under pressure.", Counter), "", func(s *chunk.Stats) float64 { return float64(s.Reclaimed) }},
	{pm("peer_trimmed_chunks_total", "Cached chunks other pools on the device freed for this one.", Counter), "", func(s *chunk.Stats) float64 { return float64(s.PeerTrimmed) }},
	{pm("device_syncs_total", "Waits for the whole device before unmapping.", Counter), "", func(s *chunk.Stats) float64 { return float64(s.DeviceSyncs) }},
	{pm("ordered_releases_total", "Chunks unmapped once their events completed, without a device-wide wait.", Counter), "", func(s *chunk.Stats) float64 { return float64(s.Ordered) }},
	{pm("sync_fallbacks_total", "Stream-ordered releases that fell back to a device-wide wait.", Counter), "", func(s *chunk.Stats) float64 { return float64(s.SyncFallbacks) }},
	{pm("worker_seconds_total", "Time the background worker spent working.", Counter), "", func(s *chunk.Stats) float64 { return float64(s.WorkerNS) / 1e9 }},
	{pm("worker_throttled_seconds_total", "Time the background worker held its rounds back to stay within its CPU cap.", Counter), "", func(s *chunk.Stats) float64 { return float64(s.WorkerThrottledNS) / 1e9 }},
	{pm("waiters", "Growths waiting for memory in the pool's queue.", Gauge), "", func(s *chunk.Stats) float64 { return float64(s.Waiters) }},
}

// Metrics returns every metric a Registry exports.
func Metrics() []*Metric {
	var ms []*Metric
	add := func(m *Metric) {
		if !slices.Contains(ms, m) {
			ms = append(ms, m)
		}
	}
	for _, r := range arenaRows {
		add(r.m)
	}
	for _, r := range poolRows {
		add(r.m)
	}
	return ms
}

// Registry is a set of arenas and pools to export, by name. It is safe for
// concurrent use.
type Registry struct {
	mu     sync.Mutex
	arenas []member[*arena.Arena]
	pools  []member[*chunk.Pool]
}

type member[T any] struct {
	name string
	v    T
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{} }

// AddArena exports a under name (its "arena" label): a non-empty, valid
// UTF-8 string (ErrInvalid otherwise), unique among the registry's arenas. From then on the arena times its growths for the
// grow-latency histogram (an arena nobody observes reads no clock).
func (r *Registry) AddArena(name string, a *arena.Arena) error {
	if a == nil {
		return fmt.Errorf("metrics: add arena %q: %w: nil arena", name, arena.ErrInvalid)
	}
	if err := add(r, &r.arenas, name, a); err != nil {
		return err
	}
	a.Activity() // starts the timing
	return nil
}

// AddPool exports p under name (its "pool" label): a non-empty, valid UTF-8
// string (ErrInvalid otherwise), unique among the registry's pools.
func (r *Registry) AddPool(name string, p *chunk.Pool) error {
	if p == nil {
		return fmt.Errorf("metrics: add pool %q: %w: nil pool", name, arena.ErrInvalid)
	}
	return add(r, &r.pools, name, p)
}

func add[T any](r *Registry, list *[]member[T], name string, v T) error {
	if name == "" {
		return fmt.Errorf("metrics: %w: empty name", arena.ErrInvalid)
	}
	if !utf8.ValidString(name) { // a label value: Prometheus refuses the scrape
		return fmt.Errorf("metrics: %w: name %q is not valid UTF-8", arena.ErrInvalid, name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.ContainsFunc(*list, func(m member[T]) bool { return m.name == name }) {
		return fmt.Errorf("metrics: %w: %q", ErrDuplicate, name)
	}
	*list = append(*list, member[T]{name, v})
	return nil
}

// RemoveArena stops exporting the arena named name, if there is one.
func (r *Registry) RemoveArena(name string) { remove(r, &r.arenas, name) }

// RemovePool stops exporting the pool named name, if there is one.
func (r *Registry) RemovePool(name string) { remove(r, &r.pools, name) }

func remove[T any](r *Registry, list *[]member[T], name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*list = slices.DeleteFunc(*list, func(m member[T]) bool { return m.name == name })
}

// A Snapshot is everything a Registry exports, read in one call: what a
// dashboard shows, as PyTorch's memory_stats is for its allocator. Collect,
// the expvar form and package prom all read the registry through it, so
// the three agree with it.
type Snapshot struct {
	Pools  []PoolSnapshot  // in the order they were added
	Arenas []ArenaSnapshot // likewise: only those added by name (AddArena)
}

// A PoolSnapshot is a pool's values: its Stats, which count its chunks and
// the arenas drawing on it (Members, UsedBytes: the bytes in use, pool-wide).
type PoolSnapshot struct {
	Name  string
	Stats chunk.Stats
}

// An ArenaSnapshot is an arena's values.
type ArenaSnapshot struct {
	Name     string
	Stats    arena.Stats
	Activity arena.Activity
}

// Snapshot reads every pool and arena of the registry once. A pool's
// figures are read under its mutex, at one moment; an arena's Stats under
// its lock (so a Snapshot waits for a growth under way on it), its
// Activity without; pools and arenas are read one after another, not at
// one moment together.
func (r *Registry) Snapshot() Snapshot {
	r.mu.Lock()
	arenas, pools := slices.Clone(r.arenas), slices.Clone(r.pools)
	r.mu.Unlock()
	s := Snapshot{Pools: make([]PoolSnapshot, 0, len(pools)), Arenas: make([]ArenaSnapshot, 0, len(arenas))}
	for _, m := range pools {
		s.Pools = append(s.Pools, PoolSnapshot{Name: m.name, Stats: m.v.Stats()})
	}
	for _, m := range arenas {
		s.Arenas = append(s.Arenas, ArenaSnapshot{Name: m.name, Stats: m.v.Stats(), Activity: m.v.Activity()})
	}
	return s
}

// Collect reads every arena and pool once (a Snapshot) and passes f a
// Sample per series: arenas, then pools, in the order they were added.
func (r *Registry) Collect(f func(Sample)) {
	s := r.Snapshot()
	for i := range s.Arenas {
		a := &s.Arenas[i]
		v := &arenaView{a.Stats, a.Activity}
		for _, row := range arenaRows {
			if row.m.Kind == Histogram {
				f(Sample{Metric: row.m, Name: a.Name, Hist: durations(v.act.GrowTime)})
				continue
			}
			f(Sample{Metric: row.m, Name: a.Name, Label: row.label, Value: row.value(v)})
		}
	}
	for i := range s.Pools {
		p := &s.Pools[i]
		for _, row := range poolRows {
			f(Sample{Metric: row.m, Name: p.Name, Label: row.label, Value: row.value(&p.Stats)})
		}
	}
}

// durations converts an arena histogram to the cumulative form.
func durations(h arena.Histogram) *Durations {
	d := &Durations{Count: h.Count, Sum: h.Sum.Seconds()}
	var cum uint64
	for i := range arena.HistogramBuckets - 1 {
		cum += h.Counts[i]
		d.Bounds = append(d.Bounds, arena.HistogramBound(i).Seconds())
		d.Buckets = append(d.Buckets, cum)
	}
	return d
}

// String returns the registry's values as JSON, so that a Registry is an
// expvar.Var: {"arenas": {name: {metric: value}}, "pools": {…}}, with the
// metric names of Metrics less their prefix; a labelled metric is an object
// by label value, a histogram {"count", "sum", "buckets": [{"le", "count"}, …]}
// with its cumulative buckets in the order of their bounds (seconds).
func (r *Registry) String() string {
	out := map[string]map[string]map[string]any{"arenas": {}, "pools": {}}
	r.Collect(func(s Sample) {
		owner := out[s.Metric.Owner+"s"]
		vals := owner[s.Name]
		if vals == nil {
			vals = map[string]any{}
			owner[s.Name] = vals
		}
		k := s.Metric.key()
		switch {
		case s.Hist != nil:
			// A list, not an object: JSON objects' keys sort as strings,
			// which puts 1e-06 after 0.5.
			b := make([]bucket, len(s.Hist.Bounds))
			for i, le := range s.Hist.Bounds {
				b[i] = bucket{LE: le, Count: s.Hist.Buckets[i]}
			}
			vals[k] = map[string]any{"count": s.Hist.Count, "sum": s.Hist.Sum, "buckets": b}
		case s.Metric.Label != "":
			byLabel, _ := vals[k].(map[string]float64)
			if byLabel == nil {
				byLabel = map[string]float64{}
				vals[k] = byLabel
			}
			byLabel[s.Label] = s.Value
		default:
			vals[k] = s.Value
		}
	})
	b, err := json.Marshal(out)
	if err != nil {
		return strconv.Quote(err.Error())
	}
	return string(b)
}

// bucket is a histogram bucket in the expvar form: the durations of at most
// LE seconds.
type bucket struct {
	LE    float64 `json:"le"`
	Count uint64  `json:"count"`
}

// Publish publishes the registry through expvar under name (served at
// /debug/vars by expvar's handler). Unlike expvar.Publish it does not
// panic when the name is taken: it returns an error matching ErrDuplicate.
func (r *Registry) Publish(name string) (err error) {
	if expvar.Get(name) != nil {
		return fmt.Errorf("metrics: %w: expvar %q", ErrDuplicate, name)
	}
	defer func() {
		if recover() != nil { // published by someone else since Get
			err = fmt.Errorf("metrics: %w: expvar %q", ErrDuplicate, name)
		}
	}()
	expvar.Publish(name, r)
	return nil
}
