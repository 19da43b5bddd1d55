//go:build linux

package ipctest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FDChanges names a descriptor opened since, one closed since, and one
// whose number now names another file; a listing compared with itself
// reads "".
func TestFDChanges(t *testing.T) {
	before, err := FDs()
	require.NoError(t, err)
	assert.Empty(t, FDChanges(before, before))
	for fd, link := range before {
		assert.NotEmpty(t, link, "descriptor %d", fd)
	}

	fd, err := Memfd("ipctest-fds", 4096, 0)
	require.NoError(t, err)
	now, err := FDs()
	require.NoError(t, err)
	opened := FDChanges(before, now)
	assert.True(t, strings.HasPrefix(opened, fmt.Sprintf("opened since: %d /memfd:ipctest-fds", fd)), "%q", opened)
	assert.NotContains(t, opened, "closed since")

	require.NoError(t, Close(fd))
	after, err := FDs()
	require.NoError(t, err)
	assert.Empty(t, FDChanges(before, after), "closed again")
	assert.Equal(t, fmt.Sprintf("closed since: %d /memfd:ipctest-fds (deleted)", fd), FDChanges(now, after))

	// The same number, another file: both changes are named.
	other := map[int]string{fd: "socket:[1]"}
	assert.Equal(t, fmt.Sprintf("opened since: %d socket:[1]; closed since: %d /memfd:ipctest-fds (deleted)", fd, fd),
		FDChanges(map[int]string{fd: now[fd]}, other))
}
