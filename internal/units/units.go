// Package units formats byte counts for messages: the exact count, for
// whoever compares it with a Config or a log, and the same in binary units,
// for whoever reads it.
package units

import "strconv"

var iec = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}}

// IEC returns n in the largest binary unit it reaches, with at most one
// decimal where the division is not exact: "2 GiB", "1.5 MiB", "3 KiB",
// "512 B". Negative counts keep their sign.
func IEC(n int64) string {
	if n < 0 {
		if n == -n { // math.MinInt64
			return strconv.FormatInt(n, 10) + " B"
		}
		return "-" + IEC(-n)
	}
	for _, u := range iec {
		unit := int64(1) << u.shift
		if n < unit {
			continue
		}
		if n%unit == 0 {
			return strconv.FormatInt(n/unit, 10) + " " + u.suffix
		}
		return strconv.FormatFloat(float64(n)/float64(unit), 'f', 1, 64) + " " + u.suffix
	}
	return strconv.FormatInt(n, 10) + " B"
}

// Bytes returns "N bytes" with IEC(n) beside it when n is 1 KiB or more:
// "2147483648 bytes (2 GiB)", "4096 bytes (4 KiB)", "100 bytes".
func Bytes(n int64) string {
	s := strconv.FormatInt(n, 10) + " bytes"
	if n >= 1<<10 || n <= -1<<10 {
		s += " (" + IEC(n) + ")"
	}
	return s
}

// Ubytes is Bytes for an unsigned count.
func Ubytes(n uint64) string {
	if n > 1<<63-1 {
		return strconv.FormatUint(n, 10) + " bytes"
	}
	return Bytes(int64(n))
}
