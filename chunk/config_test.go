package chunk_test

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/chunk"
)

// Every Config that cannot work is refused by New, with one error that
// names the field and the rule, and New makes no allocation.
func TestConfigErrorsNameTheField(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 256 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	const g = 2 << 20
	for _, c := range []struct {
		cfg  chunk.Config
		want string
	}{
		{chunk.Config{Size: -1}, "Config.Size -1: want 0"},
		{chunk.Config{Size: 3 << 20}, "Config.Size 3145728 bytes (3 MiB) is not a multiple of the driver's granularity, 2097152 bytes (2 MiB)"},
		{chunk.Config{Size: 256 << 30}, "(256 GiB) exceeds host's largest reservation, 137438953472 bytes (128 GiB)"},
		{chunk.Config{TailSize: -1}, "Config.TailSize -1: want 0 (the pool's choice, DefaultTailSize) or a multiple of the granularity that divides Config.Size"},
		{chunk.Config{Size: 4 * g, TailSize: 3 << 20}, "Config.TailSize 3145728 bytes (3 MiB) is not a multiple of the driver's granularity, 2097152 bytes (2 MiB)"},
		{chunk.Config{Size: 4 * g, TailSize: 8 * g}, "Config.TailSize 16777216 bytes (16 MiB) is larger than Config.Size, 8 MiB"},
		{chunk.Config{Size: 2 * g, TailSize: 4 * g}, "Config.TailSize 8388608 bytes (8 MiB) is larger than Config.Size, 4 MiB"},
		{chunk.Config{Size: 3 * g, TailSize: 2 * g}, "Config.TailSize 4194304 bytes (4 MiB) does not divide Config.Size, 6 MiB"},
		{chunk.Config{TailSize: 2 * g}, "Config.TailSize 4194304 bytes (4 MiB) does not divide the chunk size the pool chose for Config.Size 0, 2 MiB (see SizeFor)"},
		{chunk.Config{Budget: 64 << 30, TailSize: 3 * g}, "Config.TailSize 6291456 bytes (6 MiB) does not divide the chunk size the pool chose for Config.Size 0, 32 MiB"},
		{chunk.Config{Budget: -1}, "Config.Budget -1: want 0"},
		{chunk.Config{Budget: 1}, "Config.Budget 1 bytes is less than one chunk, 2 MiB"},
		{chunk.Config{Ahead: -1}, "Config.Ahead -1: want 0"},
		{chunk.Config{Ahead: 1_000_000}, "Config.Ahead 1000000 exceeds the reuse cache's bound, 256 chunks"},
		{chunk.Config{Ahead: 10, MaxCached: 4}, "Config.Ahead 10 exceeds the reuse cache's bound, 4 chunks"},
		{chunk.Config{Ahead: 1, MaxCached: -1}, "Config.Ahead 1 needs the reuse cache, which Config.MaxCached -1 disables"},
		{chunk.Config{Ahead: 8, Budget: 4 * g}, "Config.Ahead 8 chunks of 2 MiB (16 MiB) exceed Config.Budget, 8388608 bytes (8 MiB)"},
		{chunk.Config{Ahead: 200, MaxCached: 1000}, "Config.Ahead 200 chunks of 2 MiB (400 MiB) exceed the device's memory, 256 MiB"},
		{chunk.Config{Scrub: 9}, "Config.Scrub chunk.Scrub(9): want ScrubOnReuse"},
		{chunk.Config{MemAttr: 99}, "Config.MemAttr"},
		{chunk.Config{WorkerCPU: -0.25}, "Config.WorkerCPU -0.25: want 0 (no cap) or a share of one CPU from 0.01 to 1"},
		{chunk.Config{WorkerCPU: math.NaN()}, "Config.WorkerCPU NaN: want 0"},
		{chunk.Config{WorkerCPU: 1.5}, "Config.WorkerCPU 1.5: want 0"},
		{chunk.Config{WorkerCPU: math.Inf(1)}, "Config.WorkerCPU +Inf: want 0"},
		{chunk.Config{WorkerCPU: 0.001}, "Config.WorkerCPU 0.001: want 0"},
	} {
		p, err := chunk.New(d, c.cfg)
		if !assert.Error(t, err, "%+v", c.cfg) {
			require.NoError(t, p.Close())
			continue
		}
		assert.ErrorIs(t, err, acl.ErrInvalidParam, "%+v", c.cfg)
		assert.Contains(t, err.Error(), c.want)
		assert.True(t, strings.HasPrefix(err.Error(), "chunk: "), err.Error())
		assert.NotContains(t, err.Error(), "\n")
	}
	assert.True(t, d.Live().Zero(), "%+v", d.Live())

	// The limits themselves are accepted.
	for _, cfg := range []chunk.Config{{Budget: g}, {Ahead: 4, Budget: 4 * g}, {Ahead: 64}, {WorkerCPU: 0.01}, {WorkerCPU: 1},
		{Size: 4 * g, TailSize: g}, {Size: 4 * g, TailSize: 2 * g}, {Budget: 4 << 30, TailSize: g}} {
		p, err := chunk.New(d, cfg)
		require.NoError(t, err, "%+v", cfg)
		require.NoError(t, p.Close())
	}

	// A TailSize equal to the chunk size, given or chosen, is a pool of one
	// size; TailSize 0 is the pool's choice (DefaultTailSize): a quarter of
	// the chunk where that is a multiple of the granularity, else one size.
	for _, c := range []struct {
		cfg         chunk.Config
		large, tail int
	}{
		{chunk.Config{TailSize: g}, g, g},
		{chunk.Config{Budget: 4 << 30, TailSize: g}, 2 * g, g},
		{chunk.Config{Size: 4 * g}, 4 * g, g},
		{chunk.Config{Size: 8 * g}, 8 * g, 2 * g},
		{chunk.Config{Size: 2 * g}, 2 * g, 2 * g},
		{chunk.Config{Size: 6 * g}, 6 * g, 6 * g},
		{chunk.Config{Budget: 64 << 30}, 16 * g, 4 * g},
		{chunk.Config{Size: 4 * g, TailSize: 4 * g}, 4 * g, 4 * g},
		{chunk.Config{Budget: 64 << 30, TailSize: 16 * g}, 16 * g, 16 * g},
		{chunk.Config{Size: 4 * g, TailSize: g}, 4 * g, g},
		{chunk.Config{Size: 4 * g, TailSize: 2 * g}, 4 * g, 2 * g},
	} {
		p, err := chunk.New(d, c.cfg)
		require.NoError(t, err, "%+v", c.cfg)
		assert.Equal(t, []int{c.large, c.tail}, []int{p.ChunkSize(), p.TailSize()}, "%+v", c.cfg)
		assert.Equal(t, c.tail, p.Stats().TailSize)
		require.NoError(t, p.Close())
	}
}
