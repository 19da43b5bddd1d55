package ascend

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

// The graveyard remembers the last goneMax destroyed streams.
func TestGraveyard(t *testing.T) {
	var g graveyard
	require.False(t, g.holds(1))
	for i := range goneMax {
		g.bury(acl.Stream(0x100 + i))
	}
	require.True(t, g.holds(0x100))
	g.revive(0x101)
	require.False(t, g.holds(0x101))
	g.bury(0x101) // buried again, in a new slot
	require.False(t, g.holds(0x100), "the oldest is forgotten")
	for i := 2; i < goneMax; i++ {
		require.True(t, g.holds(acl.Stream(0x100+i)), "%#x", 0x100+i)
	}
	require.True(t, g.holds(0x101))
	g.bury(0x9000) // overwrites the slot 0x101 had first: 0x101 stays
	require.True(t, g.holds(0x101))
	require.True(t, g.holds(0x102))
	g.bury(0x9001)
	require.False(t, g.holds(0x102), "the oldest is forgotten")
	require.True(t, g.holds(0x9000))
	require.Len(t, g.slot, goneMax)
}
