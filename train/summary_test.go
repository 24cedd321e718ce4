// Tests of what a run reports about itself: its length from --steps,
// --epochs or neither, the steps this process ran, the wall time of each
// phase, one tokens/s figure, and the loss plot of an interrupted run.

package train

import (
	"context"
	"os"
	"testing"
)

// TestRunLength: neither --steps nor --epochs runs DefaultSteps; --epochs
// alone is turned into steps over the training rows; --steps alone is
// taken as given.
func TestRunLength(t *testing.T) {
	model := writeModel(t, microConfig(16, 1))
	for _, tc := range []struct {
		name   string
		steps  int
		epochs float64
		want   int
	}{
		{"neither", 0, 0, DefaultSteps},
		// builtin:reverse:300 at --seq-len 24 keeps 240 training rows
		// (8-letter words are too long); batch 4: 60 steps an epoch.
		{"epochs", 0, 2, 120},
		{"steps", 9, 0, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := quickConfig(t, model)
			c.Steps, c.Epochs, c.EvalEvery, c.EvalGenerate = tc.steps, tc.epochs, 0, 0
			res := mustRun(t, context.Background(), c, Options{StopAfter: 1})
			if res.Total != tc.want || res.Steps != 1 {
				t.Errorf("--steps %d --epochs %g: a run of %d steps (stopped after %d); want %d", tc.steps, tc.epochs, res.Total, res.Steps, tc.want)
			}
		})
	}
}

// TestRunTimes: every phase is timed, together they stay within the
// wall time, and tokens/s is this process's tokens over its step time.
func TestRunTimes(t *testing.T) {
	c := quickConfig(t, writeModel(t, microConfig(16, 1)))
	c.Steps, c.EvalEvery, c.CheckpointEvery = 3, 1, 1
	res := mustRun(t, context.Background(), c, Options{})
	tm := res.Times
	if tm.Setup <= 0 || tm.Train <= 0 || tm.Eval <= 0 || tm.Checkpoint <= 0 || tm.Export <= 0 {
		t.Errorf("a phase without time: %+v", tm)
	}
	if sum := tm.Setup + tm.Train + tm.Eval + tm.Checkpoint + tm.Export; sum > res.Elapsed {
		t.Errorf("phases sum to %v, more than the %v the run took", sum, res.Elapsed)
	}
	tokens := float64(3 * c.Batch * c.SeqLen * c.GradAccum)
	if want := tokens / tm.Train.Seconds(); res.TokensPerSec != want {
		t.Errorf("tokens/s %v, want %v tokens over %v of steps = %v", res.TokensPerSec, tokens, tm.Train, want)
	}
	if res.StepsRun != 3 || res.ResumedAt != -1 {
		t.Errorf("steps run %d, resumed at %d; want 3, -1", res.StepsRun, res.ResumedAt)
	}
}

// TestInterruptedRunPlots: a run stopped early saves its checkpoint and
// still draws the loss plot (but exports nothing).
func TestInterruptedRunPlots(t *testing.T) {
	c := quickConfig(t, writeModel(t, microConfig(16, 1)))
	res := mustRun(t, context.Background(), c, Options{StopAfter: 2})
	if !res.Interrupted || res.Export != "" {
		t.Fatalf("interrupted %v, export %q", res.Interrupted, res.Export)
	}
	if res.Plot == "" {
		t.Fatal("an interrupted run names no loss plot")
	}
	if st, err := os.Stat(res.Plot); err != nil || st.Size() == 0 {
		t.Errorf("loss plot of an interrupted run: %v", err)
	}
}
