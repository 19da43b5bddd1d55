// Package device chooses the driver a program runs on, the same way for the
// examples, the benchmark suite and users: from a spec such as "host",
// "ascend:1", "cuda" or "model:h200", usually read from $VMARENA_DEVICE.
//
// It imports every driver, so a program that wants only the host driver (and
// a binary without a dynamic loader) imports acl/host directly instead.
package device

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
)

// The package registers [Open] as the process's device selector, so that
// importing it, even for its side effect alone, makes the zero arena.Config
// honour $VMARENA_DEVICE for every device:
//
//	import _ "github.com/vmarena/vmarena/acl/device"
func init() {
	acl.RegisterSelector(func(spec string) (acl.Driver, string, error) {
		c, err := Open(spec)
		if err != nil {
			return nil, "", err
		}
		return c.Driver, c.Reason, nil
	})
}

// Choice is an opened driver and why it was chosen.
type Choice struct {
	Driver acl.Driver
	Spec   string // the spec that was asked for ("auto" when empty)
	Reason string // one short line: which driver, and why
	// Detail says why auto passed over the devices it tried before the one
	// it chose (one error per device, each with what to do about it); nil
	// when nothing was passed over. Print it for a verbose report.
	Detail error
}

// FromEnv opens the driver $VMARENA_DEVICE names (see [Open]). Its error is
// one line that names the variable (acl.DeviceEnvError).
func FromEnv() (Choice, error) {
	spec := os.Getenv(acl.DeviceEnv)
	c, err := Open(spec)
	if err != nil {
		return Choice{}, acl.DeviceEnvError(spec, err)
	}
	return c, nil
}

// Open opens the driver spec names:
//
//	host            the host driver on Linux virtual memory
//	ascend[:N]      Ascend NPU N (default 0) through the ACL runtime
//	cuda[:N]        NVIDIA GPU N (default 0) through the CUDA driver API
//	model:NAME      the device model (acl/model) with a shipped profile,
//	                e.g. model:h200; its times are modelled, not measured
//	model:PATH      the device model with the profile in a JSON file
//	model:NAME,nodata  (or model:PATH,nodata) the model without device bytes:
//	                reads fail, for server sizes (see ModelOptions)
//	auto or ""      Ascend device 0 when the runtime loads and a device
//	                answers, else CUDA device 0 likewise, else the host driver
//
// An explicit device that cannot be opened is an error that says which
// library was looked for, the environment variable that points at it, and
// the page of the documentation to read. auto falls back, says so in one
// line in Choice.Reason, and keeps the errors in Choice.Detail. auto never
// chooses the model; the model's Reason begins by saying its times are
// modelled.
func Open(spec string) (Choice, error) {
	if arg, ok := modelSpec(spec); ok {
		return openModel(arg)
	}
	spec = strings.TrimSpace(strings.ToLower(spec))
	if spec == "" {
		spec = "auto"
	}
	kind, n, err := parse(spec)
	if err != nil {
		return Choice{}, err
	}
	switch kind {
	case "host":
		d, err := host.New(host.Config{Device: int32(n)})
		if err != nil {
			return Choice{}, err
		}
		return Choice{Driver: d, Spec: spec, Reason: "host driver (asked for)"}, nil
	case "ascend":
		d, err := openAscend(n)
		if err != nil {
			return Choice{}, err
		}
		return Choice{Driver: d, Spec: spec, Reason: fmt.Sprintf("Ascend NPU %d (asked for)", n)}, nil
	case "cuda":
		d, err := openCUDA(n)
		if err != nil {
			return Choice{}, err
		}
		return Choice{Driver: d, Spec: spec, Reason: fmt.Sprintf("NVIDIA GPU %d (asked for)", n)}, nil
	}
	// auto
	d, aerr := openAscend(0)
	if aerr == nil {
		return Choice{Driver: d, Spec: spec, Reason: "Ascend NPU 0: the ACL runtime loaded and the device answered"}, nil
	}
	d, cerr := openCUDA(0)
	if cerr == nil {
		return Choice{Driver: d, Spec: spec, Detail: aerr,
			Reason: "NVIDIA GPU 0: the CUDA driver loaded and the device answered (no Ascend NPU)"}, nil
	}
	detail := errors.Join(aerr, cerr)
	h, err := host.New(host.Config{})
	if err != nil {
		return Choice{}, errors.Join(err, detail)
	}
	return Choice{Driver: h, Spec: spec, Detail: detail, Reason: "host driver: no Ascend or CUDA device answered"}, nil
}

func parse(spec string) (kind string, n int, err error) {
	kind, num, hasNum := strings.Cut(spec, ":")
	switch kind {
	case "host", "ascend", "cuda":
	case "auto":
		if hasNum {
			return "", 0, fmt.Errorf("device %q: %w: auto takes no device number", spec, acl.ErrInvalidParam)
		}
	default:
		return "", 0, fmt.Errorf("device %q: %w: want host, ascend[:N], cuda[:N], model:NAME, model:PATH or auto", spec, acl.ErrInvalidParam)
	}
	if hasNum {
		n, err = strconv.Atoi(num)
		if err != nil || n < 0 || n > math.MaxInt32 {
			// A device id is an int32 in ACL and CUDA: a larger number
			// would wrap to another device.
			return "", 0, fmt.Errorf("device %q: %w: device number %q: want 0 to %d", spec, acl.ErrInvalidParam, num, math.MaxInt32)
		}
	}
	return kind, n, nil
}

// openError is a device that could not be opened: the binding's error, said
// once under the device's name, and what to do about it.
type openError struct {
	spec string // "cuda:0"
	kind string // "cuda": the binding's own prefix, dropped where spec says it
	err  error
	hint string
}

func (e *openError) Error() string {
	msg := e.err.Error()
	if !strings.HasPrefix(msg, e.spec+":") {
		msg = e.spec + ": " + strings.TrimPrefix(msg, e.kind+": ")
	}
	if e.hint != "" {
		msg += "; " + e.hint
	}
	return msg
}

func (e *openError) Unwrap() error { return e.err }
