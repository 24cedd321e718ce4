// GEMM: the backend's Gemm at exact shapes, the fallback by arithmetic
// intensity, and the shapes of a model's training step.

package calibrate

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// gemmTurnBytes caps the memory of the GEMMs timed in turns (timeOps).
const gemmTurnBytes = 1 << 30

func (s GemmShape) operandBytes() int64 { return 4 * int64(s.M*s.K+s.K*s.N+s.M*s.N) }

// gemmRuns allocates the operands of each shape (beta 0, so C is written,
// not read) and returns a closure per shape that enqueues its Gemm, for
// timeOps, and done, which checks every result and makes the samples from
// the times timeOps measured.
func (m *meter) gemmRuns(shapes []GemmShape) (runs []func() error, done func(secs, bests []float64) ([]GemmSample, error), err error) {
	type ops struct{ A, B, C backend.Tensor }
	runs = make([]func() error, len(shapes))
	args := make([]ops, len(shapes))
	for i, s := range shapes {
		a := &tensors{m: m}
		args[i] = ops{a.f32("A", s.M*s.K, 0.5), a.f32("B", s.K*s.N, 0.25), a.f32("C", s.M*s.N, 0)}
		if a.err != nil {
			return nil, nil, fmt.Errorf("%v: %w", s, a.err)
		}
		runs[i] = func() error {
			return m.be.Gemm(m.s, s.TransA, s.TransB, s.M, s.N, s.K, 1, args[i].A, args[i].B, 0, args[i].C)
		}
	}
	done = func(secs, bests []float64) ([]GemmSample, error) {
		var out []GemmSample
		for i, s := range shapes {
			if err := m.checkGemm(s, args[i].C); err != nil {
				return nil, fmt.Errorf("%v: %w", s, err)
			}
			if err := positive(secs[i]); err != nil {
				return nil, fmt.Errorf("%v: %w", s, err)
			}
			out = append(out, GemmSample{Shape: s, Seconds: secs[i], Best: bests[i], Rate: s.FLOPs() / secs[i]})
		}
		return out, nil
	}
	return runs, done, nil
}

// checkGemm checks C's last element: every element is 0.5*0.25 summed
// over K, so a broken kernel cannot report a rate.
func (m *meter) checkGemm(s GemmShape, C backend.Tensor) error {
	got, err := backend.Download(m.be, m.s, C.Slice(s.M*s.N-1, 1))
	if err != nil {
		return err
	}
	if want := float32(s.K) / 8; got[0] != want {
		return fmt.Errorf("C[last] = %v, want %v", got[0], want)
	}
	return nil
}

func (m *meter) gemm(s GemmShape) (sec, best float64, err error) {
	defer m.release()
	A, err := m.alloc("A", s.M*s.K, backend.F32, 0.5)
	if err != nil {
		return 0, 0, err
	}
	B, err := m.alloc("B", s.K*s.N, backend.F32, 0.25)
	if err != nil {
		return 0, 0, err
	}
	C, err := m.alloc("C", s.M*s.N, backend.F32, 0)
	if err != nil {
		return 0, 0, err
	}
	sec, best, err = m.timeOp(func() error {
		return m.be.Gemm(m.s, s.TransA, s.TransB, s.M, s.N, s.K, 1, A, B, 0, C)
	})
	if err != nil {
		return 0, 0, err
	}
	if err := m.checkGemm(s, C); err != nil {
		return 0, 0, err
	}
	return sec, best, positive(sec)
}

// GemmRate is the FLOP/s of a Gemm of shape s: the measured rate when s
// was measured, else the square shapes' rate interpolated linearly in
// log(rate) against log(Intensity), clamped to the measured range; 0 when
// nothing was measured.
func (c CPU) GemmRate(s GemmShape) float64 {
	for _, g := range c.Gemm {
		if g.Shape == s {
			return g.Rate
		}
	}
	for _, g := range c.GemmSquares {
		if g.Shape == s {
			return g.Rate
		}
	}
	pts := slices.Clone(c.GemmSquares)
	if len(pts) == 0 {
		pts = slices.Clone(c.Gemm)
	}
	if len(pts) == 0 {
		return 0
	}
	slices.SortFunc(pts, func(a, b GemmSample) int {
		return cmp.Compare(a.Shape.Intensity(), b.Shape.Intensity())
	})
	x := math.Log(s.Intensity())
	xs := make([]float64, len(pts))
	ys := make([]float64, len(pts))
	for i, p := range pts {
		xs[i], ys[i] = math.Log(p.Shape.Intensity()), math.Log(p.Rate)
	}
	return math.Exp(interp(xs, ys, x))
}

// GemmTime is the seconds of one Gemm of shape s (enqueue included).
func (c CPU) GemmTime(s GemmShape) float64 {
	r := c.GemmRate(s)
	if r <= 0 {
		return math.Inf(1)
	}
	return s.FLOPs() / r
}

// interp is piecewise-linear interpolation of (xs, ys), xs ascending,
// clamped at both ends.
func interp(xs, ys []float64, x float64) float64 {
	n := len(xs)
	switch {
	case n == 0:
		return math.NaN()
	case x <= xs[0]:
		return ys[0]
	case x >= xs[n-1]:
		return ys[n-1]
	}
	i := 1
	for xs[i] < x {
		i++
	}
	if xs[i] == xs[i-1] {
		return ys[i]
	}
	f := (x - xs[i-1]) / (xs[i] - xs[i-1])
	return ys[i-1] + f*(ys[i]-ys[i-1])
}

// StepGemms lists the distinct Gemm shapes of one training step of spec at
// batch B x T, in the order the step first runs them: each block matrix
// (in x out = M x N, rows BT = B*T) forward y = x W (NN, BT x N x M),
// weight gradient dW += x^T dy (TN, M x N x BT) and input gradient dx =
// dy W^T (NT, BT x M x N); the LM head (vocabulary V, width C = the first
// matrix's input) forward logits = x E^T (NT, BT x V x C), input gradient
// (NN, BT x C x V) and weight gradient (TN, V x C x BT). This is what
// train/gpt2 and train/llama enqueue; in lsp mode the block weight
// gradients are the projector check's, of the same shape.
func StepGemms(spec model.Spec, B, T int) ([]GemmShape, error) {
	mats := spec.Matrices()
	if B < 1 || T < 1 || len(mats) == 0 {
		return nil, fmt.Errorf("calibrate: step gemms: B=%d T=%d with %d block matrices", B, T, len(mats))
	}
	BT, V, C := B*T, spec.VocabSize(), mats[0].M
	var s []GemmShape
	for _, k := range mats {
		s = append(s, GemmShape{M: BT, N: k.N, K: k.M})
	}
	s = append(s, GemmShape{TransB: true, M: BT, N: V, K: C},
		GemmShape{M: BT, N: C, K: V}, GemmShape{TransA: true, M: V, N: C, K: BT})
	for _, k := range slices.Backward(mats) {
		s = append(s, GemmShape{TransA: true, M: k.M, N: k.N, K: BT}, GemmShape{TransB: true, M: BT, N: k.M, K: k.N})
	}
	return dedupe(s), nil
}
