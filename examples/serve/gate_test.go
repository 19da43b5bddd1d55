package main

import (
	"testing"

	"github.com/vmarena/vmarena/internal/leakgate/arenagate"
)

func TestMain(m *testing.M) { arenagate.Main(m) }
