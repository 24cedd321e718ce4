package train

import (
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/metrics"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// modeConfigs are the offload modes as a user sets them, on the quick job.
func modeConfigs(t *testing.T, model string) map[string]Config {
	out := map[string]Config{}
	// mode-dense[-base]: lora-frozen-nf4 is QLoRA's set-up, a quantized
	// base with nothing else trained.
	for _, name := range []string{"zero", "lsp-device", "lsp-host", "lsp-frozen", "lora-device", "lora-frozen-nf4", "galore-device"} {
		c := quickConfig(t, model)
		c.Out = filepath.Join(t.TempDir(), name)
		parts := strings.Split(name, "-")
		c.Mode = engine.Mode(parts[0])
		if c.Mode.FrozenMatrices() {
			c.DenseParams = engine.DenseParams(parts[1])
		}
		if len(parts) > 2 {
			c.BaseDType = parts[2]
		}
		if c.Mode == engine.LSP {
			c.D, c.R, c.CheckEvery, c.CalibSamples, c.FitIters = 8, 2, 2, 4, 10
			c.Fit = true
		}
		if c.Mode == engine.Galore {
			// Refreshes at steps 1, 3 and 5: one after the resume.
			c.GaloreRank, c.GaloreEvery = 4, 2
		}
		out[name] = c
	}
	return out
}

// TestModesResumeBitForBit: a run of each mode stopped after step 3 and
// resumed ends exactly where an uninterrupted run does, lsp's projector
// checks (--check-every 2) and galore's refreshes (--galore-every 2)
// after the resume included.
func TestModesResumeBitForBit(t *testing.T) {
	checkModesResume(t, modeConfigs(t, writeModel(t, microConfig(16, 2))))
}

// TestLLaMAModesResumeBitForBit: a LLaMA checkpoint directory (the GQA
// fixture, made by transformers) trains in every mode, native included,
// and resumes exactly.
func TestLLaMAModesResumeBitForBit(t *testing.T) {
	model := filepath.Join("testdata", "llama-tiny-gqa")
	cfgs := modeConfigs(t, model)
	native := quickConfig(t, model)
	native.Out = filepath.Join(t.TempDir(), "native")
	cfgs["native"] = native
	checkModesResume(t, cfgs)
}

// checkModesResume runs each configuration whole, and stopped after step
// 3 and resumed: the losses and the checkpoints must be the same, and the
// export must read back as --model's architecture.
func checkModesResume(t *testing.T, cfgs map[string]Config) {
	for name, c := range cfgs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			full := mustRun(t, context.Background(), c, Options{})
			c2 := c
			c2.Out = filepath.Join(t.TempDir(), "out")
			first := mustRun(t, context.Background(), c2, Options{StopAfter: 3})
			c2.Resume = true
			second := mustRun(t, context.Background(), c2, Options{})
			got := append(slices.Clone(first.Losses), second.Losses...)
			if !slices.Equal(got, full.Losses) {
				t.Errorf("losses %v after resume, %v uninterrupted", got, full.Losses)
			}
			sameTensors(t, readCheckpoint(t, c.Out), readCheckpoint(t, c2.Out))
			want, _, err := catalog.Resolve(c.Model)
			if err != nil {
				t.Fatal(err)
			}
			exported, _, err := catalog.Resolve(full.Export)
			if err != nil || !sameArch(t, exported, want) {
				t.Errorf("export %s reads as %+v (%v), want %+v", full.Export, exported, err, want)
			}
		})
	}
}

// TestModesUnderHazardCheck runs each mode through Run on the backend's
// test mode (random delays, hazard detection) and compares with a plain
// backend: no hazard, the same losses.
func TestModesUnderHazardCheck(t *testing.T) {
	model := writeModel(t, microConfig(16, 2))
	for name, c := range modeConfigs(t, model) {
		t.Run(name, func(t *testing.T) {
			c.Steps = 4
			plain := mustRun(t, context.Background(), c, Options{})
			be := cpu.New(cpu.Config{Threads: 2, HazardCheck: true, MaxDelay: 50 * time.Microsecond, Seed: 9})
			defer be.Close()
			c.Out = filepath.Join(t.TempDir(), "hazard")
			res := mustRun(t, context.Background(), c, Options{Backend: be})
			if hz := be.Hazards(); len(hz) > 0 {
				t.Fatalf("%d hazards, first %v", len(hz), hz[0])
			}
			if !slices.Equal(res.Losses, plain.Losses) {
				t.Errorf("losses %v under hazard mode, %v plain", res.Losses, plain.Losses)
			}
		})
	}
}

// TestProjectorChecksInMetrics: every check writes one record per matrix
// with the ratios before and after.
func TestProjectorChecksInMetrics(t *testing.T) {
	c := modeConfigs(t, writeModel(t, microConfig(16, 2)))["lsp-device"]
	res := mustRun(t, context.Background(), c, Options{})
	recs, err := metrics.ReadFile(res.Metrics)
	if err != nil {
		t.Fatal(err)
	}
	perStep := map[int]int{}
	for _, r := range recs {
		if r.Event != "projector-check" {
			continue
		}
		p := r.Projector
		if p == nil || p.Matrix == "" || !(p.RatioBefore > 0) || !(p.RatioAfter > 0) {
			t.Fatalf("bad check record %+v", r)
		}
		perStep[r.Step]++
	}
	// Checks before steps 3, 5 and 7 (after 2, 4, 6 steps), 2 layers x 4
	// matrices each; none before step 1 (without --check-at-start, the default).
	for _, s := range []int{0, 2, 4, 6} {
		if want := 8 * min(s, 1); perStep[s] != want {
			t.Errorf("step %d: %d check records, want %d (all: %v)", s, perStep[s], want, perStep)
		}
	}
}

// TestLSPCapLogged: a --d larger than a matrix side is capped per matrix
// and the run says so.
func TestLSPCapLogged(t *testing.T) {
	c := modeConfigs(t, writeModel(t, microConfig(16, 2)))["lsp-device"]
	c.D, c.R, c.Steps = 100, 4, 1
	_, logged := loggedRun(t, c)
	for _, want := range []string{"16x48 d=16 r=4 (qkv, x2) capped at the matrix's side from --d 100", "64x16 d=16 r=4 (fcproj, x2) capped"} {
		if !strings.Contains(logged, want) {
			t.Errorf("log lacks %q:\n%s", want, logged)
		}
	}
}

// sameArch reports whether a and b are the same architecture, their
// token ids aside: an export carries its tokenizer's bos and eos ids (the
// byte tokenizer's 256 for a LLaMA checkpoint's 1 and 2), which are not
// the architecture's.
func sameArch(t *testing.T, a, b model.Spec) bool {
	t.Helper()
	if catalog.Equal(a, b) {
		return true
	}
	var ma, mb map[string]any
	for _, p := range []struct {
		s model.Spec
		m *map[string]any
	}{{a, &ma}, {b, &mb}} {
		raw, err := json.Marshal(p.s)
		if err != nil || json.Unmarshal(raw, p.m) != nil {
			return false
		}
		delete(*p.m, "bos_token_id")
		delete(*p.m, "eos_token_id")
	}
	return a.Family() == b.Family() && reflect.DeepEqual(ma, mb)
}

// TestProjectorKindsResumeBitForBit: runs with dense projectors resume
// exactly: --projector svd on the LLaMA fixture (q, k and v share P, from
// their stacked gradients), refreshed every 3 steps, after the resume
// (at step 3) too; gaussian on GPT-2.
func TestProjectorKindsResumeBitForBit(t *testing.T) {
	cfgs := map[string]Config{}
	for name, model := range map[string]string{"lsp-svd": filepath.Join("testdata", "llama-tiny-gqa"), "lsp-gauss": writeModel(t, microConfig(16, 2))} {
		c := modeConfigs(t, model)["lsp-device"]
		c.Out = filepath.Join(t.TempDir(), name)
		c.Fit = false
		c.Projector = lsp.KindGaussian
		if name == "lsp-svd" {
			c.Projector, c.CheckEvery = lsp.KindSVD, 3
		}
		cfgs[name] = c
	}
	checkModesResume(t, cfgs)
}
