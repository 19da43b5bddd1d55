// Package goid tells the calling goroutine's number, for the one thing it is
// used for here: refusing a call that would deadlock because it comes from
// a callback the callee itself is running, on the same goroutine, while it
// holds its own locks. It reads the number from the first line of the
// goroutine's stack trace ("goroutine 18 [running]:"), a format the Go
// runtime has kept since its first release; it costs about a microsecond,
// so callers look only while such a callback runs.
package goid

import (
	"runtime"
	"strconv"
)

// ID returns the calling goroutine's number, or 0 if it cannot be read.
func ID() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	const prefix = "goroutine "
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return 0
	}
	b = b[len(prefix):]
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	n, err := strconv.ParseInt(string(b[:i]), 10, 64)
	if err != nil {
		return 0
	}
	return n
}
