package workload

import (
	"fmt"
	"time"
)

// HumanBytes formats n in binary units: "512 KiB", "3.2 GiB".
func HumanBytes(n int64) string {
	neg := n < 0
	if neg {
		n = -n
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f, u := float64(n), 0
	for f >= 1024 && u < len(units)-1 {
		f /= 1024
		u++
	}
	s := ""
	switch {
	case u == 0:
		s = fmt.Sprintf("%d B", n)
	case f >= 100 || f == float64(int64(f)):
		s = fmt.Sprintf("%.0f %s", f, units[u])
	default:
		s = fmt.Sprintf("%.3g %s", f, units[u])
	}
	if neg {
		return "-" + s
	}
	return s
}

// HumanNS formats a duration in nanoseconds with three significant digits.
func HumanNS(ns float64) string {
	d := time.Duration(ns)
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.3gs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.3gms", float64(d)/1e6)
	case d >= time.Microsecond:
		return fmt.Sprintf("%.3gµs", float64(d)/1e3)
	}
	return fmt.Sprintf("%.3gns", ns)
}
