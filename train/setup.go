// The run's set-up: the steps that take a Config to a loop ready to
// start, in the order setup runs them, each failing with an error that
// names the flag at fault. The steps that belong to another job are in
// that job's file (checkOut: outputs.go; checkMemory and limitGarbage:
// memory.go; the device communicator: dataparallel.go; logLSPCaps:
// projectors.go; resume: checkpoints.go; openMetrics: report.go).
//
// The run meets the model only through model.Spec and train/catalog,
// never a family's own types, so a new family changes nothing here.
//
// Limits: nothing is written to --out before the memory plan is checked
// and the engine is built.

package train

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/chattmpl"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/quant"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// setup prepares everything the loop needs, in steps that each fail with
// an error naming the flag at fault. Nothing is written to --out before
// the memory plan is checked and the engine is built.
func (r *run) setup() error {
	for _, step := range []func() error{
		r.checkOut,
		r.resolveModel,
		r.readAdapter,
		r.loadData,
		r.checkMemory,
		r.openEngine,
		r.limitGarbage,
		r.logLSPCaps,
		r.buildLoader,
		r.resumeOrInit,
		r.openMetrics,
		r.planEval,
	} {
		if err := step(); err != nil {
			return err
		}
	}
	if r.opts.Ready != nil {
		return r.opts.Ready(r.eng)
	}
	return nil
}

// resolveModel finds the architecture of --model and its tokenizer, and
// checks that they fit --seq-len and each other.
func (r *run) resolveModel() error {
	var err error
	if r.mc, r.src, err = ResolveModel(r.cfg.Model); err != nil {
		return err
	}
	r.fromCheckpoint = r.src != ""
	if r.cfg.SeqLen > r.mc.MaxSeqLen() {
		return flagErr("seq-len", "%d is longer than the model context %s=%d", r.cfg.SeqLen, catalog.ContextName(r.mc), r.mc.MaxSeqLen())
	}
	if r.tok, err = catalog.Tokenizer(r.mc, r.src, r.cfg.Tokenizer); err != nil {
		if r.cfg.Tokenizer != "" {
			return flagErr("tokenizer", "%v", err)
		}
		return flagErr("model", "%v", err)
	}
	return nil
}

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

// loadData reads and tokenizes --data and splits off the eval set, or
// reads --eval-data as the eval set.
func (r *run) loadData() error {
	cfg := r.cfg
	var err error
	opt := data.Options{SeqLen: cfg.SeqLen, Truncate: cfg.Truncate, EvalFraction: cfg.EvalFraction, Seed: cfg.Seed}
	if opt.Chat, err = ChatTemplate(r.tok, cfg.ChatTemplate); err != nil {
		if cfg.ChatTemplate != "" {
			return flagErr("chat-template", "%s", strings.TrimPrefix(err.Error(), "chat template: "))
		}
		// The checkpoint's template matters to conversations only.
		opt.ChatErr = err
	}
	r.ds, err = data.Load(cfg.Data, r.tok, opt)
	if err != nil {
		// The data package's errors start with its name, which --data
		// says already.
		return flagErr("data", "%s%s", strings.TrimPrefix(err.Error(), "data: "), r.lengthHint(opt))
	}
	r.log.Info("data", "source", r.ds.Source, "train", len(r.ds.Train), "eval", len(r.ds.Eval),
		"dropped_too_long", r.ds.Dropped, "truncated", r.ds.Truncated)
	if r.ds.Rendering != "" {
		r.log.Info("conversations rendered", "with", r.ds.Rendering)
	}
	if cfg.EvalData != "" {
		ev, err := data.LoadEval(cfg.EvalData, r.tok, opt)
		if err != nil {
			return flagErr("eval-data", "%s", strings.TrimPrefix(err.Error(), "data: "))
		}
		r.ds.Eval, r.ds.EvalRecords, r.ds.EvalPrompts = ev.Eval, ev.EvalRecords, ev.EvalPrompts
		r.log.Info("eval data", "source", ev.Source, "eval", len(ev.Eval),
			"dropped_too_long", ev.Dropped, "truncated", ev.Truncated)
		if ev.Rendering != "" && ev.Rendering != r.ds.Rendering {
			r.log.Info("eval conversations rendered", "with", ev.Rendering)
		}
	}
	return r.checkDataFit()
}

// lengthHint says what would make the examples of --data fit after a
// load with opt failed: when loading them whole succeeds, the failure was
// their length, and the hint names the --seq-len that keeps 90% of them,
// as the drop warning does (fitAdvice). It is "" when the failure was
// something else.
func (r *run) lengthHint(opt data.Options) string {
	opt.SeqLen, opt.Truncate = math.MaxInt32, false
	ds, err := data.Load(r.cfg.Data, r.tok, opt)
	if err != nil || len(ds.Lengths) == 0 {
		return ""
	}
	return fmt.Sprintf("; the shortest example has %d tokens; %s", slices.Min(ds.Lengths), r.fitAdvice(ds.Lengths))
}

// openEngine opens the backend (unless Options gives one) and builds the
// engine on it.
func (r *run) openEngine() error {
	cfg := r.cfg
	var err error
	r.be = r.opts.Backend
	if r.be == nil {
		if r.be, err = device.Open(device.Config{Kind: cfg.Device, MemBudget: cfg.DeviceMem, Threads: cfg.Threads,
			Seed: cfg.Seed, LinkBandwidth: cfg.LinkBandwidth}); err != nil {
			return flagErr("device", "%v", err)
		}
	}
	r.s = r.be.DefaultStream()
	if err := r.openDeviceComm(); err != nil {
		return err
	}
	if r.eng, err = newEngine(r.be, r.mc, cfg, r.fromCheckpoint, r.world.comm, r.world.devComm); err != nil {
		return err
	}
	r.model = eval.Model{Model: r.eng.Model, Spec: r.mc, B: cfg.Batch, T: cfg.SeqLen}
	if b := r.eng.Base(); b != nil {
		idx, err := model.NewIndex(r.mc)
		if err != nil {
			return err
		}
		r.log.Info("quantized base", "base_dtype", b.Format, "matrices", len(idx.MatParam)*len(idx.Mats),
			"MiB", fmt.Sprintf("%.1f", float64(quant.Bytes(idx, b.Format, cfg.DType))/(1<<20)),
			"in_dtype_MiB", fmt.Sprintf("%.1f", float64(int64(idx.MatrixElems())*int64(cfg.DType.Size()))/(1<<20)))
	}
	return nil
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

// EngineConfig is the engine configuration a run of c trains with, for
// the planner to trace the same step graph (lsp-train plan).
func EngineConfig(c Config) engine.Config {
	_, src, err := catalog.Resolve(c.Model)
	return c.engineConfig(err == nil && src != "")
}

// buildLoader builds the training data's loader and the learning-rate
// schedule, turning --epochs into steps, or taking DefaultSteps when
// neither --steps nor --epochs is set (Validate refuses both).
func (r *run) buildLoader() error {
	cfg := r.cfg
	var err error
	if r.loader, err = data.NewLoader(r.ds.Train, cfg.Batch, cfg.SeqLen, cfg.Seed); err != nil {
		return flagErr("data", "%v", err)
	}
	r.loader.SetPack(cfg.Pack)
	total := cfg.Steps
	switch {
	case total > 0:
	case cfg.Epochs > 0:
		perEpoch := max(1, r.loader.EpochRows()/(cfg.Batch*cfg.GradAccum))
		total = max(1, int(math.Ceil(cfg.Epochs*float64(perEpoch))))
		r.log.Info("--epochs in steps", "epochs", cfg.Epochs, "steps_per_epoch", perEpoch, "steps", total)
	default:
		total = DefaultSteps
	}
	r.cfg.Steps = total
	r.sched = optim.Schedule{LR: cfg.LR, MinLR: cfg.MinLR, Warmup: cfg.Warmup, Total: total}
	return nil
}

// resumeOrInit prepares --out, then restores the checkpoint there
// (--resume) or sets the initial weights and optimizer state.
func (r *run) resumeOrInit() error {
	if err := r.prepareOut(); err != nil {
		return err
	}
	defer releaseHost()
	if r.cfg.Resume {
		return r.resume()
	}
	if !r.fromCheckpoint { // a preset's loss starts at ln(vocab) and its samples are noise: say why before anyone wonders
		r.log.Info("random initialisation (a preset, not pretrained weights)", "model", r.cfg.Model, "seed", r.cfg.Seed, "pretrained", "give --model a Hugging Face directory (config.json, model.safetensors, tokenizer.json)")
	}
	if err := r.loadWeights(); err != nil {
		return err
	}
	if r.adapter != nil {
		if err := r.eng.SetAdapters(r.adapter); err != nil {
			return flagErr("adapter", "%v", err)
		}
		r.adapter = nil // on the device now
	}
	return r.eng.Init()
}

// setInitialWeights hands the weights a fresh run starts from to store
// (the model's parameters in their layout: run.storeParams): the
// checkpoint's of --model, streamed from the files without a host copy of
// the whole model, or a seeded initialisation of a preset, parameter by
// parameter (the host holds one, model.InitBytes). Pretrained weights
// holding a NaN or an infinity are refused by the loader, naming the
// file, the tensor and the element, rather than trained into a run whose
// every loss is NaN; nothing reaches store then.
func setInitialWeights(store catalog.Sink, mc model.Spec, c Config, fromCheckpoint bool) error {
	if !fromCheckpoint {
		return mc.InitEach(c.Seed, func(p model.Param, v []float32) error {
			if err := store(p.Offset, v); err != nil {
				return fmt.Errorf("initial weights: %s: %w", p.Name, err)
			}
			return nil
		})
	}
	if err := catalog.LoadEach(mc, c.Model, store); err != nil {
		return flagErr("model", "%v", err)
	}
	return nil
}

// loadWeights sets the initial weights (setInitialWeights) in the phase
// of their name, and checks that every block matrix of a quantized base
// arrived whole.
func (r *run) loadWeights() error {
	defer phase(loadName(r.fromCheckpoint))()
	if err := setInitialWeights(r.storeParams, r.mc, r.cfg, r.fromCheckpoint); err != nil {
		return err
	}
	return r.eng.Loaded()
}

// storeParams writes elements off.. of the model's parameters in their
// layout (Engine.Store: a quantized base takes its matrices whole).
func (r *run) storeParams(off int, vals []float32) error { return r.eng.Store(r.s, off, vals) }

// fetchParams reads elements off.. of the model's parameters in their
// layout (Engine.Fetch: a quantized base's matrices dequantized), for
// checkpoints and exports.
func (r *run) fetchParams(off int, dst []float32) error { return r.eng.Fetch(r.s, off, dst) }

// ChatTemplate is the chat template conversations are rendered with for
// tok: the file --chat-template names when not "", else the chat_template
// of the tokenizer_config.json beside tok's files; nil when there is
// none (GPT-2, the builtin tokenizers), and conversations take the fixed
// format. The special tokens are that tokenizer_config.json's.
func ChatTemplate(tok tokenizer.Tokenizer, file string) (*chattmpl.Template, error) {
	return chattmpl.Load(tokenizer.Dir(tok), file)
}
