package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
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
