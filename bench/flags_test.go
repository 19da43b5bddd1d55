package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// A bad flag gives one error naming the flag, with that flag's help, and
// not the whole usage; -h gives the usage.
func TestFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"-count", "x"}, []string{`invalid value "x" for flag -count`, "-count int", "repetitions"}},
		{[]string{"-count"}, []string{"flag needs an argument: -count", "-count int"}},
		{[]string{"-chunk", "3x"}, []string{"-chunk size", "multiple of the driver's granularity", "4MiB"}},
		{[]string{"-touch=maybe"}, []string{"-touch", "write every tensor"}},
		{[]string{"-scrub", "sometimes"}, []string{"-scrub", "reuse, release or never"}},
		{[]string{"-nosuch"}, []string{"not defined: -nosuch"}},
	} {
		var out bytes.Buffer
		_, err := parseFlags(c.args, &out)
		if err == nil {
			t.Errorf("%q: no error", c.args)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error %q lacks %q", c.args, err, w)
			}
		}
		if n := strings.Count(err.Error(), "\n"); n > 2 {
			t.Errorf("%q: %d lines of error, want at most 3:\n%s", c.args, n+1, err)
		}
		if out.Len() != 0 {
			t.Errorf("%q: printed %d bytes besides the error:\n%s", c.args, out.Len(), out.String())
		}
	}
	var out bytes.Buffer
	_, err := parseFlags([]string{"-h"}, &out)
	if !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "usage:") || !strings.Contains(out.String(), "-kv-layers") {
		t.Errorf("-h: %v, printed:\n%s", err, out.String())
	}
}

// -chunk must be a multiple of the driver's granularity; the error says
// which sizes are valid, before anything runs.
func TestChunkMustFitGranularity(t *testing.T) {
	for _, ok := range []int64{0, 2 << 20, 64 << 20} {
		if err := checkChunk(ok, 2<<20); err != nil {
			t.Errorf("checkChunk(%d): %v", ok, err)
		}
	}
	err := checkChunk(3<<20, 2<<20)
	if err == nil || !strings.Contains(err.Error(), "-chunk 3MiB") || !strings.Contains(err.Error(), "2MiB, 4MiB, 6MiB") {
		t.Errorf("checkChunk(3MiB) = %v", err)
	}
	o, err := parseFlags([]string{"-device", "host", "-chunk", "3MiB", "-quick", "-out", t.TempDir()}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := run(o, &stdout); err == nil || !strings.Contains(err.Error(), "granularity") {
		t.Errorf("run with -chunk 3MiB: %v", err)
	}
	if stdout.Len() != 0 {
		t.Errorf("run printed before refusing -chunk:\n%s", stdout.String())
	}
}

// -kv-tail must be a multiple of the granularity (checked once the driver
// is open) and divide -chunk (the arena's pool refuses it, naming
// chunk.Config.TailSize).
func TestKVTailChecked(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-kv-tail", "3MiB"}, "-kv-tail 3MiB: want a multiple of the driver's granularity"},
		{[]string{"-chunk", "8MiB", "-kv-tail", "6MiB"}, "TailSize"},
	} {
		args := append([]string{"-device", "host", "-workloads", "kv", "-micro=false", "-quick", "-out", t.TempDir()}, c.args...)
		o, err := parseFlags(args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		var stdout bytes.Buffer
		if err := run(o, &stdout); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run %v: %v, want it to say %q", c.args, err, c.want)
		}
	}
	// A tail as large as the chunk (the pool's choice at a small budget) is
	// one size, not an error.
	o, err := parseFlags([]string{"-device", "host", "-workloads", "kv", "-micro=false", "-quick", "-chunk", "2MiB", "-kv-tail", "2MiB",
		"-strategies", "arena", "-out", t.TempDir()}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := run(o, io.Discard); err != nil {
		t.Errorf("run -chunk 2MiB -kv-tail 2MiB: %v", err)
	}
	// The models workload's pool takes the tail size too.
	dir := t.TempDir()
	o, err = parseFlags([]string{"-device", "host", "-workloads", "models", "-micro=false", "-quick", "-chunk", "4MiB", "-kv-tail", "2MiB",
		"-strategies", "arena", "-out", dir}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(o, &out); err != nil {
		t.Errorf("run -workloads models -chunk 4MiB -kv-tail 2MiB: %v", err)
	}
	if !strings.Contains(out.String(), "tails 2 MiB (-kv-tail)") {
		t.Errorf("the models workload's header does not name the tails:\n%s", out.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Rows []struct {
			Strategy string
			Pool     struct {
				TailSize int64 `json:"tail_size"`
			}
		}
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 1 || res.Rows[0].Pool.TailSize != 2<<20 {
		t.Errorf("the models workload's arena pool: %+v, want a tail size of 2 MiB", res.Rows)
	}

	// Without -kv-tail the pool chooses (a quarter of 16 MiB chunks); a
	// -kv-tail as large as the chunk asks for one size. The header says
	// which, and results.json has what the pool did.
	for _, c := range []struct {
		args   []string
		header string
		tail   int64
	}{
		{nil, "tails 4 MiB (the pool's choice)", 4 << 20},
		{[]string{"-kv-tail", "16MiB"}, "one size (-kv-tail)", 16 << 20},
	} {
		dir := t.TempDir()
		o, err := parseFlags(append([]string{"-device", "host", "-workloads", "kv", "-micro=false", "-quick", "-chunk", "16MiB",
			"-strategies", "arena", "-out", dir}, c.args...), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := run(o, &out); err != nil {
			t.Fatalf("run -chunk 16MiB %v: %v", c.args, err)
		}
		if !strings.Contains(out.String(), c.header) {
			t.Errorf("run -chunk 16MiB %v: the header does not say %q:\n%s", c.args, c.header, out.String())
		}
		b, err := os.ReadFile(filepath.Join(dir, "results.json"))
		if err != nil {
			t.Fatal(err)
		}
		res.Rows = nil
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Rows) != 1 || res.Rows[0].Pool.TailSize != c.tail {
			t.Errorf("run -chunk 16MiB %v: the arena pool %+v, want a tail size of %d", c.args, res.Rows, c.tail)
		}
	}
}

// Every bad flag fails before the first measurement, within a second, with
// an error that names the flag and says what it accepts: those that need no
// driver in parseFlags, the rest (the output directories, budgets that no
// request fits) in run before it prints its header.
func TestBadFlagsFailFirst(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-growth", "0.5"}, "-growth 0.5: want a factor above 1"},
		{[]string{"-growth", "NaN"}, "-growth NaN: want a factor above 1"},
		{[]string{"-kv-slots", "0"}, "-kv-slots 0: want 1 or more"},
		{[]string{"-kv-dtype", "0"}, "-kv-dtype 0: want bytes per element, one of 1, 2, 4, 8"},
		{[]string{"-kv-dtype", "3"}, "-kv-dtype 3: want bytes per element"},
		{[]string{"-kv-layers", "100000", "-kv-heads", "100000"}, "a token's cache would be"},
		{[]string{"-kv-prompt", "0:10"}, "-kv-prompt 0:10: want lo:hi with 1 ≤ lo ≤ hi"},
		{[]string{"-kv-compute", "-1s"}, "-kv-compute"},
		{[]string{"-kv-compute", "fast"}, "want roofline or a duration"},
		{[]string{"-kv-hidden", "0"}, "-kv-hidden 0: want a hidden size from 1 to 65536"},
		{[]string{"-kv-hidden", "65536", "-kv-layers", "100000"}, "want at most 16 TiB"},
		{[]string{"-kv-bandwidth", "-1"}, "-kv-bandwidth"},
		{[]string{"-scratch-size", "0:0"}, "-scratch-size 0:0: want lo:hi sizes with 0 < lo ≤ hi"},
		{[]string{"-scratch-spike", "1.5"}, "-scratch-spike 1.5: want a probability, 0 to 1"},
		{[]string{"-scratch-window", "0"}, "-scratch-window 0: want 1 or more"},
		{[]string{"-churn-tensor", "1000"}, "-churn-tensor 1000: want a positive multiple of"},
		{[]string{"-churn-jitter", "1"}, "-churn-jitter 1: want a fraction"},
		{[]string{"-churn-tenants", "0"}, "-churn-tenants 0: want 1 or more"},
		{[]string{"-progress", "maybe"}, `-progress "maybe": want auto, on or off`},
		{[]string{"-warm", "-2"}, "-warm -2"},
		{[]string{"-cache", "-5"}, "-cache -5"},
		{[]string{"-micro-iters", "0"}, "-micro-iters 0"},
		{[]string{"-alloc-iters", "0"}, "-alloc-iters 0"},
		{[]string{"-out", "/proc/nope"}, "-out /proc/nope: want a directory this user can write"},
		{[]string{"-img", "/proc/nope"}, "-img /proc/nope: want a directory this user can write"},
		{[]string{"-kv-budget", "1MiB"}, "-kv-budget 1MiB: the longest request's cache alone needs"},
		{[]string{"-device", "model:h200,fast"}, `unknown model option "fast"`},
		{[]string{"-readings", "optimistic"}, `-readings "optimistic": want profile, pessimistic or both`},
		{[]string{"-kv-launches", "-1"}, "-kv-launches -1: want 0 or more"},
		{[]string{"-kv-prefetch-steps", "0"}, "-kv-prefetch-steps 0: want 1 or more"},
		{[]string{"-worker-cpu", "1.5"}, "-worker-cpu 1.5: want 0 (no cap) or a share of one CPU from 0.01 to 1"},
		{[]string{"-worker-cpu", "-0.25"}, "-worker-cpu -0.25: want 0"},
		{[]string{"-worker-cpu", "NaN"}, "-worker-cpu NaN: want 0"},
	} {
		args := append([]string{"-device", "host", "-out", dir}, c.args...)
		start := time.Now()
		var stdout bytes.Buffer
		o, err := parseFlags(args, io.Discard)
		if err == nil {
			err = run(o, &stdout)
		}
		took := time.Since(start)
		if err == nil {
			t.Errorf("%q: no error", c.args)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %q lacks %q", c.args, err, c.want)
		}
		if stdout.Len() != 0 {
			t.Errorf("%q: printed before failing:\n%s", c.args, stdout.String())
		}
		if took > time.Second {
			t.Errorf("%q: failed after %v, want within a second", c.args, took)
		}
	}
}

// The help of -device lists every kind of driver, the model included.
func TestDeviceHelp(t *testing.T) {
	var out bytes.Buffer
	_, err := parseFlags([]string{"-h"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatal(err)
	}
	for _, w := range []string{"model:NAME", ",nodata", "cuda[:N]", "ascend[:N]"} {
		i := strings.Index(out.String(), "-device")
		if i < 0 || !strings.Contains(out.String()[i:], w) {
			t.Errorf("-device help lacks %q:\n%s", w, out.String())
		}
	}
}

// The suite runs the model without device bytes unless it reads them back.
func TestModelSpec(t *testing.T) {
	for _, c := range []struct {
		spec   string
		verify bool
		want   string
	}{
		{"model:h200", false, "model:h200,nodata"},
		{"Model:a100", false, "Model:a100,nodata"},
		{"model:h200", true, "model:h200"},
		{"model:h200,data", false, "model:h200,data"},
		{"host", false, "host"},
		{"", false, ""},
	} {
		if got := modelSpec(c.spec, c.verify); got != c.want {
			t.Errorf("modelSpec(%q, %v) = %q, want %q", c.spec, c.verify, got, c.want)
		}
	}
}

// Every reading of a bare model spec keeps no device bytes, the
// pessimistic one alone too (it once kept them, and its runs spent seconds
// writing the weights into host memory), unless the run reads them back; a
// spec that names its options is taken as given.
func TestReadingsKeepNoData(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"-device", "model:h200"}, []string{"model:h200,nodata", "model:h200,nodata,pessimistic"}},
		{[]string{"-device", "model:h200", "-readings", "profile"}, []string{"model:h200,nodata"}},
		{[]string{"-device", "model:h200", "-readings", "pessimistic"}, []string{"model:h200,nodata,pessimistic"}},
		{[]string{"-device", "model:h200", "-readings", "pessimistic", "-touch", "-verify"}, []string{"model:h200,pessimistic"}},
		{[]string{"-device", "model:h200,pessimistic"}, []string{"model:h200,pessimistic"}},
	} {
		o, err := parseFlags(c.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range o.readingList() {
			got = append(got, r.spec)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%q: readings %q, want %q", c.args, got, c.want)
		}
	}
}

// -chunk 0 gives the arena the size its pool would choose for the
// workload's budget (chunk.SizeFor), and the budget's two chunks per slot
// are counted in that size; an explicit -chunk wins.
func TestChunkZeroIsThePoolsChoice(t *testing.T) {
	const gran = 2 << 20
	server := []string{"-kv-slots", "64", "-kv-layers", "80", "-kv-hidden", "8192", "-kv-requests", "64", "-kv-prompt", "64:1024", "-kv-gen", "32:256"}
	for _, c := range []struct {
		args  []string
		chunk int64
	}{
		{nil, 4 << 20}, // the default size: a 5 GiB budget
		{server, 16 << 20},
		{append([]string{"-chunk", "8MiB"}, server...), 8 << 20},
		{[]string{"-chunk", "4MiB"}, 4 << 20},
	} {
		o, err := parseFlags(c.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := o.arenaChunk(o.kv, gran); got != c.chunk {
			t.Errorf("%q: arena chunk %d, want %d", c.args, got, c.chunk)
		}
		if got, want := o.budget(o.kv, gran), o.kv.Budget(c.chunk); got != want {
			t.Errorf("%q: budget %d, want %d (slack in %d-byte chunks)", c.args, got, want, c.chunk)
		}
	}
}

// -headroom's default leaves the choice to the workload: none for kv, whose
// running sequences tell their regions the block they will grow into, 2
// chunks where a region grows without notice; an explicit value wins, and
// below -1 is refused.
func TestHeadroomIsTheWorkloadsChoice(t *testing.T) {
	for _, c := range []struct {
		args      []string
		kv, other int
	}{
		{nil, 0, 2},
		{[]string{"-kv-prefetch-blocks=false"}, 2, 2},
		{[]string{"-kv-prefetch=false"}, 2, 2},
		{[]string{"-headroom", "3"}, 3, 3},
		{[]string{"-headroom", "0"}, 0, 0},
	} {
		o, err := parseFlags(c.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := o.headroomFor(o.kv); got != c.kv {
			t.Errorf("%q: kv headroom %d, want %d", c.args, got, c.kv)
		}
		if got := o.headroomFor(o.models); got != c.other {
			t.Errorf("%q: models headroom %d, want %d", c.args, got, c.other)
		}
	}
	if _, err := parseFlags([]string{"-headroom", "-2"}, io.Discard); err == nil {
		t.Error("-headroom -2 accepted")
	}
}

// -kv-token-headroom keeps a kv sequence's tokens ahead as the arena's
// headroom, in bytes, where the workload grows the arena by its tokens and
// tells it what it grows into, and -headroom leaves the choice to it.
func TestTokenHeadroom(t *testing.T) {
	for _, c := range []struct {
		args []string
		on   bool
	}{
		{nil, false},
		{[]string{"-kv-token-headroom"}, true},
		{[]string{"-kv-token-headroom", "-kv-compute", "1ms"}, true},
		{[]string{"-kv-token-headroom", "-headroom", "2"}, false},
		{[]string{"-kv-token-headroom", "-kv-token-growth=false"}, false},
		{[]string{"-kv-token-headroom", "-kv-prefetch-blocks=false"}, false},
	} {
		o, err := parseFlags(c.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		want := int64(0)
		if c.on {
			want = int64(o.kv.TokensAhead()) * o.kv.TokenBytes()
		}
		if got := o.tokenHeadroom(o.kv); got != want || c.on && got == 0 {
			t.Errorf("%q: token headroom %d, want %d", c.args, got, want)
		}
		if got := o.tokenHeadroom(o.models); got != 0 {
			t.Errorf("%q: models token headroom %d, want 0", c.args, got)
		}
	}
}
