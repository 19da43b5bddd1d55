package main

import "syscall"

// threadID returns the calling OS thread's id, by which the counting driver
// tells the caller's driver calls from the pool's worker's.
func threadID() int64 { return int64(syscall.Gettid()) }
