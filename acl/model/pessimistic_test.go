package model

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

// TestPessimisticCompile checks what the pessimistic readings change in the
// compiled costs of the shipped h200 profile: an access span's extra
// mapping costs a one-granule access call, and launches become serial; the
// rest is the profile's.
func TestPessimisticCompile(t *testing.T) {
	p, err := LoadProfile("h200")
	require.NoError(t, err)
	plain := compile(p)
	pess := compile(p)
	pess.pessimistic()
	assert.Equal(t, usToNS(p.Calls["access"].PerMapping.Value), plain.perMapping)
	assert.Equal(t, plain.base[cAccess]-int64(plain.perByte[cAccess]*float64(plain.gran)), pess.perMapping)
	assert.Greater(t, pess.perMapping, 10*plain.perMapping, "the span saves nothing")
	// So a span of k granules costs k one-granule calls: the base once per
	// mapping, and the per-MiB part over the bytes.
	assert.Equal(t, pess.base[cAccess]-int64(pess.perByte[cAccess]*float64(pess.gran)), pess.perMapping)
	assert.False(t, plain.serial[cLaunch])
	assert.True(t, pess.serial[cLaunch])
	pess.perMapping, pess.serial[cLaunch] = plain.perMapping, false
	assert.Equal(t, plain, pess, "nothing else changes")

	d := open(t, Config{Profile: p, Pessimistic: true, NoData: true})
	defer func() { require.NoError(t, d.Close()) }()
	assert.Contains(t, d.Modelled(), "pessimistic")
}

// TestPessimisticLaunchWaits checks that, pessimistic, a launch waits while
// another goroutine is inside a serial call, and that otherwise it does not.
func TestPessimisticLaunchWaits(t *testing.T) {
	const per = 20 * time.Millisecond
	for _, pessimistic := range []bool{false, true} {
		p := zeroProfile(t)
		p.Calls["meminfo"].Base.Value = float64(per.Microseconds())
		p.Calls["meminfo"].Serial.Value = true
		d := open(t, Config{Profile: p, Pessimistic: pessimistic, NoData: true})
		s, err := d.CreateStream()
		require.NoError(t, err)
		var wg sync.WaitGroup
		inside := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			close(inside)
			_, _, _ = d.GetMemInfo(acl.HBMMem)
		}()
		<-inside
		time.Sleep(per / 4) // the serial call is under way
		t0 := time.Now()
		require.NoError(t, d.LaunchFor(s, 0, 0, 0))
		took := time.Since(t0)
		wg.Wait()
		if pessimistic {
			assert.Greater(t, took, per/2, "the launch waited for the serial call")
			assert.Greater(t, d.LaunchWaitNS(), int64(per/2), "and counted the wait")
		} else {
			if !raceEnabled {
				assert.Less(t, took, per/2, "the launch did not wait")
			}
			assert.Zero(t, d.LaunchWaitNS())
		}
		require.NoError(t, d.SynchronizeStream(s))
		require.NoError(t, d.DestroyStream(s))
		require.NoError(t, d.Close())
	}
}
