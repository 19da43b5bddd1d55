//go:build linux

package ipctest

import (
	"testing"

	"github.com/vmarena/vmarena/internal/leakgate"
)

func TestMain(m *testing.M) { leakgate.Main(m) }
