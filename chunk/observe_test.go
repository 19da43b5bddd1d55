package chunk_test

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
	"github.com/vmarena/vmarena/internal/logtest"
)

// The pool reports scrubs, device waits, releases, reliefs and failures
// with what it did, asked and held.
func TestEvents(t *testing.T) {
	d := scrubDriver(t, 64<<20)
	log := &logtest.Recorder{}
	p, err := chunk.New(d, chunk.Config{Budget: 2 * g, Logger: slog.New(log)})
	require.NoError(t, err)
	defer p.Close()
	base, err := d.ReserveMemAddress(4*g, 0, 0, 0)
	require.NoError(t, err)
	defer d.ReleaseMemAddress(base)
	a, b := chunk.NewTenant(), chunk.NewTenant()

	// a's chunks are fresh (zeroed on the host driver): no scrub. b gets one
	// of a's: a scrub of a moved chunk.
	cs, err := p.Lender().Acquire(a, 2)
	require.NoError(t, err)
	_, err = p.Lender().MapRange(base, cs, nil)
	require.NoError(t, err)
	assert.Empty(t, log.Find(chunk.EventScrub))
	require.NoError(t, p.Lender().SyncDevice())
	syncs := log.Find(chunk.EventDeviceSync)
	require.Len(t, syncs, 1)
	assert.Equal(t, slog.KindDuration, syncs[0].Attrs["dur"].Kind())
	require.NoError(t, p.Lender().Release(base, cs[0]))
	require.NoError(t, p.Lender().Put(cs[0]))
	c, err := p.Lender().GetFor(b)
	require.NoError(t, err)
	require.NoError(t, p.Lender().Map(base, c))
	scrubs := log.Find(chunk.EventScrub)
	require.Len(t, scrubs, 1)
	assert.Equal(t, slog.LevelDebug, scrubs[0].Level)
	assert.Equal(t, int64(1), scrubs[0].Attrs["moved"].Int64())
	assert.Equal(t, int64(0), scrubs[0].Attrs["fresh"].Int64())
	assert.Equal(t, int64(0), scrubs[0].Attrs["queued"].Int64())
	assert.Equal(t, base.String(), scrubs[0].Attrs["at"].String())

	// The budget is spent: the pool relieves (nobody to reclaim from) and
	// reports the failure with what was asked and held.
	_, err = p.Lender().Acquire(a, 1)
	require.ErrorIs(t, err, chunk.ErrBudget)
	relief := log.Find(chunk.EventRelieve)
	require.Len(t, relief, 1)
	assert.Equal(t, "budget", relief[0].Attrs["cause"].String())
	assert.Equal(t, int64(1), relief[0].Attrs["need"].Int64())
	assert.Equal(t, int64(0), relief[0].Attrs["freed"].Int64())
	ooms := log.Find(chunk.EventOOM)
	require.Len(t, ooms, 1)
	o := ooms[0].Attrs
	assert.Equal(t, int64(1), o["asked"].Int64())
	assert.Equal(t, int64(g), o["asked_bytes"].Int64())
	assert.Equal(t, int64(2*g), o["held"].Int64())
	assert.Equal(t, int64(2*g), o["budget"].Int64())
	assert.Equal(t, int64(2), o["in_use"].Int64())
	assert.ErrorIs(t, o["err"].Any().(error), chunk.ErrBudget)

	require.NoError(t, p.Lender().SyncDevice())
	require.NoError(t, p.Lender().Release(base, c))
	require.NoError(t, p.Lender().Put(c))
	require.NoError(t, p.Lender().Release(base+acl.DevicePtr(g), cs[1]))
	require.NoError(t, p.Lender().Put(cs[1]))
}

// A release ordered by events is reported once its chunks are unmapped.
func TestEventRelease(t *testing.T) {
	d := scrubDriver(t, 64<<20)
	log := &logtest.Recorder{}
	p, err := chunk.New(d, chunk.Config{Logger: slog.New(log)})
	require.NoError(t, err)
	defer p.Close()
	s, err := d.CreateStream()
	require.NoError(t, err)
	defer d.DestroyStream(s)
	at, err := d.ReserveMemAddress(g, 0, 0, 0)
	require.NoError(t, err)
	defer d.ReleaseMemAddress(at)
	c, err := p.Lender().Get()
	require.NoError(t, err)
	require.NoError(t, p.Lender().Map(at, c))
	require.NoError(t, p.Lender().ReleaseAfter([]chunk.Mapped{{At: at, C: c}}, []acl.Stream{s}))
	waitFor(t, func() bool { return len(log.Find(chunk.EventRelease)) == 1 }, "the release event")
	assert.Equal(t, int64(1), log.Find(chunk.EventRelease)[0].Attrs["chunks"].Int64())
	assert.Empty(t, log.Find(chunk.EventDeviceSync), "no device-wide wait")
}
