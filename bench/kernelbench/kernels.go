//go:build cuda || cudasim

// Package kernelbench times the CUDA kernels at the shapes a model trains at
// (make bench-kernels): GPT-2 124M and one layer of LLaMA 7B (its
// embedding and head included), each in native mode (GEMM, attention,
// norms, activations, embedding, loss, AdamW) and in lsp mode (the
// sparse compress, S and apply kernels).
//
// The ops and their shapes are the engine's own: a real step runs first
// (bench/internal/steps, so every buffer holds what a step leaves), then
// each device node of the compute stream of the step's graph
// (engine.Graph) is run again -runs times on its own, with the L2 cache
// flushed before each run by filling a 256 MiB buffer; every op in it is
// timed by a pair of events (trace.WrapTimed). Each backend op is one
// launcher of kernels/launchers_gen.go; Scale, Accumulate and the casts,
// which such a step does not run, are run on their own at the size of
// the first block matrix. The table has, per op and shape,
// the median time, the achieved TFLOP/s (GEMM, attention) or GB/s (the
// rest: the bytes the op reads and writes), and the ratio to the device's
// peak when train/plan has a preset of that GPU.
//
// Under -tags cuda each bf16 GEMM row is also timed as cuBLAS's
// cublasGemmEx (cublas_cuda.go; cuBLAS is loaded at run time, and the
// column skipped with a line where it is absent).
//
// With a train/plan preset of the GPU, each job and mode also gets the
// planner's prediction of its ops beside the measured times, by family;
// -calibration FILE writes the efficiencies measured that way
// (plan.GPUCalibration), which lsp-train plan --calibration reads. It is
// a package so that the GPU bundle's one binary (lsp-train
// bench-kernels) runs it as bench/kernels does.
// The flush is per node (a layer's forward, say), not between the ops inside
// it. Under -tags cudasim it runs tiny and llama-tiny at 2 x 16 tokens,
// once, without the flush, and says the figures are simulated.
package kernelbench

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/lsp-offload/lsp-offload/bench/internal/gpubench"
	"github.com/lsp-offload/lsp-offload/bench/internal/steps"
	"github.com/lsp-offload/lsp-offload/cuda"
	"github.com/lsp-offload/lsp-offload/kernels"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/plan"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// flushBytes is the buffer filled before each run: larger than any
// GPU's L2 (50 MiB on an H100).
const flushBytes = 256 << 20

// Run parses args and times the kernels, printing to stdout.
func Run(args []string) error {
	fs := flag.NewFlagSet("bench-kernels", flag.ContinueOnError)
	o := options{}
	fs.IntVar(&o.runs, "runs", 10, "runs of each node (the median is reported)")
	models := fs.String("models", "gpt2,llama-7b-layer", "the jobs, comma-separated: gpt2 (4 x 1024), llama-7b-layer (one layer of LLaMA 7B, 1 x 2048); tiny and llama-tiny at 2 x 16 on the simulated runtime")
	modes := fs.String("modes", "native,lsp", "the update modes, comma-separated: native, zero, lsp")
	fs.StringVar(&o.calibration, "calibration", "", "write the per-family efficiencies measured against train/plan's preset of this GPU to `FILE` (lsp-train plan --gpu G --calibration FILE reads it)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, m := range strings.Split(*models, ",") {
		if m != "gpt2" && m != "llama-7b-layer" {
			return fmt.Errorf("-models: unknown job %q (want gpt2, llama-7b-layer)", m)
		}
		o.models = append(o.models, m)
	}
	for _, m := range strings.Split(*modes, ",") {
		mode, err := engine.ParseMode(m)
		if err != nil || (mode != engine.Native && mode != engine.Zero && mode != engine.LSP) {
			return fmt.Errorf("-modes: %q: want native, zero or lsp", m)
		}
		o.modes = append(o.modes, mode)
	}
	return run(o)
}

// options are Run's flags.
type options struct {
	runs        int
	models      []string
	modes       []engine.Mode
	calibration string
}

// job is a model at a micro-batch.
type job struct {
	name string
	spec model.Spec
	B, T int
}

// jobs are the named jobs (-models), at their small stand-ins on the
// simulated runtime.
func jobs(names []string) ([]job, error) {
	var js []job
	for _, n := range names {
		var j job
		var err error
		switch {
		case simulated && n == "gpt2":
			j.name, j.B, j.T = "tiny", 2, 16
			j.spec, err = catalog.Preset("tiny")
		case simulated:
			j.name, j.B, j.T = "llama-tiny", 2, 16
			j.spec, err = catalog.Preset("llama-tiny")
		case n == "gpt2":
			j.name, j.B, j.T = "gpt2", 4, 1024
			j.spec, err = catalog.Preset("gpt2")
		default:
			j.name, j.B, j.T = "llama-7b, one layer", 1, 2048
			var l llama.Config
			if l, err = llama.Preset("llama-7b"); err == nil {
				l.NumLayers = 1
				j.spec = l
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		js = append(js, j)
	}
	return js, nil
}

func run(o options) error {
	runs := o.runs
	probe, err := gpubench.OpenCUDA("bench-kernels")
	if probe == nil || err != nil {
		return err
	}
	var peak *plan.GPU
	var devName string
	if d, ok := probe.(interface{ Device() cuda.DeviceInfo }); ok {
		fmt.Printf("device: %v\n", d.Device())
		devName = d.Device().Name
		peak = presetOf(devName)
	}
	if err := probe.Close(); err != nil {
		return err
	}
	if simulated {
		fmt.Println("SIMULATED: the simulated CUDA runtime (-tags cudasim) runs the kernels on the CPU; these are not a GPU's figures")
		runs, peak = 1, nil
	}
	if peak != nil {
		fmt.Printf("peaks (train/plan preset %s): bf16 tensor %.0f TFLOP/s, fp32 %.1f TFLOP/s, memory %.0f GB/s\n",
			peak.Name, peak.PeakBF16/1e12, peak.PeakF32/1e12, peak.MemBW/1e9)
	} else {
		fmt.Println("peaks: unknown for this device (no train/plan preset): no ratio column")
	}
	if why := cublasMissing(); why != "" {
		fmt.Printf("no cuBLAS column: %s\n", why)
	} else {
		fmt.Println("cuBLAS: each GEMM row also timed as cublasGemmEx (bf16 in and out, fp32 accumulate), same runs and flush; speed vs cublas = its time over ours (1: as fast, below 1: slower)")
	}
	pm, err := newPredictor(devName)
	if err != nil {
		return err
	}
	js, err := jobs(o.models)
	if err != nil {
		return err
	}
	seen := map[string]bool{} // backend methods timed
	total := familySums{}
	for _, j := range js {
		for _, mode := range o.modes {
			fs := familySums{}
			if err := bench(j, mode, runs, peak, seen, pm, fs); err != nil {
				return fmt.Errorf("%s %s: %w", j.name, mode, err)
			}
			fs.print(pm, fmt.Sprintf("%s, %s mode", j.name, mode))
			total.add(fs)
		}
	}
	// The launchers no step above ran (backend.KernelDTypes names each
	// op's launcher; extraOps ran CopyD2D between fp32 and bf16 both
	// ways, which the casts launch).
	covered := map[string]bool{"lsp_cast_f32_to_bf16": true, "lsp_cast_bf16_to_f32": true}
	for _, o := range backend.KernelDTypes() {
		if seen[o.Op] {
			covered[o.Launcher] = true
		}
	}
	var missed []string
	for _, l := range kernels.Launchers {
		if l.Returns == "cudaError_t" && !covered[l.C] {
			missed = append(missed, l.Name)
		}
	}
	fmt.Printf("\nlaunchers of kernels/launchers_gen.go timed above: %d of %d", len(covered), len(covered)+len(missed))
	if len(missed) > 0 {
		fmt.Printf("; not run here: %s", strings.Join(missed, ", "))
	}
	fmt.Println()
	if o.calibration != "" {
		return total.writeCalibration(o.calibration, pm)
	}
	return nil
}

// presetOf is the train/plan GPU preset whose name has the device's model
// (A100, H100, H200, RTX 4090, ...), or nil.
func presetOf(name string) *plan.GPU {
	if k := presetKey(name); k != "" {
		g := plan.GPUs[k]
		return &g
	}
	return nil
}

// presetKey is the key of presetOf's preset, or "".
func presetKey(name string) string {
	n := strings.ToUpper(name)
	for _, k := range []string{"h200", "h100", "a100-80gb", "a100-40gb", "rtx4090"} {
		g := plan.GPUs[k]
		model := strings.ToUpper(strings.Fields(strings.TrimPrefix(g.Name, "NVIDIA GeForce "))[0])
		model = strings.TrimPrefix(model, "NVIDIA ")
		if k == "rtx4090" {
			model = "4090"
		}
		if strings.Contains(n, model) && (!strings.HasPrefix(k, "a100") || strings.Contains(n, strings.TrimSuffix(strings.TrimPrefix(k, "a100-"), "gb"))) {
			return k
		}
	}
	return ""
}

// bench runs j's step once in mode, then each compute node runs times,
// and prints a row per op and shape.
func bench(j job, mode engine.Mode, runs int, peak *plan.GPU, seen map[string]bool, pm *predictor, fs familySums) error {
	be, err := device.Open(device.Config{Kind: device.CUDA})
	if err != nil {
		return err
	}
	w := trace.WrapTimed(be)
	ec := steps.Config(mode, false, 0)
	r, err := steps.StartOn(w, steps.Job{Preset: j.name, Spec: j.spec, B: j.B, T: j.T}, ec, backend.BF16)
	if err != nil {
		return err
	}
	defer r.Close()
	g, err := r.Engine().Graph()
	if err != nil {
		return err
	}
	s := be.DefaultStream()
	var flush backend.Tensor
	if !simulated {
		if flush, err = be.Alloc("l2 flush", flushBytes/4, backend.F32); err != nil {
			return err
		}
		defer be.Free(flush)
	}
	if _, err := w.Times(); err != nil { // the warm-up's
		return err
	}
	w.Reset()
	for _, n := range g.Nodes {
		if n.Queue != engine.Compute {
			continue
		}
		for range runs {
			if flush.Buf != nil {
				if err := be.Fill(s, flush, 0); err != nil {
					return err
				}
			}
			if err := n.Run(s); err != nil {
				return fmt.Errorf("%s: %w", n.Name, err)
			}
		}
		if err := be.Synchronize(s); err != nil {
			return fmt.Errorf("%s: %w", n.Name, err)
		}
	}
	if mode == engine.Native {
		// The launchers a step of this shape does not run (gradient
		// accumulation's Scale and Accumulate, the casts of CopyD2D
		// between dtypes), on a tensor the size of the first block
		// matrix, as they would run on its gradient or weights.
		if err := extraOps(w, be, j.spec.Matrices()[0], runs, flush); err != nil {
			return err
		}
	}
	ops, err := w.Times()
	if err != nil {
		return err
	}
	type row struct {
		op    trace.Op
		times []float64
	}
	var rows []*row
	byKey := map[string]*row{}
	for _, o := range ops {
		seen[o.Method] = true
		k := fmt.Sprintf("%s %v %v %+v", o.Method, o.DType, o.Shapes, o.Gemm)
		if byKey[k] == nil {
			byKey[k] = &row{op: o}
			rows = append(rows, byKey[k])
		}
		byKey[k].times = append(byKey[k].times, o.Seconds)
	}
	slices.SortStableFunc(rows, func(a, b *row) int { return strings.Compare(string(a.op.Family), string(b.op.Family)) })
	fmt.Printf("\n== %s, %s mode, micro-batch %d x %d, bf16: %d ops of %d kinds, each run %d times ==\n",
		j.name, mode, j.B, j.T, len(ops), len(rows), runs)
	head := ""
	haveCublas := cublasMissing() == ""
	if haveCublas {
		head = fmt.Sprintf(" %10s %6s", "cublas us", "speed vs cublas")
	}
	fmt.Printf("%-11s %-26s %-44s %6s %10s %12s %6s%s\n", "family", "op", "shapes", "calls", "median us", "achieved", "/peak", head)
	for _, x := range rows {
		st := gpubench.Summarize(x.times)
		o := x.op
		rate, unit, top := o.FLOPs/st.Median/1e12, "TFLOP/s", 0.0
		if o.Family != trace.Gemm && o.Family != trace.Attention {
			rate, unit = float64(o.Bytes)/st.Median/1e9, "GB/s"
		}
		if peak != nil {
			switch {
			case unit == "GB/s":
				top = peak.MemBW / 1e9
			case o.DType == backend.BF16:
				top = peak.PeakBF16 / 1e12
			default:
				top = peak.PeakF32 / 1e12
			}
		}
		ratio := "-"
		if top > 0 && st.Median > 0 {
			ratio = fmt.Sprintf("%.2f", rate/top)
		}
		name := o.Method
		if o.Method == "CopyD2D" {
			name = fmt.Sprintf("CopyD2D %v", o.DType)
		}
		if o.Family == trace.Gemm {
			name = fmt.Sprintf("Gemm %s M%d N%d K%d", trans(o.Gemm), o.Gemm.M, o.Gemm.N, o.Gemm.K)
		}
		cub := ""
		if haveCublas && o.Family == trace.Gemm && o.DType == backend.BF16 {
			c, err := cublasGemm(o.Gemm, runs)
			if err != nil {
				return err
			}
			cub = fmt.Sprintf(" %10.1f %6.2f", c*1e6, c/st.Median)
		}
		fmt.Printf("%-11s %-26s %-44s %6d %10.1f %8.2f %-7s %6s%s\n", o.Family, name, shapes(o.Shapes), len(x.times)/max(runs, 1),
			st.Median*1e6, rate, unit, ratio, cub)
		fs.addOp(pm, o, x.times)
	}
	return nil
}

// extraOps times Scale, Accumulate and the two casts on tensors of m's
// size through w, each run runs times after an L2 flush when flush has a
// buffer.
func extraOps(w, be backend.Backend, m model.Matrix, runs int, flush backend.Tensor) error {
	n := m.M * m.N
	s := be.DefaultStream()
	var ts [4]backend.Tensor
	for i, dt := range []backend.DType{backend.F32, backend.F32, backend.BF16, backend.F32} {
		t, err := be.Alloc(fmt.Sprintf("extra %d", i), n, dt)
		if err != nil {
			return err
		}
		defer be.Free(t)
		if err := be.Fill(s, t, 1); err != nil {
			return err
		}
		ts[i] = t
	}
	for _, op := range []func() error{
		func() error { return w.Scale(s, ts[0], 0.5) },
		func() error { return w.Accumulate(s, ts[0], ts[1]) },
		func() error { return w.CopyD2D(s, ts[2], ts[0]) }, // fp32 to bf16
		func() error { return w.CopyD2D(s, ts[3], ts[2]) }, // bf16 to fp32
	} {
		for range runs {
			if flush.Buf != nil {
				if err := be.Fill(s, flush, 0); err != nil {
					return err
				}
			}
			if err := op(); err != nil {
				return err
			}
		}
	}
	return be.Synchronize(s)
}

func trans(g trace.GemmArgs) string {
	s := [2]string{"N", "N"}
	if g.TransA {
		s[0] = "T"
	}
	if g.TransB {
		s[1] = "T"
	}
	return s[0] + s[1]
}

func shapes(s [][]int) string {
	var parts []string
	for _, v := range s {
		if v == nil {
			continue
		}
		parts = append(parts, strings.Trim(strings.ReplaceAll(fmt.Sprint(v), " ", "x"), "[]"))
	}
	out := strings.Join(parts, " ")
	if len(out) > 44 {
		out = out[:41] + "..."
	}
	return out
}
