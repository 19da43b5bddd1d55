package chunk_test

import (
	"errors"
	"testing"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
)

// A Pool not made by New (its zero value) must be refused, not dereferenced.
func TestZeroPoolRefused(t *testing.T) {
	var p chunk.Pool
	call := func(name string, f func() error) {
		t.Helper()
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("%s on a zero Pool panicked: %v", name, r)
			}
		}()
		if err := f(); !errors.Is(err, acl.ErrInvalidParam) {
			t.Errorf("%s on a zero Pool = %v, want an error matching acl.ErrInvalidParam", name, err)
		}
	}
	call("Get", func() error { _, err := p.Lender().Get(); return err })
	call("SetBudget", func() error { return p.SetBudget(1 << 20) })
	call("Warm", func() error { _, err := p.Warm(1); return err })
	call("Trim", func() error { return p.Trim() })
	call("Close", func() error { return p.Close() })
	if p.Driver() != nil {
		t.Errorf("Driver of a zero Pool = %v, want nil", p.Driver())
	}
}
