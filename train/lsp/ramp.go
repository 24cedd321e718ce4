// The learning-rate re-warm of one matrix after a large subspace change.
// After a refit the carried second moment V underestimates the new
// subspace's (C o C shrinks it when the subspaces are far apart), so Adam's
// first steps there would be too large; ramping that matrix's learning rate
// back up over a few steps avoids the jump without resetting anything.

package lsp

// Ramp is the rule: a change is large when Carry.Change (max(||C-I||_F,
// ||D-I||_F) / sqrt(d), 0 for unchanged projectors and about 1 for
// independent fresh ones) exceeds Threshold; after a large change the
// matrix's learning rate is multiplied by (k+1)/(Steps+1) on the k-th step
// after it (k = 0, 1, ...), a linear ramp from near 0 to 1 that reaches 1
// at k = Steps.
type Ramp struct {
	Steps     int
	Threshold float64
}

// DefaultRamp re-warms over 20 steps after changes above 0.5.
func DefaultRamp() Ramp { return Ramp{Steps: 20, Threshold: 0.5} }

// Large reports whether a carry-over's change calls for a re-warm.
func (w Ramp) Large(c Carry) bool { return !c.Identity && c.Change > w.Threshold }

// Multiplier is the learning-rate factor on the k-th step (k = 0 for the
// first) after a large change: (k+1)/(Steps+1) up to 1. It never returns 0,
// so no step is wasted, and returns 1 for k >= Steps or Steps == 0.
func (w Ramp) Multiplier(k int) float64 {
	if k >= w.Steps || k < 0 {
		return 1
	}
	return float64(k+1) / float64(w.Steps+1)
}
