// Package prom exports a metrics.Registry to Prometheus: New returns a
// prometheus.Collector to register with the program's Prometheus registry.
// It is a package of its own so that programs that do not use Prometheus
// do not link its client.
//
//	reg := metrics.NewRegistry()
//	reg.AddPool("kv", pool)
//	prometheus.MustRegister(prom.New(reg))
//	http.Handle("/metrics", promhttp.Handler())
//
// Every series of metrics.Metrics is exported with the arena's or pool's
// registry name in its "arena" or "pool" label; the Grow latency is a
// histogram (vmarena_arena_grow_seconds) with buckets doubling from 1 µs
// to about 4.2 s. Values are read at each scrape.
package prom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vmarena/vmarena/arena/metrics"
)

// Collector is a prometheus.Collector for a metrics.Registry.
type Collector struct {
	r     *metrics.Registry
	descs map[*metrics.Metric]*prometheus.Desc
}

// New returns a collector for r. Arenas and pools added to r later are
// exported too.
func New(r *metrics.Registry) *Collector {
	c := &Collector{r: r, descs: make(map[*metrics.Metric]*prometheus.Desc)}
	for _, m := range metrics.Metrics() {
		labels := []string{m.Owner}
		if m.Label != "" {
			labels = append(labels, m.Label)
		}
		c.descs[m] = prometheus.NewDesc(m.Name, m.Help, labels, nil)
	}
	return c
}

// Describe sends the descriptions of every metric.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range metrics.Metrics() {
		ch <- c.descs[m]
	}
}

// Collect reads the registry's arenas and pools and sends their values.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.r.Collect(func(s metrics.Sample) {
		desc := c.descs[s.Metric]
		labels := []string{s.Name}
		if s.Metric.Label != "" {
			labels = append(labels, s.Label)
		}
		var m prometheus.Metric
		var err error
		switch s.Metric.Kind {
		case metrics.Histogram:
			buckets := make(map[float64]uint64, len(s.Hist.Bounds))
			for i, le := range s.Hist.Bounds {
				buckets[le] = s.Hist.Buckets[i]
			}
			m, err = prometheus.NewConstHistogram(desc, s.Hist.Count, s.Hist.Sum, buckets, labels...)
		case metrics.Counter:
			m, err = prometheus.NewConstMetric(desc, prometheus.CounterValue, s.Value, labels...)
		default:
			m, err = prometheus.NewConstMetric(desc, prometheus.GaugeValue, s.Value, labels...)
		}
		if err != nil {
			m = prometheus.NewInvalidMetric(desc, err)
		}
		ch <- m
	})
}
