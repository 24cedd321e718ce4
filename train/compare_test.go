// Tests of the compare job and the run measurements it reads: the flag
// checks, the step-0 eval and the step, link and memory figures of a
// Result (micro model, fast), a cancelled job, the reuse of the pretrained
// model, and the whole job at reduced size.
//
// Limits: TestCompare and TestComparePretrainReuse train the tiny preset
// for real (about a minute and a few seconds on two cores) and are skipped
// under -short; CI runs them in their own pass without -race
// (go test -count=1 -run TestCompare ./train/).

package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

func TestCompareConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*CompareConfig)
		flag string // "" wants no error
	}{
		{"defaults", func(*CompareConfig) {}, ""},
		{"smallest d and r", func(c *CompareConfig) { c.D, c.R = 4, 1 }, ""},
		{"d 16 r 4", func(c *CompareConfig) { c.D, c.R = 16, 4 }, ""},
		{"task with count", func(c *CompareConfig) { c.Task = "builtin:reverse:500" }, ""},
		{"d above min(m,n)/4", func(c *CompareConfig) { c.D = 33 }, "d"},
		{"d below 4", func(c *CompareConfig) { c.D, c.R = 3, 1 }, "d"},
		{"r above d/4", func(c *CompareConfig) { c.D, c.R = 16, 5 }, "r"},
		{"r zero", func(c *CompareConfig) { c.R = 0 }, "r"},
		{"same task twice", func(c *CompareConfig) { c.Task = "builtin:sort:300" }, "task"},
		{"task not builtin", func(c *CompareConfig) { c.Task = "copy" }, "task"},
		{"unknown task", func(c *CompareConfig) { c.Task = "builtin:nope" }, "task"},
		{"bad count", func(c *CompareConfig) { c.Task = "builtin:copy:x" }, "task"},
		{"bad pretrain task", func(c *CompareConfig) { c.PretrainTask = "data.txt" }, "pretrain-task"},
		{"steps 0", func(c *CompareConfig) { c.Steps = 0 }, "steps"},
		{"pretrain steps 0", func(c *CompareConfig) { c.PretrainSteps = 0 }, "pretrain-steps"},
		{"timing steps 0", func(c *CompareConfig) { c.TimingSteps = 0 }, "timing-steps"},
		{"eval every 0", func(c *CompareConfig) { c.EvalEvery = 0 }, "eval-every"},
		{"eval generate -1", func(c *CompareConfig) { c.EvalGenerate = -1 }, "eval-generate"},
		{"negative bandwidth", func(c *CompareConfig) { c.LinkBandwidth = -1 }, "link-bandwidth"},
		{"negative threads", func(c *CompareConfig) { c.Threads = -1 }, "threads"},
		{"no out", func(c *CompareConfig) { c.Out = "" }, "out"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := CompareDefaults()
			tc.edit(&c)
			err := c.Validate()
			if tc.flag == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			var fe *FlagError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), "--"+tc.flag+":") {
				t.Fatalf("err = %v, want a FlagError naming --%s", err, tc.flag)
			}
		})
	}
	// The bounds come from the tiny preset's smallest matrix side, 128.
	if dmax, rmax := compareBounds(32); dmax != 32 || rmax != 8 {
		t.Errorf("compareBounds(32) = %d, %d; want 32, 8", dmax, rmax)
	}
}

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
	l, err := EvalLoss(be, s, m, ds.Eval)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestRunMeasurements checks what the compare job reads from a Result: the
// step-0 eval of EvalAtStart (the untouched weights' loss, and none on
// resume), the plan, a peak within it, link bytes per step equal to the
// plan's, and step and check times.
func TestRunMeasurements(t *testing.T) {
	model := writeModel(t, microConfig(16, 1))
	for _, mode := range []string{"native", "zero", "lsp"} {
		t.Run(mode, func(t *testing.T) {
			c := quickConfig(t, model)
			c.Mode, c.Steps, c.EvalEvery, c.EvalGenerate = engine.Mode(mode), 3, 0, 0
			c.LinkBandwidth = 1 << 40 // charged, but too fast to matter
			res := mustRun(t, context.Background(), c, Options{EvalAtStart: true})
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

			p := res.Plan
			if string(p.Mode) != mode || p.DeviceTotal() <= 0 {
				t.Fatalf("Plan: mode %q, device %d", p.Mode, p.DeviceTotal())
			}
			if res.DevicePeak <= 0 || res.DevicePeak > p.DeviceTotal() {
				t.Errorf("DevicePeak %d, want in (0, plan %d]", res.DevicePeak, p.DeviceTotal())
			}
			link := float64(p.LinkD2H + p.LinkH2D + p.BatchD2H + p.BatchH2D)
			if res.LinkBytesPerStep != link {
				t.Errorf("LinkBytesPerStep %v, want the plan's %v", res.LinkBytesPerStep, link)
			}
			if mode != "native" && !(res.LinkBytesPerStep > float64(p.BatchD2H+p.BatchH2D)) {
				t.Errorf("%s moves no more than the batch: %v bytes per step", mode, res.LinkBytesPerStep)
			}
			if !(res.StepSeconds > 0) || res.StepSeconds > res.Elapsed.Seconds()/3 {
				t.Errorf("StepSeconds %v with %v elapsed over 3 steps", res.StepSeconds, res.Elapsed)
			}
			if (mode == "lsp") != (res.CheckSeconds > 0) {
				t.Errorf("CheckSeconds %v in %s mode", res.CheckSeconds, mode)
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

// TestCompareCancelled: a cancelled context stops the job with
// ErrInterrupted and leaves no pretraining stamp to be reused.
func TestCompareCancelled(t *testing.T) {
	c := CompareDefaults()
	c.Out = filepath.Join(t.TempDir(), "cmp")
	c.PretrainTask, c.Task, c.Threads = "builtin:sort:100", "builtin:copy:100", 1
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := Compare(ctx, c, nil)
	if !errors.Is(err, ErrInterrupted) || res != nil {
		t.Fatalf("Compare with a cancelled context: %v, %v; want ErrInterrupted", res, err)
	}
	if _, err := os.Stat(filepath.Join(c.Out, "pretrain", pretrainStampFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stamp after an interrupted pretraining: %v", err)
	}
}

// TestComparePretrainReuse: an identical pretraining is reused, and a
// different one (another seed or step count) is trained again.
func TestComparePretrainReuse(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the tiny preset (seconds); run without -short")
	}
	c := CompareDefaults()
	c.Out = filepath.Join(t.TempDir(), "cmp")
	c.PretrainSteps, c.PretrainTask = 2, "builtin:sort:200"
	ctx := context.Background()
	steps := []struct {
		edit   func(*CompareConfig)
		reused bool
	}{
		{func(*CompareConfig) {}, false},
		{func(c *CompareConfig) { c.Threads = 1 }, true}, // threads do not change the result
		{func(c *CompareConfig) { c.Seed = 2 }, false},
		{func(c *CompareConfig) { c.Seed = 2 }, true},
		{func(c *CompareConfig) { c.PretrainSteps = 3 }, false},
	}
	for i, s := range steps {
		s.edit(&c)
		hf, reused, err := comparePretrain(ctx, c, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if reused != s.reused || hf != filepath.Join(c.Out, "pretrain", "hf") {
			t.Fatalf("call %d: %s reused %v, want %v", i, hf, reused, s.reused)
		}
	}
}

// TestCompare runs the whole job at reduced size: lsp must recover at
// least 0.8 of native's eval-loss drop, native and zero must agree, the
// plan must cover the peak and predict the link bytes, and the outputs and
// the table's last line must be as documented.
func TestCompare(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the tiny preset for about a minute; run without -short")
	}
	c := CompareDefaults()
	c.Out = filepath.Join(t.TempDir(), "cmp")
	c.PretrainSteps, c.Steps, c.TimingSteps, c.EvalEvery, c.EvalGenerate = 120, 40, 2, 10, 20
	t0 := time.Now()
	res, err := Compare(context.Background(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("compare took %.1f s\n%s", time.Since(t0).Seconds(), res.Table)

	if len(res.Rows) != 4 {
		t.Fatalf("%d rows, want 4", len(res.Rows))
	}
	native, zero, lspRow := res.Rows[0], res.Rows[1], res.Rows[2]
	if native.Mode != "native" || zero.Mode != "zero" || lspRow.Mode != "lsp" || lspRow.NoFit || !res.Rows[3].NoFit {
		t.Fatalf("rows out of order: %+v", res.Rows)
	}
	if res.Recovery == nil {
		t.Fatalf("no lsp-recovery: L0 %v, native final %v", res.L0, native.FinalEvalLoss)
	}
	want := (res.L0 - lspRow.FinalEvalLoss) / (res.L0 - native.FinalEvalLoss)
	if rec := *res.Recovery; math.Abs(rec-want) > 1e-12 || rec < 0.8 {
		t.Errorf("lsp-recovery %.4f (from the rows %.4f), want >= 0.8", rec, want)
	}
	if d := math.Abs(native.FinalEvalLoss - zero.FinalEvalLoss); d > 1e-3*native.FinalEvalLoss {
		t.Errorf("final eval loss native %.6f, zero %.6f: differ by more than 1e-3 relative", native.FinalEvalLoss, zero.FinalEvalLoss)
	}
	steps := []int{0, 10, 20, 30, 40}
	for _, r := range res.Rows {
		if r.DevicePeak <= 0 || r.DevicePredicted < r.DevicePeak {
			t.Errorf("%s: predicted device %d bytes < peak %d", r.Name, r.DevicePredicted, r.DevicePeak)
		}
		if r.LinkMeasured != float64(r.LinkPredicted) {
			t.Errorf("%s: link %v bytes per step, the plan says %d", r.Name, r.LinkMeasured, r.LinkPredicted)
		}
		if r.StartEvalLoss != res.L0 {
			t.Errorf("%s: step-0 eval loss %v differs from L0 %v (same weights, same data)", r.Name, r.StartEvalLoss, res.L0)
		}
		var got []int
		for _, p := range r.Curve {
			got = append(got, p.Step)
		}
		if !slices.Equal(got, steps) {
			t.Errorf("%s: eval steps %v, want %v", r.Name, got, steps)
		}
		if !(r.StepSecondsSequential > 0 && r.StepSecondsPipelined > 0) || r.ExactMatch == nil {
			t.Errorf("%s: step s %v / %v, exact match %v", r.Name, r.StepSecondsSequential, r.StepSecondsPipelined, r.ExactMatch)
		}
	}
	if !(res.Rows[2].CheckSeconds > 0) || res.Rows[3].CheckSeconds != 0 {
		t.Errorf("check seconds lsp %v, lsp (no fit) %v", res.Rows[2].CheckSeconds, res.Rows[3].CheckSeconds)
	}

	lines := strings.Split(strings.TrimRight(res.Table, "\n"), "\n")
	last := lines[len(lines)-1]
	if !regexp.MustCompile(`^lsp-recovery: -?[0-9]+\.[0-9]{2}$`).MatchString(last) || last != fmt.Sprintf("lsp-recovery: %.2f", *res.Recovery) {
		t.Errorf("last line %q", last)
	}
	if !strings.HasPrefix(lines[0], "| row ") || !strings.Contains(res.Table, "| lsp (no fit) ") ||
		!strings.Contains(res.Table, "dense params (embeddings, norms and biases) are trained on the device") {
		t.Errorf("table:\n%s", res.Table)
	}

	if md, err := os.ReadFile(res.MD); err != nil || string(md) != res.Table {
		t.Errorf("%s: %v; differs from the printed table: %v", res.MD, err, string(md) != res.Table)
	}
	raw, err := os.ReadFile(res.JSON)
	if err != nil {
		t.Fatal(err)
	}
	var back CompareResult
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatalf("%s: %v", res.JSON, err)
	}
	if len(back.Rows) != 4 || back.Recovery == nil || *back.Recovery != *res.Recovery || back.L0 != res.L0 {
		t.Errorf("%s does not hold the numbers: %s", res.JSON, raw)
	}
	f, err := os.Open(res.PNG)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Errorf("%s: %v", res.PNG, err)
	}
}
