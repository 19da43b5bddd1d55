package acl

import (
	"strconv"
	"strings"
	"sync/atomic"
)

// DeviceEnv is the environment variable that names the device a program
// runs on when it does not say otherwise: "host", "ascend[:N]", "cuda[:N]",
// "model:NAME", or "auto" (the same as unset). Package acl/device reads it
// (device.FromEnv), and so does an arena made from the zero arena.Config.
const DeviceEnv = "VMARENA_DEVICE"

// A Selector opens the driver a device spec names (see [DeviceEnv]; "" means
// "auto") and says in one short line which driver it chose and why. An
// explicit spec it cannot honour is an error; it never substitutes another
// driver for one that was asked for.
type Selector func(spec string) (d Driver, reason string, err error)

var selector atomic.Pointer[Selector]

// RegisterSelector makes sel the process's selector, which code that must
// not link every binding (package arena) consults to honour [DeviceEnv].
// Package acl/device registers its Open in init, so importing it, even as
//
//	import _ "github.com/vmarena/vmarena/acl/device"
//
// is enough. A later registration replaces an earlier one; nil removes it.
func RegisterSelector(sel Selector) {
	if sel == nil {
		selector.Store(nil)
		return
	}
	selector.Store(&sel)
}

// RegisteredSelector returns the selector [RegisterSelector] installed, or
// nil when no package has registered one.
func RegisteredSelector() Selector {
	if p := selector.Load(); p != nil {
		return *p
	}
	return nil
}

// DeviceEnvError is err, a failure to open the device value (the value of
// [DeviceEnv]) names, as one line that names the variable and the value
// once: VMARENA_DEVICE="host:x": invalid parameter: …. Line breaks in err's
// text (a joined error, a path) become "; ". It matches what err matches;
// nil stays nil.
func DeviceEnvError(value string, err error) error {
	if err == nil {
		return nil
	}
	return envError{value, err}
}

type envError struct {
	value string
	err   error
}

var oneLine = strings.NewReplacer("\r\n", "; ", "\n", "; ", "\r", "; ")

func (e envError) Error() string {
	q := strconv.Quote(e.value)
	msg := strings.TrimPrefix(e.err.Error(), "device "+q+": ") // the selector's naming of the spec, said once
	return DeviceEnv + "=" + q + ": " + oneLine.Replace(msg)
}
func (e envError) Unwrap() error { return e.err }
