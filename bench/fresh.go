package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vmarena/vmarena/bench/internal/workload"
)

// Fresh processes: with -fresh (the default) the suite runs every
// (repetition, workload, strategy) in a child process of its own, the same
// executable started again with the same flags and two variables saying
// which run to make and where to write its result. Each run then finds the
// device as a process that serves one model does: no memory another
// strategy's run freed (whose reuse the pool would have to clear for a new
// tenant), no chunks, streams or Go heap left behind, and its own process
// CPU time. -fresh=false runs everything in this process, as the tests do.
const (
	childEnv    = "VMARENA_BENCH_CHILD"        // "workload/strategy/rep"
	childOutEnv = "VMARENA_BENCH_CHILD_OUT"    // the file the child writes its result to
	childDevEnv = "VMARENA_BENCH_CHILD_DEVICE" // the device spec the parent opened
)

// childMode reports whether this process is a child run, and if so makes the
// run and exits: main calls it before anything else.
func childMode(args []string) bool {
	spec := os.Getenv(childEnv)
	if spec == "" {
		return false
	}
	if err := runChild(spec, os.Getenv(childOutEnv), args); err != nil {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

func runChild(spec, out string, args []string) error {
	parts := strings.Split(spec, "/")
	if len(parts) != 3 || out == "" {
		return fmt.Errorf("%s=%q, %s=%q: want workload/strategy/rep and a file", childEnv, spec, childOutEnv, out)
	}
	rep, err := strconv.Atoi(parts[2])
	if err != nil {
		return fmt.Errorf("%s=%q: %w", childEnv, spec, err)
	}
	o, err := parseFlags(args, os.Stderr)
	if err != nil {
		return err
	}
	if spec := os.Getenv(childDevEnv); spec != "" {
		o.spec = spec
	}
	s, closeDrv, err := openSuite(o)
	if err != nil {
		return err
	}
	defer closeDrv()
	s.child = true
	res, err := s.runOne(o.workload(parts[0]), parts[1], rep, func(float64) {})
	if err != nil {
		return err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return os.WriteFile(out, b, 0o644)
}

// runFresh makes one run in a child process and reads its result back.
func (s *suite) runFresh(wname, name string, rep int) (*workload.Result, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("-fresh: find this executable: %w (run with -fresh=false)", err)
	}
	dir, err := os.MkdirTemp("", "vmarena-bench-run-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "result.json")
	cmd := exec.Command(exe, s.opts.args...)
	cmd.Env = append(os.Environ(), childEnv+"="+fmt.Sprintf("%s/%s/%d", wname, name, rep), childOutEnv+"="+out,
		childDevEnv+"="+s.opts.spec)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s on %s, in a fresh process: %w: %s", wname, name, err, strings.TrimSpace(stderr.String()))
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, fmt.Errorf("%s on %s, in a fresh process: %w", wname, name, err)
	}
	var res workload.Result
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, fmt.Errorf("%s on %s, in a fresh process: its result: %w", wname, name, err)
	}
	return &res, nil
}
