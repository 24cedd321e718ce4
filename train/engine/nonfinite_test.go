// Tests of the step skipped for a non-finite loss (engine.go, "A step
// whose loss is not finite"), in every mode and both schedules, with a NaN
// injected into one micro-batch through train/faults.

package engine

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/faults"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// skipModes are the modes the skip tests run: every update path (device
// AdamW over everything or over the dense parameters, the host Adam of
// zero and of lsp's dense parameters, lsp's subspace Adam and apply), and
// native with global-prev clipping, whose norm of the previous step is
// device state a skipped step must not overwrite.
func skipModes() []struct {
	name string
	cfg  Config
	dt   backend.DType
} {
	native, global := testConfig(Native), testConfig(Native)
	// A max norm far below the gradients' so that every step clips, by
	// the previous step's norm.
	global.Hyper.Clip, global.Hyper.MaxNorm = optim.ClipGlobalPrev, 1e-3
	lspFrozen := testConfig(LSP)
	lspFrozen.DenseParams = DenseFrozen
	return append([]struct {
		name string
		cfg  Config
		dt   backend.DType
	}{
		{"native", native, backend.BF16},
		{"native-global-prev", global, backend.F32},
		{"lsp-frozen", lspFrozen, backend.BF16},
	}, modesUnderTest()...)
}

// state is everything a step may change, bit for bit: the parameters and
// the optimizer state a checkpoint saves (device and host moments, master
// copies, step counts, projectors), with the engine's step count.
type state struct {
	step   int
	params []float32
	opt    map[string][]float32
}

func snapshot(t *testing.T, tr *trainer) state {
	t.Helper()
	opt, err := tr.e.SaveState()
	if err != nil {
		t.Fatal(err)
	}
	return state{step: tr.e.step, params: tr.params(t), opt: opt}
}

// diff names the first difference between two states; names for which
// skip returns true are left out.
func (a state) diff(b state, skip func(name string) bool) string {
	if a.step != b.step {
		return fmt.Sprintf("step count %d, want %d", a.step, b.step)
	}
	if d := bitsDiff(a.params, b.params); d != "" {
		return "params: " + d
	}
	for name, v := range b.opt {
		if skip != nil && skip(name) {
			continue
		}
		w, ok := a.opt[name]
		if !ok {
			return name + " missing"
		}
		if d := bitsDiff(w, v); d != "" {
			return name + ": " + d
		}
	}
	return ""
}

func bitsDiff(got, want []float32) string {
	if len(got) != len(want) {
		return fmt.Sprintf("%d values, want %d", len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return fmt.Sprintf("[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	return ""
}

// stepAt takes step number (1-based) with its batches, after a projector
// check when one is due.
func stepAt(t *testing.T, tr *trainer, seed uint64) float64 {
	t.Helper()
	if tr.e.CheckDue() {
		if _, err := tr.e.Check(batches(1000+uint64(tr.e.step), tr.e.CalibBatches())); err != nil {
			t.Fatal(err)
		}
	}
	l, err := tr.e.Step(batches(seed, tr.e.accum), 1e-2)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestSkipNonFiniteLoss: a NaN in one micro-batch's loss at step k skips
// the step: the weights, master copies, moments (device and host), step
// counts and projectors are those after step k-1, bit for bit, and the
// engine reports the skip. The run then takes step k with the next batch
// and step k+1 and ends exactly where a run that never saw the bad batch
// ends, so nothing of the skipped step (its norm for global-prev
// clipping, its step count in Adam's bias correction or in the rounding
// key, a second projector check) leaks into later steps.
//
// "loss" at step 6, right after lsp's projector check at 5, leaves the
// gradients finite, so only the flag can stop the updates; "both" at step
// 1 makes the gradients NaN too, as an overflow would, before any host
// Adam has written the pinned weights that zero mode sends up.
func TestSkipNonFiniteLoss(t *testing.T) {
	for _, tc := range skipModes() {
		for _, inj := range []struct {
			kind string
			at   int
		}{{"loss", 6}, {"both", 1}} {
			for _, pipelined := range []bool{false, true} {
				name := fmt.Sprintf("%s/%s@%d/sequential", tc.name, inj.kind, inj.at)
				bc := cpu.Config{Threads: 2}
				cfg := tc.cfg
				if pipelined {
					name = strings.Replace(name, "sequential", "pipelined", 1)
					cfg.Pipelined, bc = true, hazardConfig(11)
				}
				t.Run(name, func(t *testing.T) {
					checkSkip(t, cfg, tc.dt, bc, inj.kind, inj.at)
				})
			}
		}
	}
}

func checkSkip(t *testing.T, cfg Config, dt backend.DType, bc cpu.Config, kind string, at int) {
	ref := newTrainer(t, cfg, dt, 2, cpu.Config{Threads: 2})
	tr := newTrainer(t, cfg, dt, 2, bc)
	for s := 1; s < at; s++ {
		stepAt(t, ref, uint64(s))
		stepAt(t, tr, uint64(s))
	}
	// lsp checks its projectors before steps 1 and 6: the state to keep is
	// the one after that check (which the attempt after the skip must not
	// repeat).
	if tr.e.CheckDue() {
		if _, err := tr.e.Check(batches(1000+uint64(tr.e.step), tr.e.CalibBatches())); err != nil {
			t.Fatal(err)
		}
	}
	before := snapshot(t, tr)
	disarm, err := faults.ArmNaN(fmt.Sprintf("%s@%d/1", kind, at))
	if err != nil {
		t.Fatal(err)
	}
	up := tr.be.Traffic().H2D
	loss := stepAt(t, tr, 999)
	disarm()
	if !math.IsNaN(loss) || !tr.e.Skipped() {
		t.Fatalf("loss sum %v, skipped %v; want NaN and a skipped step", loss, tr.e.Skipped())
	}
	// Nothing but the batch goes up (and lsp's projectors in slots, which
	// every backward reads): no weights (zero), no Delta (lsp).
	want := int64(2 * 2 * testB * testT * 4)
	if tr.e.lsp != nil {
		want += 2 * tr.e.lsp.ProjectorUploadBytes()
	}
	// galore's refresh runs in the first micro-batch, before the flag is
	// known: its uploads happen, and so does its new projector, which the
	// attempt after the skip (a refresh again: the count went back)
	// replaces before any update reads it; the final comparison below
	// holds it to the run without the bad batch.
	ignore := func(n string) bool { return strings.HasSuffix(n, ".norms") }
	if tr.e.galore != nil {
		want += tr.e.galore.RefreshUploads()
		ignore = func(n string) bool { return strings.HasSuffix(n, ".norms") || n == "galore.p" }
	}
	if got := tr.be.Traffic().H2D - up; got != want {
		t.Errorf("the skipped step copied %d bytes host-to-device, want the batch's and projectors' %d", got, want)
	}
	// The per-tensor norms are scratch, written before each use by the
	// step that uses them.
	if d := snapshot(t, tr).diff(before, ignore); d != "" {
		t.Fatalf("after the skipped step: %s", d)
	}
	if tr.e.CheckDue() {
		t.Fatal("the projectors are due for a second check before the attempt after the skip")
	}
	for s := at; s <= at+1; s++ {
		lr, lt := stepAt(t, ref, uint64(s)), stepAt(t, tr, uint64(s))
		if tr.e.Skipped() || lr != lt {
			t.Fatalf("step %d: loss %v (skipped %v), %v without the bad batch", s, lt, tr.e.Skipped(), lr)
		}
	}
	if d := snapshot(t, tr).diff(snapshot(t, ref), nil); d != "" {
		t.Errorf("after step %d, unlike a run without the bad batch: %s", at+1, d)
	}
	if h := tr.hazards(); len(h) > 0 {
		t.Fatalf("%d hazards, first %v", len(h), h[0])
	}
}
