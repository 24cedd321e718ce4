// Training checkpoints: one safetensors file holding the weights, the
// optimizer state and, in its metadata, the step, data position, seed and
// configuration. It is written to a temp file, fsynced and renamed, so a
// crash or Ctrl-C never leaves a half-written checkpoint, and the previous
// one stays until the new one is complete.

package train

import (
	"encoding/json"
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// CheckpointFile is the checkpoint's name inside the output directory.
const CheckpointFile = "checkpoint.safetensors"

// state is what a checkpoint holds besides tensors.
type state struct {
	Version  int           `json:"version"`
	Step     int           `json:"step"`
	Position data.Position `json:"data_position"`
	Seed     uint64        `json:"seed"`
	Model    gpt2.Config   `json:"model"`
	DType    string        `json:"dtype"`
	Data     string        `json:"data"`
	Batch    int           `json:"batch"`
	SeqLen   int           `json:"seq_len"`
	Tokens   int64         `json:"tokens_seen"`

	GradAccum    int     `json:"grad_accum"`
	EvalFraction float64 `json:"eval_fraction"`
	Truncate     bool    `json:"truncate"`
}

const stateKey = "lsp_offload.state"

// saveCheckpoint downloads the training state and writes it atomically.
// Every tensor is saved as fp32, which holds bf16 values exactly.
func saveCheckpoint(path string, be backend.Backend, s backend.Stream, m *gpt2.Model, opt *optim.AdamW, st state) error {
	var ts []safetensors.Tensor
	add := func(name string, t backend.Tensor) error {
		if t.Buf == nil {
			return nil
		}
		v, err := backend.Download(be, s, t)
		if err != nil {
			return fmt.Errorf("checkpoint: %s: %w", name, err)
		}
		ts = append(ts, safetensors.F32Tensor(name, []int{len(v)}, v))
		return nil
	}
	for _, x := range []struct {
		name string
		t    backend.Tensor
	}{{"params", m.Params}, {"adam.m", opt.M}, {"adam.v", opt.V}, {"adam.master", opt.Master}, {"adam.norms", opt.Norms}} {
		if err := add(x.name, x.t); err != nil {
			return err
		}
	}
	st.Version = 1
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := safetensors.Write(path, ts, map[string]string{stateKey: string(raw)}); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// checkpoint is a loaded checkpoint, checked against the model it restores.
type checkpoint struct {
	state
	tensors map[string][]float32
}

// loadCheckpoint reads path and checks that it fits cfg.
func loadCheckpoint(path string, cfg gpt2.Config) (*checkpoint, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	raw, ok := f.Metadata[stateKey]
	if !ok {
		return nil, fmt.Errorf("resume: %s: no training state in its metadata (not an lsp-train checkpoint)", path)
	}
	ck := &checkpoint{tensors: map[string][]float32{}}
	if err := json.Unmarshal([]byte(raw), &ck.state); err != nil {
		return nil, fmt.Errorf("resume: %s: training state: %w", path, err)
	}
	if ck.Model != cfg {
		return nil, fmt.Errorf("resume: %s: saved for model %+v, this run has %+v", path, ck.Model, cfg)
	}
	n := cfg.NumParams()
	for _, name := range f.Names() {
		v, _, err := f.Float32(name)
		if err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		if name != "adam.norms" && len(v) != n {
			return nil, fmt.Errorf("resume: %s: tensor %s has %d elements, the model config needs %d", path, name, len(v), n)
		}
		ck.tensors[name] = v
	}
	for _, need := range []string{"params", "adam.m", "adam.v", "adam.norms"} {
		if _, ok := ck.tensors[need]; !ok {
			return nil, fmt.Errorf("resume: %s: tensor %s missing", path, need)
		}
	}
	return ck, nil
}

// restore uploads a checkpoint into the model and optimizer.
func (ck *checkpoint) restore(be backend.Backend, s backend.Stream, m *gpt2.Model, opt *optim.AdamW) error {
	pairs := []struct {
		name string
		t    backend.Tensor
	}{{"params", m.Params}, {"adam.m", opt.M}, {"adam.v", opt.V}, {"adam.norms", opt.Norms}}
	if opt.Master.Buf != nil {
		pairs = append(pairs, struct {
			name string
			t    backend.Tensor
		}{"adam.master", opt.Master})
		if _, ok := ck.tensors["adam.master"]; !ok {
			return fmt.Errorf("resume: checkpoint has no fp32 master weights; it was saved with another --dtype")
		}
	}
	for _, p := range pairs {
		v := ck.tensors[p.name]
		if len(v) != p.t.Len() {
			return fmt.Errorf("resume: tensor %s has %d elements, want %d", p.name, len(v), p.t.Len())
		}
		if err := backend.Upload(be, s, p.t, v); err != nil {
			return fmt.Errorf("resume: %s: %w", p.name, err)
		}
	}
	opt.SetStepCount(ck.Step)
	return nil
}
