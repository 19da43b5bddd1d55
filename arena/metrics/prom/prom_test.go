package prom_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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

// scrape serves pr as Prometheus scrapes it and returns the series (the
// lines that are not comments) and the size of the body.
func scrape(t *testing.T, pr *prometheus.Registry) (series []string, size int) {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(pr, promhttp.HandlerOpts{ErrorHandling: promhttp.PanicOnError}).ServeHTTP(rec,
		httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	body := rec.Body.String()
	for l := range strings.SplitSeq(body, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			series = append(series, l)
		}
	}
	return series, len(body)
}

// By default a pool's series are the pool's alone, however many arenas draw
// on it: 16 arenas on one pool export the same series as one, at most 60,
// and the pool-wide gauges say how much they use. Per-arena series are
// there on request (AddArena).
func TestSeriesPerPool(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 256 << 20})
	require.NoError(t, err)
	defer d.Close()
	pool, err := chunk.New(d, chunk.Config{})
	require.NoError(t, err)
	defer pool.Close()
	reg := metrics.NewRegistry()
	require.NoError(t, reg.AddPool("kv", pool))
	pr := prometheus.NewPedanticRegistry()
	require.NoError(t, pr.Register(prom.New(reg)))

	var arenas []*arena.Arena
	defer func() {
		for _, a := range arenas {
			assert.NoError(t, a.Close())
		}
	}()
	var used int
	var one []string
	for i := range 16 {
		a, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
		require.NoError(t, err)
		arenas = append(arenas, a)
		_, err = a.Alloc((i+1)<<16, 256)
		require.NoError(t, err)
		used += a.Len()
		if i == 0 {
			one, _ = scrape(t, pr)
		}
	}
	series, size := scrape(t, pr)
	assert.LessOrEqual(t, len(series), 60)
	assert.Len(t, series, len(one), "the default series do not grow with the arenas")
	assert.Contains(t, series, fmt.Sprintf(`vmarena_pool_used_bytes{pool="kv"} %v`, float64(used)), "the bytes in use, pool-wide")
	assert.Contains(t, series, `vmarena_pool_arenas{pool="kv"} 16`)
	t.Logf("16 arenas on one pool: %d series, %d bytes per scrape", len(series), size)

	for i, a := range arenas {
		require.NoError(t, reg.AddArena(fmt.Sprint("seq", i), a))
	}
	all, allSize := scrape(t, pr)
	per := (len(all) - len(series)) / 16
	assert.Equal(t, len(series)+16*per, len(all))
	assert.Positive(t, per)
	t.Logf("with every arena by name (AddArena): %d series (%d per arena), %d bytes per scrape", len(all), per, allSize)
}
