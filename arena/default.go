package arena

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
)

// selectorImport is the import that lets the zero Config open every device
// $VMARENA_DEVICE can name: package acl/device registers its selector in init.
const selectorImport = `import _ "github.com/vmarena/vmarena/acl/device"`

// defaults holds the drivers DefaultDriver opened, by $VMARENA_DEVICE value,
// for the life of the process.
var defaults struct {
	sync.Mutex
	m map[string]acl.Driver
}

// DefaultDriver returns the driver New uses when Config has neither Driver
// nor Pool: the device $VMARENA_DEVICE (acl.DeviceEnv) names, chosen as
// device.FromEnv chooses it:
//
//   - unset or "auto": an Ascend NPU or an NVIDIA GPU when one answers, else
//     the host driver (host.Default);
//   - "host": the host driver (host.Default);
//   - anything else ("ascend", "cuda:1", "model:h200", …): that device, or an
//     error, never another driver.
//
// Only the host driver is linked into every program. Devices are opened
// through the selector that package acl/device registers when it is
// imported, even as
//
//	import _ "github.com/vmarena/vmarena/acl/device"
//
// A program without it gets the host driver for "auto", and for any other
// value but "host" an error that says how to fix it.
//
// The driver is opened once per process (per value of the variable) and
// shared by every arena and pool that uses it; closing them does not close
// it, and callers must not close it either.
func DefaultDriver() (acl.Driver, error) {
	raw := os.Getenv(acl.DeviceEnv)
	spec := strings.ToLower(strings.TrimSpace(raw))
	sel := acl.RegisteredSelector()
	switch {
	case spec == "host", (spec == "" || spec == "auto") && sel == nil:
		return hostDefault()
	case sel == nil:
		return nil, fmt.Errorf("arena: %w", acl.DeviceEnvError(raw, fmt.Errorf("this program does not link the device selector: %w: add %s, or set Config.Driver",
			acl.ErrNotSupported, selectorImport)))
	}
	key := strings.TrimSpace(raw)
	defaults.Lock()
	defer defaults.Unlock()
	if d := defaults.m[key]; d != nil {
		return d, nil
	}
	d, _, err := sel(key)
	if err != nil {
		return nil, fmt.Errorf("arena: %w", acl.DeviceEnvError(raw, err))
	}
	if h, ok := d.(*host.Driver); ok && h != nil && (spec == "" || spec == "auto") {
		// auto found no device: use the process's host driver, as without
		// the selector, rather than a second one.
		if err := h.Close(); err != nil {
			return nil, fmt.Errorf("arena: %w", acl.DeviceEnvError(raw, err))
		}
		hd, err := hostDefault()
		if err != nil {
			return nil, err
		}
		d = hd
	}
	if defaults.m == nil {
		defaults.m = make(map[string]acl.Driver)
	}
	defaults.m[key] = d
	return d, nil
}

func hostDefault() (acl.Driver, error) {
	d, err := host.Default()
	if err != nil {
		return nil, fmt.Errorf("arena: default host driver: %w", err)
	}
	return d, nil
}
