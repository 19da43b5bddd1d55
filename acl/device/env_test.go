//go:build linux

package device

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/internal/leakgate/arenagate"
)

// envChild makes the test binary, started again by runFromEnv, open
// $VMARENA_DEVICE under a 2 GiB address-space limit and print the error.
const envChild = "VMARENA_DEVICE_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		lim := &unix.Rlimit{Cur: 2 << 30, Max: 2 << 30}
		if err := unix.Setrlimit(unix.RLIMIT_AS, lim); err != nil {
			fmt.Println("rlimit:", err)
			os.Exit(3)
		}
		c, err := FromEnv()
		if err == nil {
			c.Driver.Close()
			fmt.Println("opened", c.Driver.Name())
			os.Exit(4)
		}
		fmt.Print(err.Error())
		os.Exit(0)
	}
	arenagate.Main(m) // TestZeroArenaConfigFollowsDeviceEnv uses the default driver
}

// runFromEnv opens spec as $VMARENA_DEVICE in another process, which fails
// the test if it does not answer within the deadline (a read that waits or
// runs out of memory), and returns the error text it printed.
func runFromEnv(t *testing.T, spec string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=1", acl.DeviceEnv+"="+spec)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "%s: no answer within the deadline", spec)
	require.NoError(t, err, "%s: %s", spec, out.String())
	return out.String()
}

// $VMARENA_DEVICE is input from outside: a profile path reads a regular
// file of bounded size only, a FIFO is not waited on, a device number is
// range-checked; each failure is one line that names the variable. Before,
// model:/dev/zero read until the process ran out of memory, a FIFO hung,
// and host:4294967296 opened host device 0.
func TestEnvDeviceIsBounded(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.json")
	require.NoError(t, unix.Mkfifo(fifo, 0o600))
	big := filepath.Join(dir, "big.json")
	require.NoError(t, os.WriteFile(big, bytes.Repeat([]byte(" "), 2<<20), 0o600))
	for spec, want := range map[string]string{
		"model:/dev/zero":          "not a regular file",
		"model:" + fifo:            "not a regular file",
		"model:" + big:             "more than a profile's",
		"model:/proc/self/environ": "", // a regular file whose size says nothing: read within the bound, then parsed
		"host:4294967296":          "device number",
		"cuda:99999999999":         "device number",
		"ascend:2147483648":        "device number",
	} {
		t.Run(strings.ReplaceAll(spec, "/", "_"), func(t *testing.T) {
			msg := runFromEnv(t, spec)
			assert.True(t, strings.HasPrefix(msg, acl.DeviceEnv+"="), "%q does not name the variable first", msg)
			assert.NotContains(t, msg, "\n", "one line")
			assert.Contains(t, msg, want)
		})
	}
}

// The same checks in this process: the errors match acl.ErrInvalidParam,
// and a device number past an int32 opens nothing.
func TestEnvDeviceErrors(t *testing.T) {
	for _, spec := range []string{"host:4294967296", "host:2147483648", "cuda:-1", "model:/dev/zero", "model:/dev/null"} {
		t.Setenv(acl.DeviceEnv, spec)
		c, err := FromEnv()
		require.Error(t, err, spec)
		assert.Nil(t, c.Driver, spec)
		assert.ErrorIs(t, err, acl.ErrInvalidParam, spec)
		assert.Equal(t, 1, strings.Count(err.Error(), spec), "%s: the value once: %v", spec, err)
	}
	t.Setenv(acl.DeviceEnv, "host:2147483647")
	c, err := FromEnv()
	require.NoError(t, err, "the largest device number is a number")
	require.NoError(t, c.Driver.Close())
}
