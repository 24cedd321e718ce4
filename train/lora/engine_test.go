package lora_test

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// TestEngineMatchesPEFT: --mode lora's engine, on the CPU backend in fp32
// with PEFT's adapter (testdata/<family>/adapter) on the frozen base,
// gives PEFT's logits, its adapter gradients (the unmerged term's
// backward, not the merged model's) and, over 5 AdamW steps of the
// engine's own schedule with the fixture's hyperparameters, its losses and
// its final adapter (reference.safetensors, scripts/fixtures/peft_lora.py).
func TestEngineMatchesPEFT(t *testing.T) {
	for _, fam := range lora.Families {
		t.Run(fam, func(t *testing.T) {
			arch, idx, ref, ad := lora.PEFTFixture(t, fam)
			B, T, ids, targets, valid := lora.FixtureBatch(t, ref)
			e, be := loraEngine(t, fam, arch, idx, ad, B, T)
			s := be.DefaultStream()
			m, st := e.Model, e.Adapters()
			bufs := m.Buffers()

			// One forward and backward by hand: the logits and the
			// adapters' gradients of the mean loss.
			if err := backend.UploadInt32(be, s, bufs.Targets, targets); err != nil {
				t.Fatal(err)
			}
			if err := st.ZeroGrads(s); err != nil {
				t.Fatal(err)
			}
			want, _ := lora.TensorOf(t, ref, "logits")
			want64 := make([]float64, len(want))
			for i, w := range want {
				want64[i] = float64(w)
			}
			lora.CloseLogits(t, "logits", forward(t, e, be, ids), want64)
			if err := m.CrossEntropy(s, float32(1/float64(valid))); err != nil {
				t.Fatal(err)
			}
			if err := model.Backward(m, s, len(idx.Blocks)); err != nil {
				t.Fatal(err)
			}
			grads, err := backend.Download(be, s, st.Grads)
			if err != nil {
				t.Fatal(err)
			}
			off := 0
			for _, site := range st.Sites {
				for _, key := range []string{lora.KeyA(site), lora.KeyB(site)} {
					w, _ := lora.TensorOf(t, ref, "grad."+key)
					lora.CloseTo(t, "gradient of "+key, grads[off:off+len(w)], w, 1e-5)
					off += len(w)
				}
			}

			// Five steps on the same batch at a constant learning rate.
			wantLosses, _ := lora.TensorOf(t, ref, "adamw_losses")
			b := data.Batch{B: B, T: T, Inputs: ids, Targets: targets, NumTargets: valid}
			for step := range wantLosses {
				sum, err := e.Step([]data.Batch{b}, 1e-3)
				if err != nil {
					t.Fatal(err)
				}
				loss, w := sum/float64(valid), float64(wantLosses[step])
				if math.Abs(loss-w) > 1e-5*w {
					t.Errorf("step %d: loss %.8g, PEFT %.8g", step+1, loss, w)
				}
			}
			got, err := st.Download(s)
			if err != nil {
				t.Fatal(err)
			}
			var worst float64
			for i, site := range st.Sites {
				for _, kv := range []struct {
					key string
					v   []float32
				}{{lora.KeyA(site), got.A[i]}, {lora.KeyB(site), got.B[i]}} {
					w, _ := lora.TensorOf(t, ref, "final."+kv.key)
					worst = max(worst, lora.CloseTo(t, "final "+strings.TrimPrefix(kv.key, "base_model.model."), kv.v, w, 1e-5))
				}
			}
			t.Logf("largest final difference from PEFT, relative to the tensor's scale: %.2g", worst)
		})
	}
}

// loraEngine is an fp32 lora engine on the CPU backend for B x T over
// testdata/<family>/base, with ad's adapters, the fixture's AdamW (no
// clipping) and the dense parameters frozen.
func loraEngine(t *testing.T, fam string, arch model.Arch, idx *model.Index, ad *lora.Adapter, B, T int) (*engine.Engine, backend.Backend) {
	t.Helper()
	h := optim.Hyper{Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: optim.ClipNone}
	cfg := engine.Config{Mode: engine.LoRA, DenseParams: engine.DenseFrozen, Hyper: h, LoRA: ad.Cfg, Seed: 1}
	be := cpu.New(cpu.Config{Threads: 2})
	t.Cleanup(func() { be.Close() })
	e, err := engine.New(be, arch, B, T, 1, backend.F32, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Free() })
	s := be.DefaultStream()
	if err := backend.Upload(be, s, e.Model.Buffers().Params, lora.BaseParams(t, fam, idx)); err != nil {
		t.Fatal(err)
	}
	if err := e.SetAdapters(ad); err != nil {
		t.Fatal(err)
	}
	if err := e.Init(); err != nil {
		t.Fatal(err)
	}
	return e, be
}

// forward runs e's model on ids and returns the logits.
func forward(t *testing.T, e *engine.Engine, be backend.Backend, ids []int32) []float32 {
	t.Helper()
	s, bufs := be.DefaultStream(), e.Model.Buffers()
	if err := backend.UploadInt32(be, s, bufs.Inputs, ids); err != nil {
		t.Fatal(err)
	}
	if err := e.Model.Forward(s); err != nil {
		t.Fatal(err)
	}
	logits, err := backend.Download(be, s, bufs.Logits)
	if err != nil {
		t.Fatal(err)
	}
	return logits
}

// TestPEFTLoadsOurAdapter: the adapter WriteAdapter wrote
// (testdata/<family>/go-adapter, TestGoAdapter keeps it current), loaded
// by peft.PeftModel.from_pretrained in scripts/fixtures/peft_lora.py,
// gave the logits in go-adapter-logits.json; the engine's lora forward
// with the same adapter gives them too. Its lora_dropout (0.05) does not
// act in evaluation, in PEFT or here.
func TestPEFTLoadsOurAdapter(t *testing.T) {
	for _, fam := range lora.Families {
		t.Run(fam, func(t *testing.T) {
			arch, idx := lora.FixtureArch(t, fam)
			ad, err := lora.ReadAdapter(filepath.Join("testdata", fam, "go-adapter"), idx)
			if err != nil {
				t.Fatal(err)
			}
			ad.Cfg.Dropout = 0
			fix := lora.ReadGoAdapterLogits(t, fam)
			e, be := loraEngine(t, fam, arch, idx, ad, fix.InputShape[0], fix.InputShape[1])
			lora.CloseLogits(t, "logits with the Go-written adapter", forward(t, e, be, fix.IDs32()), fix.Logits)
		})
	}
}
