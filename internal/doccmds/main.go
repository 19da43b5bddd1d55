// Command doccmds runs every shell command README.md and docs/*.md show: the
// lines of their ```sh blocks and the code spans of their prose that start
// like a command and name what they run. table.go says how CI runs each:
// as written; scaled down by flags the docs document; up to the point where
// it needs an NPU or GPU, where it must fail with the message the docs show;
// or by another step of .ci/run. A command the table does not know, an
// entry no page shows any more, and a block of commands not marked ```sh
// all fail (go test ./internal/doccmds checks that much without running
// anything).
//
// The commands run in order, in a copy of the working tree (the files git
// tracks or does not ignore), so that what they write (bench/out, plots
// under docs/img, cuda.test) touches nothing here; the ones that need a
// device run last, after the commands that build what they use.
//
//	go run ./internal/doccmds              # run them all (CI does)
//	go run ./internal/doccmds -list        # show each command and how CI runs it
//	go run ./internal/doccmds -run bench   # only the commands matching a regexp
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

func main() {
	list := flag.Bool("list", false, "list the commands and how CI runs each, and run nothing")
	only := flag.String("run", "", "run only the commands that match this regexp")
	timeout := flag.Duration("timeout", 15*time.Minute, "the most one command may take")
	flag.Parse()
	root, err := moduleRoot()
	if err == nil {
		err = run(root, *list, *only, *timeout, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "doccmds:", err)
		os.Exit(1)
	}
}

// moduleRoot returns the repository: the directory above the working
// directory that holds go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("not inside the module: no go.mod above the working directory")
		}
		dir = up
	}
}

// planned is one command with the places the docs show it and its entry.
type planned struct {
	cmd    string
	places []string
	e      entry
}

func (p planned) describe() string {
	switch p.e.how {
	case scaledDown:
		return "scaled down: " + p.cmd + " " + p.e.flags
	case needsDevice:
		return fmt.Sprintf("needs a device: must fail with %q", p.e.want)
	case byCI:
		return "run by .ci/run: " + p.e.line
	case inNewModule:
		return "in a new module that replaces this one with the tree, offline; then a program there imports arena"
	}
	return "as written"
}

// plan checks the docs against the table and returns the commands in the
// order they run: each once, at its first place; those that need a device
// last.
func plan(root string) ([]planned, error) {
	cmds, probs, err := extract(root)
	if err != nil {
		return nil, err
	}
	errs := check(root, cmds, probs)
	if len(errs) > 0 {
		return nil, fmt.Errorf("the docs and the table of internal/doccmds disagree:\n  %s", strings.Join(errs, "\n  "))
	}
	byCmd := map[string]entry{}
	for _, e := range table {
		byCmd[e.cmd] = e
	}
	var out, device []planned
	seen := map[string]int{}
	for _, c := range cmds {
		place := fmt.Sprintf("%s:%d", c.file, c.line)
		if i, ok := seen[c.text]; ok {
			if i >= 0 {
				out[i].places = append(out[i].places, place)
			} else {
				device[-i-1].places = append(device[-i-1].places, place)
			}
			continue
		}
		p := planned{cmd: c.text, places: []string{place}, e: byCmd[c.text]}
		if p.e.how == needsDevice {
			device = append(device, p)
			seen[c.text] = -len(device)
		} else {
			out = append(out, p)
			seen[c.text] = len(out) - 1
		}
	}
	return append(out, device...), nil
}

func run(root string, list bool, only string, timeout time.Duration, w io.Writer) error {
	steps, err := plan(root)
	if err != nil {
		return err
	}
	var filter *regexp.Regexp
	if only != "" {
		if filter, err = regexp.Compile(only); err != nil {
			return fmt.Errorf("-run: %w", err)
		}
	}
	if list {
		for _, p := range steps {
			fmt.Fprintf(w, "%s\n    %s (%s)\n", p.cmd, p.describe(), strings.Join(p.places, ", "))
		}
		return nil
	}
	work, err := os.MkdirTemp("", "vmarena-doccmds-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	tree := filepath.Join(work, "tree")
	if err := copyTree(root, tree); err != nil {
		return err
	}
	fmt.Fprintf(w, "doccmds: the commands of README.md and docs/, in a copy of the tree (%s)\n", tree)
	start := time.Now()
	var failed []string
	ran, byCIn := 0, 0
	done := map[string]string{} // a line already run, and how it went
	for _, p := range steps {
		if filter != nil && !filter.MatchString(p.cmd) {
			continue
		}
		if p.e.how == byCI {
			byCIn++
			continue
		}
		line := p.cmd
		if p.e.how == scaledDown {
			line += " " + p.e.flags
		}
		if status, ok := done[line]; ok && p.e.how != needsDevice {
			// Scaled down, it is a command the docs show as it is.
			fmt.Fprintf(w, "%s    —    %s (run above)\n", status, line)
			continue
		}
		t0 := time.Now()
		var out []byte
		var runErr error
		if p.e.how == inNewModule {
			out, runErr = inModule(work, tree, line, timeout)
		} else {
			out, runErr = execute(tree, line, timeout, nil)
		}
		ran++
		verdict := judge(p, out, runErr)
		status := "ok  "
		if verdict != "" {
			status = "FAIL"
			failed = append(failed, p.cmd)
		}
		done[line] = status
		fmt.Fprintf(w, "%s %6.1fs  %s\n", status, time.Since(t0).Seconds(), line)
		if p.e.how == needsDevice && verdict == "" {
			if runErr == nil {
				fmt.Fprintf(w, "             succeeded: the device is here\n")
			} else {
				fmt.Fprintf(w, "             failed as documented: %q\n", p.e.want)
			}
		}
		if verdict != "" {
			fmt.Fprintf(w, "    %s (shown at %s)\n%s", verdict, strings.Join(p.places, ", "), tail(out, 40))
		}
	}
	fmt.Fprintf(w, "doccmds: %d commands run in %.0fs, %d run by other steps of .ci/run\n", ran, time.Since(start).Seconds(), byCIn)
	if len(failed) > 0 {
		return fmt.Errorf("%d documented commands failed:\n  %s", len(failed), strings.Join(failed, "\n  "))
	}
	return nil
}

// modulePath is this module's path, as go.mod declares it.
const modulePath = "github.com/vmarena/vmarena"

// userProgram is what a user of the module builds after go get: it must
// allocate from an arena and print the buffer's size.
const userProgram = `package main

import (
	"fmt"
	"log"

	"github.com/vmarena/vmarena/arena"
)

func main() {
	a, err := arena.New(arena.Config{Reserve: 64 << 20})
	if err != nil {
		log.Fatal(err)
	}
	defer a.Close()
	b, err := a.Alloc(1<<20, 256)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("allocated", b.Len())
}
`

// inModule runs line as a user runs it in a module of their own (see
// inNewModule), then builds and runs userProgram there.
func inModule(work, tree, line string, timeout time.Duration) ([]byte, error) {
	dir, err := os.MkdirTemp(work, "user-")
	if err != nil {
		return nil, err
	}
	sum, err := os.ReadFile(filepath.Join(tree, "go.sum"))
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644); err != nil {
		return nil, err
	}
	offline := []string{"GOPROXY=off", "GOFLAGS=-mod=mod"}
	var all []byte
	for _, step := range []string{
		"go mod init example.com/user",
		"go mod edit -replace " + modulePath + "=" + tree,
		line,
	} {
		out, err := execute(dir, step, timeout, offline)
		all = append(all, out...)
		if err != nil {
			return all, fmt.Errorf("%s: %w", step, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(userProgram), 0o644); err != nil {
		return all, err
	}
	out, err := execute(dir, "go mod tidy && go run .", timeout, offline)
	all = append(all, out...)
	if err == nil && !bytes.Contains(out, []byte("allocated 1048576")) {
		err = errors.New("the program that imports arena did not allocate")
	}
	return all, err
}

// execute runs a command line with bash in dir, with env added to the
// environment.
func execute(dir, line string, timeout time.Duration, env []string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c", line)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		err = fmt.Errorf("timed out after %v", timeout)
	}
	return out.Bytes(), err
}

// judge returns why a command's run is a failure, or "".
func judge(p planned, out []byte, err error) string {
	if p.e.how == needsDevice {
		switch {
		case err == nil:
			return ""
		case !bytes.Contains(out, []byte(p.e.want)):
			return fmt.Sprintf("failed (%v), but not with the documented %q", err, p.e.want)
		}
		return ""
	}
	if err != nil {
		return fmt.Sprintf("failed: %v", err)
	}
	if bytes.Contains(out, []byte("no tests to run")) {
		return "go test ran no test: its -run or -bench pattern matches nothing"
	}
	return ""
}

func tail(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{"    …"}, lines[len(lines)-n:]...)
	}
	return "    " + strings.Join(lines, "\n    ") + "\n"
}

// copyTree copies the files git tracks, or would track (not ignored), from
// root to dst.
func copyTree(root, dst string) error {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	list, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("git ls-files (the copy of the tree the commands run in): %w", err)
	}
	for _, f := range strings.Split(strings.TrimRight(string(list), "\x00"), "\x00") {
		if f == "" {
			continue
		}
		src := filepath.Join(root, f)
		st, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree, not yet in the index
		}
		if err != nil {
			return err
		}
		to := filepath.Join(dst, f)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if st.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, to); err != nil {
				return err
			}
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(to, b, st.Mode().Perm()); err != nil {
			return err
		}
	}
	return nil
}
