package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"

	"github.com/vmarena/vmarena/acl"
	"github.com/vmarena/vmarena/acl/device"
	"github.com/vmarena/vmarena/acl/model"
)

// runCalibrate measures every call of the driver -device names with
// model.Calibrate and writes the profile to -profile-out, for the device
// model (acl/model) to run on: go run ./bench -calibrate -device cuda.
// An interrupt stops it, and everything it allocated is released.
func runCalibrate(o *options, stdout io.Writer) error {
	dirFlag, dir := "-out", o.out
	if o.profileOut != "" {
		dirFlag, dir = "-profile-out", filepath.Dir(o.profileOut)
	}
	if err := checkDirs(dirFlag, dir); err != nil {
		return err
	}
	if _, err := model.Resolve(o.profileBase); err != nil {
		return fmt.Errorf("-profile-base: %w", err)
	}
	spec := o.spec
	if spec == "" {
		spec = os.Getenv(acl.DeviceEnv)
	}
	choice, err := device.Open(spec)
	if err != nil {
		return fmt.Errorf("open the device: %w", err)
	}
	defer choice.Driver.Close()
	name := profileName(choice.Driver.Name())
	fmt.Fprintf(stdout, "vmarena calibrate: driver %s (%s)\n", choice.Driver.Name(), choice.Reason)
	if strings.HasPrefix(choice.Driver.Name(), "model:") {
		fmt.Fprintln(stdout, "note: this calibrates the device model itself, whose times are modelled: the result is its own profile, not a device's")
	}
	base, err := model.Resolve(o.profileBase)
	if err != nil {
		return fmt.Errorf("-profile-base: %w", err)
	}
	opts := model.CalibrateOptions{
		Name: name,
		Base: base,
		Log:  func(format string, args ...any) { fmt.Fprintf(stdout, "  "+format+"\n", args...) },
	}
	if o.quick {
		opts.Granules, opts.CopySizes, opts.Reps = []int{1, 8}, []uintptr{4 << 10, 1 << 20}, 5
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	p, err := model.Calibrate(ctx, choice.Driver, opts)
	if err != nil {
		return err
	}
	out := o.profileOut
	if out == "" {
		out = filepath.Join(o.out, "profile-"+name+".json")
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := writeFile(out, p.WriteJSON); err != nil {
		return err
	}
	printProfile(stdout, p)
	m, n := p.Measured()
	fmt.Fprintf(stdout, "\nwrote %s: %d of %d coefficients measured, the rest carried over from profile %s as estimates\n", out, m, n, base.Name)
	fmt.Fprintf(stdout, "model it with VMARENA_DEVICE=model:%s (or -device model:%s)\n", out, out)
	return nil
}

// profileName makes a profile name from a driver name: "cuda:0" → "cuda-0".
func profileName(driver string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		return '-'
	}, driver)
}

// printProfile prints each call's cost, and whether it was measured.
func printProfile(w io.Writer, p *model.Profile) {
	mark := func(c model.Coef) string {
		if c.Estimate {
			return "estimate"
		}
		return "measured"
	}
	fmt.Fprintf(w, "\n  %-15s %10s %-9s %12s %-9s\n", "call", "base µs", "", "per MiB µs", "")
	for _, name := range model.CallNames() {
		cc := p.Calls[name]
		perMiB, pm := "", ""
		if cc.PerMiB != nil {
			perMiB, pm = fmt.Sprintf("%.3g", cc.PerMiB.Value), mark(*cc.PerMiB)
		}
		fmt.Fprintf(w, "  %-15s %10.3g %-9s %12s %-9s\n", name, cc.Base.Value, mark(cc.Base), perMiB, pm)
	}
	d := p.Device
	fmt.Fprintf(w, "  device latency %.3g µs (%s); local %.4g GB/s (%s); htod %.4g GB/s (%s); dtoh %.4g GB/s (%s)\n",
		d.Latency.Value, mark(d.Latency), d.LocalGBps.Value, mark(d.LocalGBps), d.HtoDGBps.Value, mark(d.HtoDGBps),
		d.DtoHGBps.Value, mark(d.DtoHGBps))
}
