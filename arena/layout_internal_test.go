package arena

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/chunk"
)

// checkLayout checks every query of g against a byte map built from the
// sizes pushed: owner[x] is the chunk holding unit x.
func checkLayout(t *testing.T, g *layout, sizes []uint64, unit uint64) {
	t.Helper()
	var owner []int
	for i, s := range sizes {
		for range s / unit {
			owner = append(owner, i)
		}
	}
	require.Equal(t, len(sizes), g.n())
	require.Equal(t, uint64(len(owner))*unit, g.top())
	for i, s := range sizes {
		require.Equal(t, s, g.size(i), "size of chunk %d", i)
		require.Equal(t, acl.PhysicalHandle(i+1), g.cs[i].Handle)
	}
	for x := uint64(0); x <= uint64(len(owner))*unit+unit; x += unit / 2 {
		want := len(sizes)
		if u := x / unit; u < uint64(len(owner)) {
			want = owner[u]
		}
		require.Equal(t, want, g.index(x), "index(%d)", x)
		wantKeep := 0
		if x > 0 {
			if u := (x - 1) / unit; u < uint64(len(owner)) {
				wantKeep = owner[u] + 1
			} else {
				wantKeep = len(sizes)
			}
		}
		require.Equal(t, wantKeep, g.keep(x), "keep(%d)", x)
		if k := g.keep(x); x > 0 && k > 0 && x <= g.top() {
			require.LessOrEqual(t, g.off(k-1), x-1, "chunk %d starts after byte %d", k-1, x-1)
			require.Greater(t, g.off(k), x-1, "chunk %d ends at or before byte %d", k-1, x-1)
		}
	}
}

// FuzzLayout pushes chunks of mixed sizes and cuts them, and checks the
// layout's offsets, index and keep against a byte map after each step.
func FuzzLayout(f *testing.F) {
	f.Add([]byte{1, 1, 1, 0x82, 4, 2})
	f.Add([]byte{8, 1, 1, 8, 0x81, 1, 8})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const unit = 4
		var g layout
		var sizes []uint64
		for _, op := range ops {
			if op&0x80 != 0 { // cut to keep chunks
				keep := int(op&0x7f) % (len(sizes) + 1)
				g.cut(keep)
				sizes = sizes[:keep]
			} else { // push a chunk of 1..16 units
				s := uint64(op%16+1) * unit
				sizes = append(sizes, s)
				g.push(chunk.Chunk{Handle: acl.PhysicalHandle(len(sizes))}, s)
			}
			checkLayout(t, &g, sizes, unit)
		}
		g.reset()
		checkLayout(t, &g, nil, unit)
	})
}
