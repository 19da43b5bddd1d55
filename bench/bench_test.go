package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmarena/vmarena/bench/internal/strategy"
	"github.com/vmarena/vmarena/internal/skip"
)

// TestQuick runs the whole suite in quick mode on the host driver, writing
// and reading back every tensor (-verify), and checks what it prints and
// writes.
func TestQuick(t *testing.T) {
	skip.IfShort(t, "the quick suite takes a few seconds")
	dir := t.TempDir()
	o, err := parseFlags([]string{"-quick", "-verify", "-device", "host", "-progress", "off", "-out", dir, "-strategies", "all"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	text := out.String()
	for _, want := range []string{"== kv:", "== models:", "serving models", "== scratch:", "== churn:", "== swap:", "== micro:", "== targets", "waits and scrubs", "on path", "serving"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	for _, name := range strategy.Names {
		if !strings.Contains(text, name) {
			t.Errorf("output lacks strategy %q", name)
		}
	}

	b, err := os.ReadFile(filepath.Join(dir, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Rows []struct {
			Workload, Strategy string
			PeakPhysical       int64   `json:"peak_physical"`
			PeakLive           int64   `json:"peak_live"`
			WallNS             float64 `json:"wall_ns"`
			DeviceSyncs        int64   `json:"device_syncs"`
			MaxMappings        int64   `json:"max_mappings"`
			MaxMapBatch        int64   `json:"max_map_batch"`
			Remaps             int64   `json:"remaps"`
			Reclaimed          int64   `json:"reclaimed"`
		}
		Targets []struct{ Name string }
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	// One key style throughout: snake_case, but for the driver calls' names.
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(v any, path string)
	walk = func(v any, path string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if k != snake(k) && !strings.HasSuffix(path, "driver_calls") && !strings.HasSuffix(path, "driver_calls_on_path") &&
					!strings.HasSuffix(path, "driver_calls_beside_path") {
					t.Errorf("results.json: key %s.%s is not snake_case", path, k)
				}
				walk(x, path+"."+k)
			}
		case []any:
			for _, x := range v {
				walk(x, path+"[]")
			}
		}
	}
	walk(doc, "")
	want := 0
	for _, w := range replayed {
		for _, name := range strategy.Names {
			if runsOn(w, name) {
				want++
			}
		}
	}
	if len(res.Rows) != want {
		t.Errorf("results.json has %d rows, want %d", len(res.Rows), want)
	}
	for _, r := range res.Rows {
		if r.WallNS <= 0 || r.PeakLive <= 0 || r.PeakPhysical < r.PeakLive {
			t.Errorf("implausible row %+v", r)
		}
		if r.Strategy == "arena" && r.DeviceSyncs != 0 {
			t.Errorf("%s: the arena, given the workload's stream, waited for the whole device %d times", r.Workload, r.DeviceSyncs)
		}
	}
	if len(res.Targets) == 0 {
		t.Error("no targets checked")
	}
	// -quick exercises what the full run does, at small sizes.
	seen := map[string]bool{}
	for _, r := range res.Rows {
		key := r.Workload + "/" + r.Strategy
		seen[key] = true
		var got []string
		if r.MaxMappings > 1 {
			got = append(got, "several")
		}
		if r.MaxMapBatch > 1 {
			got = append(got, "batch")
		}
		if r.Remaps > 0 {
			got = append(got, "regrowth")
		}
		if r.Reclaimed > 0 {
			got = append(got, "relief")
		}
		for _, f := range strings.Split(fullFeatures[key], ",") {
			if f != "" && !slices.Contains(got, f) {
				t.Errorf("%s: the full run exercises %s (%s), -quick does not (it did %v): max mappings %d, most mapped at once %d, remaps %d, reclaimed %d",
					key, f, featureMeaning[f], got, r.MaxMappings, r.MaxMapBatch, r.Remaps, r.Reclaimed)
			}
		}
	}
	for key := range fullFeatures {
		if !seen[key] {
			t.Errorf("%s: in the full run, not in -quick", key)
		}
	}

	// bench.txt is Go benchmark format: a header, then Benchmark lines with
	// an iteration count and value-unit pairs.
	f, err := os.Open(filepath.Join(dir, "bench.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		if len(fields) < 4 || len(fields)%2 != 0 {
			t.Errorf("malformed benchmark line %q", sc.Text())
		}
		lines++
	}
	if want := len(res.Rows) + 3; lines != want {
		t.Errorf("bench.txt has %d benchmark lines, want %d", lines, want)
	}

	for _, w := range replayed {
		for _, p := range []string{"mem-" + w + ".png", "grow-" + w + ".png"} {
			st, err := os.Stat(filepath.Join(dir, p))
			if err != nil || st.Size() == 0 {
				t.Errorf("plot %s: %v", p, err)
			}
		}
	}
}

// fullFeatures is what the full suite (go run ./bench, no flags) exercised
// on the host driver and on the device model, by workload and strategy (the
// default strategies; arena-eager as the arena): results.json's
// max_mappings > 1 (several), max_map_batch > 1 (batch), remaps > 0
// (regrowth) and reclaimed > 0 (relief). TestQuick requires -quick to do at
// least as much.
var fullFeatures = map[string]string{
	"kv/arena":                   "several,batch",
	"kv/arena-eager":             "several,batch",
	"kv/caching-expandable":      "several,batch",
	"models/arena":               "several,batch,relief",
	"scratch/arena":              "several,batch,regrowth",
	"scratch/arena-eager":        "several,batch,regrowth",
	"scratch/caching-expandable": "several,batch",
	"churn/arena":                "several,batch,regrowth,relief",
	"churn/arena-eager":          "several,batch,regrowth",
	"churn/caching-expandable":   "several",
}

var featureMeaning = map[string]string{
	"several":  "a region holding several mappings",
	"batch":    "several mappings made at once, before their access call",
	"regrowth": "a region mapped again where a shrink had unmapped",
	"relief":   "idle chunks taken back under the budget for another tenant",
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "256KiB": 256 << 10, "8MiB": 8 << 20, "1.5GiB": 3 << 29, "2m": 2 << 20} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := parseSize("lots"); err == nil {
		t.Error("parseSize(lots) did not fail")
	}
}

func TestFlags(t *testing.T) {
	o, err := parseFlags([]string{"-quick", "-kv-slots", "3", "-strategies", "arena,realloc", "-scratch-size", "1MiB:2MiB"}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !o.kv.Roofline || o.kv.Hidden != 512 {
		t.Errorf("quick: the step time is the roofline of a small model; got roofline %v, hidden %d", o.kv.Roofline, o.kv.Hidden)
	}
	o2, err := parseFlags([]string{"-kv-compute", "1ms"}, os.Stderr)
	if err != nil || o2.kv.Roofline || o2.kv.StepCompute != time.Millisecond {
		t.Errorf("-kv-compute 1ms: roofline %v, %v, %v", o2.kv.Roofline, o2.kv.StepCompute, err)
	}
	if o.kv.Slots != 3 || o.kv.Requests != 8 {
		t.Errorf("quick must not override an explicit flag: slots %d, requests %d", o.kv.Slots, o.kv.Requests)
	}
	if strings.Join(o.strategies, ",") != "arena,realloc" || o.scratch.MinSize != 1<<20 || o.scratch.MaxSize != 2<<20 {
		t.Errorf("flags not applied: %+v", o)
	}
	for _, bad := range [][]string{{"-strategies", "magic"}, {"-count", "0"}, {"-touch=false", "-verify"}, {"-scrub", "sometimes"}} {
		if _, err := parseFlags(bad, &bytes.Buffer{}); err == nil {
			t.Errorf("parseFlags(%q) did not fail", bad)
		}
	}
}
