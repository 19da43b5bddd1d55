//go:build unix

package main

import "syscall"

// cpuTime returns the CPU time the process has used, user and system, in
// nanoseconds: every goroutine's, the background worker's included.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
