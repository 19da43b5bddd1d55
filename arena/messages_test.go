package arena_test

import (
	"strings"
	"testing"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/acl/host"
	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/chunk"
)

// Every error the arena returns, with a driver fault injected at each call
// of each kind, names each layer once: no "arena: … arena:" or
// "chunk: … chunk:", and sizes come with their binary units.
func TestMessagesSayEachPrefixOnce(t *testing.T) {
	seen := map[string]bool{}
	note := func(err error) {
		if err != nil {
			seen[err.Error()] = true
		}
	}
	for _, op := range faultdriver.Ops {
		for n := 1; n <= 2; n++ {
			for _, streams := range []bool{false, true} {
				hd, err := host.New(host.Config{Capacity: 64 << 20})
				if err != nil {
					t.Fatal(err)
				}
				fd := faultdriver.New(hd)
				pool, err := chunk.New(fd, chunk.Config{Budget: 32 << 20})
				if err != nil {
					t.Fatal(err)
				}
				var ss []acl.Stream
				if streams {
					s, err := hd.CreateStream()
					if err != nil {
						t.Fatal(err)
					}
					ss = []acl.Stream{s}
				}
				fd.FailNth(op, n, faultdriver.DefaultCode(op))
				a, err := arena.New(arena.Config{Pool: pool, Reserve: 16 << 20, Streams: ss})
				note(err)
				if err == nil {
					b, err := a.Alloc(3<<20, 64)
					note(err)
					note(arena.CopyIn(b, make([]byte, 100)))
					note(arena.CopyOut(make([]byte, 100), b))
					note(arena.Fill(b, 1))
					note(a.Grow(4 << 20))
					note(a.Grow(64 << 20))
					note(a.Truncate(1 << 20))
					note(a.Shrink())
					note(a.Grow(6 << 20))
					note(a.Reset())
					note(a.Close())
					fd.Clear()
					note(a.Close())
					note(a.Grow(1))
				}
				fd.Clear()
				note(pool.Close())
				for _, s := range ss {
					note(hd.SynchronizeStream(s))
					note(hd.DestroyStream(s))
				}
				note(hd.Close())
			}
		}
	}
	if len(seen) < 20 {
		t.Errorf("only %d distinct messages: the faults did not reach the paths", len(seen))
	}
	for msg := range seen {
		for _, p := range []string{"arena: ", "chunk: ", "host driver: "} {
			if strings.Count(msg, p) > 1 {
				t.Errorf("%q twice: %s", p, msg)
			}
		}
		// A byte count of 1 KiB or more carries its binary units.
		fs := strings.Fields(msg)
		for k, f := range fs {
			if len(f) >= 4 && strings.Trim(f, "0123456789") == "" && k+1 < len(fs) && strings.HasPrefix(fs[k+1], "bytes") &&
				(k+2 >= len(fs) || !strings.HasPrefix(fs[k+2], "(")) {
				t.Errorf("%s bytes without units: %s", f, msg)
			}
		}
	}
}
