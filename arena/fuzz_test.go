package arena_test

import (
	"testing"

	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/chunk"
)

// FuzzModel lets the fuzzer choose the model's operations (see
// model_test.go). The first byte picks the configuration (its bits: scrub on
// release, device limit, a one-chunk cache, a four-chunk limit, headroom,
// shared tenants, streams with kernels in flight, sleep and wake), the next two a
// driver call to fail (0: none), and the rest every decision of the
// sequence. Every step is checked against the model; at the end nothing may
// be left. The seed corpus is in testdata/fuzz/FuzzModel.
//
//	go test -run '^$' -fuzz '^FuzzModel$' -fuzztime=20s ./arena
func FuzzModel(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{1, 0, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 99, 0, 255})
	f.Add([]byte{16 | 32 | 64, 0, 0, 5, 200, 17, 3, 99, 42, 8, 250, 1, 77, 6, 130, 9})
	f.Add([]byte{8 | 16 | 32 | 64, 0, 9, 1, 2, 3, 96, 97, 98, 40, 41, 42, 80, 81, 82})
	f.Add([]byte{16 | 64 | 128, 0, 0, 20, 107, 15, 108, 104, 101, 30, 109, 1, 105, 60, 102, 106, 0, 104})
	modelHook(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 3 {
			return
		}
		cfg, pos := data[0], int(data[1])<<8|int(data[2])
		o := defaultModelOpts()
		o.ops = 300
		if cfg&1 != 0 {
			o.scrub = chunk.ScrubOnRelease
		}
		if cfg&2 != 0 {
			o.byDevice = true
		}
		if cfg&4 != 0 {
			o.maxCached = 1
		}
		if cfg&8 != 0 {
			o.limit = 4
		}
		o.headroom = cfg&16 != 0
		o.tenants = cfg&32 != 0
		o.streams = cfg&64 != 0
		o.sleep = cfg&128 != 0
		w := newWorld(t, &byteChooser{data[3:]}, o)
		if pos > 0 {
			w.fd.FailNth(faultdriver.Any, pos, 0)
		}
		w.run()
	})
}
