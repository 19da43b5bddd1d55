// Package broken is a fixture of skipcheck's test: it parses (gofmt is
// happy) but does not compile.
package broken

import "testing"

func TestNeverRuns(t *testing.T) {
	var n int = "not a number"
	_ = n
}
