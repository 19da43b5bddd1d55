package model_test

import (
	"testing"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/model"
	"github.com/vmarena/vmarena/arena/arenatest"
)

// TestArenaSuite runs the arena's own suite on the model of the H200, which
// keeps its bytes: the arena and its chunk pool work on the model as on a
// driver.
func TestArenaSuite(t *testing.T) {
	arenatest.Run(t, func(t testing.TB, capacity uintptr) acl.Driver {
		d, err := model.New(model.Config{Capacity: capacity})
		if err != nil {
			t.Fatal(err)
		}
		return d // the suite closes it, and Close reports anything left live
	})
}
