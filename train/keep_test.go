// Tests of --keep-checkpoints and --export-every (keep.go): a short run of
// the micro model counts the kept checkpoints and reloads a step's export.

package train

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// TestKeepAndExportEvery: 8 steps with a checkpoint every 2 keep the last
// 3 step-numbered checkpoints, the newest the same file as the latest;
// an export every 4 leaves hf-step-000004/ (the final step's is hf/),
// whose weights have the eval loss the run recorded at step 4.
func TestKeepAndExportEvery(t *testing.T) {
	model := writeModel(t, microConfig(16, 1))
	c := quickConfig(t, model)
	c.CheckpointEvery, c.KeepCheckpoints, c.ExportEvery, c.EvalGenerate = 2, 3, 4, 0
	res := mustRun(t, context.Background(), c, Options{})

	ents, err := os.ReadDir(keptDir(c.Out))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := []string{"step-000004.safetensors", "step-000006.safetensors", "step-000008.safetensors"}; !slices.Equal(names, want) {
		t.Errorf("kept checkpoints %v, want %v", names, want)
	}
	latest, err1 := os.Stat(filepath.Join(c.Out, checkpoint.FileName))
	newest, err2 := os.Stat(filepath.Join(keptDir(c.Out), "step-000008.safetensors"))
	if err1 != nil || err2 != nil || !os.SameFile(latest, newest) {
		t.Errorf("the newest kept checkpoint is not the latest's file (a hard link): %v, %v", err1, err2)
	}
	for i, name := range names {
		f, err := safetensors.Open(filepath.Join(keptDir(c.Out), name))
		if err != nil {
			t.Fatal(err)
		}
		if st := checkpointState(t, f); st.Step != 4+2*i {
			t.Errorf("%s holds step %d", name, st.Step)
		}
		f.Close()
	}
	if st := checkpointState(t, readCheckpoint(t, c.Out)); st.Step != 8 {
		t.Errorf("the latest checkpoint is of step %d, want 8", st.Step)
	}

	dirs, _ := filepath.Glob(filepath.Join(c.Out, "hf-step-*"))
	if want := []string{stepExportDir(c.Out, 4)}; !slices.Equal(dirs, want) {
		t.Fatalf("step exports %v, want %v", dirs, want)
	}
	recs, err := metrics.ReadFile(res.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(recs, func(r metrics.Record) bool { return r.Step == 4 && r.EvalLoss != nil })
	if i < 0 {
		t.Fatal("no eval record at step 4")
	}
	want, got := *recs[i].EvalLoss, evalLossOf(t, c, dirs[0])
	if math.Abs(got-want) > 1e-6*want {
		t.Errorf("hf-step-000004's eval loss %v, want the run's at step 4, %v", got, want)
	}
	if final := evalLossOf(t, c, res.Export); final == got {
		t.Errorf("hf-step-000004 has the final weights' eval loss %v", final)
	}

	// A resumed run with a smaller --keep-checkpoints prunes to it at its
	// first save; --overwrite removes the kept ones and the step exports.
	c.Resume, c.Steps, c.KeepCheckpoints = true, 10, 2
	mustRun(t, context.Background(), c, Options{})
	ents, _ = os.ReadDir(keptDir(c.Out))
	if len(ents) != 2 || ents[1].Name() != "step-000010.safetensors" {
		t.Errorf("after a resume with --keep-checkpoints 2: %v", ents)
	}
	// Each process wrote its own TensorBoard events file; the resumed
	// one's starts the session again after its checkpoint.
	tb, _ := filepath.Glob(filepath.Join(c.Out, "tb", "events.out.tfevents.*"))
	if len(tb) != 2 {
		t.Fatalf("events files %v, want one per process", tb)
	}
	tb0 := tb[0]
	for _, f := range tb {
		evs, err := metrics.ReadTB(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) > 1 && evs[1].SessionStart && evs[1].Step == 9 && evs[len(evs)-1].Step == 10 {
			tb = nil
		}
	}
	if tb != nil {
		t.Errorf("no events file starts a session at step 9 and ends at step 10")
	}
	c.Resume, c.Overwrite, c.Steps, c.KeepCheckpoints, c.ExportEvery = false, true, 2, 1, 0
	mustRun(t, context.Background(), c, Options{})
	for _, p := range []string{keptDir(c.Out), stepExportDir(c.Out, 4), filepath.Join(c.Out, "tb", filepath.Base(tb0))} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("--overwrite left %s (%v)", p, err)
		}
	}
}
