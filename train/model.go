// The run's contact with the model (through model.Spec and train/models,
// never a family's own types) and with the engine's constructors:
// resolving --model, the memory plan, building the engine, the initial
// weights, lsp's per-matrix caps and the export. They are kept in this
// one file so that an engine that takes a model description of another
// kind changes the run here only.

package train

import (
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/models"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// Plan is the predicted memory and link traffic of a run.
type Plan = engine.Plan

// ResolveModel returns the architecture of --model, a preset name of any
// family, a Hugging Face checkpoint directory or a llama2.c model file,
// and that directory or file ("" for a preset).
func ResolveModel(name string) (model.Spec, string, error) {
	spec, src, err := models.Resolve(name)
	if err != nil {
		return nil, "", flagErr("model", "%v", err)
	}
	return spec, src, nil
}

// PlanMemory predicts the device and host memory of training cfg with the
// model mc, in cfg's mode.
func PlanMemory(mc model.Spec, c Config) (Plan, error) {
	_, src, err := models.Resolve(c.Model)
	return planMemory(mc, c, err == nil && src != "")
}

// planMemory is PlanMemory with the kind of --model known; fromCheckpoint
// picks the default of --dense-params.
func planMemory(mc model.Spec, c Config, fromCheckpoint bool) (Plan, error) {
	return engine.PlanMemory(mc, c.Batch, c.SeqLen, c.GradAccum, c.DType, c.engineConfig(fromCheckpoint))
}

// newEngine builds the engine of the run on be: the model and the update
// mode's state, all allocated, the weights not yet set.
func newEngine(be backend.Backend, mc model.Spec, c Config, fromCheckpoint bool) (*engine.Engine, error) {
	return engine.New(be, mc, c.Batch, c.SeqLen, c.GradAccum, c.DType, c.engineConfig(fromCheckpoint))
}

// setInitialWeights writes the weights a fresh run starts from into dst
// (the model's parameters, on stream st of be): the checkpoint's of
// --model, loaded straight into dst without a host copy of the whole
// model, or a seeded initialisation of a preset. Pretrained weights
// holding a NaN or an infinity are refused by the loader, naming the
// file, the tensor and the element, rather than trained into a run whose
// every loss is NaN; nothing is written to dst then.
func setInitialWeights(be backend.Backend, st backend.Stream, dst backend.Tensor, mc model.Spec, c Config, fromCheckpoint bool) error {
	if !fromCheckpoint {
		return backend.Upload(be, st, dst, mc.Init(c.Seed))
	}
	if err := models.LoadInto(mc, c.Model, be, st, dst); err != nil {
		return flagErr("model", "%v", err)
	}
	return nil
}

// lspCap is one matrix whose projector size or density lsp caps below the
// requested --d or --r.
type lspCap struct {
	matrix string
	m, n   int // the matrix's shape
	d, r   int // what the projectors get
}

// lspCaps lists the matrices of mc whose d or r are capped.
func lspCaps(mc model.Spec, d, r int) []lspCap {
	var caps []lspCap
	for _, mt := range mc.Matrices() {
		if cd := lsp.CapD(d, mt.M, mt.N); cd < d || lsp.CapR(r, cd) < r {
			caps = append(caps, lspCap{matrix: mt.Name, m: mt.M, n: mt.N, d: cd, r: lsp.CapR(r, cd)})
		}
	}
	return caps
}

// exportModel writes the weights vals of mc as a Hugging Face directory
// dir, as a whole (models.Export), with the files of tok, the tokenizer
// the run trained with (those of src, the directory --model named, when
// it came from there).
func exportModel(dir string, mc model.Spec, vals []float32, src string, tok tokenizer.Tokenizer) error {
	return models.Export(mc, dir, vals, src, tok)
}
