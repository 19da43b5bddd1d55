package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode"
)

// snakeKeys rewrites the JSON document b with every object key in
// snake_case, so that results.json uses one style throughout: the report's
// own keys are snake_case already, and the structs it embeds from other
// packages (the workloads' settings, the pool's statistics, the samples)
// have Go's field names. The order of keys is kept. The keys of the objects
// under the keys named in keep are data, not field names, and are kept as
// they are.
func snakeKeys(b []byte, keep ...string) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type frame struct {
		object, wantKey, keep bool
		n                     int
	}
	var out bytes.Buffer
	var stack []*frame
	keepNext := false // the value about to start is under a kept key
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			out.WriteByte(byte(d))
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].wantKey = true
			}
			continue
		}
		if top != nil && (!top.object || top.wantKey) && top.n > 0 {
			out.WriteByte(',')
		}
		if top != nil && top.object && top.wantKey {
			key := tok.(string)
			keepNext = false
			for _, k := range keep {
				keepNext = keepNext || key == k
			}
			if !top.keep {
				key = snake(key)
			}
			kb, _ := json.Marshal(key)
			out.Write(kb)
			out.WriteByte(':')
			top.wantKey = false
			top.n++
			continue
		}
		if top != nil && !top.object {
			top.n++
		}
		switch t := tok.(type) {
		case json.Delim:
			out.WriteByte(byte(t))
			stack = append(stack, &frame{object: t == '{', wantKey: t == '{', keep: keepNext})
			keepNext = false
			continue
		case json.Number:
			out.WriteString(t.String())
		default:
			vb, err := json.Marshal(t)
			if err != nil {
				return nil, err
			}
			out.Write(vb)
		}
		keepNext = false
		if top != nil && top.object {
			top.wantKey = true
		}
	}
	return out.Bytes(), nil
}

// snake turns a Go field name into snake_case: "InUse" → "in_use",
// "HeldBytes" → "held_bytes", "WorkerNS" → "worker_ns", "PromptMin" →
// "prompt_min". Keys already in lower case are returned as they are.
func snake(s string) string {
	r := []rune(s)
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) {
			// A word starts at an upper-case letter after a lower-case one
			// or a digit, or before a lower-case one inside a run of
			// capitals ("WorkerNS", "DTypeX").
			if i > 0 && (unicode.IsLower(r[i-1]) || unicode.IsDigit(r[i-1]) ||
				(i+1 < len(r) && unicode.IsLower(r[i+1]) && unicode.IsUpper(r[i-1]))) {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(c))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// commandLine is the command that ran the suite, for results.json: "go run
// ./bench" and the flags when go run built it, else the binary as it was
// invoked.
func commandLine(args []string) string {
	if len(args) == 0 {
		return ""
	}
	prog := args[0]
	if strings.Contains(filepath.ToSlash(prog), "/go-build") && strings.HasPrefix(prog, os.TempDir()) {
		prog = "go run ./bench"
	}
	return strings.TrimSpace(fmt.Sprint(prog, " ", strings.Join(args[1:], " ")))
}
