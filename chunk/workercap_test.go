package chunk_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/chunk"
)

// On the real clock a capped worker still does its work: it keeps chunks
// ahead, refills every member that asks, answers Settle, and stops with
// Close. (How long it waits is tested on a fake clock, in the package.)
func TestWorkerCapStillWorks(t *testing.T) {
	for _, share := range []float64{0.01, 0.25} {
		p, err := chunk.New(newDriver(t, 64<<20), chunk.Config{Ahead: 4, WorkerCPU: share})
		require.NoError(t, err)
		r := &refiller{}
		m, err := p.Lender().Join(r, true)
		require.NoError(t, err)
		for i := range 20 {
			m.WantRefill()
			r.waitFor(t, int64(i+1))
		}
		p.Lender().Settle()
		s := p.Stats()
		assert.Equal(t, 4, s.Cached, "share %v: the chunks ahead", share)
		assert.Positive(t, s.WorkerSpins)
		done := make(chan error)
		go func() { done <- p.Close() }()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("share %v: Close did not return", share)
		}
	}
}
