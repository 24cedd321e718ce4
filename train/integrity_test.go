// Tests of integrity through the run: resuming from a
// checkpoint with a corrupted byte or a NaN, and starting from pretrained
// weights holding NaN or an infinity, are refused before any training with
// an error naming the tensor and the file, and leave the checkpoint as it
// was; a version-2 checkpoint, which carries no checksums, resumes with a
// warning in the run's log and is replaced by one that carries them. The
// byte-by-byte corruption of every region of a file is tested in
// train/checkpoint.

package train

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// flipTensorByte flips every bit of the middle byte of tensor name's data
// in the safetensors file at path.
func flipTensorByte(t *testing.T, path, name string) {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ti, ok := f.Info(name)
	if !ok {
		t.Fatalf("%s: no tensor %s", path, name)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw[8+int64(binary.LittleEndian.Uint64(raw))+(ti.Begin+ti.End)/2] ^= 0xff
	writeFile(t, path, string(raw))
}

func TestIntegrityResume(t *testing.T) {
	base := quickConfig(t, writeModel(t, microConfig(16, 1)))
	stoppedRun(t, base)
	good, err := os.ReadFile(filepath.Join(base.Out, checkpoint.FileName))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, path string)
		want  []string
	}{
		{"a corrupted byte in the weights", func(t *testing.T, path string) {
			flipTensorByte(t, path, checkpoint.ParamsTensor)
		}, []string{"tensor params", "corrupted"}},
		{"a corrupted byte in the optimizer state", func(t *testing.T, path string) {
			flipTensorByte(t, path, "adam.v")
		}, []string{"tensor adam.v", "corrupted"}},
		{"a corrupted byte in the training state", func(t *testing.T, path string) {
			// One digit of the step, still a well-formed file: only the
			// checksum tells.
			raw := bytes.Replace(good, []byte(`\"step\":2,`), []byte(`\"step\":3,`), 1)
			if bytes.Equal(raw, good) {
				t.Fatal("no step 2 in the checkpoint's state")
			}
			writeFile(t, path, string(raw))
		}, []string{"training state", "corrupted"}},
		{"NaN weights", func(t *testing.T, path string) {
			rewriteCheckpoint(t, path, func(name string, v []float32) []float32 {
				if name == checkpoint.ParamsTensor {
					v[len(v)-1] = float32(math.NaN())
				}
				return v
			})
		}, []string{"tensor params", "transformer.ln_f.bias holds NaN at element 15", "not finite"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, res, err := resumeCopy(t, base, good, func(t *testing.T, _ *Config, path string) { tc.setup(t, path) })
			wantErr(t, err, append(tc.want, "resume", path)...)
			if res != nil && res.Steps > 0 {
				t.Errorf("trained %d steps from a refused checkpoint", res.Steps)
			}
		})
	}
}

// resumeCopy resumes base from a copy of the checkpoint good in an output
// folder of its own, after setup's changes to the run and to the copy
// (at path), and fails if the run changes the copy: it is to be refused.
// It returns the copy's path and what the run returned.
func resumeCopy(t *testing.T, base Config, good []byte, setup func(t *testing.T, c *Config, path string)) (string, *Result, error) {
	t.Helper()
	c := base
	c.Out = filepath.Join(t.TempDir(), "out")
	if err := os.MkdirAll(c.Out, 0o755); err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, filepath.Join(c.Out, checkpoint.FileName), string(good))
	c.Resume = true
	setup(t, &c, path)
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	res, runErr := Run(context.Background(), c, Options{})
	after, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(after, before) {
		t.Errorf("the checkpoint changed after a refused resume (%v)", err)
	}
	return path, res, runErr
}

func TestNonFinitePretrained(t *testing.T) {
	mc := microConfig(16, 1)
	offset := func(name string) int {
		for _, p := range mc.Layout() {
			if p.Name == name {
				return p.Offset
			}
		}
		t.Fatalf("no parameter %s", name)
		return 0
	}
	for _, tc := range []struct {
		name  string
		edit  func(vals []float32)
		where string
	}{
		{"NaN in a bias", func(v []float32) { v[offset("transformer.h.0.mlp.c_fc.bias")+5] = float32(math.NaN()) },
			"transformer.h.0.mlp.c_fc.bias holds NaN at element 5"},
		{"+Inf in the embedding", func(v []float32) { v[0] = float32(math.Inf(1)) },
			"transformer.wte.weight holds +Inf at element 0"},
		{"-Inf in the last block", func(v []float32) { v[offset("transformer.h.0.mlp.c_proj.weight")+17] = float32(math.Inf(-1)) },
			"transformer.h.0.mlp.c_proj.weight holds -Inf at element 17"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := gpt2.Init(mc, 7)
			tc.edit(vals)
			dir := filepath.Join(t.TempDir(), "model")
			if err := gpt2.ExportHF(dir, mc, vals); err != nil {
				t.Fatal(err)
			}
			c := quickConfig(t, dir)
			res, err := Run(context.Background(), c, Options{})
			wantErr(t, err, "--model", filepath.Join(dir, "model.safetensors"), tc.where, "not finite")
			if res != nil && res.Steps > 0 {
				t.Errorf("trained %d steps from non-finite weights", res.Steps)
			}
			if _, err := os.Stat(filepath.Join(c.Out, checkpoint.FileName)); err == nil {
				t.Errorf("a refused run wrote %s", checkpoint.FileName)
			}
		})
	}
}

// TestLegacyCheckpointWarns: resuming a version-2 checkpoint (no
// checksums) logs a warning naming it, and the checkpoint the run saves
// carries checksums and passes them.
func TestLegacyCheckpointWarns(t *testing.T) {
	out := filepath.Join(t.TempDir(), "out")
	path := filepath.Join(out, checkpoint.FileName)
	c := resumeFixture(t, "native", out)
	_, logged := loggedRun(t, c)
	if !strings.Contains(lastWarning(logged, "no checksums"), path) {
		t.Errorf("no warning naming %s that it carries no checksums; the log:\n%s", path, logged)
	}
	f := readCheckpoint(t, out)
	if st := checkpointState(t, f); st.Version != checkpoint.Version || st.Step != 6 {
		t.Errorf("the run saved version %d at step %d; want version %d at step 6", st.Version, st.Step, checkpoint.Version)
	}
	if _, ok := f.Metadata[checkpoint.ChecksumsKey]; !ok {
		t.Errorf("the saved checkpoint has no %s", checkpoint.ChecksumsKey)
	}
	mc, err := gpt2.ReadHFConfig(c.Model)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.Load(path, mc, nil); err != nil {
		t.Errorf("the saved checkpoint does not load: %v", err)
	}
}
