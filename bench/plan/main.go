// Command plan checks the step planner (train/plan) against this machine:
// it calibrates the CPU backend from microbenchmarks (train/calibrate: the
// GEMMs at the exact shapes the traced steps run, the other ops at their
// geometries, overheads, the link, host Adam and the contention between
// them), builds the planner's CPU machine from that alone
// (plan.FromCalibration: nothing is fitted to a step time), predicts each
// configuration's step, then times the real engine on the CPU backend
// (median of several steps after a warm-up) and prints both side by side.
// Configurations: tiny and gpt2 in native, zero and lsp mode, sequential
// and pipelined, and pipelined with --recompute layer (whose recomputed
// forward the plan must price), and llama-tiny, chosen after the model was
// built (a family, attention layout and MLP the model was not checked on
// while it was written). The last line is "plan-vs-measured: X", X the worst
// max(pred/meas, meas/pred).
//
// Then, for the worst row, a per-family breakdown: the same configuration
// stepped once more with every op timed on its stream by a pair of events
// (trace.WrapTimed), against the predicted time of each family.
//
// Calibration and measurement run interleaved in one process: for each
// group of configurations (all nine of a model stepped in turn, or each
// mode's three for gpt2, whose nine engines would not fit in memory
// together), the engines are started, then the model's calibration runs
// and every engine takes one step between two rounds of its op timings
// (calibrate.Options.Between), so that the calibration and the steps it
// predicts span the same seconds: this machine's speed drifts by up to 2x
// over tens of seconds (other virtual machines share the host). A fixed
// GEMM timed before and after each group (the probe column: 1, then the
// end's speed over the start's) shows by how much. The load average at the
// start and the end says how shared this virtual machine was.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/lsp-offload/lsp-offload/bench/internal/steps"
	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/calibrate"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/plan"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// job is one model at one batch; chosen marks the configuration picked
// after the model was built.
type job struct {
	steps.Job
	chosen bool
}

var jobs = []job{
	{Job: steps.Job{Preset: "tiny", B: 32, T: 24, Warm: 2, Steps: 25}},
	{Job: steps.Job{Preset: "gpt2", B: 2, T: 128, Warm: 1, Steps: 5}},
	{Job: steps.Job{Preset: "llama-tiny", B: 16, T: 64, Warm: 2, Steps: 21}, chosen: true},
}

var modes = []engine.Mode{engine.Native, engine.Zero, engine.LSP}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench plan:", err)
		os.Exit(1)
	}
}

// row is one configuration's prediction and measurement.
type row struct {
	j         job
	mode      engine.Mode
	pipelined bool
	recompute model.Recompute
	pred      plan.Report
	meas      steps.Result
	// probe is the machine's speed before and after the measurement over
	// its median speed during the calibrations.
	probe [2]float64
}

func (r row) ratio() float64 { return r.pred.Step / r.meas.Median() }

func worst(x float64) float64 { return max(x, 1/x) }

func schedName(p bool) string {
	if p {
		return "pipelined"
	}
	return "sequential"
}

// config is the engine configuration the row times.
func (r row) config(threads int) engine.Config {
	ec := steps.Config(r.mode, r.pipelined, threads)
	ec.Recompute = r.recompute
	return ec
}

// name is the row's schedule, and its recompute setting when it has one.
func (r row) name() string {
	if r.recompute != model.RecomputeNone {
		return schedName(r.pipelined) + "+" + r.recompute.String()
	}
	return schedName(r.pipelined)
}

func run() error {
	threads := flag.Int("threads", runtime.NumCPU(), "backend compute threads and host Adam workers")
	budget := flag.Duration("budget", 20*time.Second, "calibration time to aim for, per model")
	calib := flag.String("calibration", "", "read the calibration from this `FILE` (bench/calibrate -o) instead of measuring")
	only := flag.String("models", "", "comma-separated presets to run (default: all)")
	breakdown := flag.Bool("breakdown", true, "time the worst row's ops one by one and print a per-family breakdown")
	verbose := flag.Bool("v", false, "print every timed step of each row")
	flag.Parse()
	host.SetThreads(*threads)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var run []job
	for _, j := range jobs {
		if *only == "" || slices.Contains(strings.Split(*only, ","), j.Preset) {
			run = append(run, j)
		}
	}
	if len(run) == 0 {
		return fmt.Errorf("-models %q: none of tiny, gpt2, llama-tiny", *only)
	}
	fmt.Printf("plan vs measured: CPU backend, %d threads, SIMD %v, fp32, dense parameters on the device, link not charged\n",
		*threads, host.ActiveSIMD())
	fmt.Printf("load average at start: %s\n", steps.LoadAvg())

	var rows []row
	machines := map[string]plan.Machine{} // by model/mode
	var fileCal *calibrate.CPU
	if *calib != "" {
		c, err := calibrate.ReadFile(*calib)
		if err != nil {
			return fmt.Errorf("-calibration: %w", err)
		}
		fileCal = &c
		fmt.Printf("calibration: read from %s (%d threads)\n", *calib, c.Threads)
	}
	pr, err := newProbe(*threads)
	if err != nil {
		return err
	}
	defer pr.close()
	for _, j := range run {
		spec, err := catalog.Preset(j.Preset)
		if err != nil {
			return err
		}
		var all []row
		for _, mode := range modes {
			for _, pip := range []bool{false, true} {
				all = append(all, row{j: j, mode: mode, pipelined: pip})
			}
			all = append(all, row{j: j, mode: mode, pipelined: true, recompute: model.RecomputeLayer})
		}
		grps := groups(spec, j, all, *threads)
		// Each group's steps are taken during its calibration, one round
		// (a step of every configuration) between two rounds of the
		// calibration's op timings: the machine's speed drifts (other
		// virtual machines share the host), and the calibration must
		// describe it over the time the steps were measured.
		var cals []calibrate.CPU
		var groupProbes [][2]float64
		for _, grp := range grps {
			pa, err := pr.rate()
			if err != nil {
				return err
			}
			c, err := measureGroup(ctx, spec, grp, *threads, fileCal, max(*budget/time.Duration(len(grps)), 4*time.Second))
			if err != nil {
				return err
			}
			pb, err := pr.rate()
			if err != nil {
				return err
			}
			cals, groupProbes = append(cals, c), append(groupProbes, [2]float64{pa, pb})
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		fmt.Printf("\n%s B=%d T=%d: %d groups of configurations, each predicted from the calibration its steps were taken during\n",
			j.Preset, j.B, j.T, len(grps))
		for g, grp := range grps {
			c := cals[g]
			at := groupProbes[g][0] // the probe's speed before the group
			m, err := plan.FromCalibration(c, cpu.Config{})
			if err != nil {
				return err
			}
			fmt.Printf("calibrated in %.1f s (%d GEMM shapes, %d op samples), probe %.1f GFLOP/s\n", c.Seconds, len(c.Gemm), len(c.Ops), at/1e9)
			describe(c, m)
			fmt.Printf("%-11s %3s %4s %-7s %-16s %9s %9s %6s %11s\n", "model", "B", "T", "mode", "schedule", "pred s", "meas s", "ratio", "probe")
			for _, r := range grp {
				ec := r.config(*threads)
				if r.pred, err = plan.Plan(plan.Config{Arch: spec, B: j.B, T: j.T, Accum: 1, DType: backend.F32, Engine: ec}, m); err != nil {
					return fmt.Errorf("%s %s: %w", j.Preset, r.mode, err)
				}
				r.probe = [2]float64{1, groupProbes[g][1] / at}
				rows = append(rows, r)
				machines[j.Preset+"/"+string(r.mode)] = m
				note := ""
				if j.chosen {
					note = "  (chosen after the model was built)"
				}
				fmt.Printf("%-11s %3d %4d %-7s %-16s %9.4f %9.4f %6.2f %5.2f %5.2f%s\n", j.Preset, j.B, j.T, r.mode, r.name(),
					r.pred.Step, r.meas.Median(), r.ratio(), r.probe[0], r.probe[1], note)
				if *verbose {
					fmt.Printf("  steps: %.4f\n", r.meas.Seconds)
				}
			}
		}
	}
	w := rows[0]
	for _, r := range rows {
		if worst(r.ratio()) > worst(w.ratio()) {
			w = r
		}
	}
	if *breakdown {
		// Calibrated again right before, for the same reason as above.
		m := machines[w.j.Preset+"/"+string(w.mode)]
		if fileCal == nil {
			spec, _ := catalog.Preset(w.j.Preset)
			c, err := calibrateFor(ctx, spec, w.j, *threads, *budget/2, nil)
			if err != nil {
				return err
			}
			if m, err = plan.FromCalibration(c, cpu.Config{}); err != nil {
				return err
			}
		}
		if err := familyBreakdown(w, m, *threads); err != nil {
			return err
		}
	}
	fmt.Printf("\nload average at end: %s\n", steps.LoadAvg())
	fmt.Printf("worst: %s B=%d T=%d %s %s, predicted %.4f s, measured %.4f s\n", w.j.Preset, w.j.B, w.j.T, w.mode,
		w.name(), w.pred.Step, w.meas.Median())
	fmt.Printf("plan-vs-measured: %.2f\n", worst(w.ratio()))
	return nil
}

// groupBytes is the memory the engines stepped in turn may hold together.
const groupBytes = 3 << 30

// groups splits a job's configurations into those stepped in turn: all of
// them when their engines fit groupBytes together, else each mode's rows.
func groups(spec model.Spec, j job, rows []row, threads int) [][]row {
	var total int64
	for _, r := range rows {
		mem, err := engine.MemoryOf(spec, j.B, j.T, 1, backend.F32, r.config(threads))
		if err != nil {
			return [][]row{rows} // Start reports it
		}
		total += mem.DeviceTotal() + mem.HostTotal()
	}
	if total <= groupBytes {
		return [][]row{rows}
	}
	var out [][]row
	for i, r := range rows {
		if i == 0 || r.mode != rows[i-1].mode {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], r)
	}
	return out
}

// measureGroup starts an engine per row (each warmed up), then calibrates
// at the job's shapes (or takes fileCal) and steps every engine once
// between two rounds of the calibration's op timings, j.Steps rounds, so
// that drifts of the machine's speed fall on the calibration and every row
// alike; each row's meas is its steps.
func measureGroup(ctx context.Context, spec model.Spec, grp []row, threads int, fileCal *calibrate.CPU, budget time.Duration) (calibrate.CPU, error) {
	runners := make([]*steps.Runner, len(grp))
	defer func() {
		for _, r := range runners {
			if r != nil {
				r.Close()
			}
		}
	}()
	for i, r := range grp {
		var err error
		if runners[i], err = steps.Start(r.j.Job, r.config(threads), cpu.Config{Threads: threads}, nil); err != nil {
			return calibrate.CPU{}, fmt.Errorf("%s %s %s: %w", r.j.Preset, r.mode, r.name(), err)
		}
		grp[i].meas = steps.Result{}
	}
	round := func() error {
		for i, run := range runners {
			sec, err := run.Step()
			if err != nil {
				return fmt.Errorf("%s %s %s: %w", grp[i].j.Preset, grp[i].mode, grp[i].name(), err)
			}
			grp[i].meas.Seconds = append(grp[i].meas.Seconds, sec)
		}
		return nil
	}
	if fileCal != nil {
		for range grp[0].j.Steps {
			if err := round(); err != nil {
				return calibrate.CPU{}, err
			}
		}
		return *fileCal, nil
	}
	c, err := calibrateFor(ctx, spec, grp[0].j, threads, budget, round)
	if err != nil {
		return calibrate.CPU{}, fmt.Errorf("%s: %w", grp[0].j.Preset, err)
	}
	return c, nil
}

// calibrateFor measures the CPU backend at the GEMM shapes of j's traced
// steps (every mode) and the other ops at j's geometry, calling between
// (when not nil) after each of its j.Steps rounds of op timings.
func calibrateFor(ctx context.Context, spec model.Spec, j job, threads int, budget time.Duration, between func() error) (calibrate.CPU, error) {
	var gemms []calibrate.GemmShape
	for _, mode := range modes {
		_, ops, err := plan.Trace(spec, j.B, j.T, 1, backend.F32, steps.Config(mode, true, threads))
		if err != nil {
			return calibrate.CPU{}, fmt.Errorf("%s: %w", mode, err)
		}
		for _, o := range ops {
			if o.Family == trace.Gemm {
				gemms = append(gemms, calibrate.GemmShape{TransA: o.Gemm.TransA, TransB: o.Gemm.TransB, M: o.Gemm.M, N: o.Gemm.N, K: o.Gemm.K})
			}
		}
	}
	sz, err := calibrate.SizeOf(spec, j.B, j.T)
	if err != nil {
		return calibrate.CPU{}, err
	}
	sz.D, sz.R = 512, 16
	o := calibrate.Options{Threads: threads, Gemms: gemms, Ops: []calibrate.OpSize{sz}, Budget: budget, Between: between}
	if between != nil {
		o.Rounds = j.Steps
	}
	return calibrate.Measure(ctx, o)
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// probe is a fixed GEMM, timed before and after each calibration and each
// measurement: it shows how far the machine (shared with other virtual
// machines on the same host) changed speed between them.
type probe struct {
	be      *cpu.Backend
	a, b, c backend.Tensor
}

const probeN = 384

func newProbe(threads int) (*probe, error) {
	be := cpu.New(cpu.Config{Threads: threads})
	p := &probe{be: be}
	var err error
	for _, t := range []*backend.Tensor{&p.a, &p.b, &p.c} {
		if *t, err = be.Alloc("probe", probeN*probeN, backend.F32); err != nil {
			be.Close()
			return nil, err
		}
		if err := be.Fill(be.DefaultStream(), *t, 0.5); err != nil {
			be.Close()
			return nil, err
		}
	}
	return p, nil
}

func (p *probe) close() { p.be.Close() }

// rate is the median FLOP/s of 15 GEMMs of probeN^3, each synchronized.
func (p *probe) rate() (float64, error) {
	s := p.be.DefaultStream()
	var ts []float64
	for i := range 16 {
		t0 := time.Now()
		if err := p.be.Gemm(s, false, false, probeN, probeN, probeN, 1, p.a, p.b, 0, p.c); err != nil {
			return 0, err
		}
		if err := p.be.Synchronize(s); err != nil {
			return 0, err
		}
		if i > 0 { // the first warms up
			ts = append(ts, time.Since(t0).Seconds())
		}
	}
	slices.Sort(ts)
	return 2 * probeN * probeN * probeN / ts[len(ts)/2], nil
}

// describe prints the machine the predictions use.
func describe(c calibrate.CPU, m plan.Machine) {
	fmt.Printf("machine: GEMM peak %.1f GFLOP/s, triad %.2f GB/s, op %.1f us, sync %.1f us, event %.1f us\n",
		c.GemmPeak/1e9, c.Memory.Triad/1e9, c.Overhead.Op*1e6, m.GPU.Sync*1e6, m.GPU.Event*1e6)
	fmt.Printf("  link h2d %.2f GB/s, d2h %.2f GB/s, %.1f us; host Adam %.0f M params/s + %.1f us per node\n",
		m.Link.H2D/1e9, m.Link.D2H/1e9, m.Link.Latency*1e6, c.HostAdam.Rate/1e6, c.HostAdam.Overhead*1e6)
	var keys [][2]plan.Bound
	for k := range m.GPU.Contention {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [2]plan.Bound) int {
		return strings.Compare(string(a[0])+string(a[1]), string(b[0])+string(b[1]))
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s with %s %.2f", k[0], k[1], m.GPU.Contention[k]))
	}
	fmt.Printf("  contention (rate shared/alone): %s\n", strings.Join(parts, ", "))
}

// familyBreakdown runs r's configuration once more with every op timed by
// events and prints, per op family, the predicted time (the prediction's
// parts) against the measured one, and the rest of the step.
func familyBreakdown(r row, m plan.Machine, threads int) error {
	spec, _ := catalog.Preset(r.j.Preset)
	ec := r.config(threads)
	pred, err := plan.Plan(plan.Config{Arch: spec, B: r.j.B, T: r.j.T, Accum: 1, DType: backend.F32, Engine: ec}, m)
	if err != nil {
		return err
	}
	var w *trace.Backend
	j := r.j.Job
	j.Warm, j.Steps = 1, 1
	j.Timed = func() { w.Reset() }
	res, err := steps.Measure(j, ec, cpu.Config{Threads: threads}, func(be backend.Backend) backend.Backend {
		w = trace.WrapTimed(be)
		return w
	})
	if err != nil {
		return err
	}
	recorded, err := w.Times() // the timed step's
	if err != nil {
		return err
	}
	predF := map[trace.Family]float64{}
	for _, t := range pred.Tasks {
		for _, p := range t.Parts {
			predF[p.Family] += p.Seconds
		}
	}
	measF, count, sum := trace.ByFamily(recorded)
	step := res.Seconds[0]
	fmt.Printf("\nper family, %s B=%d T=%d %s %s (the worst row), ops timed one by one:\n", r.j.Preset, r.j.B, r.j.T, r.mode, r.name())
	fmt.Printf("%-12s %5s %9s %9s %6s\n", "family", "ops", "pred s", "meas s", "ratio")
	fams := append(trace.Families(), plan.HostAdam, plan.Sync)
	for _, f := range fams {
		if predF[f] == 0 && measF[f] == 0 {
			continue
		}
		ratio := math.NaN()
		if measF[f] > 0 {
			ratio = predF[f] / measF[f]
		}
		fmt.Printf("%-12s %5d %9.4f %9.4f %6.2f\n", f, count[f], predF[f], measF[f], ratio)
	}
	fmt.Printf("the timed step took %.4f s: its ops %.4f s on their streams, the rest %.4f s (host Adam, syncs, the launcher, gaps);\n",
		step, sum, step-sum)
	fmt.Printf("predicted: host Adam %.4f s, sync %.4f s\n", predF[plan.HostAdam], predF[plan.Sync])
	// The same graph priced with these measured op times: what is left is
	// the schedule's model (and the host work).
	// Ops the timed run lacks keep the calibration's price; count them.
	mm := m
	hook, missed := plan.MeasuredOps(recorded), 0
	mm.GPU.Measured = func(o trace.Op) (float64, bool) {
		if t, ok := hook(o); ok {
			return t, true
		}
		if o.Link == trace.NoLink {
			missed++
		}
		return m.GPU.Measured(o)
	}
	pm, err := plan.Plan(plan.Config{Arch: spec, B: r.j.B, T: r.j.T, Accum: 1, DType: backend.F32, Engine: ec}, mm)
	if err != nil {
		return err
	}
	fmt.Printf("the step predicted from these measured op times (plan.MeasuredOps; %d ops not found there): %.4f s, against the timed step's %.4f s (%.2f)\n",
		missed, pm.Step, step, pm.Step/step)
	return nil
}
