package gpt2

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// hookCfg is small enough for bit-exact comparisons of every gradient.
var hookCfg = Config{V: 64, MaxT: 16, C: 32, L: 2, NH: 4, Eps: 1e-5}

const hookB, hookT = 2, 8

// hookModel builds a model with hookCfg's random weights (non-trivial norms
// and biases) in dtype dt.
func hookModel(t *testing.T, be backend.Backend, dt backend.DType, opts model.Options) *Model {
	t.Helper()
	m, err := NewWithOptions(be, hookCfg, hookB, hookT, dt, opts)
	if err != nil {
		t.Fatal(err)
	}
	vals := Init(hookCfg, 5)
	rng := rand.New(rand.NewPCG(6, 7))
	for _, p := range hookCfg.Layout() {
		if len(p.Shape) == 1 {
			for i := p.Offset; i < p.Offset+p.Len(); i++ {
				vals[i] += float32(rng.NormFloat64() * 0.1)
			}
		}
	}
	if err := backend.Upload(be, be.DefaultStream(), m.Params, vals); err != nil {
		t.Fatal(err)
	}
	return m
}

// family is hookCfg for the shared pass checks.
var family = modeltest.Family{Arch: hookCfg, V: hookCfg.V, B: hookB, T: hookT,
	New: func(t *testing.T, be backend.Backend, dt backend.DType, opts model.Options) modeltest.Blocked {
		return hookModel(t, be, dt, opts)
	}}

// TestSplitPassesMatchWhole: the per-layer calls are Forward and Backward
// to the bit, over two accumulated micro-batches.
func TestSplitPassesMatchWhole(t *testing.T) {
	for _, dt := range modeltest.DTypes {
		t.Run(dt.String(), func(t *testing.T) { family.CheckSplitPasses(t, dt) })
	}
}

// TestMatrixHooksMatchDense: a hook that computes dW = X^T dY itself gets
// every matrix gradient bit for bit as the model without hooks, and the
// model's own (dense) gradients do not change either; under every
// recompute setting, with and without hooks, the gradients are those of
// the model that recomputes nothing, to the bit, and the hooks see each
// input once (modeltest.Family.CheckMatrixHooks).
func TestMatrixHooksMatchDense(t *testing.T) {
	for _, dt := range modeltest.DTypes {
		for _, rc := range model.Recomputes {
			t.Run(fmt.Sprintf("%v/recompute=%v", dt, rc), func(t *testing.T) { family.CheckMatrixHooks(t, dt, rc) })
		}
	}
}

// TestMemoryWithMatchesAllocation: MemoryWith predicts NewWithOptions' device
// memory to the byte, and Free returns all of it; without hooks or
// recompute it is Memory.
func TestMemoryWithMatchesAllocation(t *testing.T) {
	tiny, err := Preset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cases := []modeltest.MemoryCase{
		{Name: "hook", Arch: hookCfg, B: hookB, T: hookT},
		{Name: "tiny", Arch: tiny, B: 2, T: 16},
		{Name: "L1", Arch: Config{V: 5, MaxT: 3, C: 4, L: 1, NH: 2, Eps: 1e-5}, B: 1, T: 3},
	}
	for _, c := range cases {
		cfg := c.Arch.(Config)
		for _, dt := range modeltest.DTypes {
			if plan, mem := cfg.MemoryWith(c.B, c.T, dt, model.Options{}), cfg.Memory(c.B, c.T, dt); plan != mem {
				t.Errorf("%s/%v: MemoryWith without hooks %+v, Memory %+v", c.Name, dt, plan, mem)
			}
		}
	}
	modeltest.CheckMemoryCases(t, cases, []backend.DType{backend.F32}, actParts)
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
		OuterStats: []backend.Tensor{m.lnfMean, m.lnfRstd, m.Losses},
		Grad:       m.grad, GradViews: []backend.Tensor{m.dres, m.dbuf, m.dqkv, m.dfch}, Scratch: m.bwdScratch,
		DType: m.DType,
	})
}

// TestMatrixLayout: MatrixShape and MatrixParam name the layout's matrices.
func TestMatrixLayout(t *testing.T) {
	suffix := map[Matrix]string{MatQKV: "attn.c_attn.weight", MatProj: "attn.c_proj.weight", MatFC: "mlp.c_fc.weight", MatFCProj: "mlp.c_proj.weight"}
	names := map[Matrix]string{MatQKV: "qkv", MatProj: "proj", MatFC: "fc", MatFCProj: "fcproj"}
	for _, cfg := range []Config{hookCfg, {V: 50257, MaxT: 1024, C: 768, L: 3, NH: 12, Eps: 1e-5}} {
		layout := cfg.Layout()
		matrices := 0
		for i := range layout {
			if cfg.isMatrix(i) {
				matrices++
			}
		}
		if matrices != NumMatrices*cfg.L {
			t.Errorf("C=%d: %d matrices, want %d", cfg.C, matrices, NumMatrices*cfg.L)
		}
		for l := range cfg.L {
			for k := range Matrix(NumMatrices) {
				if k.String() != names[k] {
					t.Errorf("Matrix(%d).String() = %q, want %q", k, k.String(), names[k])
				}
				p := layout[cfg.MatrixParam(l, k)]
				if want := fmt.Sprintf("transformer.h.%d.%s", l, suffix[k]); p.Name != want {
					t.Errorf("MatrixParam(%d, %v) is %s, want %s", l, k, p.Name, want)
				}
				mm, n := cfg.MatrixShape(k)
				if !slices.Equal(p.Shape, []int{mm, n}) {
					t.Errorf("MatrixShape(%v) = %d x %d, layout %v", k, mm, n, p.Shape)
				}
				if !cfg.isMatrix(cfg.MatrixParam(l, k)) {
					t.Errorf("isMatrix(MatrixParam(%d, %v)) is false", l, k)
				}
			}
		}
		// The description the engine reads says the same: four matrices
		// per block, each with an input of its own, at MatrixParam.
		x, err := model.NewIndex(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if x.Inputs != NumMatrices || len(x.Blocks) != cfg.L || len(x.Blocks[0]) != perLayer {
			t.Errorf("index: %d inputs, %d blocks of %d parameters", x.Inputs, len(x.Blocks), len(x.Blocks[0]))
		}
		if want := []int{0, 1, len(layout) - 2, len(layout) - 1}; !slices.Equal(x.Outside, want) {
			t.Errorf("parameters outside the blocks %v, want %v", x.Outside, want)
		}
		modeltest.CheckIndex(t, x, func(l, k int) int { return cfg.MatrixParam(l, Matrix(k)) }, cfg.isMatrix)
	}
}

// TestPassErrors: hook errors and bad layer numbers come back as errors.
func TestPassErrors(t *testing.T) { family.CheckPassErrors(t) }

// TestKernelDTypes: at bf16 the passes use only the storage types the
// CUDA kernels take, with and without matrix hooks, with fp32 and bf16
// parameter gradients, and an fp32 model is refused
// (modeltest.Family.CheckKernelDTypes).
func TestKernelDTypes(t *testing.T) { family.CheckKernelDTypes(t) }
