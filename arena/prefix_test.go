package arena_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// The sentinels' texts name their condition alone (no package prefix), and
// every error the arena returns names its package once, first: refusals of
// closed, sleeping and bad calls included, which the fault-driven
// TestMessagesSayEachPrefixOnce does not reach.
func TestEveryErrorNamesItsPackageOnce(t *testing.T) {
	for _, s := range []error{arena.ErrClosed, arena.ErrExhausted, arena.ErrRange, arena.ErrImported, arena.ErrReadOnly,
		arena.ErrRefused, arena.ErrAsleep, arena.ErrShared, arena.ErrStale, arena.ErrCallback, arena.ErrPeer,
		chunk.ErrBudget, chunk.ErrClosed, chunk.ErrMapped, chunk.ErrBusy, chunk.ErrDeadlock, chunk.ErrNoOrder} {
		for _, p := range []string{"arena: ", "chunk: ", "ipc: ", "acl: "} {
			require.False(t, strings.HasPrefix(s.Error(), p), "a sentinel names its condition alone: %q", s)
		}
	}
	ctx := context.Background()
	var errs []error
	note := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	hd, err := host.New(host.Config{Capacity: 64 << 20})
	require.NoError(t, err)
	defer hd.Close()
	pool, err := chunk.New(hd, chunk.Config{Budget: 8 << 20})
	require.NoError(t, err)
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20})
	require.NoError(t, err)
	b, err := a.Alloc(1<<20, 64)
	require.NoError(t, err)
	_, err = a.Slice(0, 2<<20)
	note(err)
	note(a.Truncate(4 << 20))
	note(a.Grow(32 << 20))
	note(a.Grow(12 << 20))
	note(a.ShrinkTo(-1))
	note(arena.CopyIn(b, make([]byte, 2<<20)))
	note(arena.CopyOut(make([]byte, 2<<20), b))
	note(a.Sleep(ctx, arena.SleepMode(99)))
	require.NoError(t, a.Sleep(ctx, arena.Offload))
	note(a.Grow(1))
	_, err = a.Alloc(1, 1)
	note(err)
	note(a.Truncate(0))
	note(a.Reset())
	note(a.Shrink())
	note(a.Prefetch(1 << 20))
	note(arena.CopyIn(b, []byte{1}))
	note(arena.CopyOut([]byte{1}, b))
	note(arena.Fill(b, 1))
	require.NoError(t, a.Wake(ctx))
	require.NoError(t, a.Truncate(0))
	note(arena.CopyIn(b, []byte{1})) // stale
	require.NoError(t, a.Close())
	note(a.Grow(1))
	_, err = a.Alloc(1, 1)
	note(err)
	note(a.Truncate(0))
	note(a.Reset())
	note(a.Shrink())
	note(a.ShrinkTo(0))
	note(a.Sleep(ctx, arena.Offload))
	note(a.Wake(ctx))
	note(a.Prefetch(1))
	note(a.GrowContext(ctx, 1))
	_, err = a.AllocContext(ctx, 1, 1)
	note(err)
	_, err = a.Slice(0, 0)
	note(err)
	note(arena.CopyIn(b, []byte{1}))
	_, err = a.ExportDMABuf()
	note(err)
	note(a.OnBackingChange(func(arena.BackingChange) error { return nil }))
	require.NoError(t, pool.Close())
	_, err = arena.New(arena.Config{Pool: pool})
	note(err)
	_, err = arena.New(arena.Config{Reserve: -1})
	note(err)

	require.Greater(t, len(errs), 30)
	for _, err := range errs {
		msg := err.Error()
		if !strings.HasPrefix(msg, "arena: ") {
			t.Errorf("does not name the arena first: %s", msg)
		}
		for _, p := range []string{"arena: ", "chunk: ", "ipc: ", "host driver: "} {
			if strings.Count(msg, p) > 1 {
				t.Errorf("%q twice: %s", p, msg)
			}
		}
	}
}
