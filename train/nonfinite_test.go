// Tests of --on-nonfinite and --max-skips through whole runs, with a NaN
// injected into one micro-batch (train/faults NaN injections), in every
// mode and both schedules: a skipped step is recorded and the run goes on
// and finishes, resumably bit for bit across the skip; stop (the default)
// stops without saving the step; more than --max-skips in a row stops; and
// a non-finite gradient with a finite loss stops even with skip. The
// bit-for-bit state around a skipped step is the engine's test
// (TestSkipNonFiniteLoss).

package train

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/faults"
	"github.com/lsp-offload/lsp-offload/train/metrics"
)

// nonFiniteConfigs are the quick job in every mode, two micro-batches a
// step (the NaN goes into the second), with the given schedule.
func nonFiniteConfigs(t *testing.T, model string, sched Schedule) map[string]Config {
	cs := modeConfigs(t, model)
	cs["native"] = quickConfig(t, model)
	for name, c := range cs {
		c.GradAccum, c.Schedule, c.CheckpointEvery = 2, sched, 2
		c.Out = filepath.Join(t.TempDir(), name)
		cs[name] = c
	}
	return cs
}

// armNaN arms a NaN injection for the rest of the test (in-process; the
// tests here are not parallel, so no other run sees it).
func armNaN(t *testing.T, spec string) {
	t.Helper()
	disarm, err := faults.ArmNaN(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(disarm)
}

// skipRecords are the skipped-step records of a run's metrics.
func skipRecords(t *testing.T, out string) []metrics.Record {
	t.Helper()
	recs, err := metrics.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var skips []metrics.Record
	for _, r := range recs {
		if r.Event == metrics.SkippedStepEvent {
			if r.Skipped == nil || r.TrainLoss != nil {
				t.Errorf("skipped-step record %+v: want its skip and no train loss", r)
			}
			skips = append(skips, r)
		}
	}
	return skips
}

// TestSkipNonFinite: with --on-nonfinite skip a NaN loss at step 3 is
// skipped with a warning and a metrics record, the step is taken with the
// next batch, and the run finishes its 8 steps, every one finite. A run
// stopped after step 2 or after step 3 (past the skip) and resumed ends
// exactly where the uninterrupted one does: the skip happens again after
// the first resume, and the second's checkpoint holds the consumed batch.
func TestSkipNonFinite(t *testing.T) {
	model := writeModel(t, microConfig(16, 2))
	for _, sched := range []Schedule{Pipelined, Sequential} {
		for name, c := range nonFiniteConfigs(t, model, sched) {
			t.Run(name+"/"+string(sched), func(t *testing.T) {
				c.OnNonFinite = SkipNonFinite
				armNaN(t, "loss@3/1")
				full, log := loggedRun(t, c)
				if full.Steps != 8 || len(full.Losses) != 8 {
					t.Fatalf("%d steps, %d losses; want 8", full.Steps, len(full.Losses))
				}
				for i, l := range full.Losses {
					if math.IsNaN(l) || math.IsInf(l, 0) {
						t.Errorf("step %d: loss %v", i+1, l)
					}
				}
				trainRecords(t, full.Metrics, 8)
				skips := skipRecords(t, c.Out)
				if len(skips) != 1 || skips[0].Step != 3 || skips[0].Skipped.Loss != "NaN" || skips[0].Skipped.InARow != 1 ||
					skips[0].LR == nil {
					t.Errorf("skipped-step records %+v, want one at step 3 with loss NaN, 1 in a row, and the lr", skips)
				}
				for _, want := range []string{"level=WARN", "skipped a step whose loss is not finite", "step=3", "loss=NaN"} {
					if !strings.Contains(log, want) {
						t.Errorf("log lacks %q:\n%s", want, log)
					}
				}
				if sched == Sequential || name == "lsp-host" {
					return // resuming across a skip: once per mode is enough
				}
				for _, stop := range []int{2, 3} {
					c2 := c
					c2.Out = filepath.Join(t.TempDir(), "resumed")
					armNaN(t, "loss@3/1")
					first := mustRun(t, context.Background(), c2, Options{StopAfter: stop})
					c2.Resume = true
					second := mustRun(t, context.Background(), c2, Options{})
					if got := append(slices.Clone(first.Losses), second.Losses...); !slices.Equal(got, full.Losses) {
						t.Errorf("stopped after %d: losses %v after resume, %v uninterrupted", stop, got, full.Losses)
					}
					sameTensors(t, readCheckpoint(t, c.Out), readCheckpoint(t, c2.Out))
					if n := len(skipRecords(t, c2.Out)); n != 1 {
						t.Errorf("stopped after %d: %d skipped-step records after resume, want 1", stop, n)
					}
				}
			})
		}
	}
}

// TestNonFiniteStops: a NaN loss stops the run without saving the step
// under the default --on-nonfinite stop, and under skip when it is one
// more than --max-skips in a row (the skips before it recorded); a NaN
// gradient with a finite loss stops under skip too. The checkpoint of step
// 2 is kept byte for byte and nothing is exported.
func TestNonFiniteStops(t *testing.T) {
	model := writeModel(t, microConfig(16, 2))
	for _, tc := range []struct {
		name, spec string
		edit       func(*Config)
		losses     int      // in the result: step 3's finite loss too when the gradient stops it
		skips      int      // skipped-step records, all at step 3
		want       []string // in the error
	}{
		{"stop", "loss@3/1", func(*Config) {}, 2, 0,
			[]string{"step 3: loss is NaN", "--lr", "--on-nonfinite skip"}},
		{"max-skips", "loss@3/1:3", func(c *Config) { c.OnNonFinite, c.MaxSkips = SkipNonFinite, 2 }, 2, 2,
			[]string{"step 3: loss is NaN for the 3rd attempt in a row", "--max-skips 2", "--lr"}},
		{"gradient", "grad@3/1", func(c *Config) { c.OnNonFinite = SkipNonFinite }, 3, 0,
			[]string{"step 3: gradient norm is NaN", "skips a non-finite loss only", "--lr"}},
	} {
		for _, sched := range []Schedule{Pipelined, Sequential} {
			for name, c := range nonFiniteConfigs(t, model, sched) {
				t.Run(tc.name+"/"+name+"/"+string(sched), func(t *testing.T) {
					tc.edit(&c)
					armNaN(t, tc.spec)
					res, err := Run(context.Background(), c, Options{})
					if !errors.Is(err, ErrNonFinite) {
						t.Fatalf("err = %v, want one wrapping ErrNonFinite", err)
					}
					wantErr(t, err, tc.want...)
					if res == nil || res.Export != "" || len(res.Losses) != tc.losses {
						t.Fatalf("result %+v: want %d losses and no export", res, tc.losses)
					}
					ck, err := checkpoint.ReadState(readCheckpoint(t, c.Out))
					if err != nil {
						t.Fatal(err)
					}
					if ck.Step != 2 {
						t.Errorf("checkpoint at step %d, want 2 (the one before the fault)", ck.Step)
					}
					trainRecords(t, res.Metrics, 2)
					skips := skipRecords(t, c.Out)
					if len(skips) != tc.skips {
						t.Fatalf("%d skipped-step records, want %d", len(skips), tc.skips)
					}
					for i, r := range skips {
						if r.Step != 3 || r.Skipped.InARow != i+1 {
							t.Errorf("skipped-step record %d: step %d, %d in a row", i, r.Step, r.Skipped.InARow)
						}
					}
					if _, err := os.Stat(filepath.Join(c.Out, "hf")); err == nil {
						t.Error("hf/ exported after the fault")
					}
				})
			}
		}
	}
}

// A mode run under --on-nonfinite skip with no NaN trains exactly as under
// stop: the flag costs nothing in results.
func TestSkipChangesNothingWhenFinite(t *testing.T) {
	model := writeModel(t, microConfig(16, 2))
	for _, mode := range []engine.Mode{engine.Native, engine.Zero, engine.LSP} {
		t.Run(string(mode), func(t *testing.T) {
			c := quickConfig(t, model)
			c.Mode, c.Steps = mode, 4
			if mode == engine.LSP {
				c.D, c.R, c.CheckEvery, c.CalibSamples, c.FitIters = 8, 2, 2, 4, 10
				c.Fit = true
			}
			stop := mustRun(t, context.Background(), c, Options{})
			c.Out, c.OnNonFinite = filepath.Join(t.TempDir(), "skip"), SkipNonFinite
			skip := mustRun(t, context.Background(), c, Options{})
			if !slices.Equal(stop.Losses, skip.Losses) {
				t.Errorf("losses %v with skip, %v with stop", skip.Losses, stop.Losses)
			}
			sameTensors(t, readCheckpoint(t, stop.Out), readCheckpoint(t, skip.Out))
		})
	}
}
