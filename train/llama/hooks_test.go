package llama

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// hookCfg is small enough for bit-exact comparisons of every gradient:
// grouped-query attention, head_dim not hidden/heads, an intermediate size
// that is no multiple of anything, llama3 RoPE, untied head.
var hookCfg = Config{Vocab: 48, Hidden: 24, Intermediate: 40, NumLayers: 2, Heads: 4, KVHeads: 2, HeadDim: 8,
	Eps: 1e-5, RopeTheta: 10000, MaxPos: 16,
	RopeScaling: &RopeScaling{Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPos: 12}}

const hookB, hookT = 2, 8

// hookModel builds a model of cfg with random weights (norm weights away
// from 1) in dtype dt.
func hookModel(t *testing.T, be backend.Backend, cfg Config, dt backend.DType, opts model.Options) *Model {
	t.Helper()
	m, err := New(be, cfg, hookB, hookT, dt, opts)
	if err != nil {
		t.Fatal(err)
	}
	vals := cfg.Init(5)
	rng := rand.New(rand.NewPCG(6, 7))
	for _, p := range cfg.Layout() {
		if len(p.Shape) == 1 {
			for i := p.Offset; i < p.Offset+p.Len(); i++ {
				vals[i] += float32(rng.NormFloat64() * 0.1)
			}
		} else {
			for i := p.Offset; i < p.Offset+p.Len(); i++ {
				vals[i] *= 10 // 0.2: logits far enough from uniform to matter
			}
		}
	}
	must(t, backend.Upload(be, be.DefaultStream(), m.Params, vals))
	return m
}

// familyOf is cfg for the shared pass checks, with hookModel's weights.
func familyOf(cfg Config) modeltest.Family {
	return modeltest.Family{Arch: cfg, V: cfg.Vocab, B: hookB, T: hookT,
		New: func(t *testing.T, be backend.Backend, dt backend.DType, opts model.Options) modeltest.Blocked {
			return hookModel(t, be, cfg, dt, opts)
		}}
}

// TestSplitPassesMatchWhole: the per-layer calls are Forward and Backward
// to the bit, over two accumulated micro-batches.
func TestSplitPassesMatchWhole(t *testing.T) {
	for _, dt := range modeltest.DTypes {
		t.Run(dt.String(), func(t *testing.T) { familyOf(hookCfg).CheckSplitPasses(t, dt) })
	}
}

// TestMatrixHooksMatchDense: a hook that computes dW = X^T dY from the
// shared inputs it was handed gets every matrix gradient bit for bit as
// the model without hooks, and the dense gradients do not change either;
// for a tied and an untied head (the tied one with Qwen2's q, k and v
// biases); under every recompute setting, with and without hooks, the
// gradients are those of the model that recomputes nothing, to the bit,
// and the hooks see each input once (modeltest.Family.CheckMatrixHooks).
func TestMatrixHooksMatchDense(t *testing.T) {
	tied := hookCfg.clone()
	tied.Tied, tied.KVHeads, tied.RopeScaling = true, 1, &RopeScaling{Type: "linear", Factor: 2}
	// Qwen2's q, k and v biases: dense parameters next to hooked matrices.
	tied.QKVBias = true
	for _, cfg := range []Config{hookCfg, tied} {
		for _, dt := range modeltest.DTypes {
			for _, rc := range model.Recomputes {
				t.Run(fmt.Sprintf("tied=%v/%v/recompute=%v", cfg.Tied, dt, rc), func(t *testing.T) {
					familyOf(cfg).CheckMatrixHooks(t, dt, rc)
				})
			}
		}
	}
}

// TestMemoryWithMatchesAllocation: MemoryWith predicts New's device memory to
// the byte, part by part, and Free returns all of it.
func TestMemoryWithMatchesAllocation(t *testing.T) {
	tiny, err := Preset("llama-tiny")
	must(t, err)
	tied := hookCfg.clone()
	tied.Tied, tied.QKVBias = true, true
	wideHeads := Config{Vocab: 5, Hidden: 4, Intermediate: 3, NumLayers: 1, Heads: 2, KVHeads: 1, HeadDim: 6,
		Eps: 1e-5, RopeTheta: 10000, MaxPos: 3}
	name := func(c Config) string { return fmt.Sprintf("C%d-L%d-tied=%v", c.Hidden, c.NumLayers, c.Tied) }
	modeltest.CheckMemoryCases(t, []modeltest.MemoryCase{
		{Name: name(hookCfg), Arch: hookCfg, B: hookB, T: hookT},
		{Name: name(tied), Arch: tied, B: 1, T: 5},
		{Name: name(tiny), Arch: tiny, B: 2, T: 16},
		{Name: name(wideHeads), Arch: wideHeads, B: 1, T: 3},
	}, modeltest.DTypes, actParts)
}

// actParts checks m's activation views (modeltest.CheckActAllocs) and
// returns the bytes of its activations and of its activation gradients
// and scratch.
func actParts(t *testing.T, mm model.Model) (acts, actGrads int64) {
	m := mm.(*Model)
	return modeltest.CheckActAllocs(t, modeltest.ActAllocs{
		Acts: m.Cfg.blockActs(m.B, m.T), Views: m.actViews, Recompute: m.rc, Hooked: m.hooks != nil,
		Data: m.acts, Stats: m.statsBuf,
		OuterData:  []backend.Tensor{m.encoded, m.lnf, m.scratch, m.Logits},
		OuterStats: []backend.Tensor{m.invFreq, m.rstdf, m.Losses},
		Grad:       m.grad, GradViews: []backend.Tensor{m.dres, m.dbuf, m.dwide}, Scratch: m.bwdScratch,
		DType: m.DType,
	})
}

// TestMatrixLayout: MatrixShape, MatrixParam and Matrices name the
// layout's matrices, and model.NewIndex reads four shared inputs: q, k, v
// one; o one; gate and up one; down one.
func TestMatrixLayout(t *testing.T) {
	suffix := map[Matrix]string{MatQ: "self_attn.q_proj.weight", MatK: "self_attn.k_proj.weight", MatV: "self_attn.v_proj.weight",
		MatO: "self_attn.o_proj.weight", MatGate: "mlp.gate_proj.weight", MatUp: "mlp.up_proj.weight", MatDown: "mlp.down_proj.weight"}
	for _, name := range []string{"llama3-8b", "smollm2-135m"} {
		cfg, err := Preset(name)
		must(t, err)
		cfg.NumLayers = 3
		layout := cfg.Layout()
		for l := range cfg.NumLayers {
			for k := range Matrix(NumMatrices) {
				p := layout[cfg.MatrixParam(l, k)]
				if want := fmt.Sprintf("model.layers.%d.%s", l, suffix[k]); p.Name != want {
					t.Errorf("MatrixParam(%d, %v) is %s, want %s", l, k, p.Name, want)
				}
				mm, n := cfg.MatrixShape(k)
				if !slices.Equal(p.Shape, []int{mm, n}) || !p.Transposed || !p.Decay {
					t.Errorf("%s: shape %v transposed %v decay %v, want %d x %d, transposed, decayed", p.Name, p.Shape, p.Transposed, p.Decay, mm, n)
				}
			}
		}
		for _, p := range layout {
			if len(p.Shape) == 1 && (p.Decay || p.Transposed) {
				t.Errorf("%s: a norm with decay %v, transposed %v", p.Name, p.Decay, p.Transposed)
			}
		}
		if last := layout[len(layout)-1]; cfg.Tied != (last.Name == "model.norm.weight") {
			t.Errorf("tied=%v, layout ends with %s", cfg.Tied, last.Name)
		}
		x, err := model.NewIndex(cfg)
		must(t, err)
		if x.Inputs != NumInputs || !slices.Equal(x.InputM, []int{cfg.Hidden, cfg.qWidth(), cfg.Hidden, cfg.Intermediate}) {
			t.Errorf("%s: %d inputs of widths %v", name, x.Inputs, x.InputM)
		}
		want := [][]int{{0, 1, 2}, {3}, {4, 5}, {6}}
		for in, r := range x.Readers {
			if !slices.Equal(r, want[in]) {
				t.Errorf("%s: input %d read by %v, want %v", name, in, r, want[in])
			}
		}
		modeltest.CheckIndex(t, x, func(l, k int) int { return cfg.MatrixParam(l, Matrix(k)) }, cfg.isMatrix)
	}
}

// TestPassErrors: hook errors and bad layer numbers come back as errors.
func TestPassErrors(t *testing.T) { familyOf(hookCfg).CheckPassErrors(t) }

// TestKernelDTypes: at bf16 the passes use only the storage types the
// CUDA kernels take, with and without hooks, with fp32 and bf16 parameter
// gradients; the gradients are those of a plain backend, bit for bit
// (modeltest.Family.CheckKernelDTypes).
func TestKernelDTypes(t *testing.T) { familyOf(hookCfg).CheckKernelDTypes(t) }
