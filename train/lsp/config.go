// The settings of lsp mode (Config: the command's LSP flags), their flag
// values and their validation before any matrix is seen. Per-matrix
// capping of d to the matrix sides is CapD / CapR, not an error.

package lsp

import (
	"errors"
	"fmt"
	"math"

	"github.com/lsp-offload/lsp-offload/train/flagerr"
)

// CheckFlags reports every bad LSP setting at once, each error naming its
// flag: --d below 0 (0 is AutoD per matrix), --r below 1 or larger than --d, --alpha outside the
// open interval (0,1) and --check-every below 1.
func CheckFlags(d, r int, alpha float64, checkEvery int) error {
	var errs []error
	if d < 0 {
		errs = append(errs, fmt.Errorf("--d %d: the projected size must be at least 1 (or 0: a quarter of each matrix's shorter side, at most %d)", d, MaxAutoD))
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

// Config is lsp mode's settings: the projectors, their checks and fits.
type Config struct {
	D, R         int     // requested projected size (0: AutoD) and non-zeros per row (capped per matrix)
	Alpha        float64 // bias ratio a fit must reach, in (0, 1)
	CheckEvery   int     // steps between projector checks
	CalibSamples int     // rows of the calibration pass (rounded up to whole micro-batches)
	ProjLR       float64 // Adam step size of the projector fit
	FitIters     int     // step budget of one fit
	NoFit        bool    // keep the random projectors: no checks (without --fit, the default)
	Refit        Refit   // how new projectors are made at a check ("": RefitSplit)
	Accept       Accept  // which data decides whether they replace the old ones ("": AcceptHeldOut)
	Rewarm       Rewarm  // when a matrix's learning rate is re-warmed after a refit ("": RewarmFloor)
	NoGain       bool    // apply Delta without the per-column gains of the projectors (a control)
	StartRandom  bool    // no check before step 1: train on the random projectors until the first --check-every
	// ShareLayers fits one projector pair per input kind on every layer's
	// gradients and gives each layer a copy (the paper's code: one pair
	// per weight shape); the ratios reported are the first layer's
	// projectors' on all layers' gradients.
	ShareLayers bool
	Ortho       float64 // weight of the fit's column-orthogonality penalty (FitOptions.Ortho)
	// Projector is the kind of projectors ("": KindSparse): the
	// (d,r)-sparse ones, or dense ones (KindSVD, KindGaussian) stored as
	// projectors with r = d (docs/DESIGN.md, "Projector kinds").
	Projector Kind
}

// Kind is the kind of projectors a run trains with.
type Kind string

const (
	// KindSparse: (d,r)-sparse projectors, random or (with checks) fitted.
	KindSparse Kind = "sparse"
	// KindSVD: dense, P and Q the top-d left and right singular vectors
	// of the calibration gradient, refreshed at each check (drawn as
	// KindGaussian before the first).
	KindSVD Kind = "svd"
	// KindGaussian: dense N(0, 1/d) projectors drawn once, no checks.
	KindGaussian Kind = "gaussian"
)

// ParseKind reads a --projector value.
func ParseKind(s string) (Kind, error) {
	switch v := Kind(s); v {
	case KindSparse, KindSVD, KindGaussian:
		return v, nil
	}
	return "", fmt.Errorf("unknown projector kind %q (want sparse, svd or gaussian)", s)
}

func (k Kind) String() string { return string(k) }

// Set parses a --projector value (flag.Value).
func (k *Kind) Set(s string) error { return flagerr.Set(k, ParseKind, s) }

// Dense reports whether projectors of kind k are dense (r = d): their
// device storage is the values only, P m x d and Q n x d row-major.
func (k Kind) Dense() bool { return k == KindSVD || k == KindGaussian }

// Refit is how a projector check makes candidate projectors.
type Refit string

const (
	// RefitSum fits fresh positions to the calibration gradient summed
	// over the fitting micro-batches (docs/DESIGN.md, "LSP as implemented").
	RefitSum Refit = "sum"
	// RefitSplit fits them to every fitting micro-batch's gradient at once
	// (the mean of their bias objectives), a subspace that serves each
	// rather than their sum.
	RefitSplit Refit = "split"
	// RefitRandom draws fresh random projectors and fits nothing (a
	// control: the subspace moves, but not toward the gradients).
	RefitRandom Refit = "random"
)

// Accept is the data that decides whether candidate projectors replace
// the ones in use.
type Accept string

const (
	// AcceptHeldOut: half of the calibration micro-batches fit, the other
	// half decide: the candidates must capture more of the held-out
	// gradient (Capture) than the projectors in use, by AcceptMargin.
	AcceptHeldOut Accept = "heldout"
	// AcceptFit: the candidates replace the projectors in use whenever
	// their bias objective on the fitting data is lower.
	AcceptFit Accept = "fit"
)

// Rewarm is the rule that re-warms a matrix's learning rate after its
// projectors change.
type Rewarm string

const (
	// RewarmMeasured re-warms where the carried second moment is
	// measurably below the new subspace's: its bias-corrected sum is less
	// than rewarmUnder times the mean squared norm of the fitting
	// micro-batches' compressed gradients.
	RewarmMeasured Rewarm = "measured"
	// RewarmChange re-warms after every change larger than
	// DefaultRamp's threshold.
	RewarmChange Rewarm = "change"
	// RewarmOff never re-warms.
	RewarmOff Rewarm = "off"
	// RewarmFloor raises the carried second moment, entry by entry, to the
	// one the fitting micro-batches measure in the new subspace (their
	// mean S^2), so Adam's first steps there are sized right without
	// lowering the learning rate.
	RewarmFloor Rewarm = "floor"
)

// ParseRefit, ParseAccept and ParseRewarm read the flags' values.
func ParseRefit(s string) (Refit, error) {
	switch v := Refit(s); v {
	case RefitSum, RefitSplit, RefitRandom:
		return v, nil
	}
	return "", fmt.Errorf("unknown refit %q (want sum, split or random)", s)
}

func ParseAccept(s string) (Accept, error) {
	switch v := Accept(s); v {
	case AcceptHeldOut, AcceptFit:
		return v, nil
	}
	return "", fmt.Errorf("unknown accept %q (want heldout or fit)", s)
}

func ParseRewarm(s string) (Rewarm, error) {
	switch v := Rewarm(s); v {
	case RewarmMeasured, RewarmChange, RewarmOff, RewarmFloor:
		return v, nil
	}
	return "", fmt.Errorf("unknown rewarm %q (want measured, change, floor or off)", s)
}

// WithDefaults fills the zero values of the refit settings.
func (c Config) WithDefaults() Config {
	if c.Refit == "" {
		c.Refit = RefitSplit
	}
	if c.Accept == "" {
		c.Accept = AcceptHeldOut
	}
	if c.Rewarm == "" {
		c.Rewarm = RewarmFloor
	}
	if c.Projector == "" {
		c.Projector = KindSparse
	}
	return c
}

// String is the flag spelling of each refit setting.
func (r Refit) String() string  { return string(r) }
func (a Accept) String() string { return string(a) }
func (w Rewarm) String() string { return string(w) }

// Set parses a --refit value (flag.Value).
func (r *Refit) Set(s string) error { return flagerr.Set(r, ParseRefit, s) }

// Set parses an --accept value (flag.Value).
func (a *Accept) Set(s string) error { return flagerr.Set(a, ParseAccept, s) }

// Set parses a --rewarm value (flag.Value).
func (w *Rewarm) Set(s string) error { return flagerr.Set(w, ParseRewarm, s) }

// Validate reports every bad setting at once, each error naming its flag.
func (c Config) Validate() error {
	r := c.R
	if c.Projector.Dense() {
		r = 1 // dense projectors hold every column: --r does not apply
	}
	errs := []error{CheckFlags(c.D, r, c.Alpha, c.CheckEvery)}
	if c.CalibSamples < 1 {
		errs = append(errs, fmt.Errorf("--calib-samples: %d, want at least 1", c.CalibSamples))
	}
	if !(c.ProjLR > 0) {
		errs = append(errs, fmt.Errorf("--proj-lr: %g, want > 0", c.ProjLR))
	}
	if c.FitIters < 0 {
		errs = append(errs, fmt.Errorf("--fit-iters: %d, want >= 0", c.FitIters))
	}
	if !(c.Ortho >= 0) || math.IsInf(c.Ortho, 0) {
		errs = append(errs, fmt.Errorf("--proj-ortho: %g, want finite and >= 0", c.Ortho))
	}
	c = c.WithDefaults()
	if _, err := ParseRefit(string(c.Refit)); err != nil {
		errs = append(errs, fmt.Errorf("--refit: %w", err))
	}
	if _, err := ParseAccept(string(c.Accept)); err != nil {
		errs = append(errs, fmt.Errorf("--accept: %w", err))
	}
	if _, err := ParseRewarm(string(c.Rewarm)); err != nil {
		errs = append(errs, fmt.Errorf("--rewarm: %w", err))
	}
	if _, err := ParseKind(string(c.Projector)); err != nil {
		errs = append(errs, fmt.Errorf("--projector: %w", err))
	}
	switch {
	case c.Projector == KindGaussian && !c.NoFit:
		errs = append(errs, fmt.Errorf("--projector gaussian with --fit: gaussian projectors are drawn once and never checked; drop --fit"))
	case c.Projector == KindSVD && c.NoFit:
		errs = append(errs, fmt.Errorf("--projector svd without checks: svd projectors are refreshed at the projector checks"))
	}
	return errors.Join(errs...)
}
