// Package hostmemtest checks a device binding's books of MallocHost's
// buffers (package hostmem) where they are easiest to get wrong: when the
// runtime hands a freed address straight back.
package hostmemtest

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/sched"
)

// RequireFreeHostKeepsReuse runs a MallocHost at the point where d's
// FreeHost has had the runtime free its buffer (sched.HostFreed, which d
// must pass itself to), and asserts that the new buffer got the freed
// address, as the C doubles hand the last buffer freed back to the next
// allocation of its size, and that it stays on d's books (d.Live) and the
// runtime's (runtimeLive), and can be freed. A binding that takes a buffer
// off its books after the runtime freed it loses the new one's entry.
func RequireFreeHostKeepsReuse(t testing.TB, d interface {
	acl.Driver
	acl.Counter
}, runtimeLive func() int) {
	t.Helper()
	const size = 512
	old, err := d.MallocHost(size)
	require.NoError(t, err)
	var (
		again []byte
		aerr  error
		once  sync.Once
	)
	defer sched.Set(func(p sched.Point, who any) {
		if p == sched.HostFreed && who == any(d) {
			once.Do(func() { again, aerr = d.MallocHost(size) })
		}
	})()
	require.NoError(t, d.FreeHost(old))
	require.NoError(t, aerr)
	require.NotEmpty(t, again, "FreeHost passed no sched.HostFreed point with the driver")
	require.Same(t, &old[0], &again[0], "the runtime gave the freed address to the MallocHost inside FreeHost (else this forces nothing)")
	require.Equal(t, 1, d.Live().HostBuffers, "the new buffer is on the binding's books")
	require.Equal(t, 1, runtimeLive(), "and the runtime's")
	require.NoError(t, d.FreeHost(again), "and can be freed")
	require.Zero(t, d.Live().HostBuffers)
	require.Zero(t, runtimeLive())
}
