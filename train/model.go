// The run's contact with the model (through model.Spec and train/catalog,
// never a family's own types) and with the engine's constructors:
// resolving --model, the memory plan, building the engine, the initial
// weights, lsp's per-matrix caps and the export. They are kept in this
// one file so that an engine that takes a model description of another
// kind changes the run here only.

package train

import (
	"unsafe"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// Memory is the predicted memory and link traffic of a run.
type Memory = engine.Memory

// ResolveModel returns the architecture of --model, a preset name of any
// family, a Hugging Face checkpoint directory or a llama2.c model file,
// and that directory or file ("" for a preset).
func ResolveModel(name string) (model.Spec, string, error) {
	spec, src, err := catalog.Resolve(name)
	if err != nil {
		return nil, "", flagErr("model", "%v", err)
	}
	return spec, src, nil
}

// MemoryOf predicts the device and host memory of training cfg with the
// model mc, in cfg's mode, before any data is read: the plan of a run
// adds the tokenized data's bytes (run.checkMemory).
func MemoryOf(mc model.Spec, c Config) (Memory, error) {
	return MemoryOfRanks(mc, c, 1)
}

// MemoryOfRanks is MemoryOf for one rank of ranks that train
// together (mpirun -np ranks): what each rank's process holds.
func MemoryOfRanks(mc model.Spec, c Config, ranks int) (Memory, error) {
	_, src, err := catalog.Resolve(c.Model)
	return memoryOf(mc, c, src, err == nil && src != "", nil, ranks)
}

// EngineConfig is the engine configuration a run of c trains with, for
// the planner to trace the same step graph (lsp-train plan).
func EngineConfig(c Config) engine.Config {
	_, src, err := catalog.Resolve(c.Model)
	return c.engineConfig(err == nil && src != "")
}

// goHeapHeadroom is the Go heap garbage a run lets build up between
// collections once set up (boundGarbage), with the compute kernels'
// pooled scratch: a host part of every plan.
const goHeapHeadroom = 64 << 20

// memoryOf is MemoryOf with the kind of --model known (src, the
// checkpoint's path; fromCheckpoint picks the default of --dense-params)
// and the data ds when loaded (nil: not counted). To the engine's plan it
// adds the run's own host memory, by the size formulas of the
// allocations: the device's when the backend keeps it in host memory,
// the staging buffer, the data, the heap's headroom, and the transients
// of the initial weights, a resume and the export (engine.Memory says how
// the transients add up). ranks > 1 plans one rank of a data-parallel
// run.
func memoryOf(mc model.Spec, c Config, src string, fromCheckpoint bool, ds *data.Dataset, ranks int) (Memory, error) {
	ec := c.engineConfig(fromCheckpoint)
	if ranks > 1 {
		ec.Comm = comm.Planned{Ranks: ranks}
		if c.Collectives != CollectivesHost && c.Device.Base() == device.CUDA {
			ec.DeviceComm = engine.PlannedDevice{Ranks: ranks}
		}
	}
	p, err := engine.MemoryOf(mc, c.Batch, c.SeqLen, c.GradAccum, c.DType, ec)
	if err != nil {
		return p, err
	}
	p.DeviceOnHost = c.Device.Base() == device.CPU
	p.Host = append(p.Host, engine.Part{Name: "transfer staging", Bytes: backend.StagingBytes},
		engine.Part{Name: "Go heap headroom and kernel scratch", Bytes: goHeapHeadroom})
	if ds != nil {
		p.Host = append(p.Host, engine.Part{Name: "data", Bytes: datasetBytes(ds)})
	}
	N := int64(mc.NumParams())
	switch {
	case c.Resume:
		// checkpoint.Load and Restore decode one tensor at a time and
		// drop it once checked or restored (the collector's target is
		// bounded by then); the longest is the parameters, as no state
		// array is longer.
		p.Transient = append(p.Transient, engine.Part{Name: "checkpoint restore", Bytes: 4 * N})
	case !fromCheckpoint:
		p.Transient = append(p.Transient, engine.Part{Name: "initial weights", Bytes: 4 * N}) // mc.Init's values
	case catalog.LoadHoldsCopy(mc, src):
		p.Transient = append(p.Transient, engine.Part{Name: "weights load", Bytes: 4 * N})
	}
	// The export downloads every parameter as fp32 (run.finish); the
	// writer's own buffers are chunks.
	p.Transient = append(p.Transient, engine.Part{Name: "export", Bytes: 4 * N})
	return p, nil
}

// datasetBytes is the host memory of the loaded data: every example's
// tokens and header, and the eval records' text.
func datasetBytes(ds *data.Dataset) int64 {
	const exampleHeader = int64(unsafe.Sizeof(data.Example{}))
	var b int64
	for _, set := range [][]data.Example{ds.Train, ds.Eval} {
		for _, ex := range set {
			b += exampleHeader + 4*int64(len(ex.Tokens))
		}
	}
	for _, r := range ds.EvalRecords {
		b += int64(unsafe.Sizeof(r)) + int64(len(r.Prompt)+len(r.Response))
	}
	// The loader's order over the training examples.
	return b + 8*int64(len(ds.Train))
}

// newEngine builds the engine of the run on be: the model and the update
// mode's state, all allocated, the weights not yet set; cm (nil alone)
// makes it one rank of a data-parallel run.
func newEngine(be backend.Backend, mc model.Spec, c Config, fromCheckpoint bool, cm comm.Communicator, dc device.Comm) (*engine.Engine, error) {
	ec := c.engineConfig(fromCheckpoint)
	ec.Comm = cm
	if dc != nil {
		ec.DeviceComm = dc
	}
	return engine.New(be, mc, c.Batch, c.SeqLen, c.GradAccum, c.DType, ec)
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
	if err := catalog.LoadInto(mc, c.Model, be, st, dst); err != nil {
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
// dir, as a whole (catalog.Export), with the files of tok, the tokenizer
// the run trained with (those of src, the directory --model named, when
// it came from there).
func exportModel(dir string, mc model.Spec, vals []float32, src string, tok tokenizer.Tokenizer) error {
	return catalog.Export(mc, dir, vals, src, tok)
}
