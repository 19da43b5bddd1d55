//go:build !linux

package arena_test

import "testing"

// cpuPerOp reports nothing where the thread's CPU time is not read.
func cpuPerOp(b *testing.B) func() { return func() {} }
