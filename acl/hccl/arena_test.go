//go:build linux && (amd64 || arm64)

package hccl_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/internal/regtest"
)

// Arenas registered with the HCCL registrar over its double, through
// growths, shrinks, reliefs, sleeps and wakes under driver faults and
// refusals (regtest.RunRegistration): HCCL's books (the double's, with
// its 2 MiB alignment checked on every activation) follow the arenas'
// mappings with no padding, and nothing is left activated or set: the
// registrar's Close, at the test's end, fails on anything left, and the
// communicator's destruction counts what HCCL would have had to drop.
func TestArenaRegistration(t *testing.T) {
	var lib *fake
	bytes := func() uintptr { return lib.held().Bytes }
	next := func(bind bool) func(testing.TB, acl.Driver) acl.Registrar {
		return func(t testing.TB, d acl.Driver) acl.Registrar {
			var b acl.Binder
			if bind {
				b = d.(acl.Binder)
			}
			f := newFake(t, "full")
			lib = f
			r := f.registrar(t, b)
			t.Cleanup(func() { require.True(t, f.held().Zero(), "HCCL still holds %+v", f.held()) })
			return r
		}
	}
	steps := 300
	if testing.Short() {
		steps = 100
	}
	t.Run("host", func(t *testing.T) {
		regtest.RunRegistration(t, regtest.Registration{Steps: steps, Next: next(false), Bytes: bytes,
			Open: func(t testing.TB, c uintptr) acl.Driver {
				d, err := host.New(host.Config{Capacity: c})
				require.NoError(t, err)
				return d
			}})
	})
	t.Run("acl", func(t *testing.T) {
		regtest.RunRegistration(t, regtest.Registration{Steps: steps, Next: next(true), Bytes: bytes,
			Open: func(t testing.TB, c uintptr) acl.Driver {
				d, err := ascend.Open(ascend.Config{Library: doubles.Instance(t, "fakeacl", "libascendcl.so")})
				require.NoError(t, err)
				return d
			}})
	})
}
