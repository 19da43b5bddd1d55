//go:build !linux

package counting

// threadID returns 0 where the bench does not tell threads apart: every
// call inside a window then counts as the caller's.
func threadID() int64 { return 0 }
