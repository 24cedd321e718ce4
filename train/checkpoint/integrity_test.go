// Tests of checkpoint integrity: every single corrupted byte of a saved
// file (tensor data, training state, header), a truncated file, a missing
// or extra checksum, a newer format and NaN or infinite values are refused
// by Load with an error naming the file and the tensor (or the training
// state) at fault; none loads silently.

package checkpoint

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// tinyModel is small enough that every byte of its checkpoint can be
// corrupted in turn.
var tinyModel = gpt2.Config{V: 17, MaxT: 4, C: 4, L: 1, NH: 2, Eps: 1e-5}

// saveTiny saves a checkpoint of tinyModel with params (seeded
// initialisation when nil) and a small optimizer state, and returns its
// path and bytes.
func saveTiny(t *testing.T, params []float32, state map[string][]float32) (string, []byte) {
	t.Helper()
	if params == nil {
		params = gpt2.Init(tinyModel, 3)
	}
	be, s, m := uploadedModel(t, tinyModel, params)
	if state == nil {
		state = map[string][]float32{"adam.m": {0.5, -1, 2}, "adam.v": {1e-3, 4e-6}, "host.steps": {7}}
	}
	st := State{Step: 7, Position: data.Position{Epoch: 0, Index: 28}, Seed: 3, Model: tinyModel, DType: backend.F32,
		Data: "builtin:copy", Batch: 4, SeqLen: 4, Tokens: 112, GradAccum: 1, Mode: engine.Native}
	path := filepath.Join(t.TempDir(), FileName)
	if err := Save(path, be, s, m.Params, &fakeOptimizer{state: state}, st); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, raw
}

// loadBytes writes raw to path and loads it, failing if anything was
// logged (a damaged version-3 file must never pass as a legacy one).
func loadBytes(t *testing.T, path string, raw []byte) error {
	t.Helper()
	_, err := loadChecked(t, path, raw)
	return err
}

func loadChecked(t *testing.T, path string, raw []byte) (*Checkpoint, error) {
	t.Helper()
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	log, logged := captureLog()
	ck, err := Load(path, tinyModel, log)
	if err == nil && logged.Len() != 0 {
		t.Errorf("loaded with a log: %s", logged)
	}
	return ck, err
}

// wantErr fails unless err is non-nil and mentions every part.
func wantErr(t *testing.T, err error, what string, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: loaded without an error", what)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("%s: error %q does not mention %q", what, err, p)
		}
	}
}

// region is a byte range of a checkpoint file and what it holds.
type region struct {
	what       string // tensor name, or "" for the training state
	begin, end int    // in the file, end exclusive
}

// regions finds every tensor's data and the training state's JSON (as
// escaped in the header) in a checkpoint file.
func regions(t *testing.T, path string, raw []byte) []region {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	dataStart := 8 + int(binary.LittleEndian.Uint64(raw))
	var rs []region
	for _, name := range f.Names() {
		ti, _ := f.Info(name)
		rs = append(rs, region{name, dataStart + int(ti.Begin), dataStart + int(ti.End)})
	}
	key := []byte(`"` + MetadataKey + `":"`)
	i := bytes.Index(raw[:dataStart], key)
	if i < 0 {
		t.Fatalf("no %s in the header", key)
	}
	begin := i + len(key)
	end := begin
	for raw[end] != '"' || raw[end-1] == '\\' {
		end++
	}
	return append(rs, region{"", begin, end})
}

func TestCorruptByte(t *testing.T) {
	path, good := saveTiny(t, nil, nil)
	if err := loadBytes(t, path, good); err != nil {
		t.Fatal(err)
	}
	rs := regions(t, path, good)
	if len(rs) != 5 {
		t.Fatalf("found %d regions, want 4 tensors and the state", len(rs))
	}
	// Every byte of every region, in turn, with all its bits flipped and
	// with one bit flipped.
	for _, r := range rs {
		for i := r.begin; i < r.end; i++ {
			for _, mask := range []byte{0xff, 1 << (i % 8)} {
				bad := bytes.Clone(good)
				bad[i] ^= mask
				err := loadBytes(t, path, bad)
				if r.what != "" {
					wantErr(t, err, r.what, path, "tensor "+r.what, "corrupted")
					continue
				}
				// A changed state is caught by its checksum; one that no
				// longer parses as the header's JSON, by the reader.
				wantErr(t, err, "state", path)
				if msg := err.Error(); !strings.Contains(msg, "training state") && !strings.Contains(msg, "JSON header") {
					t.Fatalf("byte %d of the state: error %q names neither the training state nor the header", i-r.begin, err)
				}
			}
		}
	}
}

// TestCorruptAnyByte flips one bit of every byte of the file, header and
// length prefix included: each is an error naming the file, or, where the
// flip leaves the file meaning the same (the header's JSON field names
// match case-insensitively, so "shape" may become "Shape"), a load of the
// very same state and tensors. Nothing different loads silently.
func TestCorruptAnyByte(t *testing.T) {
	path, good := saveTiny(t, nil, nil)
	want, err := loadChecked(t, path, good)
	if err != nil {
		t.Fatal(err)
	}
	// Decoded now: the file at path is rewritten below, and a
	// checkpoint reads its mapped file when its tensors are used.
	wantTensors := decodeAll(t, want)
	step, same := 1, 0
	if testing.Short() {
		step = 7
	}
	for i := 0; i < len(good); i += step {
		bad := bytes.Clone(good)
		bad[i] ^= 1 << (i % 8)
		ck, err := loadChecked(t, path, bad)
		if err != nil {
			wantErr(t, err, "byte "+strconv.Itoa(i), path)
			continue
		}
		same++
		if !reflect.DeepEqual(ck.State, want.State) || !maps.EqualFunc(decodeAll(t, ck), wantTensors, slices.Equal) {
			t.Fatalf("byte %d (%q) flipped: loaded without an error, and not the same checkpoint", i, good[i])
		}
	}
	t.Logf("%d bytes of %d flipped: %d loaded the same checkpoint, the others were refused", (len(good)+step-1)/step, len(good), same)
}

func TestTruncated(t *testing.T) {
	path, good := saveTiny(t, nil, nil)
	hlen := 8 + int(binary.LittleEndian.Uint64(good))
	for _, n := range []int{0, 1, 7, 8, 9, hlen / 2, hlen - 1, hlen, hlen + 1, (hlen + len(good)) / 2, len(good) - 1} {
		wantErr(t, loadBytes(t, path, good[:n]), "truncated", path)
	}
}

// rewrite writes the tensors of the checkpoint at path, but those that
// drop names, with edit's changes to its metadata.
func rewrite(t *testing.T, path string, drop string, edit func(meta map[string]string)) {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []safetensors.Tensor
	for _, name := range f.Names() {
		if name == drop {
			continue
		}
		b, ti, err := f.Raw(name)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, safetensors.Tensor{Name: name, DType: ti.DType, Shape: ti.Shape, Data: bytes.Clone(b)})
	}
	meta := f.Metadata
	edit(meta)
	if err := safetensors.Write(path, ts, meta); err != nil {
		t.Fatal(err)
	}
}

// editState changes the training state of a metadata map, and its
// checksum to match.
func editState(t *testing.T, meta map[string]string, edit func(st *State)) {
	t.Helper()
	var st State
	if err := json.Unmarshal([]byte(meta[MetadataKey]), &st); err != nil {
		t.Fatal(err)
	}
	edit(&st)
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	meta[MetadataKey], meta[StateChecksumKey] = string(raw), checksum(raw)
}

// editSums changes the tensor checksums of a metadata map.
func editSums(t *testing.T, meta map[string]string, edit func(sums map[string]string)) {
	t.Helper()
	var sums map[string]string
	if err := json.Unmarshal([]byte(meta[ChecksumsKey]), &sums); err != nil {
		t.Fatal(err)
	}
	edit(sums)
	raw, err := json.Marshal(sums)
	if err != nil {
		t.Fatal(err)
	}
	meta[ChecksumsKey] = string(raw)
}

func TestMissingChecksum(t *testing.T) {
	for _, tc := range []struct {
		name  string
		drop  string // a tensor to leave out of the file
		edit  func(t *testing.T, meta map[string]string)
		parts []string
	}{
		{"no checksum for a tensor", "", func(t *testing.T, meta map[string]string) {
			editSums(t, meta, func(sums map[string]string) { delete(sums, "adam.v") })
		}, []string{"tensor adam.v", "no checksum"}},
		{"no checksum for params", "", func(t *testing.T, meta map[string]string) {
			editSums(t, meta, func(sums map[string]string) { delete(sums, ParamsTensor) })
		}, []string{"tensor params", "no checksum"}},
		{"a checksum that does not match", "", func(t *testing.T, meta map[string]string) {
			editSums(t, meta, func(sums map[string]string) { sums["adam.m"] = "not-a-crc" })
		}, []string{"tensor adam.m", "corrupted"}},
		{"a tensor gone", "adam.m", func(t *testing.T, meta map[string]string) {}, []string{"tensor adam.m", "missing from the file"}},
		{"no tensor checksums", "", func(t *testing.T, meta map[string]string) {
			delete(meta, ChecksumsKey)
		}, []string{ChecksumsKey}},
		{"unreadable tensor checksums", "", func(t *testing.T, meta map[string]string) {
			meta[ChecksumsKey] = meta[ChecksumsKey][1:]
		}, []string{ChecksumsKey}},
		{"no state checksum", "", func(t *testing.T, meta map[string]string) {
			delete(meta, StateChecksumKey)
		}, []string{"training state", StateChecksumKey}},
		{"no checksums at all in version 3", "", func(t *testing.T, meta map[string]string) {
			delete(meta, ChecksumsKey)
			delete(meta, StateChecksumKey)
		}, []string{"version 3 without checksums"}},
		{"no state", "", func(t *testing.T, meta map[string]string) {
			delete(meta, MetadataKey)
		}, []string{"no training state"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, _ := saveTiny(t, nil, nil)
			rewrite(t, path, tc.drop, func(meta map[string]string) { tc.edit(t, meta) })
			_, err := Load(path, tinyModel, nil)
			wantErr(t, err, tc.name, append(tc.parts, path)...)
		})
	}
}

// TestNewerVersion: a well-formed file of a later format is refused
// rather than misread.
func TestNewerVersion(t *testing.T) {
	path, _ := saveTiny(t, nil, nil)
	rewrite(t, path, "", func(meta map[string]string) {
		editState(t, meta, func(st *State) { st.Version = Version + 1 })
	})
	_, err := Load(path, tinyModel, nil)
	wantErr(t, err, "newer", path, "version 4")
}

// TestNonFiniteRefused: NaN or an infinity, written with valid checksums,
// is refused naming the tensor, the parameter inside params, and the file.
func TestNonFiniteRefused(t *testing.T) {
	var bias int
	for _, p := range tinyModel.Layout() {
		if p.Name == "transformer.h.0.ln_1.bias" {
			bias = p.Offset
		}
	}
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, tc := range []struct {
		name  string
		edit  func(params []float32, state map[string][]float32)
		parts []string
	}{
		{"NaN in params", func(p []float32, _ map[string][]float32) { p[bias+2] = nan },
			[]string{"tensor params", "transformer.h.0.ln_1.bias holds NaN at element 2"}},
		{"-Inf in the last parameter", func(p []float32, _ map[string][]float32) { p[len(p)-1] = -inf },
			[]string{"tensor params", "transformer.ln_f.bias holds -Inf at element 3"}},
		{"+Inf in optimizer state", func(_ []float32, s map[string][]float32) { s["adam.v"][1] = inf },
			[]string{"tensor adam.v", "+Inf at element 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			params := gpt2.Init(tinyModel, 3)
			state := map[string][]float32{"adam.m": {0.5, -1, 2}, "adam.v": {1e-3, 4e-6}}
			tc.edit(params, state)
			path, _ := saveTiny(t, params, state)
			_, err := Load(path, tinyModel, nil)
			wantErr(t, err, tc.name, append(tc.parts, path, "not finite")...)
		})
	}
}

// decodeAll decodes every tensor of ck and closes it.
func decodeAll(t *testing.T, ck *Checkpoint) map[string][]float32 {
	t.Helper()
	defer ck.Close()
	out := map[string][]float32{}
	for _, name := range ck.f.Names() {
		v, err := ck.tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = v
	}
	return out
}

// TestChangedAfterLoad: a checkpoint's tensors are decoded again when
// they are restored, from the file Load verified; a file changed in
// place after Load is refused then, naming it, rather than restored
// unverified.
func TestChangedAfterLoad(t *testing.T) {
	path, good := saveTiny(t, nil, nil)
	ck, err := loadChecked(t, path, good)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if _, err := ck.Params(); err != nil {
		t.Fatalf("Params of the file as loaded: %v", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The last byte: the end of the last tensor's data.
	if _, err := f.WriteAt([]byte{good[len(good)-1] ^ 0x40}, int64(len(good)-1)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	var failed error
	for _, name := range ck.f.Names() {
		if _, err := ck.tensor(name); err != nil {
			failed = err
		}
	}
	wantErr(t, failed, "a tensor changed after Load", path, "changed after it was verified")
}
