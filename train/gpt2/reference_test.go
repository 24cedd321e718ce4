package gpt2

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// The PyTorch fixture: a tiny random GPT2LMHeadModel written by
// transformers' save_pretrained, with its logits, loss, every gradient and
// a 10-step AdamW trajectory (scripts/fixtures/gpt2_tiny.py).
const fixtureDir = "../testdata/gpt2-tiny"

// Tolerances, fp32 throughout: |got - want| <= atol + rtol*|want|, with atol
// scaled by the largest magnitude of the tensor so that near-zero entries of
// a large tensor do not demand more than fp32 can give.
const (
	logitRTol = 1e-5
	gradRTol  = 1e-4 // gradients sum many more products; 1e-4 of the tensor's scale
	lossRTol  = 1e-5
)

// fixture is the PyTorch model's configuration and weights, and its
// reference results.
type fixture struct {
	cfg    Config
	params []float32
	*modeltest.Reference
}

func loadFixture(t *testing.T) *fixture {
	t.Helper()
	cfg, params, err := LoadHF(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{cfg, params, modeltest.LoadReference(t, fixtureDir+"/reference.safetensors", cfg.Layout())}
}

func fixtureModel(t *testing.T, be backend.Backend, fx *fixture) *Model {
	t.Helper()
	m, err := New(be, fx.cfg, fx.B, fx.T, backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	fx.Upload(t, be, m, fx.params)
	return m
}

// TestMatchesPyTorch checks logits, loss and every gradient.
func TestMatchesPyTorch(t *testing.T) {
	fx := loadFixture(t)
	be := cpu.New(cpu.Config{})
	defer be.Close()
	m := fixtureModel(t, be, fx)
	fx.CheckMatchesPyTorch(t, be, m, fx.cfg, modeltest.Tolerances{Logits: logitRTol, Loss: lossRTol, Grads: gradRTol})
}

// TestAdamWTrajectoryMatchesPyTorch runs the fixture's 10 AdamW steps (same
// batch every step, lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1
// on matrices and embeddings only, no clipping) and compares each loss and
// the final weights.
func TestAdamWTrajectoryMatchesPyTorch(t *testing.T) {
	fx := loadFixture(t)
	be := cpu.New(cpu.Config{})
	defer be.Close()
	m := fixtureModel(t, be, fx)
	final := fx.AdamWTrajectory(t, be, m, fx.cfg)
	for _, p := range m.Layout() {
		want, ok := fx.Finals[p.Name]
		if !ok {
			continue
		}
		got := final[p.Offset : p.Offset+p.Len()]
		if strings.HasSuffix(p.Name, "c_attn.bias") {
			// The key bias adds q.b_k to every score of a softmax row, which
			// the softmax cancels: its true gradient is 0 and both sides hold
			// only rounding noise, which Adam's m/sqrt(v) scales up to steps
			// of size lr. Compare q and v biases; check k moved by at most
			// 10 steps of lr in either implementation.
			C := m.Cfg.C
			for i := C; i < 2*C; i++ {
				if d := math.Abs(float64(got[i] - want[i])); d > 2*10*1e-3 {
					t.Errorf("final %s key bias %d: %g vs %g", p.Name, i-C, got[i], want[i])
				}
			}
			modeltest.CloseTo(t, "final q bias "+p.Name, got[:C], want[:C], 1e-4)
			modeltest.CloseTo(t, "final v bias "+p.Name, got[2*C:], want[2*C:], 1e-4)
			continue
		}
		modeltest.CloseTo(t, fmt.Sprintf("final %s", p.Name), got, want, 1e-4)
	}
}
