package workload

import (
	"fmt"
	"math"
	"strings"
)

// The checks of the workloads' settings. Each names the bench flag that
// sets the value and says what the flag accepts.

func firstBad(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func atLeast(flag string, v, lo int) error {
	if v < lo {
		return fmt.Errorf("%s %d: want %d or more", flag, v, lo)
	}
	return nil
}

func oneOf(flag string, v int, what string, ok ...int) error {
	for _, o := range ok {
		if v == o {
			return nil
		}
	}
	s := make([]string, len(ok))
	for i, o := range ok {
		s[i] = fmt.Sprint(o)
	}
	return fmt.Errorf("%s %d: want %s, one of %s", flag, v, what, strings.Join(s, ", "))
}

func intRange(flag string, lo, hi, min int) error {
	if lo < min || hi < lo {
		return fmt.Errorf("%s %d:%d: want lo:hi with %d ≤ lo ≤ hi", flag, lo, hi, min)
	}
	return nil
}

func sizeRange(flag string, lo, hi int64) error {
	if lo <= 0 || hi < lo {
		return fmt.Errorf("%s %s:%s: want lo:hi sizes with 0 < lo ≤ hi (e.g. 256KiB:8MiB)", flag, flagSize(lo), flagSize(hi))
	}
	return nil
}

func notNegative(flag string, v float64) error {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("%s %v: want 0 or more", flag, v)
	}
	return nil
}

// fraction checks 0 ≤ v ≤ 1, or 0 ≤ v < 1 when one is not allowed.
func fraction(flag string, v float64, one bool) error {
	if v >= 0 && (v < 1 || one && v == 1) {
		return nil
	}
	if one {
		return fmt.Errorf("%s %v: want a probability, 0 to 1", flag, v)
	}
	return fmt.Errorf("%s %v: want a fraction, 0 or more and below 1", flag, v)
}

// cacheSize checks that a token's cache is a sane size: the product of the
// flags that make it does not overflow or pass 1 GiB.
func cacheSize(flags string, tokenBytes int64, factors ...int) error {
	p := 1.0
	for _, f := range factors {
		p *= float64(f)
	}
	if p <= 0 || p*2 > 1<<30 || tokenBytes <= 0 {
		return fmt.Errorf("%s: a token's cache would be %.3g bytes; want at most 1 GiB", flags, 2*p)
	}
	return nil
}

// flagSize writes n as a size flag takes it: 4096, 256KiB, 8MiB.
func flagSize(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return fmt.Sprint(n/u.m) + u.s
		}
	}
	return fmt.Sprint(n)
}
