// Package catalog is the one place that maps what a user or a file names
// to a model family: a preset name or a Hugging Face directory (--model),
// a checkpoint's record of its model, and back out to an export. Every
// family is one Family entry in the list below; the run (train, eval,
// compare, the command) holds a model.Spec and never names a family.
//
// Limits: a directory's family is decided by config.json's model_type
// alone; a config.json without one is read as GPT-2 (the original gpt2
// hub files have none). Preset names are unique across families.
package catalog

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hf"
	"github.com/lsp-offload/lsp-offload/train/llama2c"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// Family is one model family's entry: how its specs are found, recorded,
// loaded and exported.
type Family struct {
	// Name is model.Spec.Family of its specs, and the checkpoint's
	// record of them.
	Name string
	// ModelTypes are the config.json model_type values the family reads.
	ModelTypes []string
	// ContextName is the config field of the context length, which a
	// too-long --seq-len is named after: n_positions,
	// max_position_embeddings.
	ContextName string
	// Presets lists the preset names; Preset returns one.
	Presets func() []string
	Preset  func(name string) (model.Spec, error)
	// FromDir reads dir/config.json (its model_type one of ModelTypes)
	// and checks that the family can run it.
	FromDir func(dir string) (model.Spec, error)
	// Decode reads a spec as a checkpoint records it (its JSON).
	Decode func(raw []byte) (model.Spec, error)
	// LoadWeights reads the weights of spec (FromDir's) from dir: every
	// parameter in Layout order, as fp32.
	LoadWeights func(spec model.Spec, dir string) ([]float32, error)
	// Export writes the weights fetch gives (Layout order, fetched in
	// chunks) as those of a Hugging Face directory dir; the package's
	// Export writes config.json and the tokenizer files.
	Export func(spec model.Spec, dir string, fetch hf.Fetch) error
	// ExportBytes is the most host memory Export holds for spec beyond
	// what fetch holds.
	ExportBytes func(spec model.Spec) int64
	// LoadEach, where the family has it, hands the weights of spec
	// from dir to sink a chunk at a time (off: the chunk's Layout
	// offset), without a host copy of the whole model, which a 7B model
	// in fp32 could not afford. Nil: LoadWeights, then one chunk.
	LoadEach func(spec model.Spec, dir string, sink Sink) error
	// LoadBytes, with LoadEach, is the most host memory LoadEach holds
	// for spec (the backend's staging aside).
	LoadBytes func(spec model.Spec) int64
	// Tokenizer names the builtin tokenizer of spec, as tokenizer.ByName
	// takes it: the one a model whose directory holds no tokenizer files
	// (a preset, or a directory written before exports carried theirs)
	// is taken to use.
	Tokenizer func(spec model.Spec) (string, error)
	// Equal reports whether two specs are the same architecture; nil:
	// reflect.DeepEqual.
	Equal func(a, b model.Spec) bool
}

// asSpec turns a family's constructor of its own config type into one
// of a model.Spec, as a Family entry holds it.
func asSpec[C model.Spec](f func(string) (C, error)) func(string) (model.Spec, error) {
	return func(arg string) (model.Spec, error) {
		c, err := f(arg)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
}

// decodeSpec reads a checkpoint's record of a C (its JSON) and checks it.
func decodeSpec[C interface {
	model.Spec
	Validate() error
}](raw []byte) (model.Spec, error) {
	var c C
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// families is every family the run knows, in the order presets are listed.
var families = []*Family{gpt2Family, llamaFamily}

// Families lists the families.
func Families() []*Family { return slices.Clone(families) }

// Lookup returns the family named name.
func Lookup(name string) (*Family, error) {
	for _, f := range families {
		if f.Name == name {
			return f, nil
		}
	}
	return nil, fmt.Errorf("unknown model family %q (known: %s)", name, strings.Join(familyNames(), ", "))
}

func familyNames() []string {
	var names []string
	for _, f := range families {
		names = append(names, f.Name)
	}
	return names
}

// of returns the family of spec.
func of(spec model.Spec) (*Family, error) {
	if spec == nil {
		return nil, errors.New("no model")
	}
	return Lookup(spec.Family())
}

// Presets lists every family's presets, family by family.
func Presets() []string {
	var names []string
	for _, f := range families {
		names = append(names, f.Presets()...)
	}
	return names
}

// PresetList is the presets for a message or -h, by family:
// "gpt2: gpt2, gpt2-large, ...; llama: ...".
func PresetList() string {
	parts := make([]string, len(families))
	for i, f := range families {
		parts[i] = f.Name + ": " + strings.Join(f.Presets(), ", ")
	}
	return strings.Join(parts, "; ")
}

// Preset returns the named preset of whichever family has it.
func Preset(name string) (model.Spec, error) {
	for _, f := range families {
		if slices.Contains(f.Presets(), name) {
			return f.Preset(name)
		}
	}
	return nil, fmt.Errorf("unknown model preset %q (known: %s)", name, PresetList())
}

// ModelTypes lists the config.json model_type values some family reads.
func ModelTypes() []string {
	var ts []string
	for _, f := range families {
		ts = append(ts, f.ModelTypes...)
	}
	sort.Strings(ts)
	return ts
}

// FromDir reads dir/config.json and hands it to the family of its
// model_type.
func FromDir(dir string) (model.Spec, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	var h struct {
		ModelType *string `json:"model_type"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	mt := gpt2Family.Name // the original gpt2 hub files name none
	if h.ModelType != nil {
		mt = *h.ModelType
	}
	for _, f := range families {
		if slices.Contains(f.ModelTypes, mt) {
			return f.FromDir(dir)
		}
	}
	return nil, fmt.Errorf("checkpoint %s: model_type %q is not supported (supported: %s)", path, mt, strings.Join(ModelTypes(), ", "))
}

// Resolve finds the architecture of --model: a directory holding
// config.json (src is then that directory, which the weights and the
// tokenizer files come from), a llama2.c model file (src is the file), or
// else a preset of any family (src "").
func Resolve(nameOrDir string) (spec model.Spec, src string, err error) {
	st, statErr := os.Stat(nameOrDir)
	isDir := statErr == nil && st.IsDir()
	if isDir {
		if _, err := os.Stat(filepath.Join(nameOrDir, "config.json")); err == nil {
			spec, err := FromDir(nameOrDir)
			if err != nil {
				return nil, "", err
			}
			return spec, nameOrDir, nil
		}
	}
	if statErr == nil && st.Mode().IsRegular() {
		// A file: a llama2.c model (src is then the file, which the
		// weights come from and the tokenizer.bin is looked for beside).
		c, err := llama2c.ReadConfig(nameOrDir)
		if err != nil {
			return nil, "", err
		}
		return c, nameOrDir, nil
	}
	spec, err = Preset(nameOrDir)
	switch {
	case err == nil:
		return spec, "", nil
	case isDir:
		return nil, "", fmt.Errorf("%s is a directory without config.json, not a Hugging Face checkpoint", nameOrDir)
	case filepath.IsAbs(nameOrDir) || filepath.Base(nameOrDir) != nameOrDir:
		return nil, "", fmt.Errorf("%s is neither a checkpoint directory nor a preset", nameOrDir)
	}
	return nil, "", err
}

// legacyFamily is the family of a checkpoint record without one: every
// checkpoint written before families were recorded holds a GPT-2.
const legacyFamily = "gpt2"

// Decode reads a spec of family as a checkpoint records it; family ""
// (a checkpoint from before families were recorded) is GPT-2.
func Decode(family string, raw []byte) (model.Spec, error) {
	if family == "" {
		family = legacyFamily
	}
	f, err := Lookup(family)
	if err != nil {
		return nil, err
	}
	spec, err := f.Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("%s model: %w", family, err)
	}
	return spec, nil
}

// Equal reports whether a and b are the same architecture of the same
// family.
func Equal(a, b model.Spec) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	if a.Family() != b.Family() {
		return false
	}
	f, err := of(a)
	if err != nil || f.Equal == nil {
		return reflect.DeepEqual(a, b)
	}
	return f.Equal(a, b)
}

// ContextName is the config field of spec's context length.
func ContextName(spec model.Spec) string {
	if f, err := of(spec); err == nil {
		return f.ContextName
	}
	return "context"
}

// Tokenizer returns the tokenizer of a model, by the one rule that
// training and sampling share: override (--tokenizer: a tokenizer.json, a
// vocab.json, a directory, or a builtin name) when given; else the
// tokenizer files of src, the directory spec came from (tokenizer.json,
// else vocab.json + merges.txt); else the family's builtin tokenizer for
// spec. Its ids must fit spec's vocabulary.
func Tokenizer(spec model.Spec, src, override string) (tokenizer.Tokenizer, error) {
	f, err := of(spec)
	if err != nil {
		return nil, err
	}
	var tok tokenizer.Tokenizer
	found := false
	switch {
	case override != "":
		tok, err = tokenizer.Open(override)
		found = true
	case isFile(src):
		tok, err = llama2cTokenizer(src)
		found = true
	case src != "":
		tok, found, err = tokenizer.FromDir(src)
	}
	if err != nil {
		return nil, err
	}
	if !found {
		name, err := f.Tokenizer(spec)
		if err != nil {
			return nil, err
		}
		if tok, err = tokenizer.ByName(name); err != nil {
			return nil, err
		}
	}
	if tok.VocabSize() > spec.VocabSize() {
		hint := ""
		if !found {
			hint = "; no tokenizer files say which tokenizer it has: give --tokenizer"
		}
		return nil, fmt.Errorf("the model's vocab_size %d is smaller than the vocabulary of tokenizer %s (%d ids)%s", spec.VocabSize(), tok.Name(), tok.VocabSize(), hint)
	}
	return tok, nil
}

// LoadWeights reads the weights of spec, as FromDir(dir) returned it,
// from dir; or, where dir is a llama2.c model file (Resolve's src), from
// that file.
func LoadWeights(spec model.Spec, dir string) ([]float32, error) {
	if isFile(dir) {
		return llama2cWeights(spec, dir)
	}
	f, err := of(spec)
	if err != nil {
		return nil, err
	}
	return f.LoadWeights(spec, dir)
}

// LoadInto writes the weights of spec, as FromDir(dir) returned it, from
// dir (or a llama2.c model file, tensor by tensor) into dst (spec's
// Layout, F32 or BF16) on stream s of be, and waits for them.
func LoadInto(spec model.Spec, dir string, be backend.Backend, s backend.Stream, dst backend.Tensor) error {
	if dst.Len() != spec.NumParams() {
		return fmt.Errorf("checkpoint: %s: %d parameters into %v of %d elements", dir, spec.NumParams(), dst, dst.Len())
	}
	return LoadEach(spec, dir, func(off int, vals []float32) error {
		return backend.Upload(be, s, dst.Slice(off, len(vals)), vals)
	})
}

// Sink takes a model's weights a chunk at a time: vals are the elements
// from Layout offset off on, inside one parameter.
type Sink = func(off int, vals []float32) error

// LoadEach is LoadInto handing the weights to sink, a parameter after
// another in Layout order, instead of uploading them: how a quantized
// base (train/quant) takes its matrices one at a time.
func LoadEach(spec model.Spec, dir string, sink Sink) error {
	f, err := of(spec)
	if err != nil {
		return err
	}
	if isFile(dir) {
		return llama2cLoadEach(spec, dir, sink)
	}
	if f.LoadEach != nil {
		return f.LoadEach(spec, dir, sink)
	}
	vals, err := f.LoadWeights(spec, dir)
	if err != nil {
		return err
	}
	for _, p := range spec.Layout() {
		if err := sink(p.Offset, vals[p.Offset:p.Offset+p.Len()]); err != nil {
			return err
		}
	}
	return nil
}

// LoadBytes is the most host memory LoadInto (LoadEach) of spec from src (a
// Hugging Face directory or a llama2.c file) holds, the backend's staging
// aside: a streaming load's buffers (a llama2.c file's, a family's own
// LoadInto's), or every weight as fp32 where the family has no LoadInto
// (LoadWeights, then an upload).
func LoadBytes(spec model.Spec, src string) int64 {
	whole := 4 * int64(spec.NumParams())
	if isFile(src) {
		c, err := llamaConfig(spec)
		if err != nil {
			return whole
		}
		return llama2c.LoadBytes(c)
	}
	f, err := of(spec)
	if err != nil || f.LoadEach == nil || f.LoadBytes == nil {
		return whole
	}
	return f.LoadBytes(spec)
}

// Load reads a Hugging Face directory: its spec and its weights.
func Load(dir string) (model.Spec, []float32, error) {
	spec, err := FromDir(dir)
	if err != nil {
		return nil, nil, err
	}
	vals, err := LoadWeights(spec, dir)
	if err != nil {
		return nil, nil, err
	}
	return spec, vals, nil
}

// Export writes vals (spec's Layout order) as a Hugging Face directory:
// ExportFrom from host values.
func Export(spec model.Spec, dir string, vals []float32, src string, tok tokenizer.Tokenizer) error {
	if len(vals) != spec.NumParams() {
		return fmt.Errorf("export: %d values for a model of %d parameters", len(vals), spec.NumParams())
	}
	return ExportFrom(spec, dir, hf.FetchFloat32(vals), src, tok)
}

// ExportTensor is Export from params, the model's parameters on stream
// s of be (F32 or BF16, spec's Layout), downloaded in chunks through
// be's staging buffer: the host holds ExportBytes, not the model.
func ExportTensor(spec model.Spec, dir string, be backend.Backend, s backend.Stream, params backend.Tensor, src string, tok tokenizer.Tokenizer) error {
	if params.Len() != spec.NumParams() {
		return fmt.Errorf("export: %v holds %d elements for a model of %d parameters", params, params.Len(), spec.NumParams())
	}
	return ExportFrom(spec, dir, hf.FetchTensor(be, s, params), src, tok)
}

// ExportFrom writes the weights fetch gives (spec's Layout order, in
// chunks) as a Hugging Face directory: the family's weights, config.json
// from spec.HFConfig, and the files of tok, the tokenizer the model was
// trained with. A tokenizer read from src, the directory the model came
// from, is carried over as src's tokenizer files, byte for byte
// (tokenizer.model, chat template and all); any other is written by
// tokenizer.Save. A nil tok carries src's files, if any. It writes the
// directory as a whole: into a temp directory that replaces dir only when
// complete, so that a crash mid-export never leaves a half-written dir
// that transformers would load, and an earlier export stays until then.
func ExportFrom(spec model.Spec, dir string, fetch hf.Fetch, src string, tok tokenizer.Tokenizer) error {
	f, err := of(spec)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	cfg, err := spec.HFConfig()
	if err != nil {
		return fmt.Errorf("export: config.json: %w", err)
	}
	if tok != nil {
		if cfg, err = withTokenIDs(cfg, tok); err != nil {
			return fmt.Errorf("export: config.json: %w", err)
		}
	}
	return atomicfile.WriteDir(dir, 0o755, func(tmp string) error {
		if err := f.Export(spec, tmp, fetch); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(tmp, "config.json"), func(w io.Writer) error {
			_, err := w.Write(cfg)
			return err
		}); err != nil {
			return fmt.Errorf("export: %w", err)
		}
		if tok != nil && (src == "" || filepath.Clean(tokenizer.Dir(tok)) != filepath.Clean(src)) {
			if _, err := tokenizer.Save(tok, tmp); err != nil {
				return fmt.Errorf("export: %w", err)
			}
			return nil
		}
		if src == "" || isFile(src) {
			return nil
		}
		if _, err := hf.CopyTokenizerFiles(src, tmp); err != nil {
			return fmt.Errorf("export: %w", err)
		}
		return nil
	})
}

// withTokenIDs returns config.json cfg with the bos, eos and pad ids of
// tok, the tokenizer exported beside it, where they differ: the spec's
// are those of the model's own files or preset (Llama's 1 and 2), which a
// model trained with another tokenizer (bytes, EOS 256) does not use,
// and transformers' generate stops at config's eos_token_id, not where
// sample stops. An eos_token_id list holding the EOS (Llama 3's) is
// kept; a missing id is written as null. cfg comes back unchanged, byte
// for byte, when the ids already agree.
func withTokenIDs(cfg []byte, tok tokenizer.Tokenizer) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(cfg, &m); err != nil {
		return nil, err
	}
	bos, eos, pad := tokenizer.SpecialIDs(tok)
	changed := false
	set := func(key string, id int32, ok func(json.RawMessage) bool) {
		if ok(m[key]) {
			return
		}
		m[key] = json.RawMessage("null")
		if id >= 0 {
			m[key] = json.RawMessage(fmt.Sprint(id))
		}
		changed = true
	}
	is := func(id int32) func(json.RawMessage) bool {
		return func(raw json.RawMessage) bool {
			var v *int32
			return json.Unmarshal(raw, &v) == nil && (v == nil && id < 0 || v != nil && *v == id) && raw != nil
		}
	}
	set("bos_token_id", bos, is(bos))
	set("pad_token_id", pad, func(raw json.RawMessage) bool {
		return raw == nil && pad < 0 || is(pad)(raw) // transformers' default pad is none
	})
	set("eos_token_id", eos, func(raw json.RawMessage) bool {
		var ids []int32
		return is(eos)(raw) || json.Unmarshal(raw, &ids) == nil && len(ids) > 0 && slices.Contains(ids, eos)
	})
	if !changed {
		return cfg, nil
	}
	return json.MarshalIndent(m, "", "  ")
}

// ExportBytes is the most host memory an export of spec holds (the
// family's writer; a fetch from a device adds the backend's staging
// buffer, which a plan counts on its own).
func ExportBytes(spec model.Spec) int64 {
	f, err := of(spec)
	if err != nil || f.ExportBytes == nil {
		return 4 * int64(spec.NumParams()) // unknown: as much as the model
	}
	return f.ExportBytes(spec)
}

func writeFile(path string, fn func(io.Writer) error) error {
	return atomicfile.WriteFile(path, 0o644, fn)
}
