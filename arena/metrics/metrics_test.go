package metrics_test

import (
	"context"
	"encoding/json"
	"expvar"
	"fmt"
	"log"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/arena/metrics"
	"github.com/vmarena/vmarena/chunk"
)

const g = acl.HugePageSize

// world is a pool with a 4-chunk budget and two tenants, after known
// operations: kv grew by 3 chunks, used 1 and shrank; other took the two kv
// gave back (two moved scrubs); kv then failed to grow past what other left.
type world struct {
	pool      *chunk.Pool
	kv, other *arena.Arena
	reg       *metrics.Registry
}

func newWorld(t testing.TB) *world {
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	pool, err := chunk.New(d, chunk.Config{Budget: 4 * g})
	require.NoError(t, err)
	kv, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	other, err := arena.New(arena.Config{Pool: pool, Reserve: 8 << 20})
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.NoError(t, kv.Close())
		assert.NoError(t, other.Close())
		assert.NoError(t, pool.Close())
		assert.True(t, d.Live().Zero())
		assert.NoError(t, d.Close())
	})
	// Registered first: an arena times its growths once it is observed.
	reg := metrics.NewRegistry()
	require.NoError(t, reg.AddArena("kv", kv))
	require.NoError(t, reg.AddArena("other", other))
	require.NoError(t, reg.AddPool("shared", pool))
	require.NoError(t, kv.Grow(3*g))
	_, err = kv.Alloc(g, 1)
	require.NoError(t, err)
	require.NoError(t, kv.Shrink())
	require.NoError(t, other.Grow(2*g)) // the two kv gave back
	// Within the budget for kv alone, but other holds what it lacks.
	require.ErrorIs(t, kv.Grow(3*g), arena.ErrOutOfMemory)
	return &world{pool, kv, other, reg}
}

// values collects the registry's gauges and counters by
// "metric{name,label}".
func values(r *metrics.Registry) (map[string]float64, map[string]*metrics.Durations) {
	vals, hists := map[string]float64{}, map[string]*metrics.Durations{}
	r.Collect(func(s metrics.Sample) {
		k := s.Metric.Name + "{" + s.Name
		if s.Label != "" {
			k += "," + s.Label
		}
		k += "}"
		if s.Hist != nil {
			hists[k] = s.Hist
		} else {
			vals[k] = s.Value
		}
	})
	return vals, hists
}

func TestValuesAfterKnownOperations(t *testing.T) {
	w := newWorld(t)
	v, h := values(w.reg)
	for k, want := range map[string]float64{
		"vmarena_arena_reserved_bytes{kv}":         16 << 20,
		"vmarena_arena_mapped_bytes{kv}":           g,
		"vmarena_arena_used_bytes{kv}":             g,
		"vmarena_arena_reclaimable_bytes{kv}":      0,
		"vmarena_arena_peak_bytes{kv}":             g,
		"vmarena_arena_grows_total{kv}":            1,
		"vmarena_arena_shrinks_total{kv}":          1,
		"vmarena_arena_ooms_total{kv}":             1,
		"vmarena_arena_refills_total{kv}":          0,
		"vmarena_arena_headroom_bytes{kv}":         0,
		"vmarena_arena_headroom_misses_total{kv}":  0,
		"vmarena_arena_waits_total{kv}":            0,
		"vmarena_arena_mapped_bytes{other}":        2 * g,
		"vmarena_arena_reclaimable_bytes{other}":   0,
		"vmarena_pool_budget_bytes{shared}":        4 * g,
		"vmarena_pool_in_use_bytes{shared}":        3 * g,
		"vmarena_pool_held_bytes{shared}":          3 * g, // in use: the failed growth allocated nothing
		"vmarena_pool_cached_bytes{shared}":        0,
		"vmarena_pool_scrubs_total{shared,fresh}":  0, // the host driver's fresh memory is zero
		"vmarena_pool_scrubs_total{shared,moved}":  2, // other got both of kv's
		"vmarena_pool_scrubs_queued_total{shared}": 0,
		"vmarena_pool_ooms_total{shared}":          1,
		"vmarena_pool_device_syncs_total{shared}":  1, // kv's Shrink
		"vmarena_pool_waiters{shared}":             0,
		"vmarena_pool_used_bytes{shared}":          g, // kv's Len; other grew, but allocated nothing
		"vmarena_pool_arenas{shared}":              2,
	} {
		got, ok := v[k]
		if assert.True(t, ok, "%s is exported", k) {
			assert.Equal(t, want, got, k)
		}
	}
	grow := h["vmarena_arena_grow_seconds{kv}"]
	require.NotNil(t, grow)
	assert.Equal(t, uint64(2), grow.Count, "the failed growth is timed too")
	assert.Equal(t, grow.Count, grow.Buckets[len(grow.Buckets)-1])
	assert.Positive(t, grow.Sum)
	assert.Equal(t, 1e-6, grow.Bounds[0])
	assert.Len(t, grow.Bounds, arena.HistogramBuckets-1)

	// Every metric described is collected, for arenas and pools alike.
	names := map[string]bool{}
	w.reg.Collect(func(s metrics.Sample) { names[s.Metric.Name] = true })
	for _, m := range metrics.Metrics() {
		assert.True(t, names[m.Name], m.Name)
		assert.NotEmpty(t, m.Help, m.Name)
		assert.True(t, strings.HasPrefix(m.Name, "vmarena_"+m.Owner+"_"), m.Name)
	}
}

// A Snapshot holds what each pool's and arena's own calls return, and the
// samples Collect passes on are its values.
func TestSnapshot(t *testing.T) {
	w := newWorld(t)
	s := w.reg.Snapshot()
	require.Len(t, s.Pools, 1)
	require.Len(t, s.Arenas, 2)
	assert.Equal(t, "shared", s.Pools[0].Name)
	assert.Equal(t, w.pool.Stats(), s.Pools[0].Stats)
	assert.Equal(t, 2, s.Pools[0].Stats.Members)
	assert.Equal(t, int64(w.kv.Len()+w.other.Len()), s.Pools[0].Stats.UsedBytes)
	assert.Equal(t, "kv", s.Arenas[0].Name)
	assert.Equal(t, w.kv.Stats(), s.Arenas[0].Stats)
	assert.Equal(t, w.kv.Activity(), s.Arenas[0].Activity)
	assert.Equal(t, "other", s.Arenas[1].Name)

	v, _ := values(w.reg)
	assert.Equal(t, float64(s.Pools[0].Stats.HeldBytes), v["vmarena_pool_held_bytes{shared}"])
	assert.Equal(t, float64(s.Arenas[1].Stats.Mapped), v["vmarena_arena_mapped_bytes{other}"])

	// A closed arena leaves the pool's books: it is no longer counted.
	require.NoError(t, w.other.Close())
	p := w.reg.Snapshot().Pools[0].Stats
	assert.Equal(t, 1, p.Members)
	assert.Equal(t, int64(w.kv.Len()), p.UsedBytes)

	// A sleeping arena keeps its Len, but uses no device memory.
	require.NoError(t, w.kv.Sleep(context.Background(), arena.Discard))
	assert.Zero(t, w.reg.Snapshot().Pools[0].Stats.UsedBytes)
	assert.Equal(t, g, w.kv.Len())
	require.NoError(t, w.kv.Wake(context.Background()))
}

func TestRegistry(t *testing.T) {
	w := newWorld(t)
	require.ErrorIs(t, w.reg.AddArena("kv", w.other), metrics.ErrDuplicate)
	require.ErrorIs(t, w.reg.AddPool("shared", w.pool), metrics.ErrDuplicate)
	require.NoError(t, w.reg.AddPool("kv", w.pool), "arenas and pools have names of their own")
	require.ErrorIs(t, w.reg.AddArena("", w.kv), arena.ErrInvalid)
	require.ErrorIs(t, w.reg.AddArena("x", nil), arena.ErrInvalid)
	require.ErrorIs(t, w.reg.AddPool("x", nil), arena.ErrInvalid)
	w.reg.RemoveArena("other")
	w.reg.RemovePool("kv")
	w.reg.RemovePool("nobody")
	v, _ := values(w.reg)
	_, ok := v["vmarena_arena_mapped_bytes{other}"]
	assert.False(t, ok)
	_, ok = v["vmarena_pool_held_bytes{kv}"]
	assert.False(t, ok)
}

// expvarRuns numbers TestExpvar's runs: expvar names last for the process,
// and go test -count runs a test again in the same one.
var expvarRuns atomic.Int64

// The registry is an expvar.Var: JSON with the metrics' short names.
func TestExpvar(t *testing.T) {
	w := newWorld(t)
	name := fmt.Sprintf("vmarena_test_%d", expvarRuns.Add(1))
	require.NoError(t, w.reg.Publish(name))
	require.ErrorIs(t, w.reg.Publish(name), metrics.ErrDuplicate)
	var got struct {
		Arenas map[string]map[string]json.RawMessage
		Pools  map[string]map[string]json.RawMessage
	}
	require.NoError(t, json.Unmarshal([]byte(expvar.Get(name).String()), &got))
	assert.JSONEq(t, fmt.Sprint(g), string(got.Arenas["kv"]["mapped_bytes"]))
	assert.JSONEq(t, `{"fresh": 0, "moved": 2}`, string(got.Pools["shared"]["scrubs_total"]))
	var hist struct {
		Count   uint64
		Sum     float64
		Buckets []struct {
			LE    float64
			Count uint64
		}
	}
	require.NoError(t, json.Unmarshal(got.Arenas["kv"]["grow_seconds"], &hist))
	assert.Equal(t, uint64(2), hist.Count)
	require.Len(t, hist.Buckets, arena.HistogramBuckets-1)
	for i, b := range hist.Buckets {
		if i > 0 {
			assert.Greater(t, b.LE, hist.Buckets[i-1].LE, "buckets in the order of their bounds")
			assert.GreaterOrEqual(t, b.Count, hist.Buckets[i-1].Count, "cumulative")
		}
		if b.LE == 4.194304 {
			assert.Equal(t, uint64(2), b.Count)
		}
	}
	assert.Equal(t, 1e-6, hist.Buckets[0].LE)
	assert.Len(t, got.Arenas["kv"], 17)
}

// A program exports the arenas and pools it chooses, by name, through
// expvar: Publish serves them at /debug/vars with expvar's handler.
func ExampleRegistry() {
	pool, err := chunk.New(must(host.Default()), chunk.Config{Budget: 8 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	kv, err := arena.New(arena.Config{Pool: pool, Reserve: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer kv.Close()
	if err := kv.Grow(4 << 20); err != nil {
		log.Fatal(err)
	}

	reg := metrics.NewRegistry()
	if err := reg.AddArena("kv", kv); err != nil {
		log.Fatal(err)
	}
	if err := reg.AddPool("shared", pool); err != nil {
		log.Fatal(err)
	}
	if err := reg.Publish("vmarena"); err != nil {
		log.Fatal(err)
	}

	var vars struct {
		Arenas map[string]struct {
			Mapped float64 `json:"mapped_bytes"`
			Grows  float64 `json:"grows_total"`
		}
		Pools map[string]struct {
			Held   float64 `json:"held_bytes"`
			Budget float64 `json:"budget_bytes"`
		}
	}
	if err := json.Unmarshal([]byte(expvar.Get("vmarena").String()), &vars); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("kv: %v bytes mapped in %v growth\n", vars.Arenas["kv"].Mapped, vars.Arenas["kv"].Grows)
	fmt.Printf("shared: %v of %v bytes held\n", vars.Pools["shared"].Held, vars.Pools["shared"].Budget)
	// Output:
	// kv: 4.194304e+06 bytes mapped in 1 growth
	// shared: 4.194304e+06 of 8.388608e+06 bytes held
}

// A dashboard reads everything at once: the pool's figures, the bytes its
// arenas use, and the arenas a program named.
func ExampleRegistry_Snapshot() {
	pool, err := chunk.New(must(host.Default()), chunk.Config{Budget: 16 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	reg := metrics.NewRegistry()
	if err := reg.AddPool("kv", pool); err != nil {
		log.Fatal(err)
	}
	for range 3 { // three sequences, each with its cache
		seq, err := arena.New(arena.Config{Pool: pool, Reserve: 64 << 20})
		if err != nil {
			log.Fatal(err)
		}
		defer seq.Close()
		if _, err := seq.Alloc(3<<20, 256); err != nil { // 3 MiB of 4 mapped
			log.Fatal(err)
		}
	}

	s := reg.Snapshot()
	p := s.Pools[0].Stats
	fmt.Printf("%s: %d arenas use %d MiB of %d MiB held, budget %d MiB\n",
		s.Pools[0].Name, p.Members, p.UsedBytes>>20, p.HeldBytes>>20, p.Budget>>20)
	// Output:
	// kv: 3 arenas use 9 MiB of 12 MiB held, budget 16 MiB
}

func must[T any](v T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return v
}
