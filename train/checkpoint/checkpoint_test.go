// Tests of the checkpoint format: the committed version-2 files (one per
// update mode, written by an earlier program) decode and re-encode to the
// very same state JSON and load with a warning that they carry no
// checksums, and Save then Load gives back every tensor and the state,
// without a warning. That the files also resume to the same losses is checked through
// whole runs in train (TestLegacyCheckpoint).

package checkpoint

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

const legacyDir = "../testdata/checkpoint-v2"

func TestLegacyFormat(t *testing.T) {
	model, _, err := gpt2.LoadHF(filepath.Join(legacyDir, "model"))
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []engine.Mode{engine.Native, engine.Zero, engine.LSP} {
		t.Run(string(mode), func(t *testing.T) {
			path := filepath.Join(legacyDir, string(mode), FileName)
			f, err := safetensors.Open(path)
			if err != nil {
				t.Fatalf("fixture missing (it is committed): %v", err)
			}
			st, err := ReadState(f)
			if err != nil {
				t.Fatal(err)
			}
			if st.Version != 2 || st.Mode != mode || st.DType != backend.F32 || st.Step != 3 || st.Model != model {
				t.Errorf("state %+v: want version 2, mode %s, dtype fp32, step 3, model %+v", st, mode, model)
			}
			if (mode == engine.LSP) != (st.DenseParams == engine.DenseDevice && st.D == 8 && st.R == 2) {
				t.Errorf("%s: dense params %q, d %d, r %d", mode, st.DenseParams, st.D, st.R)
			}
			// The same fields, names, order and spellings: what this program
			// writes is byte for byte what the older one wrote.
			raw, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			if string(raw) != f.Metadata[MetadataKey] {
				t.Errorf("state re-encodes to\n%s\nthe file holds\n%s", raw, f.Metadata[MetadataKey])
			}
			log, logged := captureLog()
			ck, err := Load(path, model, log)
			if err != nil {
				t.Fatal(err)
			}
			if w := logged.String(); !strings.Contains(w, "level=WARN") || !strings.Contains(w, "no checksums") ||
				!strings.Contains(w, path) || !strings.Contains(w, "version=2") {
				t.Errorf("loading a version-2 file logged %q; want a warning that it carries no checksums, naming it", w)
			}
			params, err := ck.Params()
			if err != nil || len(params) != model.NumParams() {
				t.Errorf("loaded params of %d elements (%v), want %d", len(params), err, model.NumParams())
			}
			ck.Close()
			if _, err := ck.Params(); err == nil {
				t.Errorf("Params after Close succeeded")
			}
			other := model
			other.C *= 2
			if _, err := Load(path, other, log); err == nil {
				t.Errorf("Load for another model succeeded")
			}
		})
	}
}

// captureLog returns a logger that writes text records into the buffer.
func captureLog() (*slog.Logger, *bytes.Buffer) {
	var b bytes.Buffer
	return slog.New(slog.NewTextHandler(&b, nil)), &b
}

// fakeOptimizer holds named state in memory.
type fakeOptimizer struct {
	names   []string // the arrays LoadStateFrom reads (nil: a.v and b.m)
	state   map[string][]float32
	step    int
	drained bool
}

func (o *fakeOptimizer) Drain() error { o.drained = true; return nil }
func (o *fakeOptimizer) StateArrays() ([]engine.StateArray, func() error, error) {
	var out []engine.StateArray
	for _, name := range slices.Sorted(maps.Keys(o.state)) {
		v := o.state[name]
		out = append(out, engine.StateArray{Name: name, Len: len(v), Read: func(fn func([]float32) error) error { return fn(v) }})
	}
	return out, func() error { return nil }, nil
}
func (o *fakeOptimizer) LoadStateFrom(src engine.StateSource) error {
	o.state = map[string][]float32{}
	names := o.names
	if names == nil {
		names = []string{"a.v", "b.m"}
	}
	for _, name := range names {
		n, ok := src.Len(name)
		if !ok {
			continue
		}
		v := make([]float32, n)
		if err := src.Read(name, func(off int, c []float32) error { copy(v[off:], c); return nil }); err != nil {
			return err
		}
		o.state[name] = v
	}
	return nil
}
func (o *fakeOptimizer) SetStepCount(step int) { o.step = step }

// uploadedModel is a GPT-2 of shape mc (one sequence of its full
// length) on a CPU backend, closed with the test, holding params.
func uploadedModel(t *testing.T, mc gpt2.Config, params []float32) (backend.Backend, backend.Stream, *gpt2.Model) {
	t.Helper()
	be := cpu.New(cpu.Config{Threads: 1})
	t.Cleanup(func() { be.Close() })
	s := be.DefaultStream()
	m, err := gpt2.New(be, mc, 1, mc.MaxT, backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	if err := backend.Upload(be, s, m.Params, params); err != nil {
		t.Fatal(err)
	}
	return be, s, m
}

func TestSaveLoad(t *testing.T) {
	mc := gpt2.Config{V: 257, MaxT: 8, C: 8, L: 1, NH: 2, Eps: 1e-5} // one layer
	vals := gpt2.Init(mc, 3)
	be, s, m := uploadedModel(t, mc, vals)
	opt := &fakeOptimizer{state: map[string][]float32{"b.m": {1, 2}, "a.v": {3}}}
	st := State{Step: 5, Position: data.Position{Epoch: 1, Index: 7}, Seed: 9, Model: mc, DType: backend.BF16,
		Data: "builtin:copy", Batch: 2, SeqLen: 8, Tokens: 80, GradAccum: 2, EvalFraction: 0.1, Truncate: true,
		Mode: engine.LSP, DenseParams: engine.DenseHost, D: 4, R: 1, Settings: map[string]string{"lr": "0.001", "no-fit": "true"}}
	path := filepath.Join(t.TempDir(), FileName)
	if err := Save(path, be, s, m.Params, opt, st); err != nil {
		t.Fatal(err)
	}
	if !opt.drained {
		t.Errorf("Save did not drain the optimizer first")
	}
	log, logged := captureLog()
	ck, err := Load(path, mc, log)
	if err != nil {
		t.Fatal(err)
	}
	if logged.Len() != 0 {
		t.Errorf("loading a fresh checkpoint logged %q", logged)
	}
	// Save records the version and the model's family.
	st.Version, st.Family = Version, "gpt2"
	if !reflect.DeepEqual(ck.State, st) {
		t.Errorf("state %+v, saved %+v", ck.State, st)
	}
	if err := backend.Upload(be, s, m.Params, make([]float32, len(vals))); err != nil {
		t.Fatal(err)
	}
	back := &fakeOptimizer{}
	if err := ck.Restore(be, s, m.Params, back); err != nil {
		t.Fatal(err)
	}
	got, err := backend.Download(be, s, m.Params)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, vals) || back.step != 5 || !slices.Equal(back.state["b.m"], []float32{1, 2}) ||
		!slices.Equal(back.state["a.v"], []float32{3}) {
		t.Errorf("restored params equal %v, step %d, state %v", slices.Equal(got, vals), back.step, back.state)
	}
}

// The state records the model's family beside its spec, and decodes the
// spec under it: an unknown family is refused naming it, a record without
// one (before families were recorded) is a GPT-2, and Load refuses a
// checkpoint of another model naming both.
func TestStateFamily(t *testing.T) {
	mc := gpt2.Config{V: 257, MaxT: 8, C: 8, L: 1, NH: 2, Eps: 1e-5}
	raw, err := json.Marshal(State{Family: mc.Family(), Model: mc, Mode: engine.Native})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"family":"gpt2","model":{"vocab_size":257,`) {
		t.Errorf("state encodes as %s; want the family before the GPT-2 config", raw)
	}
	var st State
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.Family != "gpt2" || st.Model != model.Spec(mc) {
		t.Errorf("decoded family %q model %#v; want gpt2 %+v", st.Family, st.Model, mc)
	}

	legacy := strings.Replace(string(raw), `"family":"gpt2",`, "", 1)
	st = State{}
	if err := json.Unmarshal([]byte(legacy), &st); err != nil {
		t.Fatal(err)
	}
	if st.Family != "" || st.Model != model.Spec(mc) {
		t.Errorf("a record without family decoded as family %q model %#v; want a GPT-2 %+v", st.Family, st.Model, mc)
	}

	for _, bad := range []struct{ json, want string }{
		{strings.Replace(string(raw), `"family":"gpt2"`, `"family":"mamba"`, 1), `"mamba"`},
		{strings.Replace(string(raw), `"n_embd":8`, `"n_embd":9`, 1), "n_embd=9"},
		{`{"version":3,"step":1}`, "no model"},
	} {
		if err := json.Unmarshal([]byte(bad.json), new(State)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("decoding %s: error %v, want one naming %s", bad.json, err, bad.want)
		}
	}

	be := cpu.New(cpu.Config{Threads: 1})
	defer be.Close()
	s := be.DefaultStream()
	m, err := gpt2.New(be, mc, 1, 8, backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), FileName)
	st = State{Model: mc, Mode: engine.Native, DType: backend.F32}
	if err := Save(path, be, s, m.Params, &fakeOptimizer{}, st); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.Metadata[MetadataKey], `"family":"gpt2"`) {
		t.Errorf("saved state %s records no family", f.Metadata[MetadataKey])
	}
	wider := mc
	wider.C = 16
	_, err = Load(path, wider, nil)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "C:8") || !strings.Contains(err.Error(), "C:16") {
		t.Errorf("Load for a wider model: %v; want an error naming the file and both models", err)
	}
	if err := Save(path, be, s, m.Params, &fakeOptimizer{}, State{}); err == nil {
		t.Error("Save of a state without a model: no error")
	}
}

// TestSaveStreamsTheSameBytes: Save, which downloads, encodes and sums
// each tensor a chunk at a time and patches the checksums into the header
// last, writes the very file that encoding everything first
// (safetensors.Write with Metadata) writes, for parameters and a state
// array several download chunks long (the last partial) and tensors
// shorter than one (the format is unchanged: files from before load, and
// files written now load in older programs); Restore gives them back,
// chunk by chunk, equal.
func TestSaveStreamsTheSameBytes(t *testing.T) {
	mc := gpt2.Config{V: 4096, MaxT: 8, C: 256, L: 1, NH: 2, Eps: 1e-5} // 1.84M parameters: two download chunks
	vals := gpt2.Init(mc, 5)
	be, s, m := uploadedModel(t, mc, vals)
	long := make([]float32, 2*saveChunk+12345)
	for i := range long {
		long[i] = float32(i)*0.25 - 7
	}
	opt := &fakeOptimizer{state: map[string][]float32{"z.long": long, "a.v": {3, -1}, "empty": {}}}
	st := State{Step: 2, Model: mc, DType: backend.F32, Mode: engine.Native}
	dir := t.TempDir()
	got := filepath.Join(dir, "streamed.safetensors")
	if err := Save(got, be, s, m.Params, opt, st); err != nil {
		t.Fatal(err)
	}
	st.Version, st.Family = Version, mc.Family()
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	ts := []safetensors.Tensor{safetensors.F32Tensor(ParamsTensor, []int{len(vals)}, vals),
		safetensors.F32Tensor("a.v", []int{2}, []float32{3, -1}), safetensors.F32Tensor("empty", []int{0}, nil),
		safetensors.F32Tensor("z.long", []int{len(long)}, long)}
	want := filepath.Join(dir, "whole.safetensors")
	if err := safetensors.Write(want, ts, Metadata(ts, string(raw))); err != nil {
		t.Fatal(err)
	}
	a, err := os.ReadFile(got)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatalf("Save wrote %d bytes that differ from the %d bytes of encoding everything first", len(a), len(b))
	}
	ck, err := Load(got, mc, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if err := backend.Upload(be, s, m.Params, make([]float32, len(vals))); err != nil {
		t.Fatal(err)
	}
	back := &fakeOptimizer{names: []string{"a.v", "empty", "z.long"}}
	if err := ck.Restore(be, s, m.Params, back); err != nil {
		t.Fatal(err)
	}
	params, err := backend.Download(be, s, m.Params)
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range opt.state {
		if !slices.Equal(back.state[name], v) {
			t.Errorf("restored %s differs", name)
		}
	}
	if !slices.Equal(params, vals) {
		t.Errorf("restored params differ")
	}
}
