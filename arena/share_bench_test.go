//go:build linux

package arena_test

import (
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/acl/ipc"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// Handing over a KV cache: sharing it (O(chunks) driver calls, no byte
// copied) against copying the same bytes through the host (the producer
// copies device to host and writes to the socket, the consumer reads and
// copies host to device), both in one run, each iteration doing both, so
// that their ratio is measured under the same conditions. The producer is
// another process; the consumer is this one. 1 GiB by default; set
// VMARENA_HANDOFF_MIB for another size.
func BenchmarkHandoff(b *testing.B) {
	mib := 1024
	if s := os.Getenv("VMARENA_HANDOFF_MIB"); s != "" {
		fmt.Sscan(s, &mib)
	}
	for _, cs := range []int{2 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("%dMiB/chunk=%dMiB", mib, cs>>20), func(b *testing.B) {
			benchHandoff(b, mib<<20, cs)
		})
	}
}

func benchHandoff(b *testing.B, size, cs int) {
	p := spawn(b, peerSpec{Role: "bench-producer", Chunks: size / cs, ChunkSize: cs})
	d, err := host.New(host.Config{Capacity: uintptr(2*size) + 256<<20})
	require.NoError(b, err)
	defer d.Close()
	fd := faultdriver.New(d)
	// The copy's destination: an arena of the consumer's own, mapped once.
	dst, err := arena.New(arena.Config{Driver: d, Reserve: size, Chunk: chunk.Config{Size: cs}})
	require.NoError(b, err)
	defer dst.Close()
	db, err := dst.Alloc(size, 64)
	require.NoError(b, err)
	piece := make([]byte, 4<<20)
	// The producer is ready once it has written its memory.
	_, _, err = ipc.Recv(p.conn, make([]byte, 1), 0)
	require.NoError(b, err)

	var share, cp time.Duration
	var calls, copyCalls int64
	b.ResetTimer()
	for range b.N {
		// Share: import, map, and give back.
		t0 := time.Now()
		before := fd.Calls(faultdriver.Any)
		require.NoError(b, ipc.Send(p.conn, []byte{'s'}, nil, false))
		v, err := arena.Import(p.conn, arena.ImportConfig{Driver: fd})
		require.NoError(b, err)
		require.NoError(b, v.Close())
		calls += fd.Calls(faultdriver.Any) - before
		copyCalls += fd.Calls(faultdriver.MemcpyHtoD) + fd.Calls(faultdriver.MemcpyDtoH) + fd.Calls(faultdriver.MemcpyDtoD)
		t1 := time.Now()
		share += t1.Sub(t0)

		// Copy through the host, 4 MiB at a time.
		require.NoError(b, ipc.Send(p.conn, []byte{'c'}, nil, false))
		for off := 0; off < size; off += len(piece) {
			_, err := io.ReadFull(p.conn, piece)
			require.NoError(b, err)
			s, err := db.Slice(off, off+len(piece))
			require.NoError(b, err)
			require.NoError(b, arena.CopyIn(s, piece))
		}
		cp += time.Since(t1)
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(share.Microseconds())/n/1000, "share-ms/op")
	b.ReportMetric(float64(cp.Microseconds())/n/1000, "copy-ms/op")
	b.ReportMetric(float64(cp)/float64(share), "copy/share")
	b.ReportMetric(float64(calls)/n, "share-driver-calls/op")
	b.ReportMetric(float64(copyCalls)/n, "share-copy-calls/op")
	b.ReportMetric(float64(size/cs), "chunks")
	require.NoError(b, ipc.Send(p.conn, []byte{'q'}, nil, false))
	p.wait()
}

// benchProducer holds Chunks chunks of ChunkSize in an arena and, on each
// command, shares them ('s') or writes them to the socket through the host
// ('c'), until 'q'.
func benchProducer(spec peerSpec, conn *net.UnixConn, d *host.Driver) error {
	size := spec.Chunks * spec.ChunkSize
	a, err := arena.New(arena.Config{Driver: d, Reserve: size, Chunk: chunk.Config{Size: spec.ChunkSize, Shareable: true}})
	if err != nil {
		return err
	}
	defer a.Close()
	buf, err := a.Alloc(size, 64)
	if err != nil {
		return err
	}
	if err := arena.Fill(buf, 0x5a); err != nil {
		return err
	}
	if err := ipc.Send(conn, []byte{'r'}, nil, false); err != nil { // ready
		return err
	}
	piece := make([]byte, 4<<20)
	for {
		cmd := make([]byte, 1)
		if _, _, err := ipc.Recv(conn, cmd, 0); err != nil {
			return err
		}
		switch cmd[0] {
		case 's':
			if err := buf.Share(conn, arena.ShareOptions{PID: os.Getppid()}); err != nil {
				return err
			}
		case 'c':
			for off := 0; off < size; off += len(piece) {
				s, err := buf.Slice(off, off+len(piece))
				if err != nil {
					return err
				}
				if err := arena.CopyOut(piece, s); err != nil {
					return err
				}
				if _, err := conn.Write(piece); err != nil {
					return err
				}
			}
		case 'q':
			return a.Close()
		}
	}
}

// The consumer's side of importing a chunk, mapping it and touching it
// (reading its first 4 KiB), through an Imported, against the bare driver calls
// that do the same (import, map, grant access, copy, unmap, free), in
// alternation in one run. An Imported imports chunks 32 at a time into one
// reservation, so the per-Imported costs (its pool, reservation and close) are
// shared by 32 chunks; the bare calls share one reservation the same way.
// touch=0 leaves the memory untouched, which shows the Imported's own costs
// best; touch=4KiB adds the first read of each chunk, which the kernel's
// page faults dominate.
func BenchmarkImportChunk(b *testing.B) {
	for _, touch := range []int{0, 4096} {
		b.Run(fmt.Sprintf("touch=%dKiB", touch>>10), func(b *testing.B) { benchImportChunk(b, touch) })
	}
}

func benchImportChunk(b *testing.B, touch int) {
	const k, cs = 32, 2 << 20
	p := spawn(b, peerSpec{Role: "bench-fds", Chunks: k, ChunkSize: cs})
	var fds []int
	for len(fds) < k {
		f, _, err := ipc.Recv(p.conn, make([]byte, 1), k)
		require.NoError(b, err)
		fds = append(fds, f...)
	}
	defer ipc.CloseAll(fds)
	hs := make([]acl.ShareableHandle, k)
	for i, fd := range fds {
		hs[i] = acl.ShareableHandle{Type: acl.MemHandleTypePOSIX, Value: uint64(fd)}
	}
	d, err := host.New(host.Config{Capacity: 1 << 30})
	require.NoError(b, err)
	defer d.Close()
	page := make([]byte, touch)

	bare := func() {
		base, err := d.ReserveMemAddress(k*cs, 0, 0, 0)
		require.NoError(b, err)
		var ids [k]acl.PhysicalHandle
		for i, s := range hs {
			h, err := d.MemImportFromShareableHandle(s, 0)
			require.NoError(b, err)
			at := base.Add(uintptr(i) * cs)
			require.NoError(b, d.MapMem(at, cs, 0, h, 0))
			require.NoError(b, d.MemSetAccess(at, cs, acl.ReadWrite(0)))
			require.NoError(b, d.MemcpyDtoH(page, at))
			ids[i] = h
		}
		require.NoError(b, d.SynchronizeDevice())
		for i, h := range ids {
			require.NoError(b, d.UnmapMem(base.Add(uintptr(i)*cs)))
			require.NoError(b, d.FreePhysical(h))
		}
		require.NoError(b, d.ReleaseMemAddress(base))
	}
	view := func() {
		v, err := arena.ImportedOf(d, cs, hs)
		require.NoError(b, err)
		for i := range k {
			s, err := v.Buffer().Slice(i*cs, i*cs+len(page))
			require.NoError(b, err)
			require.NoError(b, arena.CopyOut(page, s))
		}
		require.NoError(b, v.Close())
	}
	bare()
	view()
	var tb, tv time.Duration
	b.ResetTimer()
	for i := range b.N {
		// Alternate which goes first, so that neither pays for the other.
		first, second, tf, ts := bare, view, &tb, &tv
		if i%2 == 1 {
			first, second, tf, ts = view, bare, &tv, &tb
		}
		t0 := time.Now()
		first()
		t1 := time.Now()
		second()
		*ts += time.Since(t1)
		*tf += t1.Sub(t0)
	}
	b.StopTimer()
	perChunk := float64(b.N * k)
	b.ReportMetric(float64(tb.Nanoseconds())/perChunk/1000, "bare-µs/chunk")
	b.ReportMetric(float64(tv.Nanoseconds())/perChunk/1000, "view-µs/chunk")
	b.ReportMetric(float64(tv)/float64(tb), "view/bare")
	require.True(b, d.Live().Zero(), "%+v", d.Live())
	require.NoError(b, ipc.Send(p.conn, []byte{'q'}, nil, false))
	p.wait()
}

// benchFDs exports Chunks chunks of ChunkSize through the driver and sends
// their descriptors, then waits for 'q'.
func benchFDs(spec peerSpec, conn *net.UnixConn, d *host.Driver) error {
	p := acl.DeviceProp(0, 0)
	p.HandleType = acl.MemHandleTypePOSIX
	var hs []acl.PhysicalHandle
	var fds []int
	for range spec.Chunks {
		h, err := d.MallocPhysical(uintptr(spec.ChunkSize), &p, 0)
		if err != nil {
			return err
		}
		s, err := d.MemExportToShareableHandle(h, acl.MemHandleTypePOSIX, 0)
		if err != nil {
			return err
		}
		fd, _ := s.FD()
		hs, fds = append(hs, h), append(fds, fd)
	}
	for len(fds) > 0 {
		n := min(len(fds), 64)
		if err := ipc.Send(conn, []byte{1}, fds[:n], false); err != nil {
			return err
		}
		fds = fds[n:]
	}
	if _, _, err := ipc.Recv(conn, make([]byte, 1), 0); err != nil {
		return err
	}
	for _, h := range hs {
		if err := d.FreePhysical(h); err != nil {
			return err
		}
	}
	return d.Close()
}
