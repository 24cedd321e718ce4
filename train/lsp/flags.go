// Validation of the LSP command-line settings (--d, --r, --alpha,
// --check-every) before any matrix is seen. Per-matrix capping of d to the
// matrix sides is CapD / CapR, not an error.

package lsp

import (
	"errors"
	"fmt"
	"math"
)

// CheckFlags reports every bad LSP setting at once, each error naming its
// flag: --d below 1, --r below 1 or larger than --d, --alpha outside the
// open interval (0,1) and --check-every below 1.
func CheckFlags(d, r int, alpha float64, checkEvery int) error {
	var errs []error
	if d < 1 {
		errs = append(errs, fmt.Errorf("--d %d: the projected size must be at least 1", d))
	}
	switch {
	case r < 1:
		errs = append(errs, fmt.Errorf("--r %d: the non-zeros per projector row must be at least 1", r))
	case d >= 1 && r > d:
		errs = append(errs, fmt.Errorf("--r %d larger than --d %d: a projector row cannot hold more non-zeros than it has columns", r, d))
	}
	if !(alpha > 0 && alpha < 1) || math.IsNaN(alpha) {
		errs = append(errs, fmt.Errorf("--alpha %v: the bias-ratio threshold must lie strictly between 0 and 1", alpha))
	}
	if checkEvery < 1 {
		errs = append(errs, fmt.Errorf("--check-every %d: the projector check interval must be at least 1 step", checkEvery))
	}
	return errors.Join(errs...)
}
