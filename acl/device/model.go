package device

import (
	"fmt"
	"strings"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/model"
)

// modelSpec reports whether spec asks for the device model, and the
// profile it names, with its case kept (it may be a path).
func modelSpec(spec string) (arg string, ok bool) {
	kind, arg, _ := strings.Cut(spec, ":")
	return strings.TrimSpace(arg), strings.EqualFold(strings.TrimSpace(kind), "model")
}

// openModel opens the device model with the profile arg names: a shipped
// profile ("h200") or a profile file ("/path/to/profile.json").
func openModel(arg string) (Choice, error) {
	spec := "model:" + arg
	if arg == "" {
		return Choice{}, fmt.Errorf("device %q: %w: want model:NAME (one of %s) or model:/path/to/profile.json",
			spec, acl.ErrInvalidParam, strings.Join(model.Profiles(), ", "))
	}
	p, err := model.Resolve(arg)
	if err != nil {
		return Choice{}, fmt.Errorf("device %q: %w", spec, err)
	}
	d, err := model.New(model.Config{Profile: p})
	if err != nil {
		return Choice{}, fmt.Errorf("device %q: %w", spec, err)
	}
	return Choice{Driver: d, Spec: spec, Reason: d.Modelled() + " (asked for)"}, nil
}
