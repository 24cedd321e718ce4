package modeltest

import (
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// Reference is what a PyTorch fixture's reference.safetensors holds
// (scripts/fixtures): a batch of B x T, its logits and loss, every
// gradient, and the losses of an AdamW trajectory with the final weights
// of the parameters it kept. Tensors are in the file's (Hugging Face's)
// shapes: HFOrder puts a parameter in the same.
type Reference struct {
	File            *safetensors.File // for what a family's fixture has besides
	B, T            int
	Inputs, Targets []int32 // PyTorch's ignore_index -100 made -1
	Logits          []float32
	Loss            float64
	Grads, Finals   map[string][]float32 // by parameter name
	AdamLosses      []float32
	ValidTargets    int // targets not ignored
}

// LoadReference reads the reference file at path of a model of layout.
func LoadReference(t *testing.T, path string, layout []model.Param) *Reference {
	t.Helper()
	f, err := safetensors.Open(path)
	Must(t, err)
	r := &Reference{File: f, Grads: map[string][]float32{}, Finals: map[string][]float32{}}
	ints := func(name string) []int32 {
		v, shape, err := f.Int64(name)
		Must(t, err)
		r.B, r.T = shape[0], shape[1]
		out := make([]int32, len(v))
		for i, x := range v {
			out[i] = int32(x)
			if x == -100 { // PyTorch's ignore_index; ours is any negative
				out[i] = -1
			}
		}
		return out
	}
	r.Inputs, r.Targets = ints("input_ids"), ints("targets")
	r.Logits = r.Floats(t, "logits")
	r.Loss = float64(r.Floats(t, "loss")[0])
	r.AdamLosses = r.Floats(t, "adamw_losses")
	for _, p := range layout {
		r.Grads[p.Name] = r.Floats(t, "grad."+p.Name)
		if _, ok := f.Info("final." + p.Name); ok {
			r.Finals[p.Name] = r.Floats(t, "final."+p.Name)
		}
	}
	for _, x := range r.Targets {
		if x >= 0 {
			r.ValidTargets++
		}
	}
	return r
}

// Floats reads the file's tensor name as fp32.
func (r *Reference) Floats(t *testing.T, name string) []float32 {
	t.Helper()
	v, _, err := r.File.Float32(name)
	Must(t, err)
	return v
}

// Upload puts params and the reference's batch into m.
func (r *Reference) Upload(t *testing.T, be backend.Backend, m model.Model, params []float32) {
	t.Helper()
	s := be.DefaultStream()
	bufs := m.Buffers()
	Must(t, backend.Upload(be, s, bufs.Params, params))
	Must(t, backend.UploadInt32(be, s, bufs.Inputs, r.Inputs))
	Must(t, backend.UploadInt32(be, s, bufs.Targets, r.Targets))
}

// Transpose returns the r x c matrix v as c x r.
func Transpose(v []float32, r, c int) []float32 {
	out := make([]float32, len(v))
	for i := range r {
		for j := range c {
			out[j*r+i] = v[i*c+j]
		}
	}
	return out
}

// HFOrder is parameter p's values v (or its gradient's) in Hugging Face's
// shape: out x in for a Transposed matrix.
func HFOrder(p model.Param, v []float32) []float32 {
	if p.Transposed {
		return Transpose(v, p.Shape[0], p.Shape[1])
	}
	return v
}

// Tolerances of CheckMatchesPyTorch, each relative as in CloseTo.
type Tolerances struct{ Logits, Loss, Grads float64 }

// CheckMatchesPyTorch runs the forward and backward of m (arch's, with
// the reference's weights and batch uploaded, at fp32 on the CPU backend)
// and checks logits, loss and every gradient against the reference.
func (r *Reference) CheckMatchesPyTorch(t *testing.T, be backend.Backend, m Blocked, arch model.Arch, tol Tolerances) {
	t.Helper()
	s := be.DefaultStream()
	Must(t, m.ZeroGrads(s))
	Must(t, m.Forward(s))
	CloseTo(t, "logits", Download(t, be, m.Buffers().Logits), r.Logits, tol.Logits)
	Must(t, m.CrossEntropy(s, 1/float32(r.ValidTargets)))
	if loss := MeanLoss(t, be, m, r.ValidTargets); math.Abs(loss-r.Loss) > tol.Loss*r.Loss {
		t.Errorf("loss %.8g, PyTorch %.8g", loss, r.Loss)
	}
	Must(t, m.Backward(s))
	grads := Download(t, be, m.Buffers().Grads)
	for _, p := range arch.Layout() {
		CloseTo(t, "grad "+p.Name, HFOrder(p, grads[p.Offset:p.Offset+p.Len()]), r.Grads[p.Name], tol.Grads)
	}
}

// AdamWTrajectory runs the reference's AdamW steps on m (arch's, with the
// reference's weights and batch uploaded; same batch every step, lr 1e-3,
// betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on parameters of dim >= 2,
// no clipping) with the project's device AdamW, checks each step's loss
// to 1e-5 relative (errors compound over the steps; that holds through
// step 10), and returns the final parameters.
func (r *Reference) AdamWTrajectory(t *testing.T, be backend.Backend, m Blocked, arch model.Arch) []float32 {
	t.Helper()
	s := be.DefaultStream()
	bufs := m.Buffers()
	var ts []optim.Tensor
	for i, p := range arch.Layout() {
		g, _ := m.GradView(i)
		ts = append(ts, optim.Tensor{Name: p.Name, Param: m.ParamView(bufs.Params, i), Grad: g, Decay: p.Decay})
		if p.Decay != (len(p.Shape) >= 2) {
			t.Errorf("%s: layout decay %v differs from the fixture's dim >= 2 rule", p.Name, p.Decay)
		}
	}
	h := optim.Hyper{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: optim.ClipNone}
	opt, err := optim.New(be, h, ts, bufs.Grads)
	Must(t, err)
	for step, want := range r.AdamLosses {
		Must(t, model.Chain(
			func() error { return m.ZeroGrads(s) },
			func() error { return m.Forward(s) },
			func() error { return m.CrossEntropy(s, 1/float32(r.ValidTargets)) },
			func() error { return m.Backward(s) },
		))
		if got := MeanLoss(t, be, m, r.ValidTargets); math.Abs(got-float64(want)) > 1e-5*float64(want) {
			t.Errorf("step %d: loss %.8g, PyTorch %.8g", step, got, want)
		}
		Must(t, opt.Step(s, 1e-3, backend.Tensor{}))
	}
	return Download(t, be, bufs.Params)
}
