// Package galore is GaLore (Zhao et al., 2024) as its reference
// implementation, galore-torch 1.0 (GaLoreAdamW, proj_type "std"), defines
// it: each block matrix's gradient is projected on one side onto its top
// Rank singular vectors, refreshed every Every steps; AdamW runs in the
// projected space and the update is projected back and scaled by Scale.
//
// This file holds the configuration (--galore-rank, --galore-every,
// --galore-scale), the side rule, and Step, a float64 host reference of
// one matrix's step that the device path and the tests compare with
// (scripts/fixtures/galore_torch.py makes the fixture it is checked
// against, train/galore/testdata/).
//
// Layouts. The project stores a block matrix W as in x out (row-major, y =
// x W); galore-torch sees the nn.Linear weight, out x in (y = x W^T), the
// transpose. Its rule, on the torch matrix [rows, cols] = [out, in]:
// rows >= cols projects on the right (the in side: R = G P^T, P the top
// right singular vectors), rows < cols on the left (the out side: R = P^T
// G, P the top left singular vectors); the smaller side is projected, and
// a square matrix goes right. Transposed into our layout the same choice
// reads (Side):
//
//	out >= in: ProjectIn,  P in x r,  R = P^T G (r x out), update P N
//	out <  in: ProjectOut, Q out x r, R = G Q (in x r),    update N Q^T
//
// where P (Q) are the top left (right) singular vectors of our G, which are
// torch's right (left) ones; R here is the transpose of galore-torch's, and
// so are the moments.
package galore

import (
	"errors"
	"fmt"
	"math"
)

// Defaults of the flags: --galore-every 200 (galore-torch's
// update_proj_gap default) and --galore-scale 0.25 (GaLore's paper).
const (
	DefaultEvery = 200
	DefaultScale = 0.25
	// DefaultRank is --galore-rank's default: GaLore's paper fine-tunes
	// with rank 4 to 8 (its GLUE runs) and pre-trains with 128 to 512;
	// 8 is the fine-tuning end, the lora default's size class.
	DefaultRank = 8
)

// Config is GaLore's projection (galore-torch's rank, update_proj_gap and
// scale; proj_type is always "std").
type Config struct {
	Rank  int     // singular vectors kept (--galore-rank)
	Every int     // steps between projector refreshes (--galore-every)
	Scale float64 // the back-projected update's factor (--galore-scale)
}

// Validate refuses a configuration galore-torch could not run or that has
// no meaning.
func (c Config) Validate() error {
	switch {
	case c.Rank < 1:
		return fmt.Errorf("galore: rank %d, want at least 1", c.Rank)
	case c.Every < 1:
		return fmt.Errorf("galore: refresh every %d steps, want at least 1", c.Every)
	case !(c.Scale > 0) || math.IsInf(c.Scale, 0):
		return fmt.Errorf("galore: scale %v, want a finite value above 0", c.Scale)
	}
	return nil
}

// Side is the dimension of W (in x out) that the projector acts on.
type Side int

const (
	// ProjectIn projects the in dimension: P is in x r and R = P^T G.
	// galore-torch's "right" on the out x in weight.
	ProjectIn Side = iota
	// ProjectOut projects the out dimension: Q is out x r and R = G Q.
	// galore-torch's "left" on the out x in weight.
	ProjectOut
)

func (s Side) String() string {
	switch s {
	case ProjectIn:
		return "in"
	case ProjectOut:
		return "out"
	}
	return fmt.Sprintf("Side(%d)", int(s))
}

// SideOf is the side galore-torch 1.0 projects for the nn.Linear whose
// weight is ours transposed: its rule is rows >= cols -> right on the
// [out, in] weight, so out >= in (square included) projects the in side.
func SideOf(in, out int) Side {
	if out >= in {
		return ProjectIn
	}
	return ProjectOut
}

// RankOf is the projector's width for an in x out matrix: galore-torch
// slices the first Rank singular vectors of a reduced SVD, so a Rank above
// min(in, out) keeps all min(in, out) of them.
func (c Config) RankOf(in, out int) int {
	return min(c.Rank, in, out)
}

// AdamW is the optimizer in the projected space, galore-torch's AdamW
// (transformers' old AdamW): lr, betas, eps (its default 1e-6) and the
// decoupled weight decay, with bias correction always on (correct_bias).
type AdamW struct {
	LR, Beta1, Beta2, Eps, WeightDecay float64
}

// Validate refuses what galore-torch's AdamW refuses (and a negative
// weight decay, which it would take as growth).
func (a AdamW) Validate() error {
	switch {
	case !(a.LR >= 0) || math.IsInf(a.LR, 0):
		return fmt.Errorf("galore adamw: lr %v, want >= 0", a.LR)
	case !(a.Beta1 >= 0 && a.Beta1 < 1), !(a.Beta2 >= 0 && a.Beta2 < 1):
		return fmt.Errorf("galore adamw: betas (%v, %v), want each in [0, 1)", a.Beta1, a.Beta2)
	case !(a.Eps >= 0) || math.IsInf(a.Eps, 0):
		return fmt.Errorf("galore adamw: eps %v, want >= 0", a.Eps)
	case !(a.WeightDecay >= 0) || math.IsInf(a.WeightDecay, 0):
		return fmt.Errorf("galore adamw: weight decay %v, want >= 0", a.WeightDecay)
	}
	return nil
}

// State is one matrix's optimizer state.
type State struct {
	In, Out int
	Side    Side
	R       int // the projector's width, Config.RankOf
	// P is the projector, row-major: in x R (ProjectIn) or out x R
	// (ProjectOut), orthonormal columns; nil before the first step.
	P []float64
	// M and V are Adam's moments of the projected gradient, R x out
	// (ProjectIn) or in x R (ProjectOut); nil before the first step.
	M, V []float64
	T    int // steps taken (galore-torch's state["step"])
}

// NewState is the state of an in x out matrix before its first step.
func NewState(cfg Config, in, out int) (*State, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if in < 1 || out < 1 {
		return nil, fmt.Errorf("galore: matrix %d x %d, want both dimensions at least 1", in, out)
	}
	return &State{In: in, Out: out, Side: SideOf(in, out), R: cfg.RankOf(in, out)}, nil
}

// projShape is the projected gradient's shape (rows, cols) in our layout.
func (s *State) projShape() (int, int) {
	if s.Side == ProjectIn {
		return s.R, s.Out
	}
	return s.In, s.R
}

// RefreshDue says whether this step recomputes the projector: galore-torch
// does when it has none or when its step count, read before this step
// increments it, is a multiple of update_proj_gap. So with Every 3 the
// 1st, 4th, 7th... steps refresh.
func (s *State) RefreshDue(cfg Config) bool {
	return s.P == nil || s.T%cfg.Every == 0
}

// Refresh sets the projector to the top R singular vectors of g (in x out)
// on the state's side, from a float64 Jacobi SVD (galore-torch takes
// torch.linalg.svd of the gradient in float32, full_matrices=False). The
// moments are kept, as galore-torch keeps them: after a refresh they hold
// averages of gradients projected on the previous basis.
//
// A singular vector's sign is arbitrary, and ours are not LAPACK's
// (svdTop's convention). At the first refresh the signs do not matter
// until the second: flipping a column of P flips the matching row of R, of
// M and of the Adam direction N together, and P N stays the same. At any
// later refresh they matter at once, since M (kept) holds gradients
// projected on the previous basis and the new R's rows are added to it
// with whatever signs the SVD gave. So a run retraces galore-torch past
// its second refresh only if every refresh's signs are torch's (the tests
// drive the reference with torch's projectors, or align ours to them).
func (s *State) Refresh(g []float64) error {
	if len(g) != s.In*s.Out {
		return fmt.Errorf("galore refresh: gradient has %d elements, want %d x %d", len(g), s.In, s.Out)
	}
	if s.Side == ProjectIn {
		// Left singular vectors of g: the right ones of g^T.
		s.P = svdTop(transpose(g, s.In, s.Out), s.Out, s.In, s.R)
	} else {
		s.P = svdTop(g, s.In, s.Out, s.R)
	}
	return nil
}

// SetProjector installs a projector computed elsewhere (the fixture's,
// which is torch's), row-major in the state's layout.
func (s *State) SetProjector(p []float64) error {
	rows := s.In
	if s.Side == ProjectOut {
		rows = s.Out
	}
	if len(p) != rows*s.R {
		return fmt.Errorf("galore: projector has %d elements, want %d x %d", len(p), rows, s.R)
	}
	s.P = append(s.P[:0], p...)
	return nil
}

// Step takes one GaLore AdamW step of w (in x out, row-major, updated in
// place) with gradient g: a refresh when due, then Update.
func Step(cfg Config, opt AdamW, s *State, w, g []float64) error {
	if s.RefreshDue(cfg) {
		if err := s.Refresh(g); err != nil {
			return err
		}
	}
	return Update(cfg, opt, s, w, g)
}

// Update is the step after the projector is chosen, as galore-torch 1.0
// computes it:
//
//	R = project(g); T += 1
//	M = b1 M + (1 - b1) R;  V = b2 V + (1 - b2) R^2
//	N = M / (sqrt(V) + eps)                      eps outside the correction
//	w -= lr sqrt(1 - b2^T) / (1 - b1^T) * Scale * back(N)
//	w -= lr wd w                                 after the update, on all of w
//
// The decay is decoupled and applied last, to the already updated weight
// and without Scale (torch.optim.AdamW decays before the update instead).
func Update(cfg Config, opt AdamW, s *State, w, g []float64) error {
	if err := opt.Validate(); err != nil {
		return err
	}
	n := s.In * s.Out
	switch {
	case len(w) != n:
		return fmt.Errorf("galore step: weight has %d elements, want %d x %d", len(w), s.In, s.Out)
	case len(g) != n:
		return fmt.Errorf("galore step: gradient has %d elements, want %d x %d", len(g), s.In, s.Out)
	case s.P == nil:
		return errors.New("galore step: no projector (Refresh or SetProjector first)")
	}
	pr, pc := s.projShape()
	r := s.project(g)
	if s.M == nil {
		s.M, s.V = make([]float64, pr*pc), make([]float64, pr*pc)
	}
	s.T++
	b1, b2 := opt.Beta1, opt.Beta2
	for i, x := range r {
		s.M[i] = b1*s.M[i] + (1-b1)*x
		s.V[i] = b2*s.V[i] + (1-b2)*x*x
		r[i] = s.M[i] / (math.Sqrt(s.V[i]) + opt.Eps) // r now holds N
	}
	t := float64(s.T)
	stepSize := opt.LR * math.Sqrt(1-math.Pow(b2, t)) / (1 - math.Pow(b1, t))
	u := s.back(r)
	decay := opt.LR * opt.WeightDecay
	for i := range w {
		w[i] -= stepSize * cfg.Scale * u[i]
		if decay > 0 {
			w[i] -= decay * w[i]
		}
	}
	return nil
}

// project is R = P^T g (ProjectIn, R x out) or g Q (ProjectOut, in x R).
func (s *State) project(g []float64) []float64 {
	in, out, k := s.In, s.Out, s.R
	if s.Side == ProjectIn {
		res := make([]float64, k*out)
		for a := range k {
			for i := range in {
				p := s.P[i*k+a]
				for j := range out {
					res[a*out+j] += p * g[i*out+j]
				}
			}
		}
		return res
	}
	res := make([]float64, in*k)
	for i := range in {
		for j := range out {
			x := g[i*out+j]
			for a := range k {
				res[i*k+a] += x * s.P[j*k+a]
			}
		}
	}
	return res
}

// back is P N (ProjectIn, in x out) or N Q^T (ProjectOut, in x out).
func (s *State) back(nd []float64) []float64 {
	in, out, k := s.In, s.Out, s.R
	res := make([]float64, in*out)
	if s.Side == ProjectIn {
		for i := range in {
			for a := range k {
				p := s.P[i*k+a]
				for j := range out {
					res[i*out+j] += p * nd[a*out+j]
				}
			}
		}
		return res
	}
	for i := range in {
		for j := range out {
			var sum float64
			for a := range k {
				sum += nd[i*k+a] * s.P[j*k+a]
			}
			res[i*out+j] = sum
		}
	}
	return res
}

func transpose(a []float64, rows, cols int) []float64 {
	t := make([]float64, len(a))
	for i := range rows {
		for j := range cols {
			t[j*rows+i] = a[i*cols+j]
		}
	}
	return t
}
