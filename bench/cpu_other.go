//go:build !unix && !windows

package main

// cpuTime returns 0: this system has no per-process CPU time the suite
// reads, and the results' CPU columns read 0.
func cpuTime() int64 { return 0 }
