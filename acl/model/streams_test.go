package model

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/acltest"
)

// chunk reserves and maps size bytes with access, and returns a function
// that undoes it.
func chunk(t *testing.T, d *Driver, size uintptr) (acl.DevicePtr, func()) {
	t.Helper()
	prop := acl.DeviceProp(0, 0)
	base, err := d.ReserveMemAddress(2*size, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(size, &prop, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, size, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, size, acl.ReadWrite(0)))
	return base, func() {
		require.NoError(t, d.UnmapMem(base))
		require.NoError(t, d.FreePhysical(h))
		require.NoError(t, d.ReleaseMemAddress(base))
	}
}

func streamProfile(t *testing.T) *Profile {
	p := zeroProfile(t)
	p.Calls["memset_async"].Base.Value = 10
	p.Calls["sync_stream"].Base.Value = 5
	p.Device.Latency.Value = 2000 // 2 ms per memset
	p.Device.LocalGBps.Value = 1  // 1 MiB moved in 1.05 ms
	return p
}

func TestMemsetAsyncTime(t *testing.T) {
	timing(t, testMemsetAsyncTime)
}

func testMemsetAsyncTime(c *clock) {
	t := c.t
	d := open(t, Config{Profile: streamProfile(t)})
	defer func() { require.NoError(t, d.Close()) }()
	base, undo := chunk(t, d, 2<<20)
	defer undo()
	s, err := d.CreateStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyStream(s)) }()
	ev, err := d.CreateEvent()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyEvent(ev)) }()

	one := 10*time.Microsecond + 2*time.Millisecond + (1<<20)*time.Nanosecond + 5*time.Microsecond
	c.charged(5, one, "MemsetAsync + SynchronizeStream", func() {
		require.NoError(t, d.MemsetAsync(base, 0, 1<<20, s))
		require.NoError(t, d.SynchronizeStream(s))
	})

	t0 := time.Now()
	require.NoError(t, d.MemsetAsync(base, 0, 1<<20, s))
	require.NoError(t, d.RecordEvent(ev, s))
	require.NoError(t, d.MemsetAsync(base+(1<<20), 0, 1<<20, s))
	complete, err := d.QueryEvent(ev)
	require.NoError(t, err)
	assert.False(t, complete, "the memset before the event is still running")
	require.NoError(t, d.SynchronizeEvent(ev))
	c.within(time.Since(t0), 2*time.Millisecond+(1<<20), 1.5, "the event completes with the first memset")
	complete, err = d.QueryEvent(ev)
	require.NoError(t, err)
	assert.True(t, complete)
	require.NoError(t, d.SynchronizeStream(s))
	c.within(time.Since(t0), 2*(2*time.Millisecond+(1<<20)), 1.5, "the stream runs its two memsets one after the other")
}

func TestStreamsIndependent(t *testing.T) {
	timing(t, testStreamsIndependent)
}

func testStreamsIndependent(c *clock) {
	t := c.t
	d := open(t, Config{Profile: streamProfile(t)})
	defer func() { require.NoError(t, d.Close()) }()
	s1, err := d.CreateStream()
	require.NoError(t, err)
	s2, err := d.CreateStream()
	require.NoError(t, err)
	e1, err := d.CreateEvent()
	require.NoError(t, err)
	e2, err := d.CreateEvent()
	require.NoError(t, err)

	const long = 30 * time.Millisecond
	t0 := time.Now()
	require.NoError(t, d.LaunchFor(s1, 0, 0, long), "a long kernel touching no memory the test cares about")
	require.NoError(t, d.RecordEvent(e1, s1))
	require.NoError(t, d.RecordEvent(e2, s2))
	done, err := d.QueryEvent(e2)
	require.NoError(t, err)
	assert.True(t, done, "an event on an idle stream is complete at once")
	done, err = d.QueryEvent(e1)
	require.NoError(t, err)
	assert.False(t, done, "an event behind a running kernel is not")
	require.NoError(t, d.SynchronizeStream(s2), "the other stream does not wait for the kernel")
	assert.Less(t, time.Since(t0), long, "the other stream does not wait for the kernel")
	require.NoError(t, d.SynchronizeEvent(e1))
	c.within(time.Since(t0), long, 1.5, "SynchronizeEvent waits for the kernel")

	// SynchronizeDevice waits for the longest stream.
	t0 = time.Now()
	require.NoError(t, d.LaunchFor(s1, 0, 0, long/3))
	require.NoError(t, d.LaunchFor(s2, 0, 0, long))
	require.NoError(t, d.SynchronizeDevice())
	c.within(time.Since(t0), long, 1.5, "SynchronizeDevice")

	// Work runs in order: a memset behind a kernel held open starts when
	// the kernel is released.
	hold := make(chan struct{})
	base, undo := chunk(t, d, 2<<20)
	require.NoError(t, d.Launch(s1, base, 4096, hold))
	require.NoError(t, d.MemsetAsync(base+4096, 0, 4096, s1))
	require.NoError(t, d.RecordEvent(e1, s1))
	time.Sleep(5 * time.Millisecond)
	done, err = d.QueryEvent(e1)
	require.NoError(t, err)
	assert.False(t, done, "the memset waits behind the held kernel")
	t0 = time.Now()
	close(hold)
	require.NoError(t, d.SynchronizeStream(s1))
	c.within(time.Since(t0), 2*time.Millisecond, 1.5, "the memset runs once the kernel ends")
	undo()

	require.NoError(t, d.DestroyEvent(e1))
	require.NoError(t, d.DestroyEvent(e2))
	require.NoError(t, d.DestroyStream(s1))
	require.NoError(t, d.DestroyStream(s2))
	assert.Zero(t, d.Faults())
}

func TestFaults(t *testing.T) {
	p := streamProfile(t)
	d := open(t, Config{Profile: p})
	defer func() { require.NoError(t, d.Close()) }()
	s, err := d.CreateStream()
	require.NoError(t, err)
	defer func() { require.NoError(t, d.DestroyStream(s)) }()

	// A synchronous copy into a range a queued memset will still write is a
	// fault; once the memset has run it is not.
	base, undo := chunk(t, d, 2<<20)
	require.NoError(t, d.MemsetAsync(base, 0xAB, 4096, s))
	require.NoError(t, d.MemcpyHtoD(base+100, []byte("racing")))
	assert.Equal(t, 1, d.Faults())
	require.NoError(t, d.MemcpyHtoD(base+8192, []byte("elsewhere")), "another range does not race")
	assert.Equal(t, 1, d.Faults())
	require.NoError(t, d.SynchronizeStream(s))
	got := make([]byte, 6)
	require.NoError(t, d.MemcpyDtoH(got, base+100))
	assert.Equal(t, []byte{0xAB, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB}, got, "the memset ran after the racing copy")
	assert.Equal(t, 1, d.Faults())

	// Unmapping under a running kernel succeeds, counts a fault, and the
	// stream reports it when the kernel ends.
	require.NoError(t, d.LaunchFor(s, base, 2<<20, 5*time.Millisecond))
	require.NoError(t, d.MemsetAsync(base, 0xCD, 4096, s), "a memset queued behind it")
	undo()
	assert.Equal(t, 3, d.Faults(), "the kernel and the memset behind it")
	err = d.SynchronizeStream(s)
	acltest.RequireCode(t, err, acl.ErrCodeRTDrvInternal)
	assert.Contains(t, err.Error(), "illegal address")
	require.NoError(t, d.SynchronizeStream(s), "the fault is reported once")

	// A faulted memset writes nothing: the handle mapped again still holds
	// the earlier bytes.
	prop := acl.DeviceProp(0, 0)
	base, err = d.ReserveMemAddress(2<<20, 0, 0, 0)
	require.NoError(t, err)
	h, err := d.MallocPhysical(2<<20, &prop, 0)
	require.NoError(t, err)
	require.NoError(t, d.MapMem(base, 2<<20, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, 2<<20, acl.ReadWrite(0)))
	require.NoError(t, d.MemcpyHtoD(base, []byte("kept")))
	require.NoError(t, d.MemsetAsync(base, 0xEE, 4096, s))
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.MapMem(base, 2<<20, 0, h, 0))
	require.NoError(t, d.MemSetAccess(base, 2<<20, acl.ReadWrite(0)))
	require.Error(t, d.SynchronizeStream(s))
	got = got[:4]
	require.NoError(t, d.MemcpyDtoH(got, base))
	assert.Equal(t, "kept", string(got))
	require.NoError(t, d.UnmapMem(base))
	require.NoError(t, d.FreePhysical(h))
	require.NoError(t, d.ReleaseMemAddress(base))
}

func TestStreamRules(t *testing.T) {
	d := open(t, Config{Profile: streamProfile(t)})
	base, undo := chunk(t, d, 2<<20)
	s, err := d.CreateStream()
	require.NoError(t, err)
	require.NoError(t, d.LaunchFor(s, base, 4096, 20*time.Millisecond))
	acltest.RequireCode(t, d.DestroyStream(s), acl.ErrCodeRTParamInvalid)
	acltest.RequireCode(t, d.DestroyStream(0), acl.ErrCodeInvalidParam)
	acltest.RequireCode(t, d.LaunchFor(s, base, 4096, -1), acl.ErrCodeInvalidParam)
	acltest.RequireCode(t, d.Launch(s, base, 0, nil), acl.ErrCodeInvalidParam)
	acltest.RequireCode(t, d.LaunchFor(s, base+(2<<20), 4096, 0), acl.ErrCodeRTParamInvalid, "unmapped")
	require.NoError(t, d.SynchronizeStream(s))
	require.NoError(t, d.DestroyStream(s))

	// A synchronisation waiting on work that never ends returns when the
	// driver closes.
	s, err = d.CreateStream()
	require.NoError(t, err)
	never := make(chan struct{})
	require.NoError(t, d.Launch(s, base, 4096, never))
	waited := make(chan error, 1)
	go func() { waited <- d.SynchronizeStream(s) }()
	time.Sleep(5 * time.Millisecond)
	undo()
	err = d.Close()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1 pieces of device work still queued")
	acltest.RequireCode(t, <-waited, acl.ErrCodeRTContextNull)
	close(never)
}
