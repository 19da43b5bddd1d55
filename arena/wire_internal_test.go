package arena

import (
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
)

// An offer of chunks of one size, whichever, is the offer of before two
// sizes, byte for byte (no flag, no table, its chunk size theirs), so that a
// consumer that knows no tables reads it; chunks of two sizes make an offer
// in units with a table, which a hello may not claim to know.
func TestOfferOf(t *testing.T) {
	const u, c = 2 << 20, 8 << 20
	for _, sizes := range [][]uint64{{c, c}, {u, u, u}, {c}} {
		o, table := offerOf(acl.SharingFD, sizes, u, 100, 200)
		assert.Nil(t, table, "%v", sizes)
		old := offer{sharing: acl.SharingFD, chunkSize: sizes[0], chunks: uint64(len(sizes)), off: 100, n: 200}
		assert.Equal(t, old.encode(), o.encode(), "%v", sizes)
	}
	o, table := offerOf(acl.SharingFD, []uint64{u, u, c, c, u}, u, 100, 200)
	assert.Equal(t, offer{sharing: acl.SharingFD, flags: flagSizes, chunkSize: u, chunks: 5, off: 100, n: 200}, o)
	assert.Equal(t, "0100000001000000040000000400000001000000", hex.EncodeToString(table))
	got, _, err := decodeOffer(o.encode())
	require.NoError(t, err)
	assert.Equal(t, o, got)

	_, err = decodeHello(hello{sharing: acl.SharingFD, flags: flagSizes}.encode())
	require.ErrorIs(t, err, ErrRefused, "a hello with the sizes flag")
}
