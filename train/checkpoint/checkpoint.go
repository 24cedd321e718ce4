// Package checkpoint is the training checkpoint format: one safetensors
// file holding the weights, the optimizer state and, in its metadata, the
// step, data position, seed and the settings a resume must match. A file
// is written to a temp file, fsynced and renamed, so a crash or Ctrl-C
// never leaves a half-written checkpoint, and the previous one stays until
// the new one is complete. The file carries a CRC-32C of every tensor and
// of the state, and Load verifies them, and refuses NaN and infinities,
// before any value is used.
//
// Limits: the format is version 3; version 2 files (testdata/checkpoint-v2
// under train holds one of each update mode), which carry no checksums,
// load unverified with a warning, and version 1 files, which predate the
// update modes, load as native. Every tensor is stored as fp32, which
// holds bf16 values exactly. The model part of the state is the model's
// spec under its family (train/catalog decodes it); a file without a
// family, from before they were recorded, holds a GPT-2.
package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math"
	"sort"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// FileName is the checkpoint's name inside a run's output directory.
const FileName = "checkpoint.safetensors"

// MetadataKey is the safetensors metadata entry holding the State as JSON.
const MetadataKey = "lsp_offload.state"

// Version is the format Save writes: 3, the first with checksums.
const Version = checksumVersion

// ParamsTensor is the name of the tensor holding every model parameter;
// the optimizer state's tensors are named by the engine.
const ParamsTensor = "params"

// State is what a checkpoint holds besides tensors. Its JSON is the
// format: field names and spellings must not change.
type State struct {
	Version  int           `json:"version"`
	Step     int           `json:"step"`
	Position data.Position `json:"data_position"`
	Seed     uint64        `json:"seed"`
	Family   string        `json:"family,omitempty"` // of Model; "" in files written before it was recorded: gpt2
	Model    model.Spec    `json:"model"`
	DType    backend.DType `json:"dtype"`
	Data     string        `json:"data"`
	Batch    int           `json:"batch"`
	SeqLen   int           `json:"seq_len"`
	Tokens   int64         `json:"tokens_seen"`

	GradAccum    int     `json:"grad_accum"`
	EvalFraction float64 `json:"eval_fraction"`
	Truncate     bool    `json:"truncate"`

	// The update mode and what decides the optimizer state's shape (the
	// last three in lsp mode only).
	Mode        engine.Mode        `json:"mode"`
	DenseParams engine.DenseParams `json:"dense_params,omitempty"`
	D           int                `json:"d,omitempty"`
	R           int                `json:"r,omitempty"`

	// Settings are the run's other settings, flag name to value as text,
	// so that a resume can refuse or log a change (package train decides
	// which). Checkpoints written before they were recorded lack them.
	Settings map[string]string `json:"settings,omitempty"`
}

// UnmarshalJSON decodes a State, its Model through the family it names
// (train/catalog).
func (st *State) UnmarshalJSON(raw []byte) error {
	type plain State // State's fields without this method
	var aux struct {
		plain
		Model json.RawMessage `json:"model"` // shadows plain's Model
	}
	if err := json.Unmarshal(raw, &aux); err != nil {
		return err
	}
	*st = State(aux.plain)
	if len(aux.Model) == 0 || string(aux.Model) == "null" {
		return fmt.Errorf("no model recorded")
	}
	spec, err := catalog.Decode(st.Family, aux.Model)
	if err != nil {
		return err
	}
	st.Model = spec
	return nil
}

// Optimizer is the training side of a checkpoint: the engine, which owns
// the optimizer state and the step counter.
type Optimizer interface {
	// Drain waits for every update in flight.
	Drain() error
	SaveState() (map[string][]float32, error)
	LoadState(map[string][]float32) error
	SetStepCount(step int)
}

// stateViewer is an Optimizer that can give its state without copying
// the arrays it holds on the host (engine.Engine.SaveStateView), valid
// until its next step: a checkpoint write then holds no second copy of
// a host optimizer's master and moments.
type stateViewer interface {
	SaveStateView() (map[string][]float32, error)
}

// Save downloads the parameters and the optimizer state and writes them
// with st to path, atomically, with their checksums. Each tensor is
// encoded to little-endian fp32 a chunk at a time, for its checksum and
// again as it is written, so that the host holds the downloaded values
// once and never a second, encoded copy of them (HostPeak's "checkpoint
// write" is those values).
func Save(path string, be backend.Backend, s backend.Stream, params backend.Tensor, opt Optimizer, st State) error {
	if err := opt.Drain(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	vals, err := backend.Download(be, s, params)
	if err != nil {
		return fmt.Errorf("checkpoint: params: %w", err)
	}
	saveState := opt.SaveState
	if v, ok := opt.(stateViewer); ok {
		saveState = v.SaveStateView // Save only reads the arrays, before any step
	}
	state, err := saveState()
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	names := make([]string, 0, len(state))
	for name := range state {
		names = append(names, name)
	}
	sort.Strings(names)
	specs := []safetensors.Spec{{Name: ParamsTensor, DType: safetensors.F32, Shape: []int{len(vals)}}}
	data := [][]float32{vals}
	for _, name := range names {
		specs = append(specs, safetensors.Spec{Name: name, DType: safetensors.F32, Shape: []int{len(state[name])}})
		data = append(data, state[name])
	}
	st.Version = Version
	if st.Model == nil {
		return fmt.Errorf("checkpoint: no model in the state")
	}
	st.Family = st.Model.Family()
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	var chunk [encodeChunk * 4]byte
	sums := make(map[string]string, len(specs))
	for i, sp := range specs {
		h := crc32.New(castagnoli)
		if err := encodeF32(h, data[i], chunk[:]); err != nil {
			return fmt.Errorf("checkpoint: %w", err)
		}
		sums[sp.Name] = fmt.Sprintf("%08x", h.Sum32())
	}
	// The checksums are of the bytes encodeF32 writes: the same function
	// of the same values, which nothing changes in between (the pipeline
	// is drained and the slices are this function's own).
	err = safetensors.WriteStream(path, specs, metadata(sums, string(raw)), func(i int, w io.Writer) error {
		return encodeF32(w, data[i], chunk[:])
	})
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// encodeChunk is the floats Save encodes per write.
const encodeChunk = 16 << 10

// encodeF32 writes v to w as little-endian fp32, through buf.
func encodeF32(w io.Writer, v []float32, buf []byte) error {
	for len(v) > 0 {
		n := min(len(v), len(buf)/4)
		for i, x := range v[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
		}
		if _, err := w.Write(buf[:4*n]); err != nil {
			return err
		}
		v = v[n:]
	}
	return nil
}

// Checkpoint is a loaded checkpoint, checked against the model it
// restores. Its file stays mapped, and its tensors are decoded again when
// they are used (Restore, Params), one at a time, rather than all kept
// decoded from Load on: Close unmaps it.
type Checkpoint struct {
	State
	Path string
	f    *safetensors.File
	sums map[string]string // each tensor's checksum, verified by Load (nil for a file without them)
}

// ReadState decodes the State of an open checkpoint file, without
// verifying its checksum (Load does).
func ReadState(f *safetensors.File) (State, error) {
	var st State
	raw, ok := f.Metadata[MetadataKey]
	if !ok {
		return st, fmt.Errorf("%s: no training state in its metadata (not an lsp-train checkpoint)", f.Path)
	}
	if err := json.Unmarshal([]byte(raw), &st); err != nil {
		return st, fmt.Errorf("%s: training state: %w", f.Path, err)
	}
	if st.Mode == "" {
		st.Mode = engine.Native // version 1 checkpoints predate the modes
	}
	return st, nil
}

// Load reads path and checks that it holds an intact checkpoint of the model mc:
// the checksums of the state and of every tensor match, no value is NaN or
// infinite, and the model is the same. A file that predates checksums
// (version 2) loads unverified, with a warning on log (slog.Default() when
// nil). Every error names the file and, where one is at fault, the tensor.
func Load(path string, mc model.Spec, log *slog.Logger) (*Checkpoint, error) {
	if log == nil {
		log = slog.Default()
	}
	// Mapped, not read: the checksums and the checks of the values read
	// each tensor's pages and hand them back (Release), and each decoded
	// tensor is dropped before the next is decoded, so that a resume
	// holds on the host one decoded tensor at a time beside one tensor's
	// pages, never the whole file.
	f, err := safetensors.OpenMapped(path)
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	ck, err := load(f, path, mc, log)
	if err != nil {
		f.Close()
		return nil, err
	}
	return ck, nil
}

// load is Load of the opened file f.
func load(f *safetensors.File, path string, mc model.Spec, log *slog.Logger) (*Checkpoint, error) {
	unverified, err := verify(f)
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	st, err := ReadState(f)
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	if st.Version > Version {
		return nil, fmt.Errorf("resume: %s: format version %d is newer than this program's %d", path, st.Version, Version)
	}
	if unverified {
		log.Warn("checkpoint carries no checksums, so damage to it cannot be detected; the next one saved will carry them",
			"checkpoint", path, "version", st.Version)
	}
	ck := &Checkpoint{State: st, Path: path, f: f}
	if !unverified {
		// Verified by verify already; kept so that each later decoding
		// is checked again against the file as it is then.
		if err := json.Unmarshal([]byte(f.Metadata[ChecksumsKey]), &ck.sums); err != nil {
			return nil, fmt.Errorf("resume: %s: tensor checksums: %w", path, err)
		}
	}
	if !catalog.Equal(ck.Model, mc) {
		return nil, fmt.Errorf("resume: %s: saved for %s model %+v, this run has %s model %+v",
			path, ck.Model.Family(), ck.Model, mc.Family(), mc)
	}
	if ti, ok := f.Info(ParamsTensor); !ok {
		return nil, fmt.Errorf("resume: %s: tensor %s missing", path, ParamsTensor)
	} else if n := ti.NumElements(); n != int64(mc.NumParams()) {
		return nil, fmt.Errorf("resume: %s: tensor %s has %d elements, the model config needs %d", path, ParamsTensor, n, mc.NumParams())
	}
	for _, name := range f.Names() {
		v, err := ck.tensor(name)
		if err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		var layout []model.Param
		if name == ParamsTensor {
			layout = mc.Layout()
		}
		if d := NonFinite(v, layout); d != "" {
			return nil, fmt.Errorf("resume: %s: tensor %s: %s; refusing a checkpoint that is not finite", path, name, d)
		}
	}
	return ck, nil
}

// tensor decodes the named tensor of the file as fp32 and hands its
// pages back. The bytes are checked against the tensor's checksum again
// each time: the file is read again after Load verified it, and had it
// changed in place since (checkpoints are replaced by a rename, which
// leaves the mapped file as it was), its values would not be used.
func (ck *Checkpoint) tensor(name string) ([]float32, error) {
	defer ck.f.Release(name)
	if ck.sums != nil {
		raw, _, err := ck.f.Raw(name)
		if err != nil {
			return nil, err
		}
		if got := checksum(raw); got != ck.sums[name] {
			return nil, fmt.Errorf("%s: tensor %s: CRC-32C %s, the file records %q: the file changed after it was verified",
				ck.Path, name, got, ck.sums[name])
		}
	}
	v, _, err := ck.f.Float32(name)
	return v, err
}

// Close unmaps the checkpoint's file; Restore and Params fail after it.
func (ck *Checkpoint) Close() error { return ck.f.Close() }

// Params is every model parameter the checkpoint holds (the model's
// Layout order), for a job that needs the weights and not the optimizer
// (sampling from a run that has no export yet).
func (ck *Checkpoint) Params() ([]float32, error) {
	v, err := ck.tensor(ParamsTensor)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return v, nil
}

// stateStreamer is an Optimizer that restores its state array by array
// (engine.Engine.LoadStateFrom), so that Restore decodes each only when
// it is restored.
type stateStreamer interface {
	LoadStateFrom(read func(name string) ([]float32, bool, error)) error
}

// Restore uploads the checkpoint's parameters into params and its
// optimizer state into opt, and sets opt's step counter.
func (ck *Checkpoint) Restore(be backend.Backend, s backend.Stream, params backend.Tensor, opt Optimizer) error {
	vals, err := ck.tensor(ParamsTensor)
	if err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	if err := backend.Upload(be, s, params, vals); err != nil {
		return fmt.Errorf("resume: %s: params: %w", ck.Path, err)
	}
	read := func(name string) ([]float32, bool, error) {
		if _, ok := ck.f.Info(name); !ok {
			return nil, false, nil
		}
		v, err := ck.tensor(name)
		return v, true, err
	}
	if ss, ok := opt.(stateStreamer); ok {
		err = ss.LoadStateFrom(read)
	} else {
		state := map[string][]float32{}
		for _, name := range ck.f.Names() {
			if name == ParamsTensor {
				continue
			}
			v, _, err := read(name)
			if err != nil {
				return fmt.Errorf("resume: %w", err)
			}
			state[name] = v
		}
		err = opt.LoadState(state)
	}
	if err != nil {
		return fmt.Errorf("resume: %s: %w", ck.Path, err)
	}
	opt.SetStepCount(ck.Step)
	return nil
}
