package device

import (
	"fmt"
	"strings"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/model"
)

// modelSpec reports whether spec asks for the device model, and the
// profile it names, with its case kept (it may be a path), and its options.
func modelSpec(spec string) (arg string, ok bool) {
	kind, arg, _ := strings.Cut(spec, ":")
	return strings.TrimSpace(arg), strings.EqualFold(strings.TrimSpace(kind), "model")
}

// modelOptions are the options a model spec may add after its profile,
// each after a comma: model:h200,nodata.
var modelOptions = map[string]func(*model.Config){
	"data":        func(c *model.Config) { c.NoData = false }, // the default, said explicitly
	"nodata":      func(c *model.Config) { c.NoData = true },
	"untimed":     func(c *model.Config) { c.Untimed = true },
	"pessimistic": func(c *model.Config) { c.Pessimistic = true },
}

// ModelOptions lists the options a model spec takes after its profile
// (model:h200,nodata): "data" keeps the device's bytes (the default),
// "nodata" keeps none, so that reads fail and memory stays proportional to
// the model's books (for server sizes), "untimed" charges no time,
// "pessimistic" takes the pessimistic readings of the coefficients no device
// has measured yet (model.Config.Pessimistic).
func ModelOptions() []string { return []string{"data", "nodata", "untimed", "pessimistic"} }

// openModel opens the device model with the profile arg names: a shipped
// profile ("h200") or a profile file ("/path/to/profile.json"), followed by
// options (",nodata").
func openModel(arg string) (Choice, error) {
	spec := "model:" + arg
	parts := strings.Split(arg, ",")
	name := strings.TrimSpace(parts[0])
	if name == "" {
		return Choice{}, fmt.Errorf("device %q: %w: want model:NAME (one of %s) or model:/path/to/profile.json, optionally followed by ,%s",
			spec, acl.ErrInvalidParam, strings.Join(model.Profiles(), ", "), strings.Join(ModelOptions(), " or ,"))
	}
	var cfg model.Config
	for _, o := range parts[1:] {
		set, ok := modelOptions[strings.ToLower(strings.TrimSpace(o))]
		if !ok {
			return Choice{}, fmt.Errorf("device %q: %w: unknown model option %q (want %s)",
				spec, acl.ErrInvalidParam, strings.TrimSpace(o), strings.Join(ModelOptions(), ", "))
		}
		set(&cfg)
	}
	p, err := model.Resolve(name)
	if err != nil {
		return Choice{}, fmt.Errorf("device %q: %w", spec, err)
	}
	cfg.Profile = p
	d, err := model.New(cfg)
	if err != nil {
		return Choice{}, fmt.Errorf("device %q: %w", spec, err)
	}
	return Choice{Driver: d, Spec: spec, Reason: d.Modelled() + " (asked for)"}, nil
}
