// Tests of the measurements a run reports of its own steps
// (Options.Measurements) and of the step-0 eval, which the compare job
// reads (micro model, fast).

package train

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/eval"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// evalLossOf is the eval loss of the weights in the Hugging Face directory
// model on the eval split of c's data, computed outside any training run.
func evalLossOf(t *testing.T, c Config, model string) float64 {
	t.Helper()
	mc, vals, err := gpt2.LoadHF(model)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.ByName(mc.Tokenizer())
	if err != nil {
		t.Fatal(err)
	}
	ds, err := data.Load(c.Data, tok, data.Options{SeqLen: c.SeqLen, EvalFraction: c.EvalFraction, Seed: c.Seed})
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(cpu.Config{Threads: 1})
	defer be.Close()
	s := be.DefaultStream()
	m, err := gpt2.New(be, mc, c.Batch, c.SeqLen, backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	if err := backend.Upload(be, s, m.Params, vals); err != nil {
		t.Fatal(err)
	}
	l, err := eval.Loss(be, s, eval.Model{Model: m, Spec: mc, B: c.Batch, T: c.SeqLen}, ds.Eval, eval.Watch{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestRunMeasurements checks what the compare job reads from a run: the
// step-0 eval of EvalAtStart (the untouched weights' loss, and none on
// resume), and in Measurements the plan, a peak within it, link bytes per
// step equal to the plan's, and step and check times.
func TestRunMeasurements(t *testing.T) {
	model := writeModel(t, microConfig(16, 1))
	for _, mode := range []string{"native", "zero", "lsp"} {
		t.Run(mode, func(t *testing.T) {
			c := quickConfig(t, model)
			c.Mode, c.Steps, c.EvalEvery, c.EvalGenerate = engine.Mode(mode), 3, 0, 0
			c.LinkBandwidth = 1 << 40          // charged, but too fast to matter
			c.Fit, c.CheckAtStart = true, true // a check before step 1, whose time is measured
			var m Measurements
			res := mustRun(t, context.Background(), c, Options{EvalAtStart: true, Measurements: &m})
			recs, err := metrics.ReadFile(res.Metrics)
			if err != nil {
				t.Fatal(err)
			}
			var evalSteps []int
			for _, r := range recs {
				if r.EvalLoss != nil {
					evalSteps = append(evalSteps, r.Step)
				}
			}
			if !slices.Equal(evalSteps, []int{0, 3}) {
				t.Fatalf("eval records at steps %v, want [0 3]", evalSteps)
			}
			want := evalLossOf(t, c, model)
			if got := *recs[0].EvalLoss; recs[0].Step != 0 || math.Abs(got-want) > 1e-6*want {
				t.Errorf("step-0 eval loss %v (step %d), want %v: the untrained weights' loss", got, recs[0].Step, want)
			}

			p := m.Memory
			if string(p.Mode) != mode || p.DeviceTotal() <= 0 {
				t.Fatalf("Plan: mode %q, device %d", p.Mode, p.DeviceTotal())
			}
			if m.DevicePeak <= 0 || m.DevicePeak > p.DeviceTotal() {
				t.Errorf("DevicePeak %d, want in (0, plan %d]", m.DevicePeak, p.DeviceTotal())
			}
			// The summary's figures: the same peak beside the plan, and
			// the process's resident peak (Linux).
			if u := res.Memory; u.DevicePeak != m.DevicePeak || u.DevicePlanned != p.DeviceTotal() ||
				u.HostPlanned != p.HostPeak() || !u.DeviceOnHost || u.HostPeak < u.DevicePeak {
				t.Errorf("Result.Memory %+v, want device peak %d, planned %d, host planned %d, resident above the device's",
					u, m.DevicePeak, p.DeviceTotal(), p.HostPeak())
			}
			link := float64(p.LinkD2H + p.LinkH2D + p.BatchD2H + p.BatchH2D)
			if m.LinkBytesPerStep != link {
				t.Errorf("LinkBytesPerStep %v, want the plan's %v", m.LinkBytesPerStep, link)
			}
			if mode != "native" && !(m.LinkBytesPerStep > float64(p.BatchD2H+p.BatchH2D)) {
				t.Errorf("%s moves no more than the batch: %v bytes per step", mode, m.LinkBytesPerStep)
			}
			if !(m.StepSeconds > 0) || m.StepSeconds > res.Elapsed.Seconds()/3 {
				t.Errorf("StepSeconds %v with %v elapsed over 3 steps", m.StepSeconds, res.Elapsed)
			}
			if (mode == "lsp") != (m.CheckSeconds > 0) {
				t.Errorf("CheckSeconds %v in %s mode", m.CheckSeconds, mode)
			}

			// A resumed run evaluates no second step 0.
			c.Resume, c.Steps = true, 4
			mustRun(t, context.Background(), c, Options{EvalAtStart: true})
			if recs, err = metrics.ReadFile(res.Metrics); err != nil {
				t.Fatal(err)
			}
			zeros := 0
			for _, r := range recs {
				if r.Step == 0 && r.EvalLoss != nil {
					zeros++
				}
			}
			if zeros != 1 {
				t.Errorf("%d step-0 evals after a resume, want 1", zeros)
			}
		})
	}
}

// TestResidentPeak reads VmHWM from a status file, and says when there is
// none to read.
func TestResidentPeak(t *testing.T) {
	checkProcReader(t, "residentPeak", &statusPath, residentPeak, []procCase{
		{"Name:\tlsp-train\nVmPeak:\t  900 kB\nVmHWM:\t    1234 kB\nVmRSS:\t  1000 kB\n", 1234 << 10, true},
		{"Name:\tlsp-train\n", 0, false},
		{"VmHWM:\t12 MB\n", 0, false},
	})
}

// TestGenerationInPlan: an fp32 run whose evaluation generates with the
// KV cache peaks at its plan's device total exactly (the decoder is the
// plan's "generation cache"), and a bf16 run, which generates without the
// cache, plans none.
func TestGenerationInPlan(t *testing.T) {
	model := writeModel(t, microConfig(16, 1))
	c := quickConfig(t, model)
	c.Steps, c.EvalEvery = 2, 0
	var m Measurements
	mustRun(t, context.Background(), c, Options{Measurements: &m})
	if got := part(m.Memory.Device, "generation cache"); got <= 0 {
		t.Errorf("no generation cache in the fp32 plan: %s", m.Memory)
	}
	if m.DevicePeak != m.Memory.DeviceTotal() {
		t.Errorf("device high-water %d bytes, plan %d (%s): %+d off", m.DevicePeak, m.Memory.DeviceTotal(),
			deviceParts(m.Memory), m.DevicePeak-m.Memory.DeviceTotal())
	}
	c.DType = backend.BF16
	p, err := MemoryOf(microConfig(16, 1), c)
	if err != nil {
		t.Fatal(err)
	}
	if got := part(p.Device, "generation cache"); got != 0 {
		t.Errorf("a bf16 plan counts a generation cache of %d bytes; bf16 generates without one", got)
	}
}

// part is the bytes of the plan's part name among ps (0 when absent).
func part(ps []engine.Part, name string) int64 {
	for _, p := range ps {
		if p.Name == name {
			return p.Bytes
		}
	}
	return 0
}
