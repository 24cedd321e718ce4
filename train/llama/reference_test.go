package llama

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// The PyTorch fixtures: tiny random LlamaForCausalLM models written by
// transformers' save_pretrained, with logits, loss, every gradient and a
// 10-step AdamW trajectory (scripts/fixtures/llama_tiny.py), and tiny
// Qwen2ForCausalLM ones (q, k and v biases; 5 AdamW steps;
// scripts/fixtures/qwen2_tiny.py).
var fixtureNames = []string{"llama-tiny-gqa", "llama-tiny-rope3", "llama-tiny-tied", "qwen2-tiny-gqa", "qwen2-tiny-tied"}

func fixtureDir(name string) string { return filepath.Join("..", "testdata", name) }

// Tolerances, fp32: |got - want| <= rtol * (scale + |want|), scale the
// tensor's largest magnitude.
const (
	logitRTol = 1e-5
	gradRTol  = 1e-5
	lossRTol  = 1e-6
)

// fixture is a PyTorch model's configuration and weights, and its
// reference results.
type fixture struct {
	name       string
	cfg        Config
	params     []float32 // Layout order, matrices in x out
	logitsBF16 []float32 // logits of the bf16-rounded weights (gqa only)
	invFreq    []float32
	*modeltest.Reference
}

// loadWeights reads every parameter of cfg from an HF safetensors file as
// fp32 in Layout order, transposing the Transposed ones (a test helper:
// train/hf is the loader).
func loadWeights(t *testing.T, path string, cfg Config) []float32 {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]float32, cfg.NumParams())
	for _, p := range cfg.Layout() {
		v, shape, err := f.Float32(p.Name)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		want := p.Shape
		if p.Transposed {
			want = []int{p.Shape[1], p.Shape[0]}
			v = modeltest.Transpose(v, want[0], want[1])
		}
		if fmt.Sprint(shape) != fmt.Sprint(want) {
			t.Fatalf("%s: %s has shape %v, want %v", path, p.Name, shape, want)
		}
		copy(vals[p.Offset:], v)
	}
	return vals
}

func loadFixture(t *testing.T, name string) *fixture {
	t.Helper()
	dir := fixtureDir(name)
	cfg, err := ReadHFConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	ref := modeltest.LoadReference(t, filepath.Join(dir, "reference.safetensors"), cfg.Layout())
	fx := &fixture{name: name, cfg: cfg, params: loadWeights(t, filepath.Join(dir, "model.safetensors"), cfg), Reference: ref}
	fx.invFreq = ref.Floats(t, "rope_inv_freq")
	if _, ok := ref.File.Info("logits_bf16model"); ok {
		fx.logitsBF16 = ref.Floats(t, "logits_bf16model")
	}
	return fx
}

func fixtureModel(t *testing.T, be backend.Backend, fx *fixture, dt backend.DType, opts model.Options) *Model {
	t.Helper()
	m, err := New(be, fx.cfg, fx.B, fx.T, dt, opts)
	if err != nil {
		t.Fatal(err)
	}
	fx.Upload(t, be, m, fx.params)
	return m
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestInvFreqMatchesTransformers: the rotary inverse frequencies of each
// fixture's RoPE type (default theta 1e4, llama3 with all three bands,
// linear x2) are transformers' own, bit for bit (Go's math.Pow is the
// same on every platform; torch's float32 pow agrees with its rounding
// on all 24 entries).
func TestInvFreqMatchesTransformers(t *testing.T) {
	for _, name := range fixtureNames {
		fx := loadFixture(t, name)
		got := fx.cfg.InvFreq()
		if len(got) != len(fx.invFreq) {
			t.Fatalf("%s: %d frequencies, want %d", name, len(got), len(fx.invFreq))
		}
		for i, w := range fx.invFreq {
			if math.Float32bits(got[i]) != math.Float32bits(w) {
				t.Errorf("%s: inv_freq[%d] = %.9g, transformers %.9g", name, i, got[i], w)
			}
		}
	}
}

// TestMatchesPyTorch checks logits, loss and every gradient of each
// fixture on the CPU backend at fp32.
func TestMatchesPyTorch(t *testing.T) {
	onFixtures(t, func(t *testing.T, fx *fixture, be backend.Backend, m *Model) {
		fx.CheckMatchesPyTorch(t, be, m, fx.cfg, modeltest.Tolerances{Logits: logitRTol, Loss: lossRTol, Grads: gradRTol})
	})
}

// onFixtures runs check on each fixture's fp32 model on the CPU backend,
// in a subtest of its own.
func onFixtures(t *testing.T, check func(t *testing.T, fx *fixture, be backend.Backend, m *Model)) {
	for _, name := range fixtureNames {
		t.Run(name, func(t *testing.T) {
			fx := loadFixture(t, name)
			be := cpu.New(cpu.Config{})
			defer be.Close()
			check(t, fx, be, fixtureModel(t, be, fx, backend.F32, model.Options{}))
		})
	}
}

// TestAdamWTrajectoryMatchesPyTorch runs each fixture's 10 AdamW steps
// (same batch every step, lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight
// decay 0.1 on parameters of dim >= 2, no clipping) with the project's
// device AdamW and compares each loss, and the final weights where the
// fixture has them.
func TestAdamWTrajectoryMatchesPyTorch(t *testing.T) {
	onFixtures(t, func(t *testing.T, fx *fixture, be backend.Backend, m *Model) {
		final := fx.AdamWTrajectory(t, be, m, fx.cfg)
		for _, p := range m.Layout() {
			if want, ok := fx.Finals[p.Name]; ok {
				modeltest.CloseTo(t, "final "+p.Name, modeltest.HFOrder(p, final[p.Offset:p.Offset+p.Len()]), want, 1e-4)
			}
		}
		if strings.HasSuffix(fx.name, "gqa") && len(fx.Finals) != len(m.Layout()) {
			t.Errorf("%d final tensors in the fixture, want %d", len(fx.Finals), len(m.Layout()))
		}
	})
}

// TestBF16Logits: a bf16 model (weights rounded to bf16, every activation
// stored in bf16) gives the logits transformers computes in fp32 from the
// same bf16 weights, within bf16's rounding of the activations.
func TestBF16Logits(t *testing.T) {
	for _, name := range []string{"llama-tiny-gqa", "qwen2-tiny-gqa", "qwen2-tiny-tied"} {
		t.Run(name, func(t *testing.T) { bf16Logits(t, name) })
	}
}

func bf16Logits(t *testing.T, name string) {
	fx := loadFixture(t, name)
	if fx.logitsBF16 == nil {
		t.Fatalf("%s has no logits_bf16model", name)
	}
	be := cpu.New(cpu.Config{KernelDTypes: true})
	defer be.Close()
	s := be.DefaultStream()
	m := fixtureModel(t, be, fx, backend.BF16, model.Options{})
	must(t, m.Forward(s))
	logits, err := backend.Download(be, s, m.Logits)
	must(t, err)
	var scale, worst, sum float64
	for i, w := range fx.logitsBF16 {
		scale = max(scale, math.Abs(float64(w)))
		d := math.Abs(float64(logits[i] - w))
		worst = max(worst, d)
		sum += d
	}
	mean := sum / float64(len(logits))
	// bf16 keeps 8 significant bits (relative rounding 2^-9 = 2e-3 per
	// stored activation); over two layers the logits here (scale 0.72)
	// move by up to 0.4% of their scale (seen: max 3.1e-3, mean 5.6e-4).
	if worst > 0.012*scale || mean > 0.002*scale {
		t.Errorf("bf16 logits: max |diff| %.3g, mean %.3g, logit scale %.3g", worst, mean, scale)
	}
	t.Logf("bf16 logits: max |diff| %.3g, mean %.3g, logit scale %.3g", worst, mean, scale)
}

// TestBF16Gradients: a bf16 model's loss and gradients (bf16 weights,
// activations and activation gradients; fp32 and bf16 parameter
// gradients) stay near PyTorch's fp32 ones: every tensor within a few
// percent of its scale. It catches a bf16 path that computes something
// else, which the bit-for-bit comparisons between bf16 runs cannot.
func TestBF16Gradients(t *testing.T) {
	for _, name := range fixtureNames {
		fx := loadFixture(t, name)
		for _, gdt := range []backend.DType{backend.F32, backend.BF16} {
			t.Run(fmt.Sprintf("%s/grads-%v", name, gdt), func(t *testing.T) {
				be := cpu.New(cpu.Config{KernelDTypes: true})
				defer be.Close()
				s := be.DefaultStream()
				m := fixtureModel(t, be, fx, backend.BF16, model.Options{GradDType: gdt})
				must(t, m.ZeroGrads(s))
				must(t, m.Forward(s))
				must(t, m.CrossEntropy(s, 1/float32(fx.ValidTargets)))
				if loss := modeltest.MeanLoss(t, be, m, fx.ValidTargets); math.Abs(loss-fx.Loss) > 2e-3*fx.Loss {
					t.Errorf("loss %.6g, PyTorch (fp32) %.6g", loss, fx.Loss)
				}
				must(t, m.Backward(s))
				grads, err := backend.Download(be, s, m.Grads)
				must(t, err)
				worst, at := 0.0, ""
				for _, p := range m.Layout() {
					got, want := modeltest.HFOrder(p, grads[p.Offset:p.Offset+p.Len()]), fx.Grads[p.Name]
					var scale, diff float64
					for i, w := range want {
						scale = max(scale, math.Abs(float64(w)))
						diff = max(diff, math.Abs(float64(got[i]-w)))
					}
					if r := diff / scale; r > worst {
						worst, at = r, p.Name
					}
				}
				if worst > 0.05 {
					t.Errorf("worst gradient %s: max |diff| %.3g of its scale", at, worst)
				}
				t.Logf("worst gradient %s: max |diff| %.3g of its scale", at, worst)
			})
		}
	}
}
