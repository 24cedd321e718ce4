package engine

import (
	"maps"
	"math"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// runFrom takes steps first..last-1 (batches keyed by the step index, as
// trainer.run does).
func (tr *trainer) runFrom(t *testing.T, first, last int) {
	t.Helper()
	for i := first; i < last; i++ {
		if tr.e.CheckDue() {
			if _, err := tr.e.Check(batches(1000+uint64(i), tr.e.CalibBatches())); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tr.e.Step(batches(uint64(i), tr.e.accum), 1e-2); err != nil {
			t.Fatal(err)
		}
	}
}

// resume loads params and the state st into tr, a fresh engine like the
// one they were saved from after step steps, runs it on to step last, and
// fails unless its parameters are then straight's, bit for bit.
func (tr *trainer) resume(t *testing.T, params []float32, st map[string][]float32, step, last int, straight *trainer) {
	t.Helper()
	if err := backend.Upload(tr.be, tr.be.DefaultStream(), tr.e.Model.Buffers().Params, params); err != nil {
		t.Fatal(err)
	}
	if err := tr.e.LoadState(st); err != nil {
		t.Fatal(err)
	}
	tr.e.SetStepCount(step)
	tr.runFrom(t, step, last)
	want, got := straight.params(t), tr.params(t)
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			t.Fatalf("weight %d: straight %v, resumed %v", i, want[i], got[i])
		}
	}
}

func TestStateRoundTrip(t *testing.T) {
	lspHost, loraHost := testConfig(LSP), testConfig(LoRA)
	lspHost.DenseParams, loraHost.DenseParams = DenseHost, DenseHost
	for _, tc := range []struct {
		name string
		cfg  Config
		dt   backend.DType
	}{
		{"native", testConfig(Native), backend.BF16}, {"zero", testConfig(Zero), backend.BF16},
		{"lsp-device", testConfig(LSP), backend.BF16}, {"lsp-host", lspHost, backend.F32},
		{"lora-device", testConfig(LoRA), backend.BF16}, {"lora-host", loraHost, backend.F32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// 7 steps straight through (a projector check at 0 and 5) ...
			full := newTrainer(t, tc.cfg, tc.dt, 1, cpu.Config{Threads: 2})
			full.runFrom(t, 0, 7)
			// ... equal 4 steps, a save, a fresh engine and 3 more.
			a := newTrainer(t, tc.cfg, tc.dt, 1, cpu.Config{Threads: 2})
			a.runFrom(t, 0, 4)
			st, err := a.e.SaveState()
			if err != nil {
				t.Fatal(err)
			}
			// The model's parameters (lora's adapters are in the state).
			params := a.params(t)[:small.NumParams()]
			b := newTrainer(t, tc.cfg, tc.dt, 1, cpu.Config{Threads: 2})
			b.resume(t, params, st, 4, 7, full)
			// A missing or mis-sized array is an error naming it.
			for name := range st {
				bad := maps.Clone(st)
				bad[name] = bad[name][:len(bad[name])-1]
				if err := b.e.LoadState(bad); err == nil || !strings.Contains(err.Error(), name) {
					t.Errorf("truncated %s: %v", name, err)
				}
				break
			}
		})
	}
}
