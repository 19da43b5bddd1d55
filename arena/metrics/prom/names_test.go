package prom_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena/metrics"
	"github.com/vmarena/vmarena/arena/metrics/prom"
	"github.com/vmarena/vmarena/chunk"
)

// A name the registry accepts never breaks a scrape: either AddPool refuses
// it, or every series is exported.
func TestNameNotUTF8(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer d.Close()
	pool, err := chunk.New(d, chunk.Config{Budget: 4 * g})
	require.NoError(t, err)
	defer pool.Close()
	reg := metrics.NewRegistry()
	require.NoError(t, reg.AddPool("good", pool))
	if err := reg.AddPool("bad\xff", pool); err != nil {
		return // refused: fine
	}
	pr := prometheus.NewRegistry()
	require.NoError(t, pr.Register(prom.New(reg)))
	_, err = pr.Gather()
	require.NoError(t, err, "a name AddPool accepted broke the whole scrape")
}
