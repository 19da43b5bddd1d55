//go:build !linux

package main

// threadID returns 0 where the bench does not tell threads apart: every
// driver call made while the caller is inside a strategy call then counts
// as the caller's, an upper bound.
func threadID() int64 { return 0 }
