package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSnake(t *testing.T) {
	for in, want := range map[string]string{
		"InUse": "in_use", "HeldBytes": "held_bytes", "WorkerNS": "worker_ns", "PromptMin": "prompt_min",
		"KVHeads": "kv_heads", "DType": "d_type", "ScrubsFresh": "scrubs_fresh", "wall_ns": "wall_ns", "Step": "step",
		"BudgetBytes": "budget_bytes", "Tenants": "tenants",
	} {
		if got := snake(in); got != want {
			t.Errorf("snake(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSnakeKeys(t *testing.T) {
	in := `{"rows":[{"wall_ns":1,"pool":{"InUse":2,"HeldBytes":3.5}},{"driver_calls":{"MallocPhysical":[1,2]}}],"workloads":{"kv":{"KVHeads":8,"Seed":1}},"x":[[],{}],"s":"InUse"}`
	want := `{"rows":[{"wall_ns":1,"pool":{"in_use":2,"held_bytes":3.5}},{"driver_calls":{"MallocPhysical":[1,2]}}],"workloads":{"kv":{"kv_heads":8,"seed":1}},"x":[[],{}],"s":"InUse"}`
	got, err := snakeKeys([]byte(in), "driver_calls")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("snakeKeys:\n got %s\nwant %s", got, want)
	}
}

func TestCommandLine(t *testing.T) {
	built := filepath.Join(os.TempDir(), "go-build123", "b001", "exe", "bench")
	if got := commandLine([]string{built, "-quick"}); got != "go run ./bench -quick" {
		t.Errorf("go run: %q", got)
	}
	if got := commandLine([]string{"./vmbench", "-quick", "-out", "x"}); got != "./vmbench -quick -out x" {
		t.Errorf("a built binary: %q", got)
	}
}

func TestPlotText(t *testing.T) {
	if got := wrap("aaa bbb ccc ddd", 7); got != "aaa bbb\nccc ddd" {
		t.Errorf("wrap = %q", got)
	}
	for top, want := range map[int64]string{512: "B", 40 << 20: "MiB", 3 << 30: "GiB", 1 << 10: "KiB"} {
		if u, _ := byteUnit(top); u != want {
			t.Errorf("byteUnit(%d) = %s, want %s", top, u, want)
		}
	}
}
