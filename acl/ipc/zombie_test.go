//go:build linux

package ipc_test

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/acl/ipc"
)

// A process that has exited is not alive, reaped or not: Alive's doc says
// "an error matching ErrNoProcess once it has exited".
func TestAliveExitedNotReaped(t *testing.T) {
	cmd := exec.Command("true")
	require.NoError(t, cmd.Start())
	p, err := ipc.OpenProcess(cmd.Process.Pid)
	require.NoError(t, err)
	defer p.Close()
	defer cmd.Wait()
	var info unix.Siginfo
	// Wait for the exit, leaving the process a zombie (WNOWAIT).
	require.NoError(t, unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil))
	require.ErrorIs(t, p.Alive(), ipc.ErrNoProcess, "process %d has exited", cmd.Process.Pid)
}
