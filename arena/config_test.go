package arena_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/model"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// Every Config that cannot work is refused by New with one line that names
// the field and the rule, and leaves nothing behind.
func TestConfigErrorsNameTheField(t *testing.T) {
	d, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	small, err := host.New(host.Config{Capacity: 64 << 20, MaxReserve: 64 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, small.Close()) }()
	pool, err := chunk.New(d, chunk.Config{Budget: 8 << 20})
	require.NoError(t, err)
	poolClosed := false
	defer func() {
		if !poolClosed {
			require.NoError(t, pool.Close())
		}
	}()
	for _, c := range []struct {
		name string
		cfg  arena.Config
		want string
	}{
		{"negative reserve", arena.Config{Driver: d, Reserve: -1}, "Config.Reserve -1: want 0"},
		{"reserve past the driver", arena.Config{Driver: d, Reserve: 200 << 30},
			"Config.Reserve 214748364800 bytes (200 GiB) (in chunks of 2 MiB) exceeds host's largest reservation, 137438953472 bytes (128 GiB) (acl.Caps.MaxReserve)"},
		{"reserve past a smaller driver", arena.Config{Driver: small, Reserve: 65 << 20}, "exceeds host's largest reservation, 67108864 bytes (64 MiB)"},
		{"headroom past reserve", arena.Config{Driver: d, Reserve: 4 << 20, Headroom: 1 << 30},
			"Config.Headroom 1073741824 bytes (1 GiB) exceeds Config.Reserve 4194304 bytes (4 MiB) (in chunks of 2 MiB)"},
		{"headroom past the device", arena.Config{Driver: small, Headroom: 1 << 30},
			"Config.Headroom 1073741824 bytes (1 GiB) exceeds the reservation, 67108864 bytes (64 MiB)"},
		{"headroom past the budget", arena.Config{Pool: pool, Headroom: 16 << 20}, "Config.Headroom 16777216 bytes (16 MiB) (in chunks of 2 MiB) exceeds the pool's budget, 8388608 bytes (8 MiB)"},
		{"negative headroom", arena.Config{Driver: d, Headroom: -1}, "Config.Headroom -1: want 0"},
		{"low water past headroom", arena.Config{Driver: d, Headroom: 2 << 20, LowWater: 4 << 20}, "Config.LowWater 4194304 bytes (4 MiB) exceeds Config.Headroom 2097152 bytes (2 MiB)"},
		{"negative max headroom", arena.Config{Driver: d, Headroom: 2 << 20, MaxHeadroom: -1}, "Config.MaxHeadroom -1: want 0"},
		{"max headroom without headroom", arena.Config{Driver: d, MaxHeadroom: 2 << 20}, "Config.MaxHeadroom 2097152 bytes (2 MiB) without Config.Headroom"},
		{"max headroom below headroom", arena.Config{Driver: d, Headroom: 4 << 20, MaxHeadroom: 2 << 20},
			"Config.MaxHeadroom 2097152 bytes (2 MiB) is below Config.Headroom 4194304 bytes (4 MiB)"},
		{"max headroom past reserve", arena.Config{Driver: d, Reserve: 8 << 20, Headroom: 2 << 20, MaxHeadroom: 16 << 20},
			"Config.MaxHeadroom 16777216 bytes (16 MiB) exceeds Config.Reserve 8388608 bytes (8 MiB) (in chunks of 2 MiB)"},
		{"max headroom past the budget", arena.Config{Pool: pool, Headroom: 2 << 20, MaxHeadroom: 16 << 20},
			"Config.MaxHeadroom 16777216 bytes (16 MiB) (in chunks of 2 MiB) exceeds the pool's budget, 8388608 bytes (8 MiB)"},
		{"negative low water", arena.Config{Driver: d, LowWater: -1}, "Config.LowWater -1: want 0"},
		{"pool and chunk", arena.Config{Pool: pool, Chunk: chunk.Config{Size: 4 << 20}}, "Config.Chunk is set, but Config.Pool is given"},
		{"driver not the pool's", arena.Config{Pool: pool, Driver: small}, "Config.Driver (host) is not Config.Pool's driver (host)"},
		{"zero stream", arena.Config{Driver: d, Streams: []acl.Stream{0}}, "Config.Streams[0] is 0: not a stream"},
		{"chunk budget", arena.Config{Driver: d, Chunk: chunk.Config{Budget: 1}}, "arena: Config.Chunk: chunk: invalid parameter: Config.Budget 1 bytes is less than one chunk"},
		{"chunk ahead", arena.Config{Driver: d, Chunk: chunk.Config{Ahead: 1_000_000}}, "Config.Ahead 1000000 exceeds the reuse cache's bound"},
	} {
		a, err := arena.New(c.cfg)
		if !assert.Error(t, err, c.name) {
			require.NoError(t, a.Close())
			continue
		}
		assert.ErrorIs(t, err, arena.ErrInvalid, c.name)
		assert.Contains(t, err.Error(), c.want, c.name)
		assert.True(t, strings.HasPrefix(err.Error(), "arena: "), err.Error())
		assert.NotContains(t, err.Error(), "\n", c.name)
	}
	// The default MaxHeadroom (8 × Headroom) stays within the budget and
	// the reservation by itself.
	for _, cfg := range []arena.Config{{Pool: pool, Headroom: 2 << 20}, {Driver: d, Reserve: 4 << 20, Headroom: 2 << 20}} {
		a, err := arena.New(cfg)
		require.NoError(t, err)
		require.NoError(t, a.Close())
	}
	// The pool's worker may have allocated the headroom before the Close:
	// the pool's cache holds it until the pool closes.
	poolClosed = true
	require.NoError(t, pool.Close())
	assert.True(t, d.Live().Zero(), "%+v", d.Live())
	assert.True(t, small.Live().Zero(), "%+v", small.Live())
}

// New checks Reserve against the largest reservation of the driver in hand,
// and every driver reports one: the limit New names is the limit the driver
// enforces.
func TestReserveLimitIsTheDriversLimit(t *testing.T) {
	m, err := model.New(model.Config{Untimed: true, MaxReserve: 8 << 30})
	require.NoError(t, err)
	defer func() { require.NoError(t, m.Close()) }()
	for _, d := range []acl.Driver{m} {
		limit := int64(d.Caps().ReserveLimit())
		a, err := arena.New(arena.Config{Driver: d, Reserve: int(limit)})
		require.NoError(t, err, "the limit itself is granted")
		require.Equal(t, int(limit), a.Reserved())
		require.NoError(t, a.Close())
		_, err = arena.New(arena.Config{Driver: d, Reserve: int(limit + 1)})
		require.ErrorIs(t, err, arena.ErrInvalid)
		assert.Contains(t, err.Error(), "8 GiB")
		a, err = arena.New(arena.Config{Driver: d})
		require.NoError(t, err, "a zero Reserve stays within the limit")
		assert.Equal(t, int(limit), a.Reserved())
		require.NoError(t, a.Close())
	}
	assert.Equal(t, uintptr(arena.MaxReserve), acl.Caps{}.ReserveLimit(), "a driver that says nothing accepts MaxReserve")
}
