//go:build linux && (amd64 || arm64)

package nccl_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/nccl"
	"github.com/vmarena/vmarena/internal/regtest"
)

// Arenas registered with the NCCL registrar over its double, one
// registration per chunk and with runs coalesced, through growths, shrinks,
// reliefs, sleeps and wakes under driver faults and refusals
// (regtest.RunRegistration), on the host driver and on the CUDA binding
// over its double: NCCL's registrations (the double refuses any overlap, so
// a run made before the one it replaces went fails) follow the arenas'
// mappings, hold exactly their bytes, and nothing is left registered.
func TestArenaRegistration(t *testing.T) {
	steps := 300
	if testing.Short() {
		steps = 100
	}
	for _, coalesce := range []bool{false, true} {
		var lib *fake
		bytes := func() uintptr { return lib.live().Bytes }
		next := func(bind bool) func(testing.TB, acl.Driver) acl.Registrar {
			return func(t testing.TB, d acl.Driver) acl.Registrar {
				var b acl.Binder
				if bind {
					b = d.(acl.Binder)
				}
				var opts []nccl.Option
				if coalesce {
					opts = append(opts, nccl.Coalesce())
				}
				f := newFake(t)
				lib = f
				r, err := nccl.NewRegistrar(f.lib, f.comm(t), b, opts...)
				require.NoError(t, err)
				t.Cleanup(func() {
					require.NoError(t, r.Close(), "left registered")
					require.Zero(t, f.live().Regs)
				})
				return r
			}
		}
		name := map[bool]string{false: "per-chunk", true: "coalesced"}[coalesce]
		t.Run(name+"/host", func(t *testing.T) {
			regtest.RunRegistration(t, regtest.Registration{Steps: steps, Next: next(false), Bytes: bytes,
				Open: func(t testing.TB, c uintptr) acl.Driver {
					d, err := host.New(host.Config{Capacity: c})
					require.NoError(t, err)
					return d
				}})
		})
		t.Run(name+"/cuda", func(t *testing.T) {
			regtest.RunRegistration(t, regtest.Registration{Steps: steps, Next: next(true), Bytes: bytes,
				Open: func(t testing.TB, c uintptr) acl.Driver { return openCUDA(t) }})
		})
	}
}
