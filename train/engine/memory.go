// Memory and traffic accounting (the user's "will this fit on my GPU"): the
// device and host bytes each mode allocates, predicted from the
// configuration alone with the same size formulas the allocations use, so
// that --device-mem (and, with what a run adds, --host-mem) is checked
// before anything is allocated; and the bytes one step moves across the
// link.

package engine

import (
	"fmt"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/galore"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/quant"
)

// Part is one named share of a memory plan, in bytes.
type Part struct {
	Name  string
	Bytes int64
}

// Memory is the predicted memory of an engine, and with what a run adds
// (train.MemoryOf) of the whole run.
//
// Host memory comes in two kinds. Host parts are held from set-up to the
// end. Transient parts are each held during one phase only (loading the
// initial weights, restoring or writing a checkpoint, the export), and
// the phases never overlap: each frees its values before the next begins
// (the run collects the Go heap's garbage after each), so the host peak
// is the held parts plus the largest transient, not their sum. When the
// backend's device memory is host memory (the CPU backend: DeviceOnHost)
// the device parts count on the host too.
type Memory struct {
	Mode   Mode
	Device []Part
	Host   []Part
	// Transient are host allocations of one phase each; HostPeak counts
	// the largest.
	Transient []Part
	// DeviceOnHost says the device parts are host memory (the CPU
	// backend): HostPeak adds them.
	DeviceOnHost bool
	// CheckpointBytes is the bytes of a checkpoint's tensors (the
	// parameters and SaveState's arrays, all fp32): nearly the size of
	// its file.
	CheckpointBytes int64
	// StateWrite is the most host memory StateArrays' reads allocate at
	// once (a device array's chunk, an index array converted to fp32,
	// the step counts), StateRead LoadStateFrom's (the arrays it reads
	// whole: a matrix's lsp state, the step counts): the engine's share
	// of a checkpoint write's and a restore's transients, to which the
	// run adds the file's own buffers.
	StateWrite, StateRead int64
	// Link is the bytes one step moves each way, excluding the batch (and
	// including the non-finite flag's copy for the host Adam).
	LinkD2H, LinkH2D int64
	// Batch is the bytes of the micro-batches' inputs and targets (up) and
	// losses with the non-finite flag (down) per step.
	BatchH2D, BatchD2H int64
}

func sum(ps []Part) int64 {
	var t int64
	for _, p := range ps {
		t += p.Bytes
	}
	return t
}

// DeviceTotal is the device peak (everything is allocated up front): what
// --device-mem is checked against.
func (p Memory) DeviceTotal() int64 { return sum(p.Device) }

// HostTotal is the host memory held for the whole run (the Host parts:
// the optimizer side's, and a run's own), without the device parts or
// the transients.
func (p Memory) HostTotal() int64 { return sum(p.Host) }

// LargestTransient is the Transient part with the most bytes (a zero Part
// when there is none).
func (p Memory) LargestTransient() Part {
	var big Part
	for _, x := range p.Transient {
		if x.Bytes > big.Bytes {
			big = x
		}
	}
	return big
}

// HostPeak is the most host memory the run holds at once, over the
// process's own at start-up: the Host parts, the device parts when they
// live on the host, and the largest Transient (see Memory).
func (p Memory) HostPeak() int64 {
	t := p.HostTotal() + p.LargestTransient().Bytes
	if p.DeviceOnHost {
		t += p.DeviceTotal()
	}
	return t
}

// HostString writes the host side of a plan in MiB: its peak, then the
// held parts, the device's when it is host memory, and the transients
// with the largest, which the peak counts, marked.
func (p Memory) HostString() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%.2f MiB peak: ", mib(p.HostPeak()))
	for i, x := range p.Host {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.2f", x.Name, mib(x.Bytes))
	}
	if p.DeviceOnHost {
		fmt.Fprintf(&b, ", device memory (cpu backend) %.2f", mib(p.DeviceTotal()))
	}
	if len(p.Transient) > 0 {
		big := p.LargestTransient()
		b.WriteString("; one at a time: ")
		for i, x := range p.Transient {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %.2f", x.Name, mib(x.Bytes))
			if x == big {
				b.WriteString(" (the peak's)")
			}
		}
	}
	return b.String()
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// String is a one-line summary per side, in MiB.
func (p Memory) String() string {
	f := func(ps []Part) string {
		var b strings.Builder
		for i, x := range ps {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %.2f", x.Name, float64(x.Bytes)/(1<<20))
		}
		return b.String()
	}
	return fmt.Sprintf("device %.2f MiB (%s); host %s", float64(p.DeviceTotal())/(1<<20), f(p.Device), p.HostString())
}

// MemoryOf predicts the memory and link traffic of an engine for arch
// with micro-batches of B x T, accum per step.
func MemoryOf(arch model.Arch, B, T, accum int, dt backend.DType, cfg Config) (Memory, error) {
	if err := cfg.Validate(); err != nil {
		return Memory{}, err
	}
	cfg.LoRA = cfg.LoRA.WithDefaultTargets(arch)
	x, err := model.NewIndex(arch)
	if err != nil {
		return Memory{}, fmt.Errorf("engine: %w", err)
	}
	BT := B * T
	var opts model.Options
	var sites []lora.Site
	switch cfg.Mode {
	case LSP:
		opts.MatrixGrads = (*lsp.State)(nil) // plans for hooks
		opts.FrozenDense = cfg.DenseParams == DenseFrozen
	case LoRA:
		if sites, err = lora.Sites(x, cfg.LoRA); err != nil {
			return Memory{}, err
		}
		opts.Adapters = (*lora.State)(nil) // plans for adapters
		opts.FrozenDense = cfg.DenseParams == DenseFrozen
		if cfg.LoRA.Base != 0 {
			opts.Base = (*quant.Base)(nil) // Params without the block matrices
		}
	case Galore:
		opts.Adapters = (*galore.Device)(nil) // frozen matrices, inputs kept
		opts.FrozenDense = cfg.DenseParams == DenseFrozen
	}
	opts.GradDType, opts.Recompute, opts.Packed = cfg.GradDType, cfg.Recompute, cfg.Packed
	if cfg.ring() {
		opts.GradSlots = ringSlots // Grads: the ring's slots and resident region
	}
	mp := arch.MemoryWith(B, T, dt, opts)
	p := Memory{Mode: cfg.Mode,
		Device: []Part{{"weights", mp.Params}, {"grads", mp.Grads}, {"activations", mp.Activations},
			{"activation grads", mp.ActGrads}, {"batch", mp.Batch + int64(accum*BT*4) + 4}},
		Host:     []Part{{"batch staging", int64(accum * opts.BatchRows() * BT * 4)}},
		BatchH2D: int64(accum * opts.BatchRows() * BT * 4), BatchD2H: int64(accum*BT*4) + 4,
	}
	ranks := 1
	if cfg.Comm != nil {
		ranks = cfg.Comm.Size()
	}
	if cfg.hostOptimizer() || ranks > 1 {
		// The non-finite flag's pinned copy, read by the host Adam (and,
		// with several ranks, summed over them and copied back up).
		p.Host = append(p.Host, Part{"non-finite flag", 4})
		p.LinkD2H += 4
		if ranks > 1 {
			p.LinkH2D += 4
		}
	}
	N := int64(arch.NumParams())
	dense := N - int64(x.MatrixElems())
	dsize, gsize := int64(dt.Size()), int64(cfg.GradDType.Size())
	// CheckpointBytes is the file's tensors: the parameters and, added
	// mode by mode below, every state array.
	p.CheckpointBytes = 4 * N
	switch cfg.Mode {
	case Native:
		st := optim.StateBytes(arch.NumParams(), len(x.Layout), dt, true)
		p.Device = append(p.Device, Part{"optimizer", st})
		p.StateWrite = deviceStateChunk(N)
		p.CheckpointBytes += savedDeviceState(st)
	case Zero:
		if cfg.sharded() {
			p.Host = append(p.Host, Part{"master, moments, pinned grads and weights", shardedBytes(x, dt, cfg.Comm.Size(), cfg.Comm.Rank())})
		} else {
			p.Host = append(p.Host, Part{"master, moments, pinned grads and weights", offloadBytes(N, dt, cfg.GradDType)})
		}
		p.LinkD2H, p.LinkH2D = p.LinkD2H+gsize*N, p.LinkH2D+dsize*N
		if cfg.ring() {
			// The ring's groups go down once per micro-batch (the
			// resident region once per step), and with several
			// micro-batches are summed in an fp32 accumulator.
			lay, err := ringLayout(x)
			if err != nil {
				return Memory{}, err
			}
			n := ringElems(lay)
			p.LinkD2H += int64(accum-1) * gsize * n
			if accum > 1 {
				p.Host = append(p.Host, Part{"ring grad accumulator", 4 * n})
			}
		}
		p.StateWrite = savedHostState(len(x.Layout))
		p.StateRead = savedHostState(len(x.Layout))
		p.CheckpointBytes += 12*N + savedHostState(len(x.Layout))
	case LSP:
		n := lsp.MemoryOf(x, cfg.LSP, B, T, accum, dt, lspInFlight(cfg, accum))
		p.Device = append(p.Device,
			Part{"projectors", n.Projectors}, Part{"compressed activations (A)", n.A},
			Part{"S and Delta", n.S}, Part{"lsp workspaces", n.Workspaces})
		if !cfg.LSP.NoFit {
			p.Device = append(p.Device, Part{"calibration", n.Calibration})
			if n.Fit > 0 {
				p.Device = append(p.Device, Part{"projector fit", n.Fit})
			}
			if n.Refresh > 0 {
				p.Device = append(p.Device, Part{"svd refresh", n.Refresh})
			}
			if n.FitStaging > 0 {
				p.Host = append(p.Host, Part{"projector fit staging", n.FitStaging})
			}
		}
		p.Host = append(p.Host, Part{"S/Delta and subspace moments", n.HostS})
		if n.HostSums > 0 {
			p.Host = append(p.Host, Part{"S sums (fp32)", n.HostSums})
		}
		if n.HostProjectors > 0 {
			p.Host = append(p.Host, Part{"projectors (pinned)", n.HostProjectors})
		}
		p.StateWrite, p.StateRead = n.SaveConvert, n.RestoreHeld
		p.CheckpointBytes += n.Saved + n.Views
		p.LinkD2H, p.LinkH2D = p.LinkD2H+n.LinkDown, p.LinkH2D+n.LinkUp
		denseTensors := len(x.Layout) - len(x.Blocks)*len(x.Mats)
		switch cfg.DenseParams {
		case DenseDevice:
			st := optim.StateBytes(int(dense), denseTensors, dt, false)
			p.Device = append(p.Device, Part{"dense optimizer", st})
			p.StateWrite = max(p.StateWrite, deviceStateChunk(dense))
			p.CheckpointBytes += savedDeviceState(st)
		case DenseHost:
			p.addDenseHost(dense, denseTensors, dt, cfg.GradDType)
		}
	case Galore:
		// The projectors, projected gradients and moments, one matrix's
		// gradient and the randomized SVD's workspaces; the dense
		// parameters' device AdamW.
		gb := galore.Bytes(x, cfg.Galore, dt)
		p.Device = append(p.Device, Part{"galore projectors, moments and workspaces", gb})
		np, nm := galore.StateSizes(x, cfg.Galore)
		p.StateWrite = max(p.StateWrite, deviceStateChunk(int64(max(np, nm))))
		p.CheckpointBytes += 4 * int64(np+2*nm)
		if cfg.DenseParams == DenseDevice {
			denseTensors := len(x.Layout) - len(x.Blocks)*len(x.Mats)
			st := optim.StateBytes(int(dense), denseTensors, dt, false)
			p.Device = append(p.Device, Part{"dense optimizer", st})
			p.StateWrite = max(p.StateWrite, deviceStateChunk(dense))
			p.CheckpointBytes += savedDeviceState(st)
		}
	case LoRA:
		// The adapters and their gradients, and one device AdamW over
		// them (and the dense parameters with --dense-params device).
		na := lora.Elems(sites, cfg.LoRA.R)
		if f := cfg.LoRA.Base; f != 0 {
			p.Device = append(p.Device, Part{"quantized base (" + f.String() + ")", quant.Bytes(x, f, dt)})
		}
		p.Device = append(p.Device, Part{"adapters, grads and scratch", lora.Bytes(sites, cfg.LoRA.R, BT, dt, cfg.GradDType)})
		elems, tensors := na, 2*len(sites)
		denseTensors := len(x.Layout) - len(x.Blocks)*len(x.Mats)
		switch cfg.DenseParams {
		case DenseDevice:
			elems, tensors = elems+int(dense), tensors+denseTensors
		case DenseHost:
			p.addDenseHost(dense, denseTensors, dt, cfg.GradDType)
		}
		st := optim.StateBytes(elems, tensors, dt, false)
		p.Device = append(p.Device, Part{"optimizer", st})
		p.StateWrite = max(p.StateWrite, deviceStateChunk(int64(elems)))
		p.CheckpointBytes += 4*int64(na) + savedDeviceState(st)
	}
	// With several ranks, the gradients a device AdamW reads (native's,
	// lsp's dense ones with --dense-params device, lora's adapters) go down to a pinned
	// buffer, are all-reduced on the host and come back up (dpGrads);
	// with a device communicator they are summed on the device instead,
	// in a scratch buffer as long as the longest sum (allocScratch).
	if ranks > 1 {
		var groups []groupSpec
		switch {
		case cfg.Mode == Native:
			groups = groupsAll(x)
		case cfg.Mode.FrozenMatrices() && cfg.DenseParams == DenseDevice:
			groups = groupsDense(x)
		}
		sums := groupElems(x, groups)
		if cfg.Mode == LoRA {
			sums = loraGroupElems(x, sites, cfg.LoRA.R, sums)
		}
		var n int64
		for _, s := range sums {
			n += int64(s)
		}
		switch {
		case cfg.DeviceComm != nil:
			if sc := collectiveScratch(x, cfg, sums, ranks); sc > 0 {
				p.Device = append(p.Device, Part{"device collectives' scratch", 4 * int64(sc)})
			}
		case n > 0:
			p.Host = append(p.Host, Part{"data-parallel gradients", 4 * n})
			p.LinkD2H += 4 * n
			p.LinkH2D += 4 * n
		}
	}
	return p, nil
}

// addDenseHost adds the dense parameters offloaded as zero's (lsp and
// lora with --dense-params host): dense elements of denseTensors tensors,
// weights in dt and gradients in gdt.
func (p *Memory) addDenseHost(dense int64, denseTensors int, dt, gdt backend.DType) {
	dsize, gsize := int64(dt.Size()), int64(gdt.Size())
	p.Host = append(p.Host, Part{"dense master, moments, pinned grads and weights", offloadBytes(dense, dt, gdt)})
	p.StateWrite = max(p.StateWrite, savedHostState(denseTensors))
	p.StateRead = max(p.StateRead, savedHostState(denseTensors))
	p.CheckpointBytes += 12*dense + savedHostState(denseTensors)
	p.LinkD2H += gsize * dense
	p.LinkH2D += dsize * dense
}

// shardedBytes is one rank's host memory of zero mode's sharded optimizer
// (shard.go): the whole pinned gradients (fp32) and weights (model dtype),
// and for its shard alone the summed gradients, the moments and (bf16
// models) the master. A checkpoint write gathers each array group by
// group into the pinned gradients, adding nothing.
func shardedBytes(x *model.Index, dt backend.DType, size, rank int) int64 {
	var groups []int
	var n int64
	for _, sp := range groupsAll(x) {
		g := 0
		for _, i := range sp.params {
			g += x.Layout[i].Len()
		}
		groups = append(groups, g)
		n += int64(g)
	}
	s := int64(shardElems(groups, size, rank))
	arrays := int64(2) // the moments
	if dt != backend.F32 {
		arrays++ // the master
	}
	return 4*n + int64(dt.Size())*n + 4*s + 4*arrays*s
}

// savedDeviceState is the fp32 bytes of a device optimizer's arrays in a
// checkpoint, whose state is st bytes (optim.StateBytes): all of it but
// the norms' work, which is not saved; every array of it is fp32 already
// (a bf16 model's master included).
func savedDeviceState(st int64) int64 { return st - backend.SumSquaresWork*8 }

// deviceStateChunk is the host buffer StateArrays reads a device
// optimizer of n parameters through: one chunk, as long as its longest
// array (the moments, n) or stateChunk.
func deviceStateChunk(n int64) int64 { return 4 * min(stateChunk, n) }

// savedHostState is the bytes of a host optimizer's step counts over
// tensors tensors, made as fp32 for a checkpoint (its fp32 master and
// moments are handed over as they are).
func savedHostState(tensors int) int64 { return 4 * int64(tensors) }

// collectiveScratch is the device communicator's scratch (allocScratch): for
// the longest of each layer's S (lsp) and of the groups' gradients.
func collectiveScratch(x *model.Index, cfg Config, sums []int, ranks int) int {
	if cfg.Mode == LSP {
		d, _ := lsp.Dims(x, cfg.LSP)
		n := 0
		for _, dk := range d {
			n += dk * dk
		}
		sums = append(sums, n)
	}
	return scratchElems(sums, ranks)
}

// groupElems is each group's elements.
func groupElems(x *model.Index, groups []groupSpec) []int {
	sums := make([]int, len(groups))
	for gi, g := range groups {
		for _, i := range g.params {
			sums[gi] += x.Layout[i].Len()
		}
	}
	return sums
}

// loraGroupElems is lora mode's data-parallel sums (loraGradGroups): each
// block's adapters plus dense, the block's share of the dense groups'
// elements (none, or groupsDense's), and the dense parameters outside the
// blocks.
func loraGroupElems(x *model.Index, sites []lora.Site, r int, dense []int) []int {
	L := len(x.Blocks)
	sums := make([]int, L+1)
	copy(sums, dense) // groupsDense's order: blocks from the last, then outside
	for _, s := range sites {
		sums[L-1-s.Layer] += r * (s.M + s.N)
	}
	return sums
}
