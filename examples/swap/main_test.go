package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	t.Setenv("VMARENA_DEVICE", "host")
	*weightsMiB, *kvMiB, *turns = 16, 8, 4
	var out bytes.Buffer
	res, err := run(&out)
	if err != nil {
		t.Fatal(err)
	}
	if res.modelled || res.wake <= 0 || res.reload <= 0 || !strings.Contains(out.String(), "wall-clock times") {
		t.Errorf("on the host driver: %+v\n%s", res, out.String())
	}
	if !strings.Contains(out.String(), "model-A's wake, asked while model-B held the budget, waited") {
		t.Errorf("the wake that waits for memory is not shown:\n%s", out.String())
	}
}

// TestWakeBeatsReloadOnTheModel checks the claim the example prints, on the
// device model, where the times are modelled and so the same on every run
// and machine: a wake costs less than a full reload, which frees, allocates,
// maps and copies from Go memory at the pageable bandwidth where the wake
// copies from pinned memory.
func TestWakeBeatsReloadOnTheModel(t *testing.T) {
	t.Setenv("VMARENA_DEVICE", "model:h200")
	*weightsMiB, *kvMiB, *turns = 16, 8, 2
	var out bytes.Buffer
	res, err := run(&out)
	if err != nil {
		t.Fatal(err)
	}
	if !res.modelled {
		t.Fatalf("the model's times were not used:\n%s", out.String())
	}
	if r := res.ratio(); r <= 1 {
		t.Errorf("a full reload took %.2f× a wake on the model, not more:\n%s", r, out.String())
	}
	if want := fmt.Sprintf("%.2f× the wake", res.ratio()); !strings.Contains(out.String(), want) {
		t.Errorf("the output does not say %q:\n%s", want, out.String())
	}
	again, err := run(&bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if again != res {
		t.Errorf("modelled times differ between two runs: %+v, then %+v", res, again)
	}
}
