package model

import "math"

// Checked is int64 arithmetic that notes overflow, for computing a
// configuration's sizes (on sizes already known to be positive) before
// anything is sized from them, so that an absurd config.json is refused
// rather than wrapped around. Its zero value is ready.
type Checked struct {
	// Overflow is set by the first Mul or Add whose result does not fit;
	// the result is 0 then.
	Overflow bool
}

// Mul is a * b.
func (c *Checked) Mul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		c.Overflow = true
		return 0
	}
	return a * b
}

// Add is a + b.
func (c *Checked) Add(a, b int64) int64 {
	if a > math.MaxInt64-b {
		c.Overflow = true
		return 0
	}
	return a + b
}

// Int is n as an int; ok is false after an overflow or when n does not
// fit in an int.
func (c *Checked) Int(n int64) (_ int, ok bool) {
	if c.Overflow || n > math.MaxInt {
		return 0, false
	}
	return int(n), true
}
