package chunk_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/faultdriver"
	"github.com/vmarena/vmarena/chunk"
)

// An Acquire of more chunks than the whole budget holds fails at once, with
// no driver call; one that fits the budget still succeeds.
func TestAcquireOverBudgetFailsFast(t *testing.T) {
	fd := faultdriver.New(newDriver(t, 64<<20))
	p, err := chunk.New(fd, chunk.Config{Budget: 8 * g})
	require.NoError(t, err)
	defer func() { assert.NoError(t, p.Close()) }()
	assert.Equal(t, int64(8*g), p.Budget())
	before := fd.Calls(faultdriver.Any)
	_, err = p.Lender().Acquire(chunk.NewTenant(), 9)
	assert.ErrorIs(t, err, chunk.ErrBudget)
	assert.ErrorIs(t, err, acl.ErrOutOfMemory)
	assert.ErrorContains(t, err, "16777216 bytes (16 MiB)")
	assert.Equal(t, before, fd.Calls(faultdriver.Any), "no driver call")
	assert.Equal(t, int64(1), p.Stats().Failures)
	cs, err := p.Lender().Acquire(chunk.NewTenant(), 8)
	require.NoError(t, err)
	for _, c := range cs {
		require.NoError(t, p.Lender().Put(c))
	}
}
