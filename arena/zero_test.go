package arena_test

import (
	"errors"
	"net"
	"testing"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// refusedInvalid runs f and fails the test if it panics or returns an error not
// matching arena.ErrInvalid.
func refusedInvalid(t *testing.T, name string, f func() error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s panicked: %v", name, r)
		}
	}()
	if err := f(); !errors.Is(err, arena.ErrInvalid) {
		t.Errorf("%s = %v, want an error matching arena.ErrInvalid", name, err)
	}
}

// A Pool not made by chunk.New is refused by New, as an Arena not made by New is.
func TestNewZeroPool(t *testing.T) {
	refusedInvalid(t, "New(Config{Pool: new(chunk.Pool)})", func() error {
		a, err := arena.New(arena.Config{Pool: new(chunk.Pool)})
		if err == nil {
			a.Close()
		}
		return err
	})
}

// socketPair returns a connection that Import's argument checks, which come
// before any use of it, accept.
func socketPair(t *testing.T) *net.UnixConn { return new(net.UnixConn) }

// A typed-nil driver is refused by Import, as it is by New.
func TestImportTypedNilDriver(t *testing.T) {
	conn := socketPair(t)
	refusedInvalid(t, "Import(Driver: (*host.Driver)(nil))", func() error {
		v, err := arena.Import(conn, arena.ImportConfig{Driver: (*host.Driver)(nil)})
		if err == nil {
			v.Close()
		}
		return err
	})
}

// A Pool not made by chunk.New is refused by Import.
func TestImportZeroPool(t *testing.T) {
	conn := socketPair(t)
	refusedInvalid(t, "Import(Pool: new(chunk.Pool))", func() error {
		v, err := arena.Import(conn, arena.ImportConfig{Pool: new(chunk.Pool)})
		if err == nil {
			v.Close()
		}
		return err
	})
}

// Stats of an Arena not made by New must not panic (a nil *Arena's does not).
func TestZeroArenaStats(t *testing.T) {
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("new(arena.Arena).Stats() panicked: %v", r)
		}
	}()
	_ = new(arena.Arena).Stats()
}
