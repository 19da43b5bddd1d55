package prom_test

import (
	"fmt"
	"log"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/arena/metrics"
	"github.com/vmarena/vmarena/arena/metrics/prom"
	"github.com/vmarena/vmarena/chunk"
)

const g = acl.HugePageSize

// find returns the series of family name whose labels include want.
func find(t *testing.T, fams []*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	t.Helper()
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if got[k] != v {
					continue series
				}
			}
			return m
		}
	}
	t.Fatalf("no series %s%v", name, want)
	return nil
}

func TestCollector(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer d.Close()
	pool, err := chunk.New(d, chunk.Config{Budget: 4 * g})
	require.NoError(t, err)
	defer pool.Close()
	kv, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	defer kv.Close()
	reg := metrics.NewRegistry() // registered first: an arena times its growths once observed
	require.NoError(t, reg.AddArena("kv", kv))
	require.NoError(t, reg.AddPool("shared", pool))
	require.NoError(t, kv.Grow(2*g))
	require.ErrorIs(t, kv.Grow(5*g), arena.ErrOutOfMemory)
	c := prom.New(reg)

	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names and help follow Prometheus's conventions")

	// The pedantic registry checks that what is collected matches what is
	// described.
	pr := prometheus.NewPedanticRegistry()
	require.NoError(t, pr.Register(c))
	fams, err := pr.Gather()
	require.NoError(t, err)
	assert.Equal(t, float64(2*g), find(t, fams, "vmarena_arena_mapped_bytes", map[string]string{"arena": "kv"}).GetGauge().GetValue())
	assert.Equal(t, float64(1), find(t, fams, "vmarena_arena_ooms_total", map[string]string{"arena": "kv"}).GetCounter().GetValue())
	assert.Equal(t, float64(4*g), find(t, fams, "vmarena_pool_budget_bytes", map[string]string{"pool": "shared"}).GetGauge().GetValue())
	assert.Equal(t, float64(0), find(t, fams, "vmarena_pool_scrubs_total", map[string]string{"pool": "shared", "kind": "moved"}).GetCounter().GetValue())
	h := find(t, fams, "vmarena_arena_grow_seconds", map[string]string{"arena": "kv"}).GetHistogram()
	assert.Equal(t, uint64(2), h.GetSampleCount())
	assert.Len(t, h.GetBucket(), arena.HistogramBuckets-1)
	assert.Equal(t, 1e-6, h.GetBucket()[0].GetUpperBound())

	// Arenas added later are collected too; removed ones are not.
	other, err := arena.New(arena.Config{Pool: pool, Reserve: 8 << 20})
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, reg.AddArena("other", other))
	assert.Equal(t, 2, testutil.CollectAndCount(c, "vmarena_arena_mapped_bytes"))
	reg.RemoveArena("other")
	assert.Equal(t, 1, testutil.CollectAndCount(c, "vmarena_arena_mapped_bytes"))
}

// A program registers the collector with its Prometheus registry, and
// serves it (promhttp.Handler) as usual.
func ExampleNew() {
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

	reg := metrics.NewRegistry() // first: from then on the arena times its growths
	if err := reg.AddArena("kv", kv); err != nil {
		log.Fatal(err)
	}
	if err := reg.AddPool("shared", pool); err != nil {
		log.Fatal(err)
	}
	if err := kv.Grow(4 << 20); err != nil {
		log.Fatal(err)
	}
	pr := prometheus.NewRegistry()
	if err := pr.Register(prom.New(reg)); err != nil {
		log.Fatal(err)
	}

	fams, err := pr.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range fams {
		switch f.GetName() {
		case "vmarena_arena_mapped_bytes", "vmarena_pool_held_bytes":
			m := f.GetMetric()[0]
			fmt.Printf("%s{%s=%q} %v\n", f.GetName(), m.GetLabel()[0].GetName(), m.GetLabel()[0].GetValue(),
				m.GetGauge().GetValue())
		case "vmarena_arena_grow_seconds":
			fmt.Printf("%s: %d growth\n", f.GetName(), f.GetMetric()[0].GetHistogram().GetSampleCount())
		}
	}
	// Output:
	// vmarena_arena_grow_seconds: 1 growth
	// vmarena_arena_mapped_bytes{arena="kv"} 4.194304e+06
	// vmarena_pool_held_bytes{pool="shared"} 4.194304e+06
}

func must[T any](v T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return v
}
