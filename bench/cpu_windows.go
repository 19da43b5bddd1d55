package main

import "syscall"

// cpuTime returns the CPU time the process has used, user and system, in
// nanoseconds: every goroutine's, the background worker's included.
func cpuTime() int64 {
	p, err := syscall.GetCurrentProcess()
	if err != nil {
		return 0
	}
	var created, exited, kernel, user syscall.Filetime
	if err := syscall.GetProcessTimes(p, &created, &exited, &kernel, &user); err != nil {
		return 0
	}
	// A Filetime counts 100 ns intervals.
	ticks := func(f syscall.Filetime) int64 { return int64(f.HighDateTime)<<32 | int64(f.LowDateTime) }
	return (ticks(kernel) + ticks(user)) * 100
}
