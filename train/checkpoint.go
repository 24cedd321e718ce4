// Training checkpoints: one safetensors file holding the weights, the
// optimizer state and, in its metadata, the step, data position, seed and
// configuration. It is written to a temp file, fsynced and renamed, so a
// crash or Ctrl-C never leaves a half-written checkpoint, and the previous
// one stays until the new one is complete.

package train

import (
	"encoding/json"
	"fmt"
	"sort"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
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
	DType    backend.DType `json:"dtype"`
	Data     string        `json:"data"`
	Batch    int           `json:"batch"`
	SeqLen   int           `json:"seq_len"`
	Tokens   int64         `json:"tokens_seen"`

	GradAccum    int     `json:"grad_accum"`
	EvalFraction float64 `json:"eval_fraction"`
	Truncate     bool    `json:"truncate"`

	// The update mode and what decides the optimizer state's shape.
	Mode        engine.Mode        `json:"mode"`
	DenseParams engine.DenseParams `json:"dense_params,omitempty"`
	D           int                `json:"d,omitempty"`
	R           int                `json:"r,omitempty"`
}

const stateKey = "lsp_offload.state"

// saveCheckpoint downloads the training state and writes it atomically.
// Every tensor is saved as fp32, which holds bf16 values exactly.
func saveCheckpoint(path string, be backend.Backend, s backend.Stream, eng *engine.Engine, st state) error {
	if err := eng.Drain(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	params, err := backend.Download(be, s, eng.Model.Params)
	if err != nil {
		return fmt.Errorf("checkpoint: params: %w", err)
	}
	ts := []safetensors.Tensor{safetensors.F32Tensor("params", []int{len(params)}, params)}
	opt, err := eng.SaveState()
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	names := make([]string, 0, len(opt))
	for name := range opt {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		ts = append(ts, safetensors.F32Tensor(name, []int{len(opt[name])}, opt[name]))
	}
	st.Version = 2
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
	path    string
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
	ck := &checkpoint{path: path, tensors: map[string][]float32{}}
	if err := json.Unmarshal([]byte(raw), &ck.state); err != nil {
		return nil, fmt.Errorf("resume: %s: training state: %w", path, err)
	}
	if ck.Mode == "" {
		ck.Mode = engine.Native // version 1 checkpoints predate the modes
	}
	if ck.Model != cfg {
		return nil, fmt.Errorf("resume: %s: saved for model %+v, this run has %+v", path, ck.Model, cfg)
	}
	for _, name := range f.Names() {
		v, _, err := f.Float32(name)
		if err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		ck.tensors[name] = v
	}
	if v, ok := ck.tensors["params"]; !ok {
		return nil, fmt.Errorf("resume: %s: tensor params missing", path)
	} else if len(v) != cfg.NumParams() {
		return nil, fmt.Errorf("resume: %s: tensor params has %d elements, the model config needs %d", path, len(v), cfg.NumParams())
	}
	return ck, nil
}

// restore uploads a checkpoint into the model and the engine's optimizer
// state.
func (ck *checkpoint) restore(be backend.Backend, s backend.Stream, eng *engine.Engine) error {
	if err := backend.Upload(be, s, eng.Model.Params, ck.tensors["params"]); err != nil {
		return fmt.Errorf("resume: %s: params: %w", ck.path, err)
	}
	if err := eng.LoadState(ck.tensors); err != nil {
		return fmt.Errorf("resume: %s: %w", ck.path, err)
	}
	eng.SetStepCount(ck.Step)
	return nil
}
