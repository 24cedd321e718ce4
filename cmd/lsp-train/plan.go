// The plan command: will a model fit, in which mode, and how long will a
// step take, on a machine described by presets (train/plan). Nothing is
// trained and no weights are read: the sizes come from a preset or a
// checkpoint directory's config.json.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/calibrate"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/plan"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// planOptions are the plan command's flags.
type planOptions struct {
	model                 string
	batch, seqLen, accum  int
	dtype, gradDType      string
	mode, dense, schedule string
	recompute             string
	gradResidency         string
	d, r                  int
	fit                   bool
	projector             lsp.Kind
	loraR                 int
	loraAlpha             float64
	loraTargets           string
	baseDType             string
	galoreRank            int
	galoreEvery           int
	gpu, link, host       string
	ranks                 int
	net                   string
	collectives           string
	hostBW                byteSize
	hostMem, deviceMem    byteSize
	hostWorkers           int
	timeline              string
	// --gpu cpu: this machine's CPU backend, calibrated.
	calibration   string
	calibBudget   time.Duration
	threads       int
	linkBandwidth byteSize
}

func defaultPlanOptions() planOptions {
	d := train.Defaults()
	return planOptions{model: "gpt2", batch: 4, seqLen: 512, accum: 1, dtype: "bf16", mode: "all",
		schedule: "pipelined", recompute: "auto", gradResidency: "auto", d: d.D, r: d.R, loraR: d.LoRAR, loraAlpha: d.LoRAAlpha,
		galoreRank: d.GaloreRank, galoreEvery: d.GaloreEvery, gpu: "rtx4090", ranks: 1, net: "shm", collectives: "auto", calibBudget: 10 * time.Second}
}

func bindPlanFlags(fs *flag.FlagSet, o *planOptions) {
	fs.StringVar(&o.model, "model", o.model, "the `MODEL`: a preset or a Hugging Face checkpoint directory (only its config.json is read)")
	fs.IntVar(&o.batch, "batch", o.batch, "rows per micro-batch")
	fs.IntVar(&o.seqLen, "seq-len", o.seqLen, "tokens per row (at most the model context)")
	fs.IntVar(&o.accum, "grad-accum", o.accum, "micro-batches per step")
	fs.StringVar(&o.dtype, "dtype", o.dtype, "`TYPE` of weights and activations: fp32 or bf16")
	fs.StringVar(&o.gradDType, "grad-dtype", o.gradDType, "`TYPE` of the parameter gradients: fp32 or bf16 (default: --dtype; fp32 with --ranks)")
	fs.StringVar(&o.mode, "mode", o.mode, "`MODE`: native, zero, lsp, lora, galore, or all (the five side by side)")
	fs.StringVar(&o.dense, "dense-params", o.dense, "lsp and lora: `WHERE` the parameters outside the block matrices are updated: frozen, device or host (default: as training does, frozen for a checkpoint directory, device for a preset)")
	fs.StringVar(&o.schedule, "schedule", o.schedule, "`SCHEDULE`: pipelined (streams overlap) or sequential (one op at a time)")
	fs.StringVar(&o.recompute, "recompute", o.recompute, "`WHAT` the backward recomputes: none, attn, layer, or auto (the least that fits the GPU's memory, per mode)")
	fs.StringVar(&o.gradResidency, "grad-residency", o.gradResidency, "zero and lsp: `WHERE` the gradients (lsp: S and the projectors) wait on the device: whole, ring (a few blocks' at a time, copied down per micro-batch) or auto (whole when it fits the GPU's memory)")
	fs.IntVar(&o.d, "d", o.d, "lsp: projected size d (capped by each matrix); 0 (the default): as training, a quarter of each matrix's shorter side, at most 512")
	fs.IntVar(&o.r, "r", o.r, "lsp: non-zeros per projector row")
	fs.BoolVar(&o.fit, "fit", o.fit, "lsp: with fitted projectors (lsp-train --fit), whose checks keep calibration buffers on the device")
	fs.Var(&o.projector, "projector", "lsp: `KIND` of projectors, as lsp-train's flag: sparse, svd (dense m x d and n x d, refreshed from the top singular vectors at every check: its calibration and SVD buffers on the device, the SVDs' FLOPs per check below the table) or gaussian (dense, drawn once)")
	fs.IntVar(&o.loraR, "lora-r", o.loraR, "lora: the adapters' rank r, as lsp-train's flag")
	fs.Float64Var(&o.loraAlpha, "lora-alpha", o.loraAlpha, "lora: alpha, as lsp-train's flag (it scales the adapters' term and costs nothing)")
	fs.StringVar(&o.loraTargets, "lora-targets", o.loraTargets, "lora: comma-separated Hugging Face `MODULES` to adapt, as lsp-train's flag (default: every attention and MLP linear)")
	fs.StringVar(&o.baseDType, "base-dtype", o.baseDType, "lora: `nf4` or int8 stores the frozen block matrices quantized (QLoRA), as lsp-train's flag (default: in --dtype)")
	fs.IntVar(&o.galoreRank, "galore-rank", o.galoreRank, "galore: the singular vectors kept per matrix, as lsp-train's flag")
	fs.IntVar(&o.galoreEvery, "galore-every", o.galoreEvery, "galore: `STEPS` between projector refreshes, as lsp-train's flag (the refresh's time is given apart from the step's)")
	fs.StringVar(&o.gpu, "gpu", o.gpu, "the `GPU` preset: "+strings.Join(slices.Sorted(maps.Keys(plan.GPUs)), ", ")+
		", or cpu: this machine's CPU backend, described by microbenchmarks (train/calibrate)")
	fs.StringVar(&o.calibration, "calibration", o.calibration, "read the machine's measured figures from `FILE`: with --gpu cpu, the CPU backend's description (go run ./bench/calibrate -o FILE) instead of measuring it now; "+
		"with a GPU preset, the op efficiencies that GPU measured (the GPU bundle's calibration.json, lsp-train bench-kernels -calibration FILE), for that preset only")
	fs.DurationVar(&o.calibBudget, "calibrate-budget", o.calibBudget, "--gpu cpu: time to spend measuring the CPU backend when no --calibration is given")
	fs.IntVar(&o.threads, "threads", o.threads, "--gpu cpu: compute threads and host Adam workers to measure (0: all cores)")
	fs.Var(&o.linkBandwidth, "link-bandwidth", "--gpu cpu: the CPU backend's charge per device-host copy in bytes/s, as train's --link-bandwidth (0: free)")
	fs.StringVar(&o.link, "link", o.link, "the `LINK` preset: "+strings.Join(slices.Sorted(maps.Keys(plan.Links)), ", ")+" (default: the GPU's usual one)")
	fs.StringVar(&o.host, "host", o.host, "the `HOST` preset: "+strings.Join(slices.Sorted(maps.Keys(plan.Hosts)), ", ")+" (default: the GPU's usual one)")
	fs.IntVar(&o.ranks, "ranks", o.ranks, "data parallelism: `N` such GPUs, one process each (mpirun -np N), each with the micro-batch and --grad-accum given")
	fs.StringVar(&o.collectives, "collectives", o.collectives, "with --ranks: `WHERE` the ranks sum lsp's S and the device AdamW's gradients, as lsp-train's flag: nccl (on the GPUs), host (through pinned memory, over MPI) or auto (nccl on a GPU, host with --gpu cpu)")
	fs.StringVar(&o.net, "net", o.net, "with --ranks: the `NETWORK` between ranks: "+strings.Join(slices.Sorted(maps.Keys(plan.Nets)), ", ")+" (shm: processes on one host)")
	fs.Var(&o.hostBW, "host-bw", "host memory bandwidth per second, e.g. 80GB, instead of the host preset's")
	fs.Var(&o.hostMem, "host-mem", "host memory, e.g. 64GiB, instead of the host preset's")
	fs.Var(&o.deviceMem, "device-mem", "device memory, e.g. 8GiB, instead of the GPU preset's")
	fs.IntVar(&o.hostWorkers, "host-workers", o.hostWorkers, "host Adam workers (0: one per host core)")
	fs.StringVar(&o.timeline, "timeline", o.timeline, "write the predicted step's timeline to `FILE`.png (with --mode all: FILE-native.png, ...)")
}

// planFlags is the plan command's flag set, bound to the options it
// returns, which hold the plan's defaults until parsed.
func planFlags() (*flag.FlagSet, *planOptions) {
	fs := flag.NewFlagSet("lsp-train plan", flag.ContinueOnError)
	o := defaultPlanOptions()
	bindPlanFlags(fs, &o)
	return fs, &o
}

func newPlanFlags() *flag.FlagSet {
	fs, _ := planFlags()
	return fs
}

// planJob is the parsed command line.
type planJob struct {
	spec    model.Spec
	dt, gdt backend.DType
	modes   []engine.Mode
	// recompute is --recompute; auto: the least setting that fits the
	// device, chosen per mode.
	recompute model.Recompute
	auto      bool
	// residency is --grad-residency (zero's and lsp's; native keeps the
	// whole gradient); auto is resolved per recompute setting.
	residency engine.GradResidency
	machine   plan.Machine
	cpu       bool // --gpu cpu: machine is built by cpuMachine
	// gpuCalib is the --calibration of a GPU preset, applied to machine
	// (nil: none).
	gpuCalib *plan.GPUCalibration
}

// parse checks every flag, naming each one at fault.
func (o planOptions) parse() (planJob, error) {
	var j planJob
	var errs []error
	bad := func(flag, format string, a ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, a...)))
	}
	spec, _, err := catalog.Resolve(o.model)
	if err != nil {
		bad("model", "%v", err)
	} else {
		j.spec = spec
		if o.seqLen > spec.MaxSeqLen() {
			bad("seq-len", "%d is longer than %s's context of %d", o.seqLen, o.model, spec.MaxSeqLen())
		}
	}
	if o.batch < 1 {
		bad("batch", "%d, want at least 1", o.batch)
	}
	if o.seqLen < 1 {
		bad("seq-len", "%d, want at least 1", o.seqLen)
	}
	if o.accum < 1 {
		bad("grad-accum", "%d, want at least 1", o.accum)
	}
	if j.dt, err = backend.ParseDType(o.dtype); err != nil {
		bad("dtype", "%v", err)
	}
	j.gdt = j.dt
	if o.ranks > 1 {
		j.gdt = backend.F32 // data parallelism all-reduces fp32 gradients
	}
	if o.gradDType != "" {
		if j.gdt, err = backend.ParseDType(o.gradDType); err != nil {
			bad("grad-dtype", "%v", err)
		}
	}
	if o.mode == "all" {
		j.modes = slices.Clone(engine.Modes)
		if o.ranks > 1 {
			// galore runs in one process (engine.Config.Validate).
			j.modes = slices.DeleteFunc(j.modes, func(m engine.Mode) bool { return m == engine.Galore })
		}
	} else if m, err := engine.ParseMode(o.mode); err != nil {
		bad("mode", "%v (or all)", err)
	} else {
		j.modes = []engine.Mode{m}
	}
	if _, err := engine.ParseDenseParams(o.dense); o.dense != "" && err != nil {
		bad("dense-params", "%v", err)
	}
	if o.recompute == "auto" {
		j.auto = true
	} else if j.recompute, err = model.ParseRecompute(o.recompute); err != nil {
		bad("recompute", "%v (or auto)", err)
	}
	if j.residency, err = engine.ParseGradResidency(o.gradResidency); err != nil {
		bad("grad-residency", "%v", err)
	}
	if o.schedule != "pipelined" && o.schedule != "sequential" {
		bad("schedule", "unknown schedule %q (want pipelined or sequential)", o.schedule)
	}
	if o.ranks < 1 {
		bad("ranks", "%d, want at least 1", o.ranks)
	}
	if _, err := train.ParseCollectives(o.collectives); err != nil {
		bad("collectives", "%v", err)
	}
	net, err := plan.NetPreset(o.net)
	if err != nil {
		errs = append(errs, err) // names its flag
	}
	if o.hostWorkers < 0 {
		bad("host-workers", "%d, want >= 0", o.hostWorkers)
	}
	if o.hostBW < 0 || o.hostMem < 0 || o.deviceMem < 0 {
		bad("host-bw, --host-mem, --device-mem", "sizes must not be negative")
	}
	if o.threads < 0 {
		bad("threads", "%d, want >= 0", o.threads)
	}
	if o.linkBandwidth < 0 {
		bad("link-bandwidth", "must not be negative")
	}
	if o.gpu != "cpu" && (o.threads != 0 || o.linkBandwidth != 0) {
		bad("threads, --link-bandwidth", "only with --gpu cpu")
	}
	if o.gpu == "cpu" {
		j.cpu = true
		if o.link != "" || o.host != "" {
			bad("link, --host", "not with --gpu cpu: the link and host are this machine's, measured")
		}
		if o.calibBudget <= 0 {
			bad("calibrate-budget", "%v, want > 0", o.calibBudget)
		}
	} else if m, err := plan.Preset(o.gpu, o.link, o.host); err != nil {
		errs = append(errs, err) // names its flag
	} else {
		if o.hostBW > 0 {
			m.Host.MemBW = float64(o.hostBW)
		}
		if o.hostMem > 0 {
			m.Host.Memory = int64(o.hostMem)
		}
		if o.deviceMem > 0 {
			m.GPU.DeviceMem = int64(o.deviceMem)
		}
		m.Host.Workers = o.hostWorkers
		if o.calibration != "" {
			// A GPU's measured efficiencies (the GPU bundle's); Apply
			// refuses another preset's.
			c, err := plan.ReadGPUCalibration(o.calibration)
			if err == nil {
				err = c.Apply(&m, o.gpu)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("--calibration: %w", err))
			}
			j.gpuCalib = &c
		}
		j.machine = m
	}
	j.machine.Ranks, j.machine.Net = o.ranks, net
	if len(errs) == 0 {
		for _, mode := range j.modes {
			ec := o.engineConfig(j, mode)
			if err := ec.Validate(); err != nil {
				errs = append(errs, err) // names its flag
			} else if mode == engine.LoRA {
				// Targets the model lacks are refused here, by name,
				// rather than after the other modes' plans are printed.
				if err := checkLoRATargets(j.spec, ec); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return j, errors.Join(errs...)
}

// checkLoRATargets says which of c's --lora-targets spec has no module
// of (lora.Sites' error, naming the flag and the model's matrices).
func checkLoRATargets(spec model.Spec, c engine.Config) error {
	idx, err := model.NewIndex(spec)
	if err != nil {
		return fmt.Errorf("--model: %w", err)
	}
	_, err = lora.Sites(idx, c.LoRA.WithDefaultTargets(spec))
	return err
}

// trainConfig is the run the plan of mode describes: the train
// command's defaults with the plan's flags, on a GPU (device memory is
// not host memory) or, with --gpu cpu, on the CPU backend (it is).
func (o planOptions) trainConfig(j planJob, mode engine.Mode) train.Config {
	c := train.Defaults()
	c.Model, c.Batch, c.SeqLen, c.GradAccum, c.DType, c.GradDType = o.model, o.batch, o.seqLen, o.accum, j.dt, j.gdt
	c.Mode, c.DenseParams, c.D, c.R, c.Fit = mode, engine.DenseParams(o.dense), o.d, o.r, o.fit
	if o.projector != "" {
		c.Projector = o.projector
	}
	c.LoRAR, c.LoRAAlpha, c.LoRATargets = o.loraR, o.loraAlpha, o.loraTargets
	c.GaloreRank, c.GaloreEvery = o.galoreRank, o.galoreEvery
	if mode == engine.LoRA {
		c.BaseDType = o.baseDType // the lora row of --mode all too
	}
	c.Schedule, c.Device, c.Recompute = train.Schedule(o.schedule), device.CUDA, j.recompute
	c.Collectives = train.Collectives(o.collectives)
	if c.GradResidency = j.residency; mode == engine.Native {
		c.GradResidency = engine.ResidencyWhole
	}
	if j.cpu {
		c.Device, c.Threads, c.LinkBandwidth = device.CPU, o.threads, int64(o.linkBandwidth)
		if c.Collectives == train.CollectivesAuto {
			c.Collectives = train.CollectivesHost // the CPU backend has no device communicator
		}
	}
	return c
}

// engineConfig is the engine configuration of mode, as lsp-train would
// build it.
func (o planOptions) engineConfig(j planJob, mode engine.Mode) engine.Config {
	return train.EngineConfig(o.trainConfig(j, mode))
}

func planCmd(args []string, stdout io.Writer, stderr *os.File) error {
	fs, o := planFlags()
	if err := parseSubcommandFlags(fs, args, stderr, "lsp-train plan [flags]",
		"Predicts, without training or reading weights, whether --model fits the device and host memory of a\n"+
			"machine in each update mode and how long a step takes: the engine's own step graph, traced op by op,\n"+
			"costed against the machine's peak rates and simulated stream by stream (train/plan says how)."); err != nil {
		return err
	}
	j, err := o.parse()
	if err != nil {
		return err
	}
	modelGiven := false
	fs.Visit(func(f *flag.Flag) { modelGiven = modelGiven || f.Name == "model" })
	if !modelGiven && !j.cpu {
		return o.printWhatFits(stdout, j)
	}
	if j.cpu {
		if j.machine, err = o.cpuMachine(j, stdout); err != nil {
			return err
		}
	}
	m := j.machine
	fmt.Fprintf(stdout, "%s: %.3gB parameters; micro-batch %d x %d, %d per step, %v (grads %v), %s schedule\n",
		o.model, float64(j.spec.NumParams())/1e9, o.batch, o.seqLen, o.accum, j.dt, j.gdt, o.schedule)
	fmt.Fprintf(stdout, "machine: %s (%s memory); %s; host %s (%s, %.0f GB/s)\n", m.GPU.Name, gibs(m.GPU.Memory),
		m.Link.Name, m.Host.Name, gibs(m.Host.Memory), m.Host.MemBW/1e9)
	fmt.Fprintln(stdout, figuresLine(m, j.gpuCalib))
	if m.Ranks > 1 {
		where := "on the GPUs (NCCL)"
		if o.trainConfig(j, engine.LSP).Collectives == train.CollectivesHost {
			where = "on the host (MPI, through pinned memory)"
		}
		fmt.Fprintf(stdout, "data parallelism: %d ranks (one process and GPU each), %s (%.3g GB/s per rank, %s per message), sums %s; every figure is one rank's\n",
			m.Ranks, m.Net.Name, m.Net.Bandwidth/1e9, secs(m.Net.Latency), where)
	}
	fmt.Fprintln(stdout)
	reports := make([]plan.Report, len(j.modes))
	settings := make([]model.Recompute, len(j.modes))
	for i, mode := range j.modes {
		tc := o.trainConfig(j, mode)
		mems, residencies, err := recomputePlans(j.spec, tc, m.Ranks, m.GPU.Budget())
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		need, someInBudget := leastRecompute(mems, m.GPU.Budget())
		if j.auto {
			tc.Recompute = need
		}
		settings[i] = tc.Recompute
		mem := mems[tc.Recompute]
		auto := tc.GradResidency == engine.ResidencyAuto
		tc.GradResidency = residencies[tc.Recompute]
		c := plan.Config{Arch: j.spec, B: o.batch, T: o.seqLen, Accum: o.accum, DType: j.dt, Engine: train.EngineConfig(tc), Memory: &mem,
			DeviceCollectives: tc.Collectives != train.CollectivesHost}
		r, err := plan.Plan(c, m)
		if err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
		reports[i] = r
		printReport(stdout, mode, r, m)
		printRecompute(stdout, mems, tc.Recompute, need, someInBudget, j.auto)
		if offloadsGrads(tc) {
			if err := printResidency(stdout, j.spec, tc, m, mem, auto, o.accum); err != nil {
				return fmt.Errorf("%s: %w", mode, err)
			}
		}
		if o.timeline != "" {
			path := o.timeline
			if len(j.modes) > 1 {
				ext := filepath.Ext(path)
				path = strings.TrimSuffix(path, ext) + "-" + string(mode) + ext
			}
			title := fmt.Sprintf("%s %s on %s: step %.3g s", o.model, mode, m.GPU.Name, r.Step)
			if err := plan.WriteTimeline(path, r.Prediction, m.Resources().Workers, title); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "  timeline: %s\n", path)
		}
		fmt.Fprintln(stdout)
	}
	tw := tabwriter.NewWriter(stdout, 2, 8, 2, ' ', tabwriter.AlignRight)
	net := func(r plan.Report) string { return "" }
	head := "mode\trecompute\tdevice\thost\tfits\tstep\ttokens/s\tbound\toverlap\t"
	if m.Ranks > 1 {
		head += "net/step\tnet time\t"
		net = func(r plan.Report) string { return gibs(r.NetBytes) + "\t" + secs(r.NetSeconds) + "\t" }
	}
	fmt.Fprintln(tw, head)
	for i, r := range reports {
		fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\t%s\t%.0f\t%s\t%.2f\t%s\n", j.modes[i], settings[i], gibs(r.Memory.DeviceTotal()), gibs(r.Memory.HostPeak()),
			fits(r), secs(r.Step), r.TokensPerSec, r.Bound, r.Overlap, net(r))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i, r := range reports {
		if r.RefreshSeconds > 0 {
			every := o.galoreEvery
			fmt.Fprintf(stdout, "%s: projector refresh of every matrix %s (randomized SVDs, one matrix at a time), every %d steps: %s a step on average\n",
				j.modes[i], secs(r.RefreshSeconds), every, secs(r.RefreshSeconds/float64(max(every, 1))))
		}
		if r.FitSeconds > 0 {
			fmt.Fprintf(stdout, "%s: projector fits of one check %s (every fit for its whole --fit-iters budget; calibration passes not counted)\n",
				j.modes[i], secs(r.FitSeconds))
		}
	}
	for _, mode := range j.modes {
		if err := o.printSVDRefresh(stdout, j, mode); err != nil {
			return err
		}
	}
	answers := make([]answer, len(j.modes))
	for i, mode := range j.modes {
		if answers[i], err = o.answerMode(j, mode, m); err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
	}
	fmt.Fprintln(stdout)
	printAnswers(stdout, *o, answers, m)
	return nil
}

// printSVDRefresh states the cost of --projector svd's refresh, once per
// check: the randomized SVDs of every input's stacked gradient and of
// each of its readers' (rsvd.FLOPs), on the device but for the host's
// small factorisations; nothing unless mode's projectors are svd.
func (o planOptions) printSVDRefresh(w io.Writer, j planJob, mode engine.Mode) error {
	c := o.engineConfig(j, mode)
	if mode != engine.LSP || c.LSP.Projector != lsp.KindSVD {
		return nil
	}
	groups, err := lsp.SVDGroups(j.spec, c.LSP)
	if err != nil {
		return err
	}
	var flops float64
	svds := 0
	for _, g := range groups {
		flops += float64(g.Count) * g.FLOPs()
		svds += g.Count * (1 + len(g.Ns)*min(1, len(g.Ns)-1))
	}
	t, err := plan.SVDRefreshTime(plan.Config{Arch: j.spec, Engine: c}, j.machine)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s: svd refresh of one check (every --check-every steps, %d steps by default): %.3g FLOPs in %d randomized SVDs "+
		"(k = d, oversampling %d, %d power iterations; calibration passes not counted), %s predicted (the host's factorisations at %.3g flop/s)\n",
		mode, train.Defaults().CheckEvery, flops, svds, lsp.SVDOversample, lsp.SVDPower, secs(t), plan.HostJacobiRate)
	return err
}

// cpuMachine is --gpu cpu: the CPU backend of this machine from its
// calibration, read from --calibration or measured now at the model's
// shapes (every mode's GEMMs, the other ops at its geometry) within
// --calibrate-budget, with the memory and host overrides applied.
func (o planOptions) cpuMachine(j planJob, stdout io.Writer) (plan.Machine, error) {
	var c calibrate.CPU
	var err error
	if o.calibration != "" {
		if c, err = calibrate.ReadFile(o.calibration); err != nil {
			return plan.Machine{}, fmt.Errorf("--calibration: %w", err)
		}
	} else {
		var gemms []calibrate.GemmShape
		for _, mode := range j.modes {
			_, ops, err := plan.Trace(j.spec, o.batch, o.seqLen, o.accum, j.dt, o.engineConfig(j, mode))
			if err != nil {
				return plan.Machine{}, fmt.Errorf("%s: %w", mode, err)
			}
			for _, op := range ops {
				g := op.Gemm
				if s := (calibrate.GemmShape{TransA: g.TransA, TransB: g.TransB, M: g.M, N: g.N, K: g.K}); op.Family == trace.Gemm && !slices.Contains(gemms, s) {
					gemms = append(gemms, s)
				}
			}
		}
		size, err := calibrate.SizeOf(j.spec, o.batch, o.seqLen)
		if err != nil {
			return plan.Machine{}, fmt.Errorf("--model: %w", err)
		}
		size.D, size.R = o.d, o.r
		fmt.Fprintf(stdout, "calibrating the CPU backend (%d GEMM shapes, about %v)...\n", len(gemms), o.calibBudget)
		if c, err = calibrate.Measure(context.Background(), calibrate.Options{Threads: o.threads, Gemms: gemms,
			Ops: []calibrate.OpSize{size}, Budget: o.calibBudget}); err != nil {
			return plan.Machine{}, err
		}
	}
	m, err := plan.FromCalibration(c, cpu.Config{LinkBandwidth: float64(o.linkBandwidth), MemBudget: int64(o.deviceMem)})
	if err != nil {
		return plan.Machine{}, err
	}
	if o.hostBW > 0 {
		m.Host.MemBW = float64(o.hostBW)
	}
	if o.hostMem > 0 {
		m.Host.Memory = int64(o.hostMem)
	}
	if o.hostWorkers > 0 {
		m.Host.Workers = o.hostWorkers
	}
	if j.dt != backend.F32 {
		fmt.Fprintf(stdout, "note: the calibration times fp32 ops; %v steps are predicted at those speeds\n", j.dt)
	}
	m.Ranks, m.Net = j.machine.Ranks, j.machine.Net
	return m, nil
}

// recomputePlans is the memory plan of c (one rank of ranks) under each
// recompute setting, by setting, with the gradient residency of each
// (--grad-residency auto resolved against a device of budget bytes).
func recomputePlans(spec model.Spec, c train.Config, ranks int, budget int64) ([]engine.Memory, []engine.GradResidency, error) {
	plans := make([]engine.Memory, len(model.Recomputes))
	residencies := make([]engine.GradResidency, len(model.Recomputes))
	for _, rc := range model.Recomputes {
		c.Recompute = rc
		rcfg, err := train.ResolveGradResidency(spec, c, ranks, budget)
		if err != nil {
			return nil, nil, err
		}
		p, err := train.MemoryOfRanks(spec, rcfg, ranks)
		if err != nil {
			return nil, nil, err
		}
		plans[rc], residencies[rc] = p, rcfg.GradResidency
	}
	return plans, residencies, nil
}

// offloadsGrads reports whether c's gradients (lsp's S) go to a host
// optimizer, so that where they wait on the device is a choice: zero's
// and lsp's always, lora's dense parameters' with --dense-params host
// (its adapters are updated on the device).
func offloadsGrads(c train.Config) bool {
	switch c.Mode {
	case engine.Zero, engine.LSP:
		return true
	case engine.LoRA:
		return train.EngineConfig(c).DenseParams == engine.DenseHost
	}
	return false
}

// printResidency says where zero mode's gradients (lsp's S and
// projectors) wait on the device and what the other residency would
// need: the ring's saving of device memory, and its cost, the gradients
// (S) down once per micro-batch, the host's fp32 accumulator (sums) and
// lsp's projectors up once per micro-batch.
func printResidency(w io.Writer, spec model.Spec, c train.Config, m plan.Machine, used engine.Memory, auto bool, accum int) error {
	other := c
	other.GradResidency = engine.ResidencyWhole
	if c.GradResidency != engine.ResidencyRing {
		other.GradResidency = engine.ResidencyRing
	}
	what := "gradients"
	switch c.Mode {
	case engine.LSP:
		what = "S and projectors"
	case engine.LoRA:
		what = "dense gradients"
	}
	if m.Ranks > 1 && other.GradResidency == engine.ResidencyRing {
		fmt.Fprintf(w, "%s (--grad-residency %s): whole on the device (the ring is for one rank)\n", what, c.GradResidency)
		return nil
	}
	alt, err := train.MemoryOfRanks(spec, other, m.Ranks)
	if err != nil {
		return err
	}
	whole, ring := alt, used
	if c.GradResidency != engine.ResidencyRing {
		whole, ring = used, alt
	}
	how := "--grad-residency " + c.GradResidency.String()
	if auto {
		how = "auto: " + c.GradResidency.String()
	}
	var acc int64
	for _, p := range ring.Host {
		if p.Name == "ring grad accumulator" || p.Name == "S sums (fp32)" {
			acc = p.Bytes
		}
	}
	fmt.Fprintf(w, "%s (%s): the ring keeps %s less on the device (%s against whole's %s)",
		what, how, gibs(whole.DeviceTotal()-ring.DeviceTotal()), gibs(ring.DeviceTotal()), gibs(whole.DeviceTotal()))
	if ring.LinkD2H == whole.LinkD2H {
		fmt.Fprintf(w, " for the same %s down per step", gibs(ring.LinkD2H))
	} else {
		fmt.Fprintf(w, "; it sends %s down per step instead of %s (each of the %d micro-batches' %s)", gibs(ring.LinkD2H), gibs(whole.LinkD2H), accum, what)
	}
	if ring.LinkH2D != whole.LinkH2D {
		fmt.Fprintf(w, ", %s up instead of %s (the projectors, uploaded for each micro-batch's backward)", gibs(ring.LinkH2D), gibs(whole.LinkH2D))
	}
	if acc > 0 {
		fmt.Fprintf(w, " and sums them on the host in a %s fp32 accumulator, read and written once per micro-batch", gibs(acc))
	}
	fmt.Fprintln(w)
	return nil
}

// leastRecompute is the first recompute setting whose plan fits a
// device of mem bytes; the last (the most recomputation) and false when
// none does.
func leastRecompute(plans []engine.Memory, mem int64) (model.Recompute, bool) {
	for _, rc := range model.Recomputes {
		if plans[rc].DeviceTotal() <= mem {
			return rc, true
		}
	}
	return model.Recomputes[len(model.Recomputes)-1], false
}

// printRecompute says what each recompute setting needs of the device
// and which one the model needs to fit it.
func printRecompute(w io.Writer, plans []engine.Memory, used, need model.Recompute, someInBudget, auto bool) {
	parts := make([]string, len(plans))
	for rc, p := range plans {
		parts[rc] = fmt.Sprintf("%v %s", model.Recompute(rc), gibs(p.DeviceTotal()))
	}
	verdict := "does not fit even with --recompute layer"
	switch {
	case someInBudget && need == model.RecomputeNone:
		verdict = "fits without recompute"
	case someInBudget:
		verdict = fmt.Sprintf("needs --recompute %v to fit", need)
	}
	how := "--recompute " + used.String()
	if auto {
		how = "auto: " + used.String()
	}
	fmt.Fprintf(w, "recompute (%s): device memory %s; %s\n", how, strings.Join(parts, ", "), verdict)
}

func fits(r plan.Report) string {
	switch {
	case r.DeviceInBudget && r.HostInBudget:
		return "yes"
	case !r.DeviceInBudget && !r.HostInBudget:
		return "no (device, host)"
	case !r.DeviceInBudget:
		return "no (device)"
	}
	return "no (host)"
}

func printReport(w io.Writer, mode engine.Mode, r plan.Report, m plan.Machine) {
	verdict := func(ok bool) string {
		if ok {
			return "fits"
		}
		return "does NOT fit"
	}
	fmt.Fprintf(w, "== %s ==\n", mode)
	fmt.Fprintf(w, "device memory %s of %s: %s\n", gibs(r.Memory.DeviceTotal()), budgetString(m.GPU), verdict(r.DeviceInBudget))
	for _, p := range r.Memory.Device {
		fmt.Fprintf(w, "  %-48s %12s\n", p.Name, gibs(p.Bytes))
	}
	fmt.Fprintf(w, "host memory %s peak of %s: %s\n", gibs(r.Memory.HostPeak()), gibs(m.Host.Memory), verdict(r.HostInBudget))
	for _, p := range r.Memory.Host {
		fmt.Fprintf(w, "  %-48s %12s\n", p.Name, gibs(p.Bytes))
	}
	if r.Memory.DeviceOnHost {
		fmt.Fprintf(w, "  %-48s %12s\n", "device memory (cpu backend)", gibs(r.Memory.DeviceTotal()))
	}
	big := r.Memory.LargestTransient()
	for _, p := range r.Memory.Transient {
		mark := ""
		if p == big {
			mark = " (the peak's)"
		}
		fmt.Fprintf(w, "  %-48s %12s\n", "one at a time: "+p.Name+mark, gibs(p.Bytes))
	}
	fmt.Fprintf(w, "link per step: %s down, %s up (gradients, S, Delta, weights; the batch adds %s up)\n",
		gibs(r.Memory.LinkD2H), gibs(r.Memory.LinkH2D), gibs(r.Memory.BatchH2D))
	fmt.Fprintf(w, "step %s predicted: %.0f tokens/s\n", secs(r.Step), r.TokensPerSec)
	if mode == engine.LoRA && r.Step > 0 {
		fmt.Fprintf(w, "  lora adapters: %d GEMMs (unfused), %s costed alone, %.1f%% of the step\n",
			r.AdapterGemms, secs(r.AdapterSeconds), 100*r.AdapterSeconds/r.Step)
	}
	if m.Ranks > 1 {
		fmt.Fprintf(w, "  network: %s sent and as much received per rank and step; collectives %s (on a lane of their own)\n",
			gibs(r.NetBytes), secs(r.NetSeconds))
	}
	fmt.Fprintf(w, "  busy: compute %s, d2h %s, h2d %s, host %s; overlap %.2f (sum of busy times / step)\n",
		secs(r.Busy[engine.Compute]), secs(r.Busy[engine.D2H]), secs(r.Busy[engine.H2D]), secs(r.Busy[engine.Host]), r.Overlap)
	fmt.Fprintf(w, "  critical path: %s bound (compute %s, link %s, host %s over %d nodes)\n", r.Bound,
		secs(r.OnPath[plan.ComputeBound]), secs(r.OnPath[plan.LinkBound]), secs(r.OnPath[plan.HostBound]), len(r.Critical))
}

func gibs(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.2f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}

func secs(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%.3f s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.2f ms", s*1e3)
	}
	return fmt.Sprintf("%.1f us", s*1e6)
}

// budgetString says what a run on g may allocate and where it comes from:
// --device-mem, or the card less the CUDA context and the backend's
// headroom.
func budgetString(g plan.GPU) string {
	switch {
	case g.DeviceMem > 0:
		return gibs(g.DeviceMem) + " (--device-mem)"
	case g.SharesHost:
		return gibs(g.Memory)
	}
	return fmt.Sprintf("%s usable (the card's %s less %s of CUDA context and %s the backend leaves to CUDA)",
		gibs(g.Budget()), gibs(g.Memory), gibs(g.Context), gibs(g.Memory-g.Context-g.Budget()))
}

// figuresLine says which of the machine's figures are measured and which
// assumed: a GPU preset's peaks and bandwidths are datasheet figures (or
// derived from them, cited in train/plan/machine.go), its op efficiencies
// and CUDA context assumptions (unless a GPU calibration, c, measured
// them); --device-mem changes the budget only, the preset's speeds stay.
func figuresLine(m plan.Machine, c *plan.GPUCalibration) string {
	if m.GPU.SharesHost {
		return "figures: measured on this machine (the calibration), the link as --link-bandwidth charges it"
	}
	line := "figures: the GPU's peaks, bandwidths and the link from datasheets (cited in train/plan/machine.go); " +
		"op efficiencies, the CUDA context and the host's Adam rate assumed; nothing measured on a GPU"
	if c != nil {
		line = "figures: the GPU's peaks, bandwidths and the link from datasheets (cited in train/plan/machine.go); " +
			"op efficiencies measured by --calibration (" + c.String() + "); the host's Adam rate assumed"
		if c.Context == 0 {
			line += "; the CUDA context assumed"
		}
	}
	if m.GPU.DeviceMem > 0 {
		line += fmt.Sprintf("; --device-mem %s: the speeds of the %s with that budget", gibs(m.GPU.DeviceMem), m.GPU.Name)
	}
	return line
}
