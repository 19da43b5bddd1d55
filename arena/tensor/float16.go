package tensor

import (
	"math"
	"strconv"
)

// Float16 is an IEEE 754 half-precision number (binary16: 1 sign bit, 5
// exponent bits, 10 mantissa bits), held as its bits: the "fp16" or "half"
// of ML frameworks. It is an Element, copied to the device as it is.
type Float16 uint16

// BFloat16 is a bfloat16 number (1 sign bit, 8 exponent bits, 7 mantissa
// bits: the upper half of a float32), held as its bits. It is an Element,
// copied to the device as it is.
type BFloat16 uint16

// String formats h as the number it holds, in the shortest form that reads
// back to the same Float16: "1.5", "-0.0001221", "+Inf", "NaN".
func (h Float16) String() string { return formatHalf(h.Float32()) }

// String formats b as the number it holds, in the shortest form that reads
// back to the same BFloat16: "1.5", "3.39e+38", "-Inf", "NaN".
func (b BFloat16) String() string { return formatHalf(b.Float32()) }

// formatHalf formats f, a half float widened exactly, with the fewest
// digits that identify it as a float32 (which identifies the half too).
func formatHalf(f float32) string { return strconv.FormatFloat(float64(f), 'g', -1, 32) }

// HalfFloat is the constraint satisfied by the two 16-bit float types.
type HalfFloat interface {
	Float16 | BFloat16
	Float32() float32
}

// NewFloat16 returns the Float16 nearest to f, ties to even (as the
// hardware converts): values beyond the largest finite Float16 (65504)
// become infinities, values too small for its subnormals become zeros, and
// NaN stays NaN.
func NewFloat16(f float32) Float16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff { // infinity or NaN
		if mant == 0 {
			return Float16(sign | 0x7c00)
		}
		return Float16(sign | 0x7e00 | uint16(mant>>13)) // a quiet NaN
	}
	e := exp - 127 + 15 // the exponent, rebiased
	if e >= 0x1f {
		return Float16(sign | 0x7c00)
	}
	if e <= 0 {
		// A subnormal Float16: m × 2^-24 with m = (1.mant) × 2^(exp-126),
		// the implicit bit made explicit and shifted right by 14-e.
		s := uint32(14 - e)
		if s >= 32 {
			return Float16(sign)
		}
		full := mant | 0x800000
		return Float16(sign | uint16(roundShift(full, s)))
	}
	// A carry out of the mantissa raises the exponent, to infinity at most.
	return Float16(sign | uint16(roundShift(uint32(e)<<23|mant, 13)))
}

// roundShift returns x >> s rounded to nearest, ties to even (0 < s < 32).
func roundShift(x, s uint32) uint32 {
	q := x >> s
	rem := x & (1<<s - 1)
	half := uint32(1) << (s - 1)
	if rem > half || rem == half && q&1 == 1 {
		q++
	}
	return q
}

// Float32 returns h as a float32, exactly.
func (h Float16) Float32() float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f: // infinity or NaN
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: normalise
		e := uint32(127 - 14)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		return math.Float32frombits(sign | e<<23 | (mant&0x3ff)<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// NewBFloat16 returns the BFloat16 nearest to f, ties to even; NaN stays
// NaN.
func NewBFloat16(f float32) BFloat16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return BFloat16(b>>16 | 0x40) // a quiet NaN, even if rounding would clear the mantissa
	}
	return BFloat16(roundShift(b, 16)) // a carry raises the exponent, to infinity at most
}

// Float32 returns b as a float32, exactly.
func (b BFloat16) Float32() float32 { return math.Float32frombits(uint32(b) << 16) }
