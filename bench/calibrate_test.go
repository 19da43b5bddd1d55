package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmarena/vmarena/acl/model"
)

// TestCalibrate runs -calibrate -quick on the device model and reads the
// profile it writes back.
func TestCalibrate(t *testing.T) {
	out := filepath.Join(t.TempDir(), "p.json")
	o, err := parseFlags([]string{"-calibrate", "-quick", "-device", "model:a100", "-profile-out", out}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := runCalibrate(o, &buf); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	text := buf.String()
	for _, want := range []string{"times are modelled", "calibrates the device model itself", "malloc", "wrote " + out} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	p, err := model.LoadProfileFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "model-a100" || p.Calls["malloc"].Base.Estimate {
		t.Errorf("profile %s: malloc %+v", p.Name, p.Calls["malloc"].Base)
	}
	if _, err := parseFlags([]string{"-calibrate", "-device", "model:a100", "-profile-base", "v100"}, os.Stderr); err != nil {
		t.Fatal(err)
	}
	o.profileBase = "v100"
	if err := runCalibrate(o, &buf); err == nil || !strings.Contains(err.Error(), "-profile-base") {
		t.Errorf("an unknown base profile: %v", err)
	}
}
