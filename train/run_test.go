// Tests of whole training runs: resuming bit for bit, Ctrl-C, the outputs
// (metrics, loss plot, Hugging Face export) and determinism across thread
// counts and under the hazard-checking backend.
//
// Limits: the runs use a micro GPT-2 (one layer, 32 channels) written as a
// Hugging Face directory, so a step takes milliseconds even under -race;
// the loss plot of every finished run dominates their time.

package train

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// microConfig is a GPT-2 small enough for runs under -race; V = 257 so it
// uses the byte tokenizer like the tiny preset.
func microConfig(C, L int) gpt2.Config {
	return gpt2.Config{V: 257, MaxT: 32, C: C, L: L, NH: 2, Eps: 1e-5}
}

// writeModel writes cfg with seeded initial weights as a Hugging Face
// directory and returns it.
func writeModel(t *testing.T, cfg gpt2.Config) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "model")
	if err := gpt2.ExportHF(dir, cfg, gpt2.Init(cfg, 7)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// quickConfig is a run of 8 steps of the micro model on a small builtin
// task, with an eval at step 4 and at the end.
func quickConfig(t *testing.T, model string) Config {
	c := Defaults()
	c.Model = model
	c.Data = "builtin:reverse:300"
	c.Steps, c.Batch, c.SeqLen, c.Warmup = 8, 4, 24, 2
	c.EvalEvery, c.EvalGenerate, c.CheckpointEvery = 4, 4, 0
	c.EvalFraction = 0.05
	c.Threads = 1
	c.Out = filepath.Join(t.TempDir(), "out")
	return c
}

func mustRun(t *testing.T, ctx context.Context, c Config, o Options) *Result {
	t.Helper()
	res, err := Run(ctx, c, o)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

// readCheckpoint opens <out>/checkpoint.safetensors.
func readCheckpoint(t *testing.T, out string) *safetensors.File {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(out, checkpoint.FileName))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// checkpointParams reads the weights of <out>/checkpoint.safetensors.
func checkpointParams(t *testing.T, out string) []float32 {
	t.Helper()
	v, _, err := readCheckpoint(t, out).Float32(checkpoint.ParamsTensor)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func checkpointState(t *testing.T, f *safetensors.File) checkpoint.State {
	t.Helper()
	st, err := checkpoint.ReadState(f)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// sameTensors fails unless a and b hold the same tensor names with
// byte-identical data and the same training state, apart from the
// settings a resume may change (the thread count, ...), which the state
// records as each run was given them.
func sameTensors(t *testing.T, a, b *safetensors.File) {
	t.Helper()
	if !slices.Equal(a.Names(), b.Names()) {
		t.Fatalf("tensor names differ: %v vs %v", a.Names(), b.Names())
	}
	for _, name := range a.Names() {
		ra, _, err := a.Raw(name)
		if err != nil {
			t.Fatal(err)
		}
		rb, _, err := b.Raw(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ra, rb) {
			t.Errorf("tensor %s differs between %s and %s", name, a.Path, b.Path)
		}
	}
	sa, sb := checkpointState(t, a), checkpointState(t, b)
	for _, s := range settingsOf(resumeAllowed{}) {
		delete(sa.Settings, s.flag)
		delete(sb.Settings, s.flag)
	}
	if !reflect.DeepEqual(sa, sb) {
		t.Errorf("training state differs:\n%+v\n%+v", sa, sb)
	}
}

// trainRecords returns the metrics records with a train loss, failing on
// a duplicated or missing step.
func trainRecords(t *testing.T, path string, steps int) []metrics.Record {
	t.Helper()
	recs, err := metrics.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var train []metrics.Record
	for i, r := range recs {
		if i > 0 && r.Time < recs[i-1].Time {
			t.Errorf("%s: time_s goes back from %v to %v at step %d", path, recs[i-1].Time, r.Time, r.Step)
		}
		if r.TrainLoss != nil {
			train = append(train, r)
		}
	}
	if len(train) != steps {
		t.Fatalf("%s: %d train records, want %d (one per step)", path, len(train), steps)
	}
	for i, r := range train {
		if r.Step != i+1 {
			t.Fatalf("%s: train record %d has step %d, want %d (steps duplicated or missing)", path, i, r.Step, i+1)
		}
		if r.TokensPerSec == nil || !(*r.TokensPerSec > 0) {
			t.Errorf("%s: step %d: tokens_per_s missing or not positive", path, r.Step)
		}
	}
	return recs
}

// checkOutputs checks what a finished run leaves behind: metrics with
// every step once and evals at evalSteps, a decodable loss plot, and a
// Hugging Face export equal to the final checkpoint's weights.
func checkOutputs(t *testing.T, res *Result, losses []float64, evalSteps []int) {
	t.Helper()
	recs := trainRecords(t, res.Metrics, len(losses))
	var got []float64
	var evals []int
	for _, r := range recs {
		if r.TrainLoss != nil {
			got = append(got, *r.TrainLoss)
		}
		if r.EvalLoss != nil || r.ExactMatch != nil {
			if r.EvalLoss == nil || r.ExactMatch == nil {
				t.Errorf("eval at step %d: eval_loss %v, eval_exact_match %v; want both", r.Step, r.EvalLoss, r.ExactMatch)
			}
			evals = append(evals, r.Step)
		}
	}
	if !slices.Equal(got, losses) {
		t.Errorf("metrics train_loss %v, want %v", got, losses)
	}
	if !slices.Equal(evals, evalSteps) {
		t.Errorf("evals at steps %v, want %v", evals, evalSteps)
	}

	f, err := os.Open(res.Plot)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatalf("%s: %v", res.Plot, err)
	}
	if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
		t.Errorf("%s: image is %v", res.Plot, b)
	}

	cfg, vals, err := gpt2.LoadHF(res.Export)
	if err != nil {
		t.Fatalf("LoadHF(%s): %v", res.Export, err)
	}
	ck := readCheckpoint(t, res.Out)
	want, _, err := ck.Float32("params")
	if err != nil {
		t.Fatal(err)
	}
	if cfg != checkpointState(t, ck).Model {
		t.Errorf("export config %+v, checkpoint %+v", cfg, checkpointState(t, ck).Model)
	}
	if len(vals) != len(want) {
		t.Fatalf("export has %d params, checkpoint %d", len(vals), len(want))
	}
	for i := range vals {
		if math.Float32bits(vals[i]) != math.Float32bits(want[i]) {
			t.Fatalf("export param %d = %v, checkpoint %v", i, vals[i], want[i])
		}
	}
	raw, err := os.ReadFile(filepath.Join(res.Export, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var hc map[string]any
	if err := json.Unmarshal(raw, &hc); err != nil {
		t.Fatal(err)
	}
	if hc["model_type"] != "gpt2" || hc["tie_word_embeddings"] != true {
		t.Errorf("config.json: model_type %v, tie_word_embeddings %v; want gpt2, true", hc["model_type"], hc["tie_word_embeddings"])
	}
}

// TestResumeBitForBit compares an uninterrupted run with one stopped after
// 3 steps (checkpointing as Ctrl-C does) and resumed: the losses and the
// final checkpoints must be identical, bit for bit.
func TestResumeBitForBit(t *testing.T) {
	model := writeModel(t, microConfig(32, 1))
	for _, tc := range []struct {
		name    string
		clip    optim.ClipMode
		dtype   backend.DType
		maxNorm float64
	}{
		{"matrix-fp32", optim.ClipMatrix, backend.F32, 1},
		// A small max norm so global-prev clips every step after the first:
		// the resumed step 4 must clip by step 3's norm from the checkpoint.
		{"global-prev-fp32", optim.ClipGlobalPrev, backend.F32, 0.05},
		{"matrix-bf16", optim.ClipMatrix, backend.BF16, 1},
		{"global-prev-bf16", optim.ClipGlobalPrev, backend.BF16, 0.05},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := quickConfig(t, model)
			c.ClipMode, c.DType, c.GradClip = tc.clip, tc.dtype, tc.maxNorm
			full := mustRun(t, context.Background(), c, Options{})
			if full.Interrupted || full.Steps != 8 || len(full.Losses) != 8 {
				t.Fatalf("uninterrupted run: interrupted %v, steps %d, %d losses", full.Interrupted, full.Steps, len(full.Losses))
			}
			checkOutputs(t, full, full.Losses, []int{4, 8})

			c2 := c
			c2.Out = filepath.Join(t.TempDir(), "out")
			first := mustRun(t, context.Background(), c2, Options{StopAfter: 3})
			if !first.Interrupted || first.Steps != 3 || len(first.Losses) != 3 {
				t.Fatalf("stopped run: interrupted %v, steps %d, %d losses; want true, 3, 3", first.Interrupted, first.Steps, len(first.Losses))
			}
			if st := checkpointState(t, readCheckpoint(t, c2.Out)); st.Step != 3 {
				t.Fatalf("checkpoint after the stop is at step %d, want 3", st.Step)
			}
			if tc.clip == "global-prev" {
				recs := trainRecords(t, first.Metrics, 3)
				if gn := recs[2].GradNorm; gn == nil || !(*gn > tc.maxNorm) {
					t.Fatalf("step 3 grad norm %v does not exceed --grad-clip %g; the test would not see a lost norm", gn, tc.maxNorm)
				}
			}
			c2.Resume = true
			second := mustRun(t, context.Background(), c2, Options{})
			if second.Interrupted || second.Steps != 8 {
				t.Fatalf("resumed run: interrupted %v, steps %d", second.Interrupted, second.Steps)
			}
			got := append(slices.Clone(first.Losses), second.Losses...)
			if len(got) != len(full.Losses) {
				t.Fatalf("losses %v, want %v", got, full.Losses)
			}
			for i := range got {
				if got[i] != full.Losses[i] {
					t.Errorf("step %d: loss %v after resume, %v uninterrupted", i+1, got[i], full.Losses[i])
				}
			}
			sameTensors(t, readCheckpoint(t, c.Out), readCheckpoint(t, c2.Out))
			checkOutputs(t, second, full.Losses, []int{4, 8})
		})
	}
}

// TestResumeFinished: resuming a run that already reached --steps trains
// nothing, keeps the metrics free of duplicates and still exports.
func TestResumeFinished(t *testing.T) {
	c := quickConfig(t, writeModel(t, microConfig(16, 1)))
	c.Steps, c.EvalEvery = 3, 0
	first := mustRun(t, context.Background(), c, Options{})
	c.Resume = true
	again := mustRun(t, context.Background(), c, Options{})
	if again.Steps != 3 || len(again.Losses) != 0 || again.Interrupted {
		t.Fatalf("resumed finished run: steps %d, losses %v, interrupted %v", again.Steps, again.Losses, again.Interrupted)
	}
	checkOutputs(t, again, first.Losses, []int{3})
}

// TestCtrlC cancels the context once the first metrics line is written:
// the run must stop with a checkpoint, and resuming from it must continue
// exactly as a run that was never stopped.
func TestCtrlC(t *testing.T) {
	model := writeModel(t, microConfig(32, 1))
	c := quickConfig(t, model)
	c.Steps = 100000 // far more than can run before the cancel lands
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		path := filepath.Join(c.Out, "metrics.jsonl")
		for ctx.Err() == nil {
			if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte("\n")) {
				cancel()
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	res := mustRun(t, ctx, c, Options{})
	k := res.Steps
	if !res.Interrupted || k < 1 || k > 1000 || len(res.Losses) != k {
		t.Fatalf("cancelled run: interrupted %v, steps %d, %d losses", res.Interrupted, k, len(res.Losses))
	}
	if res.Export != "" {
		t.Errorf("an interrupted run exported %s", res.Export)
	}
	if st := checkpointState(t, readCheckpoint(t, c.Out)); st.Step != k {
		t.Fatalf("checkpoint at step %d, run stopped after %d", st.Step, k)
	}

	c.Resume = true
	more := mustRun(t, context.Background(), c, Options{StopAfter: k + 2})
	if more.Steps != k+2 || len(more.Losses) != 2 {
		t.Fatalf("resumed run: steps %d, %d losses; want %d, 2", more.Steps, len(more.Losses), k+2)
	}
	trainRecords(t, more.Metrics, k+2)

	ref := c
	ref.Resume = false
	ref.Out = filepath.Join(t.TempDir(), "ref")
	straight := mustRun(t, context.Background(), ref, Options{StopAfter: k + 2})
	if got := append(slices.Clone(res.Losses), more.Losses...); !slices.Equal(got, straight.Losses) {
		t.Errorf("losses with a Ctrl-C %v, without %v", got, straight.Losses)
	}
	sameTensors(t, readCheckpoint(t, c.Out), readCheckpoint(t, ref.Out))
}

// TestCancelledBeforeStart: a context cancelled before the first step
// still leaves a checkpoint (step 0) that resumes.
func TestCancelledBeforeStart(t *testing.T) {
	c := quickConfig(t, writeModel(t, microConfig(16, 1)))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res := mustRun(t, ctx, c, Options{})
	if !res.Interrupted || res.Steps != 0 || len(res.Losses) != 0 {
		t.Fatalf("interrupted %v, steps %d, losses %v; want true, 0, none", res.Interrupted, res.Steps, res.Losses)
	}
	c.Resume = true
	res = mustRun(t, context.Background(), c, Options{StopAfter: 1})
	if res.Steps != 1 || len(res.Losses) != 1 || math.IsNaN(res.Losses[0]) {
		t.Fatalf("resumed: steps %d, losses %v", res.Steps, res.Losses)
	}
}

// TestDeterministic: the thread count and the hazard-checking backend with
// random op delays must not change a single bit.
func TestDeterministic(t *testing.T) {
	model := writeModel(t, microConfig(32, 1))
	var ref []float64
	var refOut string
	for _, tc := range []struct {
		name    string
		threads int
		hazard  bool
	}{{"threads-1", 1, false}, {"threads-2", 2, false}, {"hazard-check", 2, true}} {
		c := quickConfig(t, model)
		c.Threads = tc.threads
		var opts Options
		var be *cpu.Backend
		if tc.hazard {
			be = cpu.New(cpu.Config{Threads: tc.threads, HazardCheck: true, MaxDelay: 20 * time.Microsecond, Seed: 3})
			defer be.Close()
			opts.Backend = be
		}
		res := mustRun(t, context.Background(), c, Options{Backend: opts.Backend, StopAfter: 3})
		if be != nil {
			if hz := be.Hazards(); len(hz) > 0 {
				t.Errorf("%s: %d hazards, first %v", tc.name, len(hz), hz[0])
			}
		}
		if ref == nil {
			ref, refOut = res.Losses, c.Out
			continue
		}
		if !slices.Equal(res.Losses, ref) {
			t.Errorf("%s: losses %v, want %v", tc.name, res.Losses, ref)
		}
		sameTensors(t, readCheckpoint(t, refOut), readCheckpoint(t, c.Out))
	}
}

// TestDeviceMemExact: the memory plan is the budget the run really needs:
// exactly that many bytes is enough, one byte less is refused up front.
func TestDeviceMemExact(t *testing.T) {
	c := quickConfig(t, writeModel(t, microConfig(16, 1)))
	for _, tc := range []struct {
		dt backend.DType
		rc model.Recompute
	}{{backend.F32, model.RecomputeNone}, {backend.BF16, model.RecomputeNone}, {backend.F32, model.RecomputeLayer}, {backend.BF16, model.RecomputeAttn}} {
		dt := tc.dt
		c.DType, c.Recompute = dt, tc.rc
		_, plan := memoryPlan(t, c)
		c.DeviceMem = plan.DeviceTotal()
		c.Out = filepath.Join(t.TempDir(), "out")
		if _, err := Run(context.Background(), c, Options{StopAfter: 1}); err != nil {
			t.Fatalf("%s, recompute %v: budget = plan (%d bytes): %v", dt, tc.rc, plan.DeviceTotal(), err)
		}
		c.DeviceMem--
		c.Out = filepath.Join(t.TempDir(), "out")
		if _, err := Run(context.Background(), c, Options{StopAfter: 1}); err == nil {
			t.Fatalf("%s, recompute %v: budget one byte below the plan was accepted", dt, tc.rc)
		}
	}
}

// TestGradResidencyRun: a zero-mode run whose whole gradient does not fit
// --device-mem resolves --grad-residency auto to the ring, trains within
// the budget, and (one micro-batch) ends where the whole gradient's run
// does, bit for bit.
func TestGradResidencyRun(t *testing.T) {
	c := quickConfig(t, "tiny")
	c.Mode, c.Steps, c.EvalEvery = engine.Zero, 3, 0
	_, whole := memoryPlan(t, c)
	ref := mustRun(t, context.Background(), c, Options{})
	c.Out = filepath.Join(t.TempDir(), "out")
	// One byte below the whole plan: checkMemory would refuse the run
	// unless auto chose the ring.
	c.DeviceMem = whole.DeviceTotal() - 1
	res := mustRun(t, context.Background(), c, Options{})
	if math.Float64bits(res.TrainLoss) != math.Float64bits(ref.TrainLoss) {
		t.Errorf("ring run's final loss %v, the whole gradient's %v", res.TrainLoss, ref.TrainLoss)
	}
}
