package strategy

import (
	"testing"

	"github.com/vmarena/vmarena/acl"
)

// The modelled registrar counts what each mode's library is called: one
// call per chunk, or, for runs, one deregistration of every run a change
// touches and one registration of every run it leaves.
func TestModelRegistrarCounts(t *testing.T) {
	const g = 2 << 20
	m := func(i int) acl.Mapping {
		return acl.Mapping{Ptr: acl.DevicePtr(1<<40 + i*g), Size: g, Handle: acl.PhysicalHandle(i + 1)}
	}
	batch := func(is ...int) []acl.Mapping {
		var out []acl.Mapping
		for _, i := range is {
			out = append(out, m(i))
		}
		return out
	}
	for _, tc := range []struct {
		mode string
		want [][2]int64 // after each step: registrations, deregistrations
	}{
		{RegisterChunk, [][2]int64{{3, 0}, {5, 0}, {5, 1}, {6, 1}, {6, 3}, {6, 6}}},
		{RegisterRun, [][2]int64{{1, 0}, {2, 1}, {4, 2}, {5, 4}, {6, 5}, {6, 6}}},
	} {
		all := &registrations{mode: tc.mode}
		r := newModelRegistrar(all)
		steps := []func() error{
			func() error { return r.RegisterBatch(batch(0, 1, 2)) },   // a run of 3
			func() error { return r.RegisterBatch(batch(3, 4)) },      // it grows by 2
			func() error { return r.Deregister(m(2)) },                // a hole: two runs
			func() error { return r.Register(m(2)) },                  // filled: one run again
			func() error { return r.DeregisterBatch(batch(3, 4)) },    // the tail goes
			func() error { return r.DeregisterBatch(batch(0, 1, 2)) }, // everything
		}
		for i, step := range steps {
			if err := step(); err != nil {
				t.Fatalf("%s step %d: %v", tc.mode, i, err)
			}
			if got := [2]int64{all.reg.Load(), all.dereg.Load()}; got != tc.want[i] {
				t.Fatalf("%s step %d: registrations, deregistrations %v, want %v", tc.mode, i, got, tc.want[i])
			}
		}
		if len(r.reg) != 0 {
			t.Fatalf("%s: left %v", tc.mode, r.reg)
		}
		if err := r.Deregister(m(0)); err == nil {
			t.Fatalf("%s: a deregistration of what is not registered is accepted", tc.mode)
		}
	}
}
