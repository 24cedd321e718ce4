// Package engine runs training steps in the four update modes of
// docs/DESIGN.md, "The update modes" (native, zero, lsp, lora) on any Backend, as a
// graph of ops (graph.go) run by the sequential or the pipelined interpreter.
//
//	native: weights, grads and AdamW on the device (train/optim).
//	zero:   grads of each layer go device-to-host as soon as the layer's
//	        backward is done; CPU Adam on fp32 master weights and moments
//	        on the host; the new weights come back host-to-device.
//	        With --grad-residency ring (ring.go) the device holds a few
//	        groups' gradients at a time, each micro-batch's going down.
//	lsp:    the block matrices go through learned sparse projectors
//	        (train/lsp, scheduled by lsp.go): S = P^T G Q (d x d) down,
//	        subspace Adam on the host, Delta up, W += P Delta Q^T applied
//	        on the device.
//	lora:   the block matrices frozen, PEFT's low-rank adapters on the
//	        targeted ones (train/lora) trained by the device AdamW.
//
// The engine knows no model family: a model describes its layout and
// offers its passes through train/model's Arch and Model.
//
// A step's graph: zero grads; per micro-batch upload, forward, loss and
// backward layer by layer; then, per layer from the last, the offload
// chain d2h -> host Adam -> h2d -> apply. Every update is applied before
// Step returns, so checkpoints, eval and Ctrl-C between steps always see a
// drained pipeline.
//
// A step whose loss is not finite is skipped whole: after the last
// micro-batch's loss, NonFiniteFlag reduces the step's per-token losses
// into a flag on the device, before any update. Every device update op
// (AdamW, SparseApply) reads it and writes nothing when it is set; in
// zero and lsp mode a 4-byte copy of it goes down on the d2h stream
// ahead of the first gradient, and the host
// Adam nodes, which wait for their gradient's copy anyway, read it there
// and neither update nor send anything up. The launcher never waits for
// the flag: the only host read of it outside the host nodes is with the
// losses after the step's drain, which takes the skipped step back from
// the step counts (Skipped). A non-finite gradient with a finite loss is
// not caught this way: it shows only layer by layer, when deeper layers
// are already updated (GradNorm tells the caller).
//
// Limits: --clip-mode global-prev only in native mode (the host Adam clips
// per tensor).
package engine

import (
	"errors"
	"fmt"
	"math"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/comm"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/faults"
	"github.com/lsp-offload/lsp-offload/train/galore"
	"github.com/lsp-offload/lsp-offload/train/hazard"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/quant"
)

// Mode is the update mode (--mode).
type Mode string

// Modes.
const (
	Native Mode = "native"
	Zero   Mode = "zero"
	LSP    Mode = "lsp"
	LoRA   Mode = "lora"
	// Galore: GaLore's projected AdamW on the device (train/galore).
	Galore Mode = "galore"
)

// Modes lists every mode, in the order tables show them.
var Modes = []Mode{Native, Zero, LSP, LoRA, Galore}

// ParseMode reads a --mode value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Native, Zero, LSP, LoRA, Galore:
		return m, nil
	}
	return "", fmt.Errorf("unknown mode %q (want native, zero, lsp, lora or galore)", s)
}

// FrozenMatrices reports whether the mode gives the block matrices no
// dense gradient (lsp compresses it; lora freezes them; galore forms it
// one matrix at a time in its own hook), so that the other parameters
// follow --dense-params.
func (m Mode) FrozenMatrices() bool { return m == LSP || m == LoRA || m == Galore }

// DenseParams says what lsp and lora modes do with the parameters that are not
// block matrices (embeddings, norms, biases): --dense-params.
type DenseParams string

// Dense parameter treatments.
const (
	DenseFrozen DenseParams = "frozen" // not updated
	DenseDevice DenseParams = "device" // AdamW on the device, as native
	DenseHost   DenseParams = "host"   // offloaded to the host, as zero
)

// ParseDenseParams reads a --dense-params value.
func ParseDenseParams(s string) (DenseParams, error) {
	switch d := DenseParams(s); d {
	case DenseFrozen, DenseDevice, DenseHost:
		return d, nil
	}
	return "", fmt.Errorf("unknown dense-params %q (want frozen, device or host)", s)
}

// Config configures an engine.
type Config struct {
	Mode        Mode
	DenseParams DenseParams // lsp and lora only
	Hyper       optim.Hyper
	Pipelined   bool
	LSP         lsp.Config
	LoRA        lora.Config
	Galore      galore.Config
	Seed        uint64
	HostThreads int // host Adam workers (0: one per core)
	// GradDType stores the parameter gradients on the device (and on the
	// host in zero mode): fp32 (the zero value) or bf16. LSP's S is fp32.
	GradDType backend.DType
	// Recompute drops activations in the forward and recomputes them in
	// the backward (--recompute): less device memory, the same results.
	Recompute model.Recompute
	// GradResidency keeps zero mode's gradients whole on the device or in
	// a ring of per-group slots (ring.go), and with ring lsp's projectors
	// and, over several micro-batches, its S in slots too (lspInFlight);
	// auto and "" are whole here (the caller resolves auto against its
	// device budget).
	GradResidency GradResidency
	// Comm is the group of ranks that train together (dp.go); nil or a
	// one-rank communicator trains alone.
	Comm comm.Communicator
	// DeviceComm, with several ranks, sums on the device what the device
	// reads back (dp.go): lsp's S before its copy down, and the gradients
	// a device AdamW updates from (native; lsp with --dense-params
	// device), so they skip the round trip through pinned memory. It is
	// the same ranks as Comm (cuda.NCCL, joined through Comm); nil: those
	// sums go through Comm on the host. The flag, the targets, the loss
	// and zero mode's sharded host optimizer use Comm either way.
	DeviceComm DeviceComm
	// Packed rows (--pack): every micro-batch carries Positions
	// (data.Batch), staged and uploaded with its inputs and targets into
	// the model's positions buffer (model.Options.Packed).
	Packed bool
	// slots (tests): lsp's device slots instead of lspSlots, so that a
	// model of two blocks reuses them.
	slots int
	// replicateHost (tests): zero mode with several ranks all-reduces
	// the gradients and runs the whole host Adam on every rank, the path
	// before ZeRO's sharding (shard.go), to compare the two.
	replicateHost bool
}

// Validate checks the configuration, naming the flag at fault.
func (c Config) Validate() error {
	var errs []error
	if _, err := ParseMode(string(c.Mode)); err != nil {
		errs = append(errs, fmt.Errorf("--mode: %w", err))
	}
	if c.Mode.FrozenMatrices() {
		if _, err := ParseDenseParams(string(c.DenseParams)); err != nil {
			errs = append(errs, fmt.Errorf("--dense-params: %w", err))
		}
	}
	if c.Mode == LSP {
		if err := c.LSP.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Mode == LoRA {
		if err := c.LoRA.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Mode == Galore {
		if err := c.Galore.Validate(); err != nil {
			errs = append(errs, err)
		}
		if c.DenseParams == DenseHost {
			errs = append(errs, fmt.Errorf("--dense-params host: not with --mode galore, whose optimizer runs on the device (use device or frozen)"))
		}
		if c.Comm != nil && c.Comm.Size() > 1 {
			errs = append(errs, fmt.Errorf("--mode galore: one process only (its projected gradients are not summed over ranks), not %d", c.Comm.Size()))
		}
	}
	if c.GradDType != backend.F32 && c.GradDType != backend.BF16 {
		errs = append(errs, fmt.Errorf("--grad-dtype: %v is not fp32 or bf16", c.GradDType))
	}
	if err := c.checkResidency(); err != nil {
		errs = append(errs, err)
	}
	if c.Recompute > model.RecomputeLayer {
		errs = append(errs, fmt.Errorf("--recompute: %v is not none, attn or layer", c.Recompute))
	}
	if c.Mode != Native && c.Hyper.Clip == optim.ClipGlobalPrev {
		errs = append(errs, fmt.Errorf("--clip-mode: global-prev is supported with --mode native only; use matrix or none with --mode %s", c.Mode))
	}
	if c.Comm != nil && c.Comm.Size() > 1 {
		errs = append(errs, c.checkComm())
	}
	if c.DeviceComm != nil {
		if c.Comm == nil || c.Comm.Size() != c.DeviceComm.Size() || c.Comm.Rank() != c.DeviceComm.Rank() {
			errs = append(errs, fmt.Errorf("engine: the device communicator (rank %d of %d) is not the ranks of the host communicator", c.DeviceComm.Rank(), c.DeviceComm.Size()))
		}
	}
	return errors.Join(errs...)
}

// hostOptimizer reports whether an optimizer runs on the host: zero's,
// lsp's subspace Adam, or the dense parameters' with --dense-params host.
func (c Config) hostOptimizer() bool {
	return c.Mode == Zero || c.Mode == LSP || (c.Mode == LoRA && c.DenseParams == DenseHost)
}

// Engine trains one model in one mode.
type Engine struct {
	cfg     Config
	be      backend.Backend
	st      Streams
	interp  Interpreter
	pip     *Pipelined // interp when pipelined: its events are the engine's
	Model   model.Model
	idx     *model.Index // the model's layout by block
	b, t    int          // micro-batch shape B x T
	dt      backend.DType
	accum   int // micro-batches per step
	step    int // optimizer steps taken
	workers *host.Workers

	stage backend.HostBuffer // inputs and targets of every micro-batch (I32)

	// lossFlag is lossAcc, the per-position losses of every micro-batch,
	// followed by skipFlag, the step's non-finite flag (F32 [1]): one
	// allocation, so that the losses and the flag come back in one copy.
	lossFlag, lossAcc, skipFlag backend.Tensor

	losses   []float32          // lossFlag read back (through the backend's staging buffer)
	flagHost backend.HostBuffer // the flag's copy for the host Adam (zero, lsp)
	skipped  bool               // the latest Step was skipped
	checked  int                // the step count of the latest projector check (-1: none)

	opt   *optim.AdamW // native: every parameter; lora: the adapters (and the dense parameters with --dense-params device)
	off   *offload     // zero, and lsp and lora with --dense-params host
	ring  *gradRing    // zero with --grad-residency ring
	dense *optim.AdamW // lsp with --dense-params device: the dense parameters
	lsp   *lsp.State   // lsp
	lora  *lora.State  // lora
	// galore is galore mode's projectors and moments (the model's adapters).
	galore *galore.Device
	base   *quant.Base // lora with --base-dtype: the quantized block matrices
	// loraSet: the adapters were uploaded (SetAdapters), so Init does not
	// draw them.
	loraSet bool
	dp      *dp      // several ranks (dp.go); nil alone
	dpg     *dpGrads // native mode with several ranks: the gradients' all-reduce

	// editGraph, when set, rewrites each step's graph (tests remove edges).
	editGraph func(*Graph) *Graph

	// sizeOnly: built for TraceStep on a backend without memory; no Go
	// copy of host optimizer state and no worker pool is made.
	sizeOnly bool
}

// New builds the model of arch for micro-batches of B x T (accum per step)
// and the state of cfg's mode. Parameters start at zero: upload them into
// Model.Buffers().Params, then call Init.
func New(be backend.Backend, arch model.Arch, B, T, accum int, dt backend.DType, cfg Config) (*Engine, error) {
	return newEngine(be, arch, B, T, accum, dt, cfg, false)
}

func newEngine(be backend.Backend, arch model.Arch, B, T, accum int, dt backend.DType, cfg Config, sizeOnly bool) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.LoRA = cfg.LoRA.WithDefaultTargets(arch)
	if accum < 1 {
		return nil, fmt.Errorf("engine: --grad-accum %d must be at least 1", accum)
	}
	idx, err := model.NewIndex(arch)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := &Engine{cfg: cfg, be: be, idx: idx, b: B, t: T, dt: dt, accum: accum, checked: -1, sizeOnly: sizeOnly, dp: newDP(cfg.Comm, cfg.DeviceComm)}
	if e.st, err = NewStreams(be); err != nil {
		return nil, err
	}
	if e.dp.onDevice() {
		if e.st.Comm, err = be.NewStream("comm"); err != nil {
			_ = e.st.Destroy(be) // the creation error is the one to report
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	if cfg.Pipelined {
		e.pip = NewPipelined(be, e.st)
		e.interp = e.pip
	} else {
		e.interp = Sequential{Backend: be, Streams: e.st}
	}
	ok := false
	defer func() {
		if !ok {
			_ = e.Free() // New's error is the one to report
		}
	}()
	opts := model.Options{GradDType: cfg.GradDType, Recompute: cfg.Recompute, Packed: cfg.Packed}
	if cfg.ring() {
		opts.GradSlots = ringSlots
	}
	switch cfg.Mode {
	case LSP:
		e.lsp = new(lsp.State)
		opts.MatrixGrads = e.lsp
		opts.FrozenDense = cfg.DenseParams == DenseFrozen
	case LoRA:
		if e.lora, err = lora.New(be, idx, cfg.LoRA, B*T, dt, cfg.GradDType); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		opts.Adapters = e.lora
		opts.FrozenDense = cfg.DenseParams == DenseFrozen
		if f := cfg.LoRA.Base; f != 0 {
			if e.base, err = quant.NewBase(be, idx, f, dt); err != nil {
				return nil, fmt.Errorf("engine: %w", err)
			}
			opts.Base = e.base
		}
	case Galore:
		if e.galore, err = galore.New(be, idx, cfg.Galore, cfg.Hyper, cfg.Seed, B*T, dt); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		opts.Adapters = e.galore
		opts.FrozenDense = cfg.DenseParams == DenseFrozen
	}
	if e.Model, err = arch.NewModel(be, B, T, dt, opts); err != nil {
		return nil, err
	}
	if e.base != nil {
		offs, _ := opts.ParamOffsets(idx.Layout, func(i int) bool { return idx.IsMat[i] })
		e.base.Bind(e.Model.Buffers().Params, offs)
	}
	BT := B * T
	if e.stage, err = be.AllocHost("batch staging", accum*opts.BatchRows()*BT*4); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if e.lossFlag, err = be.Alloc("step losses and non-finite flag", accum*BT+1, backend.F32); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e.lossAcc, e.skipFlag = e.lossFlag.Slice(0, accum*BT), e.lossFlag.Slice(accum*BT, 1)
	if e.galore != nil {
		params := e.Model.Buffers().Params
		e.galore.Bind(func(l, k int) backend.Tensor { return e.Model.ParamView(params, idx.MatParam[l][k]) }, e.skipFlag)
	}
	e.losses = make([]float32, accum*BT+1)
	if cfg.hostOptimizer() {
		if !sizeOnly { // a traced graph's host nodes never run: no pool
			if e.workers, err = host.NewWorkers(host.WorkersOptions{N: cfg.HostThreads}); err != nil {
				return nil, fmt.Errorf("engine: %w", err)
			}
		}
	}
	if cfg.hostOptimizer() || e.dp != nil {
		if e.flagHost, err = be.AllocHost("non-finite flag", 4); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	switch cfg.Mode {
	case Native:
		// Without hooks every parameter has a gradient, and Grads is laid
		// out as Params: the whole gradient gives the global norm.
		if e.opt, err = optim.New(be, cfg.Hyper, e.denseTensors(), e.Model.Buffers().Grads); err != nil {
			return nil, err
		}
		if e.dp != nil {
			if e.dpg, err = newDPGrads(e, groupsAll(idx)); err != nil {
				return nil, err
			}
		}
	case Zero:
		if e.off, err = newOffload(e, groupsAll(idx)); err != nil {
			return nil, err
		}
		if cfg.ring() {
			if e.ring, err = newRing(e); err != nil {
				return nil, err
			}
		}
	case LSP:
		if err := e.initLSP(); err != nil {
			return nil, err
		}
		switch cfg.DenseParams {
		case DenseDevice:
			if e.dense, err = optim.New(be, cfg.Hyper, e.denseTensors(), backend.Tensor{}); err != nil {
				return nil, fmt.Errorf("engine: dense optimizer: %w", err)
			}
			if e.dp != nil {
				if e.dpg, err = newDPGrads(e, groupsDense(idx)); err != nil {
					return nil, err
				}
			}
		case DenseHost:
			if e.off, err = newOffload(e, groupsDense(idx)); err != nil {
				return nil, err
			}
		}
	case LoRA:
		// One device AdamW: the adapters, then with --dense-params
		// device the dense parameters.
		ts := e.lora.Tensors()
		switch cfg.DenseParams {
		case DenseDevice:
			ts = append(ts, e.denseTensors()...)
		case DenseHost:
			if e.off, err = newOffload(e, groupsDense(idx)); err != nil {
				return nil, err
			}
		}
		if e.opt, err = optim.New(be, cfg.Hyper, ts, backend.Tensor{}); err != nil {
			return nil, fmt.Errorf("engine: adapter optimizer: %w", err)
		}
		if e.dp != nil {
			if e.dpg, err = newDPGradsOf(e, loraGradGroups(e)); err != nil {
				return nil, err
			}
		}
	}
	if cfg.Mode == Galore && cfg.DenseParams == DenseDevice {
		// The matrices' updates are galore's own (in the backward); the
		// other parameters take the device AdamW, as native's.
		if e.opt, err = optim.New(be, cfg.Hyper, e.denseTensors(), backend.Tensor{}); err != nil {
			return nil, fmt.Errorf("engine: dense optimizer: %w", err)
		}
	}
	if err := e.dp.allocScratch(e); err != nil {
		return nil, err
	}
	ok = true
	return e, nil
}

// denseTensors lists the parameters that have a dense gradient (every one
// without matrix hooks), in layout order, for the device AdamW.
func (e *Engine) denseTensors() []optim.Tensor {
	params := e.Model.Buffers().Params
	var ts []optim.Tensor
	for i, p := range e.idx.Layout {
		if g, ok := e.Model.GradView(i); ok {
			ts = append(ts, optim.Tensor{Name: p.Name, Param: e.Model.ParamView(params, i), Grad: g, Decay: p.Decay})
		}
	}
	return ts
}

// Init reads the parameters the caller uploaded into the optimizer state
// (fp32 master copies); in lsp mode it draws the random projectors, and in
// lora mode the adapters, unless SetAdapters gave them.
func (e *Engine) Init() error {
	s := e.st.Compute
	if e.lora != nil && !e.loraSet {
		if err := e.lora.Draw(s, e.cfg.Seed); err != nil {
			return fmt.Errorf("engine: adapters: %w", err)
		}
	}
	if e.opt != nil {
		if err := e.opt.InitMaster(s); err != nil {
			return err
		}
	}
	if e.off != nil {
		if err := e.off.initMaster(); err != nil {
			return err
		}
	}
	if e.dense != nil {
		if err := e.dense.InitMaster(s); err != nil {
			return err
		}
	}
	if e.lsp != nil {
		if err := e.lsp.Draw(); err != nil {
			return err
		}
	}
	return e.be.Synchronize(s)
}

// Free releases the engine's state, its streams and events, and the
// model, after the work in flight has run. It releases everything even when
// that work failed, and returns that failure with any of its own.
func (e *Engine) Free() error {
	errs := []error{e.Drain()}
	if e.pip != nil {
		errs = append(errs, e.pip.Close())
	}
	errs = append(errs, e.st.Destroy(e.be))
	if e.opt != nil {
		e.opt.Free()
	}
	if e.lsp != nil {
		e.lsp.Free()
	}
	if e.base != nil {
		e.base.Free()
	}
	if e.lora != nil {
		e.lora.Free()
	}
	if e.galore != nil {
		e.galore.Free()
	}
	if e.dense != nil {
		e.dense.Free()
	}
	if e.off != nil {
		e.off.free()
	}
	e.ring.free()
	e.dpg.free(e.be)
	e.dp.free(e.be)
	if e.lossFlag.Buf != nil {
		e.be.Free(e.lossFlag)
	}
	if e.stage != nil {
		e.be.FreeHost(e.stage)
	}
	if e.flagHost != nil {
		e.be.FreeHost(e.flagHost)
	}
	if e.Model != nil {
		e.Model.Free()
	}
	if e.workers != nil {
		e.workers.Close()
	}
	return errors.Join(errs...)
}

// Fetch reads elements off..off+len(dst) of the model's parameters in
// their layout (hf.Fetch) on stream s: Params, or with a quantized base
// the other parameters from Params and the block matrices dequantized.
func (e *Engine) Fetch(s backend.Stream, off int, dst []float32) error {
	if e.base != nil {
		return e.base.Fetch(s, off, dst)
	}
	return e.be.Staging().DownloadInto(s, dst, e.Model.Buffers().Params.Slice(off, len(dst)))
}

// Store writes vals as elements off.. of the model's parameters in their
// layout on stream s: into Params, or with a quantized base the block
// matrices quantized as each is whole (quant.Base.Store; Loaded reports
// one left part-way).
func (e *Engine) Store(s backend.Stream, off int, vals []float32) error {
	if e.base != nil {
		return e.base.Store(s, off, vals)
	}
	return backend.Upload(e.be, s, e.Model.Buffers().Params.Slice(off, len(vals)), vals)
}

// Loaded reports a block matrix that Store has had only part of.
func (e *Engine) Loaded() error {
	if e.base != nil {
		return e.base.Loaded()
	}
	return nil
}

// Base is lora mode's quantized base (nil without --base-dtype).
func (e *Engine) Base() *quant.Base { return e.base }

// Adapters is lora mode's adapters (nil in the other modes).
func (e *Engine) Adapters() *lora.State { return e.lora }

// SetAdapters uploads lora mode's adapters before Init, which then keeps
// them instead of drawing new ones: an adapter loaded with --adapter.
func (e *Engine) SetAdapters(ad *lora.Adapter) error {
	if e.lora == nil {
		return fmt.Errorf("engine: adapters given to --mode %s", e.cfg.Mode)
	}
	if err := e.lora.Upload(e.st.Compute, ad); err != nil {
		return err
	}
	e.loraSet = true
	return nil
}

// DenseParams is the treatment of the non-matrix parameters in lsp and lora modes.
func (e *Engine) DenseParams() DenseParams { return e.cfg.DenseParams }

// SetStepCount restores the step count from a checkpoint.
func (e *Engine) SetStepCount(n int) {
	e.step, e.checked = n, -1
	if e.galore != nil {
		e.galore.SetSteps(n)
	}
	for _, o := range []*optim.AdamW{e.opt, e.dense} {
		if o != nil {
			o.SetStepCount(n)
		}
	}
}

// hostAccesser is the CPU backend's hazard declaration for host code.
type hostAccesser interface {
	HostAccess(name string, reads, writes []backend.Range)
}

// hostOrderer is a hazard-checking backend's view of the order between
// goroutines, which it cannot see: the pipelined schedule tells it where
// one goroutine hands work to another (hazard.Checker.Snapshot).
type hostOrderer interface {
	HostSnapshot() hazard.Clock
	HostJoin(hazard.Clock)
}

// hostAccess declares host reads and writes of pinned memory to a backend
// that checks hazards.
func (e *Engine) hostAccess(name string, reads, writes []backend.Range) {
	if h, ok := e.be.(hostAccesser); ok {
		h.HostAccess(name, reads, writes)
	}
}

// Step runs one optimizer step over the micro-batches (len == accum) at
// learning rate lr and returns the sum of the per-token losses (divide by
// the batches' NumTargets for the mean). Every update is applied when it
// returns. When the loss is not finite the step is skipped (see Skipped):
// the sum returned is NaN or infinite, and nothing was updated. With
// several ranks (Config.Comm) every rank calls Step with its own
// micro-batches; the loss is scaled by the targets of all of them, and the
// sum returned is over every rank's (dp.go).
func (e *Engine) Step(batches []data.Batch, lr float64) (lossSum float64, err error) {
	if len(batches) != e.accum {
		return 0, fmt.Errorf("engine: %d micro-batches for --grad-accum %d", len(batches), e.accum)
	}
	targets := 0
	for _, b := range batches {
		targets += b.NumTargets
	}
	if e.dp != nil {
		var err error
		if targets, err = e.dp.globalTargets(targets); err != nil {
			return 0, fmt.Errorf("step %d: %w", e.step+1, err)
		}
	}
	if targets == 0 {
		return 0, fmt.Errorf("step %d: no target tokens in the batch", e.step+1)
	}
	if err := e.stageBatches(batches); err != nil {
		return 0, err
	}
	e.step++
	e.skipped = false
	if e.galore != nil {
		e.galore.Begin(uint64(e.step), lr, e.accum)
	}
	g, err := e.stepGraph(float32(1/float64(targets)), lr)
	if err != nil {
		return 0, err
	}
	g = g.Reduce()
	if e.editGraph != nil {
		g = e.editGraph(g)
	}
	if err := e.interp.Run(g); err != nil {
		return 0, fmt.Errorf("step %d: %w", e.step, err)
	}
	if err := e.Drain(); err != nil {
		return 0, fmt.Errorf("step %d: %w", e.step, err)
	}
	// The losses and the flag: one copy, after the drain, where the step
	// has finished anyway.
	if err := e.be.Staging().DownloadInto(e.st.Compute, e.losses, e.lossFlag); err != nil {
		return 0, err
	}
	n := e.lossAcc.Len()
	for _, l := range e.losses[:n] {
		lossSum += float64(l)
	}
	if e.dp != nil {
		if lossSum, err = e.dp.globalLoss(lossSum); err != nil {
			return 0, fmt.Errorf("step %d: %w", e.step, err)
		}
	}
	if e.losses[n] != 0 {
		if err := e.undoStep(); err != nil {
			return 0, fmt.Errorf("step %d: taking back the skipped step: %w", e.step+1, err)
		}
	}
	return lossSum, nil
}

// Skipped reports whether the latest Step was skipped because its loss was
// not finite: no parameter, master copy or moment (device or host) was
// written, and the step counts (Adam's bias correction, the rounding key,
// the next Step's number) did not advance, as torch's GradScaler leaves
// the optimizer untouched on a step it skips. The batches were consumed.
func (e *Engine) Skipped() bool { return e.skipped }

// undoStep takes a step that the device skipped back from the step counts.
func (e *Engine) undoStep() error {
	e.skipped = true
	e.step--
	if e.galore != nil {
		e.galore.Skipped()
	}
	for _, o := range []*optim.AdamW{e.opt, e.dense} {
		if o != nil {
			if err := o.Skipped(e.st.Compute); err != nil {
				return err
			}
		}
	}
	return e.be.Synchronize(e.st.Compute)
}

// hostSkip reads the step's non-finite flag from its pinned copy. Only a
// host node ordered after the flag's d2h copy (every one after a gradient
// copy is: the flag goes first on the d2h stream) may call it.
func (e *Engine) hostSkip(node string) bool {
	e.hostAccess(node+" (flag)", []backend.Range{hazard.HostRange(e.flagHost, 0, 4)}, nil)
	return e.flagHost.Float32()[0] != 0
}

// Drain waits until every stream is idle.
func (e *Engine) Drain() error {
	for _, s := range []backend.Stream{e.st.Compute, e.st.D2H, e.st.H2D} {
		if s == nil {
			continue // New failed before making it
		}
		if err := e.be.Synchronize(s); err != nil {
			return err
		}
	}
	return nil
}

// GradNorm is the global gradient norm of the latest step (in lsp mode:
// over the compressed S of the matrices and the dense gradients that were
// updated).
func (e *Engine) GradNorm() (float64, error) {
	var sq float64
	for _, o := range []*optim.AdamW{e.opt, e.dense} {
		if o != nil {
			d, err := o.GradNormSq(e.st.Compute)
			if err != nil {
				return 0, err
			}
			sq += d
		}
	}
	if e.off != nil {
		sq += e.off.stepNormSq()
	}
	if e.lsp != nil {
		sq += e.lsp.StepNormSq()
	}
	return math.Sqrt(sq), nil
}

// stageRows is the number of [B,T] arrays staged per micro-batch: inputs
// and targets, and positions when packed; micro-batch i's array k starts
// at element (stageRows*i + k)*B*T of the staging buffer.
func (e *Engine) stageRows() int {
	if e.cfg.Packed {
		return 3
	}
	return 2
}

// stageBatches writes the micro-batches into the pinned staging buffer. The
// previous step has been drained, so no copy still reads it.
func (e *Engine) stageBatches(batches []data.Batch) error {
	BT, rows := e.b*e.t, e.stageRows()
	buf := e.stage.Int32()
	e.hostAccess("stage batch", nil, []backend.Range{hazard.HostRange(e.stage, 0, len(buf)*4)})
	for i, b := range batches {
		if len(b.Inputs) != BT || len(b.Targets) != BT {
			return fmt.Errorf("engine: micro-batch %d has %d inputs and %d targets for %d x %d", i, len(b.Inputs), len(b.Targets), e.b, e.t)
		}
		switch {
		case e.cfg.Packed && len(b.Positions) != BT:
			return fmt.Errorf("engine: micro-batch %d has %d positions for %d x %d packed rows", i, len(b.Positions), e.b, e.t)
		case !e.cfg.Packed && b.Positions != nil:
			return fmt.Errorf("engine: micro-batch %d is packed; the engine was built without Config.Packed", i)
		}
		copy(buf[rows*i*BT:], b.Inputs)
		copy(buf[(rows*i+1)*BT:], b.Targets)
		if b.Positions != nil {
			copy(buf[(rows*i+2)*BT:], b.Positions)
		}
	}
	return nil
}

// stepGraph builds the graph of one step.
func (e *Engine) stepGraph(lossScale float32, lr float64) (*Graph, error) {
	m, be, bufs := e.Model, e.be, e.Model.Buffers()
	L, BT := len(e.idx.Blocks), e.b*e.t
	g := &Graph{}
	var ring *ringStep // zero mode's gradient ring (ring.go): no whole gradient to zero
	if e.ring != nil {
		ring = e.ring.addZero(g)
	} else {
		g.Add("zero grads", Compute, func(s backend.Stream) error {
			if e.lora != nil {
				if err := e.lora.ZeroGrads(s); err != nil {
					return err
				}
			}
			return m.ZeroGrads(s)
		})
	}
	var slots *lspSlotSched // lsp's blocks through device slots (lsp.go)
	if e.lsp != nil {
		slots = e.newLSPSlotSched(g, lr)
	}
	bwd := make([]NodeID, L) // each layer's backward in the last micro-batch
	var agreed NodeID        // several ranks: the flag summed over ranks
	var bwdEmbed NodeID
	for i := 0; i < e.accum; i++ {
		i := i
		// A test's NaN injection (train/faults), decided here so that both
		// schedules run the same graph.
		scale, nan := lossScale, faults.NaNAt(e.step, i)
		if nan == faults.NaNGrad || nan == faults.NaNBoth {
			scale = float32(math.NaN()) // every gradient of the micro-batch, not its loss
		}
		g.Add(fmt.Sprintf("forward %d", i), Compute, func(s backend.Stream) error {
			rows := e.stageRows()
			if err := be.CopyH2D(s, bufs.Inputs, e.stage, rows*i*BT*4); err != nil {
				return err
			}
			if err := be.CopyH2D(s, bufs.Targets, e.stage, (rows*i+1)*BT*4); err != nil {
				return err
			}
			if e.cfg.Packed {
				if err := be.CopyH2D(s, bufs.Positions, e.stage, (rows*i+2)*BT*4); err != nil {
					return err
				}
			}
			if e.lsp != nil {
				e.lsp.SetMicro(i)
			}
			if e.galore != nil {
				e.galore.SetMicro(i)
			}
			if err := m.Forward(s); err != nil {
				return err
			}
			if err := m.CrossEntropy(s, scale); err != nil {
				return err
			}
			if err := be.CopyD2D(s, e.lossAcc.Slice(i*BT, BT), bufs.Losses); err != nil {
				return err
			}
			if nan == faults.NaNLoss || nan == faults.NaNBoth {
				if err := be.Fill(s, e.lossAcc.Slice(i*BT, 1), float32(math.NaN())); err != nil {
					return err
				}
			}
			if ring != nil {
				return nil // the head's backward is a node of the ring's
			}
			return m.BackwardHead(s)
		})
		if i == e.accum-1 {
			// Every loss of the step is known: the flag, before any update.
			flag := g.Add("non-finite flag", Compute, func(s backend.Stream) error {
				return be.NonFiniteFlag(s, e.skipFlag, e.lossAcc)
			})
			if e.flagHost != nil {
				d2h := g.Add("d2h non-finite flag", D2H, func(s backend.Stream) error {
					return be.CopyD2H(s, e.flagHost, 0, e.skipFlag)
				}, flag)
				if e.dp != nil {
					agreed = e.addFlag(g, d2h)
				}
			}
		}
		if ring != nil {
			e.ring.addMicro(g, ring, i)
			continue
		}
		for l := L - 1; l >= 0; l-- {
			l := l
			var deps []NodeID
			if slots != nil {
				deps = slots.before(i, l)
			}
			bwd[l] = g.Add(fmt.Sprintf("backward %d.%d", i, l), Compute, func(s backend.Stream) error {
				if e.lsp != nil {
					e.lsp.SetMicro(i)
				}
				if e.galore != nil {
					e.galore.SetMicro(i)
				}
				return m.BackwardLayer(s, l)
			}, deps...)
			if slots != nil {
				slots.after(i, l, bwd[l])
			}
		}
		bwdEmbed = g.Add(fmt.Sprintf("backward %d.embed", i), Compute, func(s backend.Stream) error {
			return m.BackwardEmbed(s)
		})
	}
	switch e.cfg.Mode {
	case Native:
		var ups []NodeID
		if e.dp != nil {
			reduced := e.addGradsDown(g, bwd, bwdEmbed)
			e.addFlagUp(g, agreed)
			ups = e.addGradsUp(g, reduced)
		}
		g.Add("adamw", Compute, func(s backend.Stream) error { return e.opt.Step(s, float32(lr), e.skipFlag) }, ups...)
	case Zero:
		var adam []NodeID
		if ring != nil {
			adam = e.ring.addAdam(g, ring, lr)
		} else {
			adam = e.off.addDown(g, bwd, bwdEmbed, lr)
		}
		if e.dp != nil {
			e.addFlagUp(g, agreed) // the losses' flag, read back after the step
		}
		e.off.addUp(g, adam)
	case LSP:
		denseAdam := func(deps ...NodeID) {
			g.Add("dense adamw", Compute, func(s backend.Stream) error { return e.dense.Step(s, float32(lr), e.skipFlag) }, deps...)
		}
		if e.dense != nil && e.dp == nil {
			denseAdam()
		}
		// Every copy down and host Adam first, then the copies up and the
		// applies: the launcher blocks on a host result only after all the
		// work that can overlap with it is enqueued.
		// With several ranks the matrices come first: their collectives
		// chain in list order, and layer L-1's S is ready long before the
		// dense group of the embeddings.
		var offAdam, lspAdam []NodeID
		if e.off != nil && e.dp == nil {
			offAdam = e.off.addDown(g, bwd, bwdEmbed, lr)
		}
		if slots == nil {
			lspAdam = e.addLSPDown(g, bwd, lr)
		}
		if e.dp != nil {
			if e.off != nil {
				offAdam = e.off.addDown(g, bwd, bwdEmbed, lr)
			}
			var reduced []NodeID
			if e.dpg != nil {
				reduced = e.addGradsDown(g, bwd, bwdEmbed)
			}
			e.addFlagUp(g, agreed)
			if e.dense != nil {
				denseAdam(e.addGradsUp(g, reduced)...)
			}
		}
		if e.off != nil {
			e.off.addUp(g, offAdam)
		}
		if slots == nil {
			e.addLSPUp(g, lspAdam, lr)
		} else {
			slots.finish()
		}
	case Galore:
		// Each matrix was updated in its block's backward; the dense
		// parameters' AdamW after the whole backward.
		if e.opt != nil {
			g.Add("adamw", Compute, func(s backend.Stream) error { return e.opt.Step(s, float32(lr), e.skipFlag) })
		}
	case LoRA:
		// As lsp's dense parameters: every copy down and host Adam
		// before the copies up; with several ranks the adapters' (and
		// device dense parameters') sums before the AdamW reads them.
		var offAdam, ups []NodeID
		if e.off != nil {
			offAdam = e.off.addDown(g, bwd, bwdEmbed, lr)
		}
		if e.dp != nil {
			reduced := e.addGradsDown(g, bwd, bwdEmbed)
			e.addFlagUp(g, agreed)
			ups = e.addGradsUp(g, reduced)
		}
		g.Add("adamw", Compute, func(s backend.Stream) error { return e.opt.Step(s, float32(lr), e.skipFlag) }, ups...)
		if e.off != nil {
			e.off.addUp(g, offAdam)
		}
	}
	return g, nil
}
