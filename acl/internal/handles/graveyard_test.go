package handles

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

// The graveyard remembers the last GraveyardSize destroyed streams.
func TestGraveyard(t *testing.T) {
	var g Graveyard
	require.False(t, g.Holds(1))
	for i := range GraveyardSize {
		g.Bury(acl.Stream(0x100 + i))
	}
	require.True(t, g.Holds(0x100))
	g.Revive(0x101)
	require.False(t, g.Holds(0x101))
	g.Bury(0x101) // buried again, in a new slot
	require.False(t, g.Holds(0x100), "the oldest is forgotten")
	for i := 2; i < GraveyardSize; i++ {
		require.True(t, g.Holds(acl.Stream(0x100+i)), "%#x", 0x100+i)
	}
	require.True(t, g.Holds(0x101))
	g.Bury(0x9000) // overwrites the slot 0x101 had first: 0x101 stays
	require.True(t, g.Holds(0x101))
	require.True(t, g.Holds(0x102))
	g.Bury(0x9001)
	require.False(t, g.Holds(0x102), "the oldest is forgotten")
	require.True(t, g.Holds(0x9000))
	require.Len(t, g.slot, GraveyardSize)
}
