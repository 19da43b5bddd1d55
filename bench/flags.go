package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vmarena/vmarena/bench/internal/workload"
)

// flagError is a flag the flag package could not parse, with the help of
// that flag alone.
type flagError struct {
	err  error
	help string // "  -count int\n    \trepetitions; …", or "" when the flag is not known
}

func (e *flagError) Error() string {
	if e.help == "" {
		return e.err.Error()
	}
	return e.err.Error() + "\n" + e.help
}

func (e *flagError) Unwrap() error { return e.err }

// flagHelp returns the help of the flag err names, as PrintDefaults writes
// it, or "" when err names no flag of fs.
func flagHelp(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	i := strings.LastIndex(msg, "-")
	for i > 0 && msg[i-1] == '-' {
		i--
	}
	if i < 0 {
		return ""
	}
	name := strings.TrimLeft(msg[i:], "-")
	if j := strings.IndexAny(name, ": ="); j >= 0 {
		name = name[:j]
	}
	f := fs.Lookup(name)
	if f == nil {
		return ""
	}
	one := flag.NewFlagSet("", flag.ContinueOnError)
	var b strings.Builder
	one.SetOutput(&b)
	one.Var(f.Value, f.Name, f.Usage)
	one.Lookup(f.Name).DefValue = f.DefValue
	one.PrintDefaults()
	return strings.TrimRight(b.String(), "\n")
}

// checkChunk checks -chunk against the driver's granularity gran, once the
// driver is open.
func checkChunk(chunk, gran int64) error {
	if chunk == 0 || chunk%gran == 0 {
		return nil
	}
	return fmt.Errorf("-chunk %s: want a multiple of the driver's granularity, %s (%s, %s, %s, …), or 0 for the granularity itself",
		formatSize(chunk), formatSize(gran), formatSize(gran), formatSize(2*gran), formatSize(3*gran))
}

// sizeFlag is a byte count written as 4096, 256KiB, 8MiB, 1.5GiB.
type sizeFlag struct{ p *int64 }

func (f sizeFlag) String() string {
	if f.p == nil {
		return ""
	}
	return formatSize(*f.p)
}

func (f sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*f.p = n
	return nil
}

// rangeFlag is an inclusive range lo:hi of ints.
type rangeFlag struct{ lo, hi *int }

func (f rangeFlag) String() string {
	if f.lo == nil {
		return ""
	}
	return fmt.Sprintf("%d:%d", *f.lo, *f.hi)
}

func (f rangeFlag) Set(s string) error {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		b = a
	}
	lo, err1 := strconv.Atoi(strings.TrimSpace(a))
	hi, err2 := strconv.Atoi(strings.TrimSpace(b))
	if err1 != nil || err2 != nil || lo > hi {
		return fmt.Errorf("want lo:hi with lo ≤ hi, got %q", s)
	}
	*f.lo, *f.hi = lo, hi
	return nil
}

// sizeRangeFlag is an inclusive range lo:hi of byte counts.
type sizeRangeFlag struct{ lo, hi *int64 }

func (f sizeRangeFlag) String() string {
	if f.lo == nil {
		return ""
	}
	return formatSize(*f.lo) + ":" + formatSize(*f.hi)
}

func (f sizeRangeFlag) Set(s string) error {
	a, b, ok := strings.Cut(s, ":")
	if !ok {
		b = a
	}
	lo, err1 := parseSize(a)
	hi, err2 := parseSize(b)
	if err1 != nil || err2 != nil || lo > hi {
		return fmt.Errorf("want lo:hi sizes with lo ≤ hi (e.g. 256KiB:8MiB), got %q", s)
	}
	*f.lo, *f.hi = lo, hi
	return nil
}

var sizeUnits = []struct {
	suffix string
	mult   float64
}{
	{"TIB", 1 << 40}, {"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10},
	{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10},
	{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1},
}

func parseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	mult := 1.0
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("bad size %q (want e.g. 4096, 256KiB, 8MiB, 1.5GiB)", s)
	}
	return int64(f * mult), nil
}

func formatSize(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return strconv.FormatInt(n/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}

// listFlag is a comma-separated list drawn from a fixed set of names.
type listFlag struct {
	p       *[]string
	allowed []string
}

func (f listFlag) String() string {
	if f.p == nil {
		return ""
	}
	return strings.Join(*f.p, ",")
}

func (f listFlag) Set(s string) error {
	var out []string
	for _, x := range strings.Split(s, ",") {
		x = strings.TrimSpace(x)
		if x == "" {
			continue
		}
		if x == "all" {
			out = append(out[:0], f.allowed...)
			continue
		}
		ok := false
		for _, a := range f.allowed {
			ok = ok || a == x
		}
		if !ok {
			return fmt.Errorf("unknown %q (want some of %s, or all)", x, strings.Join(f.allowed, ","))
		}
		out = append(out, x)
	}
	if len(out) == 0 {
		return fmt.Errorf("empty list")
	}
	*f.p = out
	return nil
}

// computeFlag is the KV step's device compute: "roofline" or a duration.
type computeFlag struct {
	fixed    *time.Duration
	roofline *bool
}

func (f computeFlag) String() string {
	if f.fixed == nil {
		return ""
	}
	return workload.StepTime{Fixed: *f.fixed, Roofline: *f.roofline}.String()
}

func (f computeFlag) Set(s string) error {
	if strings.EqualFold(strings.TrimSpace(s), "roofline") {
		*f.roofline, *f.fixed = true, 0
		return nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d < 0 {
		return fmt.Errorf("want roofline or a duration of 0 or more (e.g. 1ms), got %q", s)
	}
	*f.roofline, *f.fixed = false, d
	return nil
}
