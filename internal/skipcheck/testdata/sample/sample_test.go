// Package sample is the fixture of skipcheck's test: one test of each kind
// the checker must tell apart. SAMPLE_FAIL=1 makes TestFails fail.
package sample

import (
	"errors"
	"os"
	"testing"

	"github.com/vmarena/vmarena/internal/skip"
)

func TestPasses(t *testing.T) {}

func TestNoDevice(t *testing.T) { skip.NoDevice(t, "no NPU here") }

func TestSubtests(t *testing.T) {
	t.Run("Runs", func(t *testing.T) {})
	t.Run("Short", func(t *testing.T) { skip.IfShort(t, "long") })
}

func TestNoGCC(t *testing.T) { skip.NoGCC(t, errors.New("no C compiler (gcc)")) }

func TestUntagged(t *testing.T) { t.Skip("our double did not build") }

func TestFails(t *testing.T) {
	if os.Getenv("SAMPLE_FAIL") != "" {
		t.Fatal("failed on purpose")
	}
}
