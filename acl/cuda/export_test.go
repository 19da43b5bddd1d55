//go:build linux && (amd64 || arm64)

package cuda

import "testing"

// NewFakeLibrary gives tests in package cuda_test a fresh copy of the libcuda
// test double: its path, a setter of its knobs, and a check that it holds
// nothing. It skips the test without a C compiler.
func NewFakeLibrary(t testing.TB) (path string, set func(knob string, v uintptr), requireClean func(testing.TB)) {
	f := newFake(t)
	return f.path, func(knob string, v uintptr) { f.set(t, knob, v) }, f.requireClean
}
