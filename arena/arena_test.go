package arena_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena/arenatest"
)

func openHost(t testing.TB, capacity uintptr) acl.Driver {
	d, err := host.New(host.Config{Capacity: capacity})
	require.NoError(t, err)
	return d
}

func TestConformanceHost(t *testing.T) { arenatest.Run(t, openHost) }

// The same guarantees hold on a runtime without aclrtMemSetAccess.
func TestConformanceHostImplicitAccess(t *testing.T) {
	arenatest.Run(t, func(t testing.TB, capacity uintptr) acl.Driver {
		d, err := host.New(host.Config{Capacity: capacity, NoSetAccess: true})
		require.NoError(t, err)
		return d
	})
}
