package arena

import (
	"testing"

	"github.com/vmarena/vmarena/acl/host"
)

// BenchmarkStaleCheck is what a copy's checks of its buffer cost (Buffer.check:
// the arena open and awake, the buffer not stale and in range), by how the
// staleness is settled:
// fresh, a buffer cut after the arena's last drop; below, one cut before
// drops that all left Len above its end (two atomic loads each); searched,
// one cut before such drops but above an earlier one, whose check searches
// the drops' records (depth of them since the buffer). Compare with
// BenchmarkCopyIn4K.
func BenchmarkStaleCheck(b *testing.B) {
	for _, tc := range []struct {
		name         string
		above, depth int
	}{{"fresh", 0, 0}, {"below", 0, 1}, {"searched", 1, 1}, {"searched-64", 1, 64}} {
		b.Run(tc.name, func(b *testing.B) {
			d, err := host.New(host.Config{Capacity: 64 << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close()
			a, err := New(Config{Driver: d, Reserve: 16 << 20})
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			if tc.above > 0 { // a drop below the buffer
				if _, err := a.Alloc(128, 1); err != nil {
					b.Fatal(err)
				}
				if err := a.Truncate(64); err != nil {
					b.Fatal(err)
				}
			}
			buf, err := a.Alloc(4096, 64)
			if err != nil {
				b.Fatal(err)
			}
			for i := range tc.depth { // drops above it, each above the last
				l := a.Len()
				if _, err := a.Alloc(64+i, 1); err != nil {
					b.Fatal(err)
				}
				if _, err := a.Alloc(64, 1); err != nil {
					b.Fatal(err)
				}
				if err := a.Truncate(l + 64 + i); err != nil {
					b.Fatal(err)
				}
			}
			for b.Loop() {
				if err := buf.check("copy in"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
