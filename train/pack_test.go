package train

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/engine"
)

// TestPackRuns: --pack trains in every mode (per-document attention and
// positions on the model, the packed loader, positions staged with every
// micro-batch, evaluation on unpacked rows of a packed model) with finite
// losses, in fewer steps per epoch; a resume must keep --pack and names it
// when it does not.
func TestPackRuns(t *testing.T) {
	model := writeModel(t, microConfig(16, 1))
	for _, mode := range []engine.Mode{engine.Native, engine.Zero, engine.LSP} {
		t.Run(string(mode), func(t *testing.T) {
			c := quickConfig(t, model)
			c.Mode, c.Pack, c.Steps, c.GradAccum = mode, true, 3, 2
			res := mustRun(t, context.Background(), c, Options{})
			if res.Steps != 3 || len(res.Losses) != 3 {
				t.Fatalf("steps %d, %d losses", res.Steps, len(res.Losses))
			}
			for i, l := range res.Losses {
				if math.IsNaN(float64(l)) || math.IsInf(float64(l), 0) {
					t.Fatalf("step %d loss %v", i+1, l)
				}
			}
			if mode != engine.Native {
				return
			}
			bad := c
			bad.Resume, bad.Pack, bad.Steps = true, false, 4
			_, err := Run(context.Background(), bad, Options{})
			wantErr(t, err, "--pack: checkpoint has true, command line has false")
		})
	}
}

// TestPackEpochSteps: --epochs counts packed rows, so an epoch of short
// examples takes fewer steps packed.
func TestPackEpochSteps(t *testing.T) {
	mc := microConfig(16, 1)
	mc.MaxT = 96
	c := quickConfig(t, writeModel(t, mc))
	c.SeqLen = 96
	c.Steps, c.Epochs, c.EvalEvery, c.EvalGenerate = 0, 0.3, 0, 0
	c.Out = filepath.Join(t.TempDir(), "plain")
	plain := mustRun(t, context.Background(), c, Options{})
	c.Pack, c.Out = true, filepath.Join(t.TempDir(), "packed")
	packed := mustRun(t, context.Background(), c, Options{})
	if packed.Steps >= plain.Steps {
		t.Fatalf("an epoch takes %d steps packed, %d unpacked", packed.Steps, plain.Steps)
	}
}
