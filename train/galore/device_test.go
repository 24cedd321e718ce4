// The device GaLore (Device, on the CPU backend) on the galore-torch
// fixture: each matrix's gradient handed over as Backward's X^T dY with X
// the identity, five steps with two refreshes. Its randomized SVD must
// span torch's subspace at each refresh; driven by the device's own
// projectors, the float64 reference (Update, itself checked against
// galore-torch) must give the device's weights, moments and step changes;
// and with two micro-batches the projected gradients must sum.

package galore

import (
	"fmt"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// oneMatrix is the index of a model of one block holding one in x out
// matrix.
func oneMatrix(in, out int) *model.Index {
	return &model.Index{
		Layout:   []model.Param{{Name: "w", Shape: []int{in, out}, Decay: true}},
		Blocks:   [][]int{{0}},
		Mats:     []model.Matrix{{Name: "w", M: in, N: out}},
		MatParam: [][]int{{0}},
		Inputs:   1,
		InputM:   []int{in},
		IsMat:    []bool{true},
		Readers:  [][]int{{0}},
	}
}

func f32(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

func f64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func eye(n int) []float32 {
	v := make([]float32, n*n)
	for i := range n {
		v[i*n+i] = 1
	}
	return v
}

func TestDeviceOnFixture(t *testing.T) {
	m := loadFixture(t)
	h := optim.Hyper{Beta1: float32(fixAdam.Beta1), Beta2: float32(fixAdam.Beta2), Eps: float32(fixAdam.Eps),
		WeightDecay: float32(fixAdam.WeightDecay), Clip: optim.ClipNone}
	for _, name := range m.matNames {
		out, in := m.Matrices[name].Shape[0], m.Matrices[name].Shape[1]
		be := cpu.New(cpu.Config{})
		t.Cleanup(func() { _ = be.Close() })
		s := be.DefaultStream()
		d, err := New(be, oneMatrix(in, out), fixCfg, h, 1, in, backend.F32)
		if err != nil {
			t.Fatal(err)
		}
		w0 := m.ours(t, name+".w0", in, out)
		W := upload(t, be, f32(w0))
		d.Bind(func(int, int) backend.Tensor { return W }, backend.Tensor{})
		X := upload(t, be, eye(in))
		ref, err := NewState(fixCfg, in, out)
		if err != nil {
			t.Fatal(err)
		}
		// The reference starts from the device's fp32 weights.
		w := f64(f32(w0))
		x := d.Mats[0][0]
		// The device's betas are float32: 1 - float32(0.999) is 1.3e-5
		// from 0.001, which the moments would show; the reference takes
		// the same betas (the fixture's own check is the reference's).
		adam := fixAdam
		adam.Beta1, adam.Beta2 = float64(h.Beta1), float64(h.Beta2)
		for step := 1; step <= fixSteps; step++ {
			g := m.ours(t, fmt.Sprintf("%s.grad.%d", name, step), in, out)
			dY := upload(t, be, f32(g))
			due := ref.RefreshDue(fixCfg)
			d.Begin(uint64(step), fixAdam.LR, 1)
			d.SetMicro(0)
			if err := d.Backward(s, 0, 0, X, dY, backend.Tensor{}); err != nil {
				t.Fatal(err)
			}
			if due {
				p := download(t, be, x.P)
				tp := m.torchProjector(t, fmt.Sprintf("%s.proj.%d", name, step), ref)
				rows := len(tp) / ref.R
				if diff := subspaceDiff(p, tp, rows, ref.R); diff > 1e-4 {
					t.Errorf("%s step %d: the randomized SVD's span differs from torch's by %.3g", name, step, diff)
				}
				if err := ref.SetProjector(p); err != nil {
					t.Fatal(err)
				}
			}
			prev := append([]float64(nil), w...)
			if err := Update(fixCfg, adam, ref, w, f64(f32(g))); err != nil {
				t.Fatal(err)
			}
			got := download(t, be, W)
			rw, rd := maxRel(got, w), maxRel(sub(got, prev), sub(w, prev))
			rm, rv := maxRel(download(t, be, x.M), ref.M), maxRel(download(t, be, x.V), ref.V)
			t.Logf("%s step %d: weights %.2g, change %.2g, exp_avg %.2g, exp_avg_sq %.2g", name, step, rw, rd, rm, rv)
			if !(rw <= relTol && rd <= changeTol && rm <= relTol && rv <= relTol) {
				t.Errorf("%s step %d: device against the reference: weights %.3g, change %.3g, moments %.3g, %.3g", name, step, rw, rd, rm, rv)
			}
			// The device keeps fp32 weights: the reference goes on from
			// them, so each step compares one step's arithmetic.
			copy(w, got)
		}
		d.Free()
	}
}

// Two micro-batches whose gradients sum to one's give that one's step.
func TestDeviceMicroBatchesSum(t *testing.T) {
	const in, out = 6, 9
	h := optim.Hyper{Beta1: 0.9, Beta2: 0.999, Eps: 1e-6, WeightDecay: 0.1, Clip: optim.ClipNone}
	cfg := Config{Rank: 3, Every: 5, Scale: 0.25}
	g := make([]float32, in*out)
	for i := range g {
		g[i] = float32((i*7)%11) - 5
	}
	half := make([]float32, len(g))
	for i, v := range g {
		half[i] = v / 2 // exact
	}
	run := func(parts [][]float32) []float64 {
		be := cpu.New(cpu.Config{})
		defer be.Close()
		d, err := New(be, oneMatrix(in, out), cfg, h, 1, in, backend.F32)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Free()
		W := upload(t, be, make([]float32, in*out))
		d.Bind(func(int, int) backend.Tensor { return W }, backend.Tensor{})
		X := upload(t, be, eye(in))
		for step := 1; step <= 2; step++ {
			d.Begin(uint64(step), 1e-2, len(parts))
			for i, p := range parts {
				d.SetMicro(i)
				if err := d.Backward(be.DefaultStream(), 0, 0, X, upload(t, be, p), backend.Tensor{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		return download(t, be, W)
	}
	one, two := run([][]float32{g}), run([][]float32{half, half})
	if r := maxRel(two, one); r > 1e-6 {
		t.Errorf("two micro-batches of half the gradient: weights differ from one micro-batch's by %.3g", r)
	}
}

func upload(t *testing.T, be backend.Backend, v []float32) backend.Tensor {
	t.Helper()
	x, err := be.Alloc("test", len(v), backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	if err := backend.Upload(be, be.DefaultStream(), x, v); err != nil {
		t.Fatal(err)
	}
	return x
}

func download(t *testing.T, be backend.Backend, x backend.Tensor) []float64 {
	t.Helper()
	v, err := backend.Download(be, be.DefaultStream(), x)
	if err != nil {
		t.Fatal(err)
	}
	return f64(v)
}
