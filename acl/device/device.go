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
	"os"
	"strconv"
	"strings"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/host"
)

// EnvVar is the environment variable [FromEnv] reads.
const EnvVar = "VMARENA_DEVICE"

// Choice is an opened driver and why it was chosen.
type Choice struct {
	Driver acl.Driver
	Spec   string // the spec that was asked for ("auto" when empty)
	Reason string // one line: which driver, and why
}

// FromEnv opens the driver $VMARENA_DEVICE names (see [Open]).
func FromEnv() (Choice, error) { return Open(os.Getenv(EnvVar)) }

// Open opens the driver spec names:
//
//	host            the host driver on Linux virtual memory
//	ascend[:N]      Ascend NPU N (default 0) through the ACL runtime
//	cuda[:N]        NVIDIA GPU N (default 0) through the CUDA driver API
//	model:NAME      the device model (acl/model) with a shipped profile,
//	                e.g. model:h200; its times are modelled, not measured
//	model:PATH      the device model with the profile in a JSON file
//	auto or ""      Ascend device 0 when the runtime loads and a device
//	                answers, else CUDA device 0 likewise, else the host driver
//
// An explicit device that cannot be opened is an error; auto falls back and
// says why in Choice.Reason. auto never chooses the model; the model's
// Reason begins by saying its times are modelled.
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
		return Choice{d, spec, "host driver (asked for)"}, nil
	case "ascend":
		d, err := openAscend(n)
		if err != nil {
			return Choice{}, err
		}
		return Choice{d, spec, fmt.Sprintf("Ascend NPU %d (asked for)", n)}, nil
	case "cuda":
		d, err := openCUDA(n)
		if err != nil {
			return Choice{}, err
		}
		return Choice{d, spec, fmt.Sprintf("NVIDIA GPU %d (asked for)", n)}, nil
	}
	// auto
	var why []string
	if d, err := openAscend(0); err == nil {
		return Choice{d, spec, "Ascend NPU 0: the ACL runtime loaded and the device answered"}, nil
	} else {
		why = append(why, "ascend: "+err.Error())
	}
	if d, err := openCUDA(0); err == nil {
		return Choice{d, spec, "NVIDIA GPU 0: the CUDA driver loaded and the device answered; " + strings.Join(why, "; ")}, nil
	} else {
		why = append(why, "cuda: "+err.Error())
	}
	d, err := host.New(host.Config{})
	if err != nil {
		return Choice{}, errors.Join(append([]error{err}, errors.New(strings.Join(why, "; ")))...)
	}
	return Choice{d, spec, "host driver: no device answered (" + strings.Join(why, "; ") + ")"}, nil
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
		if err != nil || n < 0 {
			return "", 0, fmt.Errorf("device %q: %w: bad device number", spec, acl.ErrInvalidParam)
		}
	}
	return kind, n, nil
}
