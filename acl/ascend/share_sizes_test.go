//go:build linux && (amd64 || arm64)

package ascend_test

import (
	"bytes"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/ascend"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// asProcess is a driver on the double whose calls that depend on the
// calling process (an allocation's owner, an export's allow-list, an
// import, the process's own id) come from process pid: the double keeps one
// current process for the whole library, so two drivers in one test
// process take turns under mu.
type asProcess struct {
	*ascend.Driver
	pid int32
	dbl *double
	mu  *sync.Mutex
}

func (d asProcess) as() func() {
	d.mu.Lock()
	d.dbl.setPid(d.pid)
	return d.mu.Unlock
}

func (d asProcess) MallocPhysical(size uintptr, prop *acl.PhysicalMemProp, flags uint64) (acl.PhysicalHandle, error) {
	defer d.as()()
	return d.Driver.MallocPhysical(size, prop, flags)
}

func (d asProcess) MemSetPidToShareableHandle(s acl.ShareableHandle, pids []int32) error {
	defer d.as()()
	return d.Driver.MemSetPidToShareableHandle(s, pids)
}

func (d asProcess) MemImportFromShareableHandle(s acl.ShareableHandle, device int32) (acl.PhysicalHandle, error) {
	defer d.as()()
	return d.Driver.MemImportFromShareableHandle(s, device)
}

func (d asProcess) DeviceGetBareTgid() (int32, error) {
	defer d.as()()
	return d.Driver.DeviceGetBareTgid()
}

// The token path end to end with chunks of two sizes: an arena on a pool of
// large chunks of two granules and tails of one shares a buffer lying on a
// tail, two large chunks and a tail; the offer carries the sizes table
// before the tokens, the consumer (process 1002, the producer 1001, both on
// the double) imports each token as its own size into a private pool and
// maps them side by side, and both see one memory. Everything goes back to
// the runtime at the end.
func TestShareTwoSizesOverDouble(t *testing.T) {
	const g = acl.HugePageSize
	path := freshCopy(t, "full", "", "libascendcl.so")
	pd, dbl := openDouble(t, path, 0, ascend.Config{})
	cd, _ := openDouble(t, path, 0, ascend.Config{})
	defer dbl.setPid(int32(os.Getpid()))
	var mu sync.Mutex
	prod := asProcess{pd, 1001, dbl, &mu}
	cons := asProcess{cd, 1002, dbl, &mu}

	pool, err := chunk.New(prod, chunk.Config{Size: 2 * g, TailSize: g, Shareable: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, pool.Close()) }()
	a, err := arena.New(arena.Config{Pool: pool, Reserve: 32 << 20})
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	_, err = a.Alloc(g, 1) // the first tail, not shared
	require.NoError(t, err)
	b, err := a.Alloc(5*g+g/2, 1024) // from a tail, over two large chunks, into a tail
	require.NoError(t, err)
	want := bytes.Repeat([]byte("two sizes, one memory "), b.Len()/22+1)[:b.Len()]
	require.NoError(t, arena.CopyIn(b, want))

	mine, theirs := connPair(t)

	type got struct {
		v   *arena.Imported
		err error
	}
	done := make(chan got, 1)
	go func() {
		v, err := arena.Import(theirs, arena.ImportConfig{Driver: cons})
		done <- got{v, err}
	}()
	require.NoError(t, b.Share(mine, arena.ShareOptions{PID: os.Getpid()}))
	g1 := <-done
	require.NoError(t, g1.err)
	v := g1.v
	defer func() {
		if v != nil {
			require.NoError(t, v.Close())
		}
	}()

	l := cd.Live()
	assert.Equal(t, 4, l.Imported, "the tail the buffer starts in, two large chunks and the tail it ends in")
	assert.Equal(t, uintptr(6*g), l.ImportedBytes)
	assert.Equal(t, int64(4), pool.Stats().Exported)

	vb := v.Buffer()
	require.Equal(t, b.Len(), vb.Len())
	read := make([]byte, vb.Len())
	require.NoError(t, arena.CopyOut(read, vb))
	assert.True(t, bytes.Equal(want, read), "the consumer reads what the producer wrote, across chunks of both sizes")

	// The consumer writes at the end, in the last tail; the producer sees it.
	tail, err := vb.Slice(vb.Len()-8, vb.Len())
	require.NoError(t, err)
	require.NoError(t, arena.CopyIn(tail, []byte("consumer")))
	ptail, err := b.Slice(b.Len()-8, b.Len())
	require.NoError(t, err)
	seen := make([]byte, 8)
	require.NoError(t, arena.CopyOut(seen, ptail))
	assert.Equal(t, "consumer", string(seen))

	require.NoError(t, v.Close())
	v = nil
	assert.True(t, cd.Live().Zero(), "the consumer holds nothing: %+v", cd.Live())
	require.NoError(t, a.Close())
	require.NoError(t, pool.Close())
	assert.True(t, pd.Live().Zero(), "the producer holds nothing: %+v", pd.Live())
	assert.True(t, dbl.Live().Zero(), "the runtime holds nothing: %+v", dbl.Live())
}
