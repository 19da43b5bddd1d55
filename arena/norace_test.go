//go:build !race

package arena_test

// raceEnabled is whether the race detector is on: long tests run less.
const raceEnabled = false
