// The run's contact with the model family (GPT-2) and with the engine's
// constructors: resolving --model, the memory plan, building the engine,
// the initial weights, lsp's per-matrix caps and the export. They are kept
// in this one file so that a second model family, or an engine that takes
// a model description instead of a GPT-2 configuration, changes the run
// here only.

package train

import (
	"os"
	"path/filepath"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/lsp"
)

// Plan is the predicted memory and link traffic of a run.
type Plan = engine.Plan

// ResolveModel returns the architecture of --model, a preset name or a
// checkpoint directory, and whether it is a checkpoint.
func ResolveModel(model string) (gpt2.Config, bool, error) {
	if st, err := os.Stat(model); err == nil && st.IsDir() {
		cfg, err := gpt2.ReadHFConfig(model)
		if err != nil {
			return gpt2.Config{}, false, flagErr("model", "%v", err)
		}
		return cfg, true, nil
	}
	cfg, err := gpt2.Preset(model)
	if err != nil {
		if filepath.IsAbs(model) || filepath.Base(model) != model {
			return gpt2.Config{}, false, flagErr("model", "%s is neither a checkpoint directory nor a preset", model)
		}
		return gpt2.Config{}, false, flagErr("model", "%v", err)
	}
	return cfg, false, nil
}

// PlanMemory predicts the device and host memory of training cfg with the
// model mc, in cfg's mode.
func PlanMemory(mc gpt2.Config, c Config) (Plan, error) {
	st, err := os.Stat(c.Model)
	return planMemory(mc, c, err == nil && st.IsDir())
}

// planMemory is PlanMemory with the kind of --model known; fromCheckpoint
// picks the default of --dense-params.
func planMemory(mc gpt2.Config, c Config, fromCheckpoint bool) (Plan, error) {
	return engine.PlanMemory(mc, c.Batch, c.SeqLen, c.GradAccum, c.DType, c.engineConfig(fromCheckpoint))
}

// newEngine builds the engine of the run on be: the model and the update
// mode's state, all allocated, the weights not yet set.
func newEngine(be backend.Backend, mc gpt2.Config, c Config, fromCheckpoint bool) (*engine.Engine, error) {
	return engine.New(be, mc, c.Batch, c.SeqLen, c.GradAccum, c.DType, c.engineConfig(fromCheckpoint))
}

// initialWeights are the weights a fresh run starts from: the checkpoint's
// of --model, or a seeded initialisation of a preset. Pretrained weights
// holding a NaN or an infinity are refused, naming the tensor, rather than
// trained into a run whose every loss is NaN.
func initialWeights(mc gpt2.Config, c Config, fromCheckpoint bool) ([]float32, error) {
	if !fromCheckpoint {
		return gpt2.Init(mc, c.Seed), nil
	}
	_, vals, err := gpt2.LoadHF(c.Model)
	if err != nil {
		return nil, flagErr("model", "%v", err)
	}
	if d := checkpoint.NonFinite(vals, mc.Layout()); d != "" {
		return nil, flagErr("model", "%s: %s; refusing weights that are not finite", filepath.Join(c.Model, "model.safetensors"), d)
	}
	return vals, nil
}

// lspCap is one matrix whose projector size or density lsp caps below the
// requested --d or --r.
type lspCap struct {
	matrix string
	m, n   int // the matrix's shape
	d, r   int // what the projectors get
}

// lspCaps lists the matrices of mc whose d or r are capped.
func lspCaps(mc gpt2.Config, d, r int) []lspCap {
	var caps []lspCap
	for k := gpt2.Matrix(0); k < gpt2.NumMatrices; k++ {
		m, n := mc.MatrixShape(k)
		if cd := lsp.CapD(d, m, n); cd < d || lsp.CapR(r, cd) < r {
			caps = append(caps, lspCap{matrix: k.String(), m: m, n: n, d: cd, r: lsp.CapR(r, cd)})
		}
	}
	return caps
}

// describeModel is the log line's view of the architecture.
func describeModel(mc gpt2.Config) []any {
	return []any{"params", mc.NumParams(), "layers", mc.L, "width", mc.C, "heads", mc.NH, "vocab", mc.V}
}

// exportModel writes the weights vals of mc as a Hugging Face directory,
// as a whole: into a temp directory that replaces dir only when complete,
// so that a crash mid-export never leaves a half-written dir that
// transformers would load, and an earlier export stays until then.
func exportModel(dir string, mc gpt2.Config, vals []float32) error {
	return atomicfile.WriteDir(dir, 0o755, func(tmp string) error {
		return gpt2.ExportHF(tmp, mc, vals)
	})
}
