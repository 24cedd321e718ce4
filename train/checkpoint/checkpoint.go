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

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
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
	// StateArrays and LoadStateFrom stream the state array by array,
	// chunk by chunk (engine.Engine's).
	StateArrays() (arrays []engine.StateArray, finish func() error, err error)
	LoadStateFrom(src engine.StateSource) error
	SetStepCount(step int)
}

// saveChunk is the parameters' elements Save downloads per chunk, and
// the bytes Load and Restore read per chunk of a tensor (4 MiB
// either way: the staging buffer's size).
const (
	saveChunk = backend.StagingBytes / 4
	readChunk = backend.StagingBytes
)

// SaveBytes is the host memory Save holds for a model of n parameters
// besides what the optimizer's arrays hand over (engine.Memory's
// StateWrite): the parameters' download chunk, the encoding chunk and the
// file's write buffer.
func SaveBytes(n int) int64 {
	return 4*int64(min(saveChunk, n)) + 4*encodeChunk + atomicfile.BufferBytes
}

// RestoreBytes is the host memory Load and Restore hold for a model of n
// parameters besides what the optimizer reads whole (engine.Memory's
// StateRead): a chunk as read and as decoded.
func RestoreBytes(n int) int64 {
	return 4*int64(min(readChunk/4, n)) + readChunk
}

// Save writes the parameters and the optimizer state with st to path,
// atomically, with their checksums, streaming every tensor: the
// parameters come down a chunk at a time, the optimizer's arrays as
// opt.StateArrays hands them over, each encoded to little-endian fp32 a
// small chunk at a time as it is written and summed on the way. The
// checksums go into the header last, in place of a placeholder of the
// same length, so the host holds a few chunks, never a tensor
// (HostPeak's "checkpoint write").
func Save(path string, be backend.Backend, s backend.Stream, params backend.Tensor, opt Optimizer, st State) (err error) {
	stg := be.Staging()
	return SaveFrom(path, params.Len(), func(off int, dst []float32) error {
		return stg.DownloadInto(s, dst, params.Slice(off, len(dst)))
	}, opt, st)
}

// SaveFrom is Save with the n parameters read through fetch, a chunk at
// a time (off: the chunk's first element): a model whose parameters are
// not one tensor (a quantized base's, train/quant) saves them as one.
func SaveFrom(path string, n int, fetch func(off int, dst []float32) error, opt Optimizer, st State) (err error) {
	if err := opt.Drain(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	arrays, finish, err := opt.StateArrays()
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer func() {
		// A sharded optimizer's gathers not yet done, which the other
		// ranks wait for even when this write failed.
		if ferr := finish(); ferr != nil && err == nil {
			err = fmt.Errorf("checkpoint: %w", ferr)
		}
	}()
	st.Version = Version
	if st.Model == nil {
		return fmt.Errorf("checkpoint: no model in the state")
	}
	st.Family = st.Model.Family()
	raw, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	specs := []safetensors.Spec{{Name: ParamsTensor, DType: safetensors.F32, Shape: []int{n}}}
	for _, a := range arrays {
		specs = append(specs, safetensors.Spec{Name: a.Name, DType: safetensors.F32, Shape: []int{a.Len}})
	}
	draft := make(map[string]string, len(specs))
	for _, sp := range specs {
		draft[sp.Name] = fmt.Sprintf("%08x", 0)
	}
	sums := make(map[string]string, len(specs))
	var chunk [encodeChunk * 4]byte
	var buf []float32
	fill := func(i int, w io.Writer) error {
		h := crc32.New(castagnoli)
		out := io.MultiWriter(w, h)
		var err error
		if i == 0 {
			buf = make([]float32, min(saveChunk, n))
			for off := 0; off < n && err == nil; off += len(buf) {
				c := min(len(buf), n-off)
				if err = fetch(off, buf[:c]); err != nil {
					err = fmt.Errorf("params: %w", err)
					break
				}
				err = encodeF32(out, buf[:c], chunk[:])
			}
		} else {
			err = arrays[i-1].Read(func(v []float32) error { return encodeF32(out, v, chunk[:]) })
		}
		sums[specs[i].Name] = fmt.Sprintf("%08x", h.Sum32())
		return err
	}
	err = safetensors.WriteStreamMeta(path, specs, metadata(draft, string(raw)), fill,
		func() map[string]string { return metadata(sums, string(raw)) })
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
// restores. Its file stays open, and its tensors are read again, a chunk
// at a time, when they are used (Restore, Params): Close closes it.
type Checkpoint struct {
	State
	Path string
	f    *safetensors.File
	sums map[string]string // each tensor's checksum, verified by Load (nil for a file without them)
	// verified: Load has checked every tensor, and a checksum that fails
	// now means the file changed since.
	verified bool
	buf      []float32 // read's decoded chunk
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
	// Streamed, neither read whole nor mapped: each tensor is read a
	// chunk at a time into one buffer (checksum and finiteness in one
	// pass), so that a resume holds on the host a chunk, never a
	// tensor, let alone the file.
	f, err := safetensors.OpenStream(path)
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

// load is Load of the opened file f. Its errors come in the order of
// their causes: a damaged file (a checksum) before a file of another
// model, and that before a value that is not finite.
func load(f *safetensors.File, path string, mc model.Spec, log *slog.Logger) (*Checkpoint, error) {
	sums, unverified, err := verify(f)
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	ck := &Checkpoint{Path: path, f: f, sums: sums}
	var notFinite error
	for _, name := range f.Names() {
		var layout []model.Param
		if name == ParamsTensor {
			layout = mc.Layout()
		}
		d := ""
		err := ck.read(name, func(off int, v []float32) error {
			if d == "" {
				d = nonFinite(v, off, layout)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("resume: %w", err)
		}
		if d != "" && notFinite == nil {
			notFinite = fmt.Errorf("resume: %s: tensor %s: %s; refusing a checkpoint that is not finite", path, name, d)
		}
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
	ck.State = st
	if !catalog.Equal(ck.Model, mc) {
		return nil, fmt.Errorf("resume: %s: saved for %s model %+v, this run has %s model %+v",
			path, ck.Model.Family(), ck.Model, mc.Family(), mc)
	}
	if ti, ok := f.Info(ParamsTensor); !ok {
		return nil, fmt.Errorf("resume: %s: tensor %s missing", path, ParamsTensor)
	} else if n := ti.NumElements(); n != int64(mc.NumParams()) {
		return nil, fmt.Errorf("resume: %s: tensor %s has %d elements, the model config needs %d", path, ParamsTensor, n, mc.NumParams())
	}
	if notFinite != nil {
		return nil, notFinite
	}
	ck.verified = true
	return ck, nil
}

// read decodes the named tensor of the file as fp32 a chunk at a time,
// handing each chunk to fn with the index of its first element. The
// bytes are summed on the way and checked against the tensor's checksum
// at the end: in Load, that is the verification; after it, a check that
// the file did not change in place since (checkpoints are replaced by a
// rename, which leaves the open file as it was), whose values fn has
// then had, and the caller must fail. A file without checksums is read
// unchecked.
func (ck *Checkpoint) read(name string, fn func(off int, v []float32) error) error {
	ti, ok := ck.f.Info(name)
	if !ok {
		return fmt.Errorf("%s: no tensor %s", ck.Path, name)
	}
	switch ti.DType {
	case safetensors.F32, safetensors.BF16, safetensors.F16:
	default:
		return fmt.Errorf("%s: tensor %s has dtype %s, want F32, BF16 or F16", ck.Path, name, ti.DType)
	}
	bits, _ := ti.DType.Bits()
	es := int(bits / 8)
	if k := min(readChunk/es, int(ti.NumElements())); len(ck.buf) < k {
		ck.buf = make([]float32, k) // one for every tensor: a chunk's worth once a tensor is that long
	}
	buf := ck.buf
	h := crc32.New(castagnoli)
	off := 0
	err := ck.f.Chunks(name, readChunk, func(b []byte) error {
		h.Write(b)
		n := len(b) / es
		safetensors.Decode(buf[:n], b, ti.DType)
		err := fn(off, buf[:n])
		off += n
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: tensor %s: %w", ck.Path, name, err)
	}
	if ck.sums == nil {
		return nil
	}
	if got := fmt.Sprintf("%08x", h.Sum32()); got != ck.sums[name] {
		if !ck.verified { // Load's own read: the verification
			return fmt.Errorf("%s: tensor %s: CRC-32C %s, the file records %q: the file is corrupted", ck.Path, name, got, ck.sums[name])
		}
		return fmt.Errorf("%s: tensor %s: CRC-32C %s, the file records %q: the file changed after it was verified",
			ck.Path, name, got, ck.sums[name])
	}
	return nil
}

// tensor decodes the whole named tensor as fp32 (read's checks).
func (ck *Checkpoint) tensor(name string) ([]float32, error) {
	ti, ok := ck.f.Info(name)
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %s", ck.Path, name)
	}
	v := make([]float32, ti.NumElements())
	err := ck.read(name, func(off int, c []float32) error {
		copy(v[off:], c)
		return nil
	})
	return v, err
}

// Close closes the checkpoint's file; Restore and Params fail after it.
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

// Len is the element count of the named tensor (engine.StateSource).
func (ck *Checkpoint) Len(name string) (int, bool) {
	ti, ok := ck.f.Info(name)
	return int(ti.NumElements()), ok
}

// Read hands the named tensor over chunk by chunk (engine.StateSource).
func (ck *Checkpoint) Read(name string, fn func(off int, v []float32) error) error {
	return ck.read(name, fn)
}

// Restore uploads the checkpoint's parameters into params and its
// optimizer state into opt, a chunk at a time, and sets opt's step
// counter.
func (ck *Checkpoint) Restore(be backend.Backend, s backend.Stream, params backend.Tensor, opt Optimizer) error {
	return ck.RestoreWith(params.Len(), func(off int, v []float32) error {
		return backend.Upload(be, s, params.Slice(off, len(v)), v)
	}, opt)
}

// RestoreWith is Restore handing the n parameters to store a chunk at a
// time (off: the chunk's first element; a chunk may span parameters).
func (ck *Checkpoint) RestoreWith(n int, store func(off int, v []float32) error, opt Optimizer) error {
	if have, _ := ck.Len(ParamsTensor); have != n {
		return fmt.Errorf("resume: %s: tensor %s has %d elements, the model's parameters %d", ck.Path, ParamsTensor, have, n)
	}
	err := ck.read(ParamsTensor, store)
	if err != nil {
		return fmt.Errorf("resume: params: %w", err)
	}
	if err := opt.LoadStateFrom(ck); err != nil {
		return fmt.Errorf("resume: %s: %w", ck.Path, err)
	}
	opt.SetStepCount(ck.Step)
	return nil
}
