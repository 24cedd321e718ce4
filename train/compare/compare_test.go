// Tests of the compare job: the flag checks, a cancelled job, the reuse of
// the pretrained model, and the whole job at reduced size. The run
// measurements it reads are tested with the run (train, TestRunMeasurements).
//
// Limits: TestCompare and TestComparePretrainReuse train the tiny preset
// for real (about a minute and a few seconds on two cores) and are skipped
// under -short; CI runs them in their own pass without -race
// (go test -count=1 -run TestCompare ./train/compare/).

package compare

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
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/flagerr"
	"github.com/lsp-offload/lsp-offload/train/lsp"
)

func TestCompareConfigValidate(t *testing.T) {
	dir := t.TempDir()
	corpus, alpaca := filepath.Join(dir, "corpus.txt"), filepath.Join(dir, "alpaca.json")
	for _, f := range []string{corpus, alpaca} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		edit func(*Config)
		flag string // "" wants no error
	}{
		{"defaults", func(*Config) {}, ""},
		{"smallest d and r", func(c *Config) { c.D, c.R = 4, 1 }, ""},
		{"d 16 r 4", func(c *Config) { c.D, c.R = 16, 4 }, ""},
		{"task with count", func(c *Config) { c.Task = "builtin:reverse:500" }, ""},
		{"d above min(m,n)/4", func(c *Config) { c.D = 33 }, "d"},
		{"d below 4", func(c *Config) { c.D, c.R = 3, 1 }, "d"},
		{"r above d/4", func(c *Config) { c.D, c.R = 16, 5 }, "r"},
		{"r zero", func(c *Config) { c.R = 0 }, "r"},
		{"same task twice", func(c *Config) { c.Task = "builtin:sort:300" }, "task"},
		{"task not builtin", func(c *Config) { c.Task = "copy" }, "task"},
		{"unknown task", func(c *Config) { c.Task = "builtin:nope" }, "task"},
		{"bad count", func(c *Config) { c.Task = "builtin:copy:x" }, "task"},
		{"bad pretrain task", func(c *Config) { c.PretrainTask = "data.txt" }, "pretrain-task"},
		{"steps 0", func(c *Config) { c.Steps = 0 }, "steps"},
		{"check every 0", func(c *Config) { c.CheckEvery = 0 }, "check-every"},
		{"pretrain steps 0", func(c *Config) { c.PretrainSteps = 0 }, "pretrain-steps"},
		{"timing steps 0", func(c *Config) { c.TimingSteps = 0 }, "timing-steps"},
		{"eval every 0", func(c *Config) { c.EvalEvery = 0 }, "eval-every"},
		{"eval generate -1", func(c *Config) { c.EvalGenerate = -1 }, "eval-generate"},
		{"negative bandwidth", func(c *Config) { c.LinkBandwidth = -1 }, "link-bandwidth"},
		{"negative threads", func(c *Config) { c.Threads = -1 }, "threads"},
		{"no out", func(c *Config) { c.Out = "" }, "out"},
		{"llama-tiny d 16", func(c *Config) { c.Model, c.D, c.R = "llama-tiny", 16, 4 }, ""},
		{"llama-tiny d above its k|v width/4", func(c *Config) { c.Model, c.D, c.R = "llama-tiny", 17, 4 }, "d"},
		{"unknown model", func(c *Config) { c.Model = "gpt5" }, "model"},
		{"seeds 0", func(c *Config) { c.Seeds = 0 }, "seeds"},
		{"unknown row", func(c *Config) { c.Rows = "native,qlora" }, "rows"},
		{"bad lr", func(c *Config) { c.LRs = "3e-3,fast" }, "lrs"},
		{"negative lr", func(c *Config) { c.LRs = "-1e-3" }, "lrs"},
		{"lr twice", func(c *Config) { c.LRs = "1e-3,0.001" }, "lrs"},
		{"lora r 0", func(c *Config) { c.LoRAR = 0 }, "lora-r"},
		{"row twice", func(c *Config) { c.Rows = "native,lsp,native" }, "rows"},
		{"every row", func(c *Config) { c.Rows = strings.Join(RowNames(), ",") }, ""},
		{"batch 0", func(c *Config) { c.Batch = 0 }, "batch"},
		{"seq-len 0", func(c *Config) { c.SeqLen = 0 }, "seq-len"},
		{"data files", func(c *Config) { c.PretrainTask, c.Task = corpus, alpaca }, ""},
		{"same data file", func(c *Config) { c.PretrainTask, c.Task = corpus, corpus }, "task"},
		{"a directory", func(c *Config) { c.Task = dir }, "task"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Defaults()
			tc.edit(&c)
			err := c.Validate()
			if tc.flag == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			var fe *flagerr.Error
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), "--"+tc.flag+":") {
				t.Fatalf("err = %v, want a FlagError naming --%s", err, tc.flag)
			}
		})
	}
	// The bounds come from the tiny preset's smallest matrix side, 128.
	if dmax, rmax := bounds("tiny", 32); dmax != 32 || rmax != 8 {
		t.Errorf("bounds(32) = %d, %d; want 32, 8", dmax, rmax)
	}
}

// TestCompareCancelled: a cancelled context stops the job with
// ErrInterrupted and leaves no pretraining stamp to be reused.
func TestCompareCancelled(t *testing.T) {
	c := Defaults()
	c.Out = filepath.Join(t.TempDir(), "cmp")
	c.PretrainTask, c.Task, c.Threads = "builtin:sort:100", "builtin:copy:100", 1
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := Run(ctx, c, nil)
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
	c := Defaults()
	c.Out = filepath.Join(t.TempDir(), "cmp")
	c.PretrainSteps, c.PretrainTask = 2, "builtin:sort:200"
	ctx := context.Background()
	steps := []struct {
		edit   func(*Config)
		reused bool
	}{
		{func(*Config) {}, false},
		{func(c *Config) { c.Threads = 1 }, true}, // threads do not change the result
		{func(c *Config) { c.Seed = 2 }, false},
		{func(c *Config) { c.Seed = 2 }, true},
		{func(c *Config) { c.PretrainSteps = 3 }, false},
	}
	for i, s := range steps {
		s.edit(&c)
		hf, reused, err := pretrain(ctx, c, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if reused != s.reused || hf != filepath.Join(c.Out, "pretrain", "hf") {
			t.Fatalf("call %d: %s reused %v, want %v", i, hf, reused, s.reused)
		}
	}
}

// TestCompare runs the whole job at reduced size, at one learning rate
// (TestCompareLRGrid chooses among several): lsp must recover at least 0.8
// of native's eval-loss drop, native and zero must agree, lora must
// lower the loss with less device memory than native and nothing but the
// batch over the link, the plan must cover the peak and predict the link
// bytes, and the outputs and the table's last line must be as documented.
func TestCompare(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the tiny preset for about a minute; run without -short")
	}
	c := Defaults()
	c.Out = filepath.Join(t.TempDir(), "cmp")
	c.PretrainSteps, c.Steps, c.TimingSteps, c.EvalEvery, c.EvalGenerate = 120, 40, 2, 10, 20
	c.Seeds, c.Rows, c.LRs = 2, "native,zero,lsp,lsp-fit,lsp-resample,lora,lora-nf4,lsp-svd,lsp-gauss,galore-em", "3e-3"
	// 40 steps end before the first check (step 50): check before step
	// 1 too, so the rows that check do.
	c.CheckAtStart = true
	t0 := time.Now()
	res, err := Run(context.Background(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("compare took %.1f s\n%s", time.Since(t0).Seconds(), res.Table)

	if len(res.Rows) != 10 {
		t.Fatalf("%d rows, want 10", len(res.Rows))
	}
	// The dense kinds: svd refreshes before step 1, so it trains unlike
	// the gaussian draw it starts from; the equal-memory row runs at its
	// rank; every row but lsp is paired against lsp.
	svd, gauss, galoreEM := res.Rows[7], res.Rows[8], res.Rows[9]
	if svd.Projector != "svd" || gauss.Projector != "gaussian" || svd.D != c.D || gauss.D != c.D ||
		svd.Seeds[0].FinalEvalLoss == gauss.Seeds[0].FinalEvalLoss {
		t.Errorf("svd %+v, gaussian %+v", svd, gauss)
	}
	if len(res.EqualMemory) != 1 || !galoreEM.EqualMemory || galoreEM.Mode != "galore" || galoreEM.R != res.EqualMemory[0].Rank {
		t.Errorf("galore at equal memory: %+v, ranks %+v", galoreEM, res.EqualMemory)
	}
	for _, r := range res.Rows {
		if (r.Study.Paired == nil) != (r.Name == "lsp") || r.Study.Target == nil || len(r.Study.Predicted) != len(paperShapes) {
			t.Errorf("%s: study %+v", r.Name, r.Study)
		}
	}
	native, zero, lspRow, fitted, resampled, loraRow, nf4Row := res.Rows[0], res.Rows[1], res.Rows[2], res.Rows[3], res.Rows[4], res.Rows[5], res.Rows[6]
	if native.Mode != "native" || zero.Mode != "zero" || lspRow.Mode != "lsp" || loraRow.Mode != "lora" || lspRow.Fit || !fitted.Fit || !resampled.Fit ||
		resampled.Refit != "random" || fitted.Refit != string(train.Defaults().Refit) || lspRow.Refit != "" {
		t.Fatalf("rows out of order: %+v", res.Rows)
	}
	if res.Recovery == nil {
		t.Fatalf("no lsp-recovery: L0 %v, native final %v", res.L0, native.FinalEvalLoss)
	}
	// Per seed against native's same seed, then the mean; the row's loss
	// is the seeds' mean and its spread their sample standard deviation.
	var want float64
	for j, s := range lspRow.Seeds {
		l0 := native.Seeds[j].StartEvalLoss
		if s.StartEvalLoss != l0 {
			t.Errorf("seed %d: lsp starts at %v, native at %v (same weights, same data)", s.Seed, s.StartEvalLoss, l0)
		}
		want += (l0 - s.FinalEvalLoss) / (l0 - native.Seeds[j].FinalEvalLoss) / 2
	}
	if rec := *res.Recovery; math.Abs(rec-want) > 1e-12 || rec < 0.8 {
		t.Errorf("lsp-recovery %.4f (from the seeds %.4f), want >= 0.8", rec, want)
	}
	if lspRow.Recovery == nil || *lspRow.Recovery != *res.Recovery || native.Recovery == nil || math.Abs(*native.Recovery-1) > 1e-12 {
		t.Errorf("row recoveries: lsp %v (lsp-recovery %v), native %v (want 1)", lspRow.Recovery, *res.Recovery, native.Recovery)
	}
	// lora: the adapters and the dense parameters' AdamW on the device,
	// not every parameter's; no gradient crosses the link; the loss
	// falls.
	if loraRow.Recovery == nil || !(*loraRow.Recovery > 0) || loraRow.R != c.LoRAR ||
		!(loraRow.DevicePredicted < native.DevicePredicted) || loraRow.LinkPredicted != native.LinkPredicted {
		t.Errorf("lora: recovery %v, r %d, device %d bytes (native %d), link %d bytes (native %d)", loraRow.Recovery, loraRow.R,
			loraRow.DevicePredicted, native.DevicePredicted, loraRow.LinkPredicted, native.LinkPredicted)
	}
	// lora (nf4): the same run on a quantized base, in less memory, and
	// the loss still falls.
	if nf4Row.Mode != "lora" || nf4Row.Base != "nf4" || loraRow.Base != "" || nf4Row.Recovery == nil || !(*nf4Row.Recovery > 0) ||
		!(nf4Row.DevicePredicted < loraRow.DevicePredicted) {
		t.Errorf("lora (nf4): base %q, recovery %v, device %d bytes (lora %d)", nf4Row.Base, nf4Row.Recovery, nf4Row.DevicePredicted, loraRow.DevicePredicted)
	}
	for _, r := range res.Rows {
		if len(r.Seeds) != 2 || r.Seeds[0].Seed != 1 || r.Seeds[1].Seed != 2 || r.Seeds[0].Out == r.Seeds[1].Out {
			t.Fatalf("%s: seeds %+v", r.Name, r.Seeds)
		}
		// One rate: no grid directories, the row's own.
		if r.LR != 3e-3 || len(r.Grid) != 1 || r.Grid[0].Out != r.Out || filepath.Base(r.Out) != filepath.Base(r.Seeds[0].Out) {
			t.Errorf("%s: lr %v, grid %+v, out %s", r.Name, r.LR, r.Grid, r.Out)
		}
		a, b := r.Seeds[0].FinalEvalLoss, r.Seeds[1].FinalEvalLoss
		if math.Abs(r.FinalEvalLoss-(a+b)/2) > 1e-12 || math.Abs(r.FinalEvalSD-math.Abs(a-b)/math.Sqrt2) > 1e-12 || a == b {
			t.Errorf("%s: loss %v ± %v from seeds %v, %v", r.Name, r.FinalEvalLoss, r.FinalEvalSD, a, b)
		}
	}
	for j := range native.Seeds {
		n, z := native.Seeds[j].FinalEvalLoss, zero.Seeds[j].FinalEvalLoss
		if d := math.Abs(n - z); d > 1e-3*n {
			t.Errorf("seed %d: final eval loss native %.6f, zero %.6f: differ by more than 1e-3 relative", j, n, z)
		}
	}
	// Checks: at steps 0 and --check-every (no later one in 40 steps) in the
	// rows that check; resampling keeps every draw under --accept fit
	// only, so its share is whatever the held-out data decided, but it
	// never counts as fitted.
	for _, r := range []Row{fitted, resampled} {
		for _, s := range r.Seeds {
			if len(s.Checks) != 1 || s.Checks[0].Step != 0 || s.Checks[0].Matrices != 16 || !(s.CheckSeconds > 0) {
				t.Errorf("%s seed %d: checks %+v (%v s)", r.Name, s.Seed, s.Checks, s.CheckSeconds)
			}
		}
	}
	if resampled.Fitted || lspRow.Fitted || len(lspRow.Seeds[0].Checks) != 0 {
		t.Errorf("the random rows count as fitted: %+v, %+v", resampled, lspRow)
	}
	if fitted.Fitted != (res.Quality != nil) || fitted.Fitted && (res.QualityRow != "lsp (fitted)" || *res.Quality != *recovery(native, fitted)) {
		t.Errorf("lsp (fitted) fitted %v, quality %v (%q)", fitted.Fitted, res.Quality, res.QualityRow)
	}
	steps := []int{0, 10, 20, 30, 40}
	for _, r := range res.Rows {
		if r.DevicePeak <= 0 || r.DevicePredicted < r.DevicePeak {
			t.Errorf("%s: predicted device %d bytes < peak %d", r.Name, r.DevicePredicted, r.DevicePeak)
		}
		// galore's refresh (at step 1 here) sends rsvd's small
		// factorisations to the host and back inside its step, which
		// the plan's per-step link leaves out: more, never less.
		if r.LinkMeasured != float64(r.LinkPredicted) && !(r.Mode == "galore" && r.LinkMeasured > float64(r.LinkPredicted)) {
			t.Errorf("%s: link %v bytes per step, the plan says %d", r.Name, r.LinkMeasured, r.LinkPredicted)
		}
		if r.StartEvalLoss != res.L0 && r.Base == "" { // a quantized base starts elsewhere
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
	if !(fitted.CheckSeconds > 0) || lspRow.CheckSeconds != 0 {
		t.Errorf("check seconds lsp (fitted) %v, lsp %v", fitted.CheckSeconds, lspRow.CheckSeconds)
	}

	lines := strings.Split(strings.TrimRight(res.Table, "\n"), "\n")
	last := lines[len(lines)-1]
	if !regexp.MustCompile(`^lsp-recovery: -?[0-9]+\.[0-9]{2}$`).MatchString(last) || last != fmt.Sprintf("lsp-recovery: %.2f", *res.Recovery) {
		t.Errorf("last line %q", last)
	}
	if q := lines[len(lines)-2]; !regexp.MustCompile(`^lsp-quality: ([0-9.-]+ \(lsp \(fitted\)\)|n/a .*)$`).MatchString(q) {
		t.Errorf("line before last %q", q)
	}
	if !strings.HasPrefix(lines[0], "| row ") || !strings.Contains(res.Table, "| lsp (fitted) ") ||
		!strings.Contains(res.Table, "dense params (embeddings, norms and biases) are trained on the device") ||
		!strings.Contains(res.Table, "| lora ") || !strings.Contains(res.Table, "lr: 0.003 in every row") {
		t.Errorf("table:\n%s", res.Table)
	}

	if md, err := os.ReadFile(res.MD); err != nil || string(md) != res.Table {
		t.Errorf("%s: %v; differs from the printed table: %v", res.MD, err, string(md) != res.Table)
	}
	raw, err := os.ReadFile(res.JSON)
	if err != nil {
		t.Fatal(err)
	}
	var back Result
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatalf("%s: %v", res.JSON, err)
	}
	if len(back.Rows) != len(res.Rows) || back.Recovery == nil || *back.Recovery != *res.Recovery || back.L0 != res.L0 {
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

// TestCompareLRGrid: with three rates each row runs its first seed at
// each, keeps the one with the lowest held-out loss, runs its other seeds
// at it and times it; the table says each row's rate and every point's
// loss. native and lora at a small size: the choice, not the quality.
func TestCompareLRGrid(t *testing.T) {
	if testing.Short() {
		t.Skip("trains the tiny preset; run without -short")
	}
	c := Defaults()
	c.Out = filepath.Join(t.TempDir(), "cmp")
	c.PretrainSteps, c.Steps, c.TimingSteps, c.EvalEvery, c.EvalGenerate = 40, 10, 1, 10, 0
	c.Seeds, c.Rows, c.LRs = 2, "native,lora", "1e-4,3e-3,3e-2"
	// Small data and batches: eight fine-tuning runs and four timing
	// runs in seconds.
	c.Batch, c.Task, c.PretrainTask = 8, "builtin:copy:2000", "builtin:sort:2000"
	res, err := Run(context.Background(), c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", res.Table)
	lrs := []float64{1e-4, 3e-3, 3e-2}
	for _, r := range res.Rows {
		if len(r.Grid) != 3 {
			t.Fatalf("%s: grid %+v", r.Name, r.Grid)
		}
		best := 0
		for i, g := range r.Grid {
			if g.LR != lrs[i] || g.Out != filepath.Join(c.Out, r.Mode+"-lr"+strconv.FormatFloat(lrs[i], 'g', -1, 64)) {
				t.Errorf("%s: grid point %d %+v", r.Name, i, g)
			}
			if g.FinalEvalLoss < r.Grid[best].FinalEvalLoss {
				best = i
			}
		}
		if r.LR != lrs[best] || r.Out != r.Grid[best].Out || r.Seeds[0].Out != r.Out || r.Seeds[0].FinalEvalLoss != r.Grid[best].FinalEvalLoss {
			t.Errorf("%s: lr %v from grid %+v; out %s, first seed %+v", r.Name, r.LR, r.Grid, r.Out, r.Seeds[0])
		}
		// The points differ: the rate reached the runs.
		if r.Grid[0].FinalEvalLoss == r.Grid[1].FinalEvalLoss || r.Grid[1].FinalEvalLoss == r.Grid[2].FinalEvalLoss {
			t.Errorf("%s: the rates gave equal losses %+v", r.Name, r.Grid)
		}
		if len(r.Seeds) != 2 || r.Seeds[1].Seed != 2 || !strings.HasSuffix(r.Seeds[1].Out, r.Mode+"-seed2") || !(r.StepSecondsPipelined > 0) {
			t.Errorf("%s: seeds %+v, step %v s", r.Name, r.Seeds, r.StepSecondsPipelined)
		}
		if !strings.Contains(res.Table, fmt.Sprintf("%s {%g: %.4f, ", r.Name, lrs[0], r.Grid[0].FinalEvalLoss)) {
			t.Errorf("the table lacks %s's grid:\n%s", r.Name, res.Table)
		}
	}
	// The lowest rate barely moves a model in 10 steps: neither row keeps it.
	for _, r := range res.Rows {
		if r.LR == lrs[0] {
			t.Errorf("%s chose %g: grid %+v", r.Name, r.LR, r.Grid)
		}
	}
}

// Every row's run is one lsp-train accepts, with the rank the study
// gives it: --d for the dense projector kinds and galore (which
// refreshes at svd's cadence), --lora-r for lora, equalMemoryRanks' for
// the equal-memory rows; svd refreshes before step 1; the dense
// parameters train on the device in every row that has them.
func TestCompareRowConfigs(t *testing.T) {
	c := Defaults()
	c.Rows = strings.Join(RowNames(), ",")
	specs, err := c.rowSpecs()
	if err != nil {
		t.Fatal(err)
	}
	em, err := equalMemoryRanks(specs, c.D)
	if err != nil {
		t.Fatal(err)
	}
	resolveRanks(c, specs, em)
	for _, s := range specs {
		cfg := rowConfig(c, s, "tiny", 1, 3e-3)
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: configuration refused: %v", s.dir, err)
		}
		want := c.D
		if s.mode == engine.LoRA {
			want = c.LoRAR
		}
		if s.equalMemory {
			i := slices.IndexFunc(em, func(e EqualMemory) bool { return e.Row == s.dir })
			if i < 0 {
				t.Fatalf("%s: no equal-memory rank in %+v", s.dir, em)
			}
			want = em[i].Rank
		}
		var got int
		switch {
		case s.mode == engine.LSP && cfg.Projector.Dense():
			got = cfg.D
			if cfg.CheckAtStart != (cfg.Projector == lsp.KindSVD) || cfg.CheckEvery != c.CheckEvery {
				t.Errorf("%s: check at start %v, every %d", s.dir, cfg.CheckAtStart, cfg.CheckEvery)
			}
		case s.mode == engine.LSP:
			got, want = cfg.D, c.D
			if cfg.R != c.R {
				t.Errorf("%s: r %d", s.dir, cfg.R)
			}
		case s.mode == engine.LoRA:
			got = cfg.LoRAR
		case s.mode == engine.Galore:
			got = cfg.GaloreRank
			if cfg.GaloreEvery != c.CheckEvery {
				t.Errorf("%s: refreshes every %d steps, svd every %d", s.dir, cfg.GaloreEvery, c.CheckEvery)
			}
		default:
			got, want = 0, 0
		}
		if got != want || want < 0 {
			t.Errorf("%s: rank %d, want %d", s.dir, got, want)
		}
		if (s.mode == engine.LSP || s.mode == engine.LoRA || s.mode == engine.Galore) && cfg.DenseParams != engine.DenseDevice {
			t.Errorf("%s: dense params %s", s.dir, cfg.DenseParams)
		}
	}
}
