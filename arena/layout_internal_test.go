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
		if g.unit == 0 {
			continue
		}
		if x <= g.top() {
			require.Equal(t, g.off(g.keep(x)), g.end(x), "end(%d), without the lock", x)
		} else {
			require.Equal(t, (x+g.unit-1)/g.unit*g.unit, g.end(x), "end(%d) above the top", x)
		}
	}
}

// FuzzLayout pushes chunks and cuts them, and checks the layout's offsets,
// index, keep and end against a byte map after each step: chunks of any
// size, where nothing reads end; and a pool's two sizes, laid as tile lays
// a growth.
func FuzzLayout(f *testing.F) {
	f.Add([]byte{1, 1, 1, 0x82, 4, 2}, false)
	f.Add([]byte{8, 1, 1, 8, 0x81, 1, 8}, false)
	f.Add([]byte{9, 3, 0x81, 17, 2, 0x80, 40}, true)
	f.Fuzz(func(t *testing.T, ops []byte, two bool) {
		const unit, large = 4, 16
		var g layout
		if two {
			g.sizes(large, unit, 64<<10)
		}
		var sizes []uint64
		for _, op := range ops {
			switch {
			case op&0x80 != 0: // cut to keep chunks
				keep := int(op&0x7f) % (len(sizes) + 1)
				g.cut(keep)
				sizes = sizes[:keep]
			case two: // a growth by 1..64 units
				for _, s := range g.tile(nil, g.top(), g.top()+uint64(op%64+1)*unit) {
					sizes = append(sizes, s)
					g.push(chunk.Chunk{Handle: acl.PhysicalHandle(len(sizes))}, s)
				}
			default: // a chunk of 1..16 units
				s := uint64(op%16+1) * unit
				sizes = append(sizes, s)
				g.push(chunk.Chunk{Handle: acl.PhysicalHandle(len(sizes))}, s)
			}
			checkLayout(t, &g, sizes, unit)
		}
		g.reset()
		checkLayout(t, &g, nil, unit)
		for i := range g.big {
			require.Zero(t, g.big[i].Load(), "a block still marked with no chunk in it")
		}
	})
}

// TestTile lays growths as placement does: unit chunks up to a block,
// whole blocks large, unit chunks after.
func TestTile(t *testing.T) {
	var g layout
	g.sizes(16, 4, 1<<10)
	for _, c := range []struct {
		from, to uint64
		want     []uint64
	}{
		{0, 4, []uint64{4}},
		{0, 16, []uint64{16}},
		{0, 20, []uint64{16, 4}},
		{4, 36, []uint64{4, 4, 4, 16, 4}},
		{8, 16, []uint64{4, 4}},
		{16, 48, []uint64{16, 16}},
		{12, 12, nil},
	} {
		require.Equal(t, c.want, g.tile(nil, c.from, c.to), "[%d, %d)", c.from, c.to)
	}
	var one layout
	one.sizes(8, 8, 1<<10)
	require.Equal(t, []uint64{8, 8, 8}, one.tile(nil, 8, 32), "one size")
	require.Nil(t, one.big, "one size keeps no bits")
}
