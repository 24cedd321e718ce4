// Tests of bad input: every error must name the file, field or flag at
// fault, come before any training, and leave earlier outputs untouched.

package train

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// wantErr fails unless err is non-nil and its message holds every part.
func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one mentioning %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
}

func writeFile(t *testing.T, path, text string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeHFDir writes a Hugging Face directory by hand: config.json as given
// and, when tensors is not nil, model.safetensors.
func writeHFDir(t *testing.T, config string, tensors []safetensors.Tensor) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "hf")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "config.json"), config)
	if tensors != nil {
		if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), tensors, nil); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// modelTensors lays cfg's initial weights out as Hugging Face tensors,
// with override changing the shape of one of them.
func modelTensors(cfg gpt2.Config, name string, shape []int) []safetensors.Tensor {
	vals := gpt2.Init(cfg, 1)
	var ts []safetensors.Tensor
	for _, p := range cfg.Layout() {
		v, sh := vals[p.Offset:p.Offset+p.Len()], p.Shape
		if p.Name == name {
			n := 1
			for _, d := range shape {
				n *= d
			}
			v, sh = make([]float32, n), shape
		}
		ts = append(ts, safetensors.F32Tensor(p.Name, sh, v))
	}
	return ts
}

func hfConfigJSON(nEmbd, nHead, nPositions int) string {
	return `{"model_type": "gpt2", "vocab_size": 257, "n_positions": ` + strconv.Itoa(nPositions) +
		`, "n_embd": ` + strconv.Itoa(nEmbd) + `, "n_layer": 1, "n_head": ` + strconv.Itoa(nHead) + `}`
}

func TestBadInput(t *testing.T) {
	model := writeModel(t, microConfig(16, 1))
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, c *Config)
		want  []string
	}{
		{"missing data file", func(t *testing.T, c *Config) {
			c.Data = filepath.Join(t.TempDir(), "nope.jsonl")
		}, []string{"--data", "nope.jsonl"}},
		{"empty data file", func(t *testing.T, c *Config) {
			c.Data = writeFile(t, filepath.Join(t.TempDir(), "empty.txt"), "")
		}, []string{"--data", "empty.txt", "empty"}},
		{"empty jsonl", func(t *testing.T, c *Config) {
			c.Data = writeFile(t, filepath.Join(t.TempDir(), "empty.jsonl"), "")
		}, []string{"--data", "empty.jsonl", "empty"}},
		{"malformed JSON line", func(t *testing.T, c *Config) {
			c.Data = writeFile(t, filepath.Join(t.TempDir(), "bad.jsonl"),
				`{"instruction": "say hi", "output": "hi"}`+"\n"+`{"instruction": "oops", "output": `+"\n")
		}, []string{"--data", "bad.jsonl:2"}},
		{"unknown builtin task", func(t *testing.T, c *Config) {
			c.Data = "builtin:juggle"
		}, []string{"--data", "juggle"}},
		{"unknown preset", func(t *testing.T, c *Config) {
			c.Model = "gpt3-mini"
		}, []string{"--model", "gpt3-mini", "tiny"}},
		{"model path that does not exist", func(t *testing.T, c *Config) {
			c.Model = filepath.Join(t.TempDir(), "no-such-model")
		}, []string{"--model", "no-such-model", "neither a checkpoint directory nor a preset"}},
		{"n_embd not divisible by n_head", func(t *testing.T, c *Config) {
			c.Model = writeHFDir(t, hfConfigJSON(30, 4, 32), nil)
		}, []string{"--model", "config.json", "n_embd=30", "n_head=4"}},
		{"config.json not JSON", func(t *testing.T, c *Config) {
			c.Model = writeHFDir(t, `{"n_embd": 16,`, nil)
		}, []string{"--model", "config.json"}},
		{"seq-len beyond n_positions", func(t *testing.T, c *Config) {
			c.SeqLen = 33
		}, []string{"--seq-len", "33", "n_positions=32"}},
		{"seq-len beyond the tiny preset", func(t *testing.T, c *Config) {
			c.Model, c.SeqLen = "tiny", 65
		}, []string{"--seq-len", "n_positions=64"}},
		{"wrong-shaped tensor", func(t *testing.T, c *Config) {
			cfg := microConfig(16, 1)
			c.Model = writeHFDir(t, hfConfigJSON(16, 2, 32),
				modelTensors(cfg, "transformer.wpe.weight", []int{31, 16}))
		}, []string{"--model", "model.safetensors", "transformer.wpe.weight", "[31 16]", "[32 16]"}},
		{"missing tensor file", func(t *testing.T, c *Config) {
			c.Model = writeHFDir(t, hfConfigJSON(16, 2, 32), nil)
		}, []string{"--model", "model.safetensors"}},
		{"truncated model.safetensors", func(t *testing.T, c *Config) {
			dir := writeModel(t, microConfig(16, 1))
			truncate(t, filepath.Join(dir, "model.safetensors"))
			c.Model = dir
		}, []string{"--model", "model.safetensors", "truncated"}},
		{"resume without a checkpoint", func(t *testing.T, c *Config) {
			c.Resume = true
		}, []string{"resume", checkpoint.FileName}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := quickConfig(t, model)
			c.SeqLen = 24
			tc.setup(t, &c)
			_, err := Run(context.Background(), c, Options{})
			wantErr(t, err, tc.want...)
			if _, err := os.Stat(filepath.Join(c.Out, checkpoint.FileName)); err == nil {
				t.Errorf("a failed run left %s", checkpoint.FileName)
			}
		})
	}
}

// truncate cuts a file to half its length.
func truncate(t *testing.T, path string) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, st.Size()/2); err != nil {
		t.Fatal(err)
	}
}

// stoppedRun leaves a checkpoint of the micro model at step 2 in c.Out.
func stoppedRun(t *testing.T, c Config) {
	t.Helper()
	res := mustRun(t, context.Background(), c, Options{StopAfter: 2})
	if !res.Interrupted || res.Steps != 2 {
		t.Fatalf("stopped run: interrupted %v, steps %d", res.Interrupted, res.Steps)
	}
}

func TestBadCheckpoint(t *testing.T) {
	base := quickConfig(t, writeModel(t, microConfig(16, 1)))
	stoppedRun(t, base)
	ck := filepath.Join(base.Out, checkpoint.FileName)
	good, err := os.ReadFile(ck)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, c *Config)
		want  []string
	}{
		{"another model", func(t *testing.T, c *Config) {
			c.Model = writeModel(t, microConfig(32, 1))
		}, []string{"resume", checkpoint.FileName, "model"}},
		{"another batch", func(t *testing.T, c *Config) {
			c.Batch = 3
		}, []string{"resume", checkpoint.FileName, "--batch: checkpoint has 4, command line has 3"}},
		{"another dtype", func(t *testing.T, c *Config) {
			c.DType = backend.BF16
		}, []string{"resume", checkpoint.FileName, "--dtype: checkpoint has fp32, command line has bf16"}},
		{"truncated", func(t *testing.T, c *Config) {
			truncate(t, filepath.Join(c.Out, checkpoint.FileName))
		}, []string{"resume", checkpoint.FileName, "truncated"}},
		{"not a training checkpoint", func(t *testing.T, c *Config) {
			hf := writeModel(t, microConfig(16, 1))
			raw, err := os.ReadFile(filepath.Join(hf, "model.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(c.Out, checkpoint.FileName), string(raw))
		}, []string{"resume", checkpoint.FileName, "not an lsp-train checkpoint"}},
		{"wrong tensor length", func(t *testing.T, c *Config) {
			path := filepath.Join(c.Out, checkpoint.FileName)
			rewriteCheckpoint(t, path, func(name string, v []float32) []float32 {
				if name == "adam.m" {
					return v[:len(v)-1]
				}
				return v
			})
		}, []string{"resume", checkpoint.FileName, "adam.m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := resumeCopy(t, base, good, func(t *testing.T, c *Config, _ string) { tc.setup(t, c) })
			wantErr(t, err, tc.want...)
		})
	}
}

// raiseLR sets c's learning rate to lr and records it as the one the
// checkpoint in c.Out was saved with, so that the resume, which refuses a
// changed --lr, goes on from finite weights with a rate that breaks them.
func raiseLR(t *testing.T, c *Config, lr float64) {
	t.Helper()
	c.LR = lr
	editCheckpoint(t, filepath.Join(c.Out, checkpoint.FileName), func(st *checkpoint.State) {
		st.Settings["lr"] = settingText(reflect.ValueOf(lr))
	}, nil)
}

// rewriteCheckpoint rewrites every tensor of a checkpoint through edit,
// keeping its training state, with checksums of the edited tensors.
func rewriteCheckpoint(t *testing.T, path string, edit func(name string, v []float32) []float32) {
	t.Helper()
	editCheckpoint(t, path, nil, edit)
}

// editCheckpoint rewrites a checkpoint with editState's changes to its
// training state and edit's to its tensors (nil: unchanged), and with the
// checksums of what it writes.
func editCheckpoint(t *testing.T, path string, editState func(st *checkpoint.State), edit func(name string, v []float32) []float32) {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	state := f.Metadata[checkpoint.MetadataKey]
	if editState != nil {
		st, err := checkpoint.ReadState(f)
		if err != nil {
			t.Fatal(err)
		}
		editState(&st)
		raw, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		state = string(raw)
	}
	var ts []safetensors.Tensor
	for _, name := range f.Names() {
		v, _, err := f.Float32(name)
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			v = edit(name, v)
		}
		ts = append(ts, safetensors.F32Tensor(name, []int{len(v)}, v))
	}
	if err := safetensors.Write(path, ts, checkpoint.Metadata(ts, state)); err != nil {
		t.Fatal(err)
	}
}

// TestNonFinite: a loss that is NaN or infinite stops the run with
// ErrNonFinite before the update, and the previous checkpoint stays as it
// was, byte for byte.
func TestNonFinite(t *testing.T) {
	model := writeModel(t, microConfig(16, 1))
	for _, tc := range []struct {
		name, what string                        // what is not finite
		setup      func(t *testing.T, c *Config) // after a checkpoint at step 2
	}{
		// Step 3 is finite, its update breaks the weights: the eval at step
		// 4 sees it (a step-5 loss would too).
		{"lr 1e9", "eval loss is NaN", func(t *testing.T, c *Config) { raiseLR(t, c, 1e9) }},
		// Without that eval, the step-5 loss is the first to see it (NaN
		// weights in a checkpoint are refused when it loads instead:
		// TestIntegrityResume).
		{"lr 1e9, no eval", "step 5: loss is NaN", func(t *testing.T, c *Config) { raiseLR(t, c, 1e9); c.EvalEvery = 0 }},
		// A huge final LayerNorm bias: the logits and the loss stay finite,
		// but the squared norm of the tied embedding's gradient overflows.
		{"gradient norm overflow", "gradient norm is +Inf", func(t *testing.T, c *Config) {
			C := microConfig(16, 1).C
			rewriteCheckpoint(t, filepath.Join(c.Out, checkpoint.FileName), func(name string, v []float32) []float32 {
				if name == "params" {
					for i := len(v) - C; i < len(v); i++ {
						v[i] = 1e20 // ln_f.bias
					}
				}
				return v
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := quickConfig(t, model)
			stoppedRun(t, c)
			tc.setup(t, &c)
			c.Resume = true
			path := filepath.Join(c.Out, checkpoint.FileName)
			before, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			res, runErr := Run(context.Background(), c, Options{})
			if res == nil {
				t.Fatalf("no result with error %v", runErr)
			}
			if !errors.Is(runErr, ErrNonFinite) {
				t.Fatalf("err = %v, want one wrapping ErrNonFinite", runErr)
			}
			wantErr(t, runErr, "step", "--lr", tc.what)
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(after) != string(before) {
				t.Errorf("%s changed after the non-finite loss", checkpoint.FileName)
			}
			if res.Export != "" {
				t.Errorf("exported %s after a non-finite loss", res.Export)
			}
			// The metrics keep the steps before the failure, once each; a
			// step whose gradients failed is not recorded.
			steps := 2 + len(res.Losses)
			if strings.Contains(runErr.Error(), "gradient norm") {
				steps--
			}
			recs := trainRecords(t, filepath.Join(c.Out, "metrics.jsonl"), steps)
			for _, r := range recs {
				if r.TrainLoss != nil && (math.IsNaN(*r.TrainLoss) || math.IsInf(*r.TrainLoss, 0)) {
					t.Errorf("metrics hold a non-finite loss at step %d", r.Step)
				}
			}
		})
	}
}

// TestDeviceMemTooSmall: a budget below the plan is an error before
// training that states the bytes needed, and nothing is written.
func TestDeviceMemTooSmall(t *testing.T) {
	c := quickConfig(t, "tiny")
	c.DeviceMem = 1 << 20
	_, plan := memoryPlan(t, c)
	_, err := Run(context.Background(), c, Options{})
	wantErr(t, err, "--device-mem", "needs "+strconv.FormatInt(plan.DeviceTotal(), 10)+" bytes", strconv.FormatInt(c.DeviceMem, 10))
	var fe *FlagError
	if !errors.As(err, &fe) || fe.Flag != "device-mem" {
		t.Errorf("error %v is not a FlagError for device-mem", err)
	}
	if _, err := os.Stat(filepath.Join(c.Out, checkpoint.FileName)); err == nil {
		t.Errorf("checkpoint written despite the memory error")
	}
	if !strings.Contains(err.Error(), "even --recompute layer needs") {
		t.Errorf("error %v does not say what the most recomputation needs", err)
	}

	// A budget between the plans without and with recomputation: the
	// error names the setting that fits, and that setting runs.
	c.Recompute = model.RecomputeAttn
	_, attn := memoryPlan(t, c)
	c.Recompute = model.RecomputeNone
	c.DeviceMem = attn.DeviceTotal()
	_, err = Run(context.Background(), c, Options{})
	wantErr(t, err, "--device-mem", "--recompute attn fits ("+strconv.FormatInt(attn.DeviceTotal(), 10)+" bytes")
	c.Recompute = model.RecomputeAttn
	if _, err := Run(context.Background(), c, Options{StopAfter: 1}); err != nil {
		t.Errorf("--recompute attn within the budget its error named: %v", err)
	}
}

func TestValidate(t *testing.T) {
	if err := Defaults().Validate(); err != nil {
		t.Fatalf("Defaults().Validate() = %v", err)
	}
	for _, tc := range []struct {
		flag string
		set  func(c *Config)
	}{
		{"batch", func(c *Config) { c.Batch = 0 }},
		{"seq-len", func(c *Config) { c.SeqLen = -1 }},
		{"grad-accum", func(c *Config) { c.GradAccum = 0 }},
		{"steps", func(c *Config) { c.Steps = -1 }},
		{"epochs", func(c *Config) { c.Steps, c.Epochs = 5, 1 }}, // both: one would be ignored
		{"epochs", func(c *Config) { c.Epochs = -1 }},
		{"epochs", func(c *Config) { c.Epochs = math.NaN() }},
		{"lr", func(c *Config) { c.LR = 0 }},
		{"min-lr", func(c *Config) { c.MinLR = 2 * c.LR }},
		{"warmup", func(c *Config) { c.Warmup = -1 }},
		{"weight-decay", func(c *Config) { c.WeightDecay = -0.1 }},
		{"beta1", func(c *Config) { c.Beta1 = 1 }},
		{"beta2", func(c *Config) { c.Beta2 = -0.5 }},
		{"clip-mode", func(c *Config) { c.ClipMode = "global" }},
		{"grad-clip", func(c *Config) { c.GradClip = 0 }},
		{"eval-every", func(c *Config) { c.EvalEvery = -1 }},
		{"eval-fraction", func(c *Config) { c.EvalFraction = 1 }},
		{"eval-fraction", func(c *Config) { c.EvalData = "held-out.jsonl" }}, // and the default share: two held-out sets
		{"eval-generate", func(c *Config) { c.EvalGenerate = -1 }},
		{"checkpoint-every", func(c *Config) { c.CheckpointEvery = -1 }},
		{"device", func(c *Config) { c.Device = "tpu" }},
		{"device", func(c *Config) { c.Device = "cuda:x" }}, // no device number (cuda missing from a build: train/device TestCUDARefused)
		{"device-mem", func(c *Config) { c.DeviceMem = -1 }},
		{"dtype", func(c *Config) { c.DType = backend.I32 }}, // not a storage type
		{"grad-dtype", func(c *Config) { c.GradDType = backend.DType(9) }},
		{"mode", func(c *Config) { c.Mode = "offload" }},
		{"dense-params", func(c *Config) { c.DenseParams = "cpu" }},
		{"schedule", func(c *Config) { c.Schedule = "eager" }},
		{"threads", func(c *Config) { c.Threads = -2 }},
		{"out", func(c *Config) { c.Out = "" }},
		{"model", func(c *Config) { c.Model = "" }},
		{"data", func(c *Config) { c.Data = "" }},
	} {
		c := Defaults()
		tc.set(&c)
		err := c.Validate()
		var fe *FlagError
		if !errors.As(err, &fe) || fe.Flag != tc.flag {
			t.Errorf("--%s: Validate() = %v, want a FlagError for it", tc.flag, err)
			continue
		}
		wantErr(t, err, "--"+tc.flag+":")
		// Run validates first: nothing is created.
		c.Out = filepath.Join(t.TempDir(), "out")
		if tc.flag == "out" {
			c.Out = ""
		}
		if _, err := Run(context.Background(), c, Options{}); !errors.As(err, &fe) || fe.Flag != tc.flag {
			t.Errorf("--%s: Run() = %v", tc.flag, err)
		}
		if _, err := os.Stat(c.Out); c.Out != "" && err == nil {
			t.Errorf("--%s: Run created %s despite the bad flag", tc.flag, c.Out)
		}
	}
	// Several bad values are all reported.
	c := Defaults()
	c.Batch, c.LR = 0, -1
	wantErr(t, c.Validate(), "--batch", "--lr")
	// grad-clip 0 is fine when clipping is off.
	c = Defaults()
	c.ClipMode, c.GradClip = "none", 0
	if err := c.Validate(); err != nil {
		t.Errorf("--clip-mode none --grad-clip 0: %v", err)
	}
}
