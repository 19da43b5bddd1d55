package arena_test

import (
	"runtime"
	"syscall"
	"testing"
	"time"
)

// threadCPU returns the CPU time the calling thread has used (user and
// system).
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuPerOp locks the benchmark to its thread and returns a function that
// reports the thread's CPU time per operation ("cpu-ns/op"), which time the
// machine gave other processes does not inflate as it does ns/op. Call it
// just before the loop and the function just after.
func cpuPerOp(b *testing.B) func() {
	runtime.LockOSThread()
	t0 := threadCPU()
	return func() {
		b.ReportMetric(float64(threadCPU()-t0)/float64(b.N), "cpu-ns/op")
		runtime.UnlockOSThread()
	}
}
