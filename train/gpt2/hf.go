// Hugging Face checkpoints: a directory with config.json and the weights as
// GPT2LMHeadModel.save_pretrained writes them (model.safetensors, or shards
// listed by model.safetensors.index.json), read and written through
// train/hf. Import accepts both "transformer."-prefixed names
// (save_pretrained) and bare ones (the original gpt2 hub files); export
// writes the prefixed names in fp32, with the LM head tied to wte and so
// not stored.

package gpt2

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hf"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// hfConfig is the part of a transformers GPT2Config that this model uses.
type hfConfig struct {
	ModelType          string       `json:"model_type"`
	Architectures      []string     `json:"architectures,omitempty"`
	VocabSize          int          `json:"vocab_size"`
	NPositions         int          `json:"n_positions"`
	NCtx               int          `json:"n_ctx,omitempty"`
	NEmbd              int          `json:"n_embd"`
	NLayer             int          `json:"n_layer"`
	NHead              int          `json:"n_head"`
	NInner             *int         `json:"n_inner"`
	Activation         string       `json:"activation_function"`
	LayerNormEpsilon   *float32JSON `json:"layer_norm_epsilon"`
	TieWordEmbeddings  *bool        `json:"tie_word_embeddings,omitempty"`
	ResidPdrop         float64      `json:"resid_pdrop"`
	EmbdPdrop          float64      `json:"embd_pdrop"`
	AttnPdrop          float64      `json:"attn_pdrop"`
	InitializerRange   float64      `json:"initializer_range"`
	ScaleAttnWeights   *bool        `json:"scale_attn_weights,omitempty"`
	ScaleByInverseIdx  bool         `json:"scale_attn_by_inverse_layer_idx,omitempty"`
	ReorderAndUpcast   bool         `json:"reorder_and_upcast_attn,omitempty"`
	BosTokenID         int          `json:"bos_token_id"`
	EosTokenID         int          `json:"eos_token_id"`
	TorchDtype         string       `json:"torch_dtype,omitempty"`
	TransformersVerson string       `json:"transformers_version,omitempty"`
}

// float32JSON is a number the model holds as a float32. It reads as any
// JSON number and writes as the shortest decimal that reads back as the
// same float32, in Python's form, as transformers writes it: 1e-05, not
// the float32 value's expansion 0.000009999999747378752 (nor Go's
// 0.00001).
type float32JSON float64

func (f float32JSON) MarshalJSON() ([]byte, error) {
	x := float32(f)
	if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
		return nil, fmt.Errorf("%v is not a JSON number", x)
	}
	return strconv.AppendFloat(nil, float64(x), 'g', -1, 32), nil
}

// ReadHFConfig reads dir/config.json and checks that this model can run it.
func ReadHFConfig(dir string) (Config, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("checkpoint: %w", err)
	}
	var h hfConfig
	if err := json.Unmarshal(raw, &h); err != nil {
		return Config{}, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if h.ModelType != "" && h.ModelType != "gpt2" {
		return Config{}, fmt.Errorf("checkpoint %s: model_type %q is not gpt2", path, h.ModelType)
	}
	switch h.Activation {
	case "gelu_new", "gelu_pytorch_tanh", "":
	default:
		return Config{}, fmt.Errorf("checkpoint %s: activation_function %q not supported (want gelu_new)", path, h.Activation)
	}
	if h.NInner != nil && *h.NInner != 4*h.NEmbd {
		return Config{}, fmt.Errorf("checkpoint %s: n_inner=%d not supported (want 4*n_embd)", path, *h.NInner)
	}
	if h.TieWordEmbeddings != nil && !*h.TieWordEmbeddings {
		return Config{}, fmt.Errorf("checkpoint %s: tie_word_embeddings=false not supported", path)
	}
	if h.ScaleAttnWeights != nil && !*h.ScaleAttnWeights || h.ScaleByInverseIdx || h.ReorderAndUpcast {
		return Config{}, fmt.Errorf("checkpoint %s: non-default attention scaling options not supported", path)
	}
	c := Config{V: h.VocabSize, MaxT: h.NPositions, C: h.NEmbd, L: h.NLayer, NH: h.NHead, Eps: 1e-5}
	if e := h.LayerNormEpsilon; e != nil {
		// The model computes in float32: an epsilon that float32 cannot
		// hold (1e300 is +Inf, 1e-50 is 0) is refused, not changed.
		c.Eps = float32(*e)
		if *e > 0 && (c.Eps == 0 || math.IsInf(float64(c.Eps), 0)) {
			return Config{}, fmt.Errorf("checkpoint %s: layer_norm_epsilon=%g is outside float32's range", path, *e)
		}
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	size, err := hf.WeightBytes(dir)
	if err != nil {
		return Config{}, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	if err := checkWeightsSize(size, weightsName(dir), c); err != nil {
		return Config{}, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	return c, nil
}

// minParamBytes is the least storage of one parameter in a weights file:
// two bytes (BF16, F16), the narrowest dtype LoadWeights converts.
const minParamBytes = 2

// paramCount is cfg.NumParams computed without building the layout and
// without overflow; ok is false when the count does not fit in an int.
// Per layer: 12*C*C weights and 13*C biases and LayerNorm parameters.
func paramCount(c Config) (n int, ok bool) {
	var k model.Checked
	mul, add := k.Mul, k.Add
	C, V, T, L := int64(c.C), int64(c.V), int64(c.MaxT), int64(c.L)
	perLayer := add(mul(12, mul(C, C)), mul(13, C))
	return k.Int(add(add(mul(V, C), mul(T, C)), add(mul(L, perLayer), mul(2, C))))
}

// checkWeightsSize refuses a config whose parameters cannot be in weights of
// size bytes (described by what, for the error), judged by the size alone,
// so that an absurd config.json (n_embd = 1e12, n_layer = 1e9) is refused
// before anything is allocated for it: by the loader here, and by callers
// that build a model from ReadHFConfig before loading the weights. The
// size follows symbolic links, as Hugging Face's cache needs (see LoadHF).
func checkWeightsSize(size int64, what string, c Config) error {
	n, ok := paramCount(c)
	if !ok {
		return fmt.Errorf("the parameter count of n_embd=%d n_layer=%d vocab_size=%d n_positions=%d overflows",
			c.C, c.L, c.V, c.MaxT)
	}
	if int64(n) > size/minParamBytes {
		return fmt.Errorf("the config declares %d parameters (n_embd=%d n_layer=%d vocab_size=%d n_positions=%d) of at least %d bytes each, but %s holds %d bytes",
			n, c.C, c.L, c.V, c.MaxT, minParamBytes, what, size)
	}
	return nil
}

// weightsName names dir's weights for errors: model.safetensors, or the
// index when there is no single file.
func weightsName(dir string) string {
	single := filepath.Join(dir, hf.SingleFile)
	if _, err := os.Stat(single); err != nil {
		return "the shards of " + filepath.Join(dir, hf.IndexFile)
	}
	return single
}

// LoadHF reads a Hugging Face GPT-2 directory: its config and every
// parameter, in Layout order, as fp32.
//
// File names are fixed (config.json, model.safetensors) or, for shards,
// read from the index and kept inside the directory by train/hf. The
// files may be symbolic links: Hugging Face's own cache makes
// snapshots/<rev>/model.safetensors a link to ../../blobs/<hash>, so
// refusing links, or that link out of the directory, would refuse every
// model downloaded with transformers.
func LoadHF(dir string) (Config, []float32, error) {
	cfg, err := ReadHFConfig(dir)
	if err != nil {
		return Config{}, nil, err
	}
	c, err := hf.Open(dir)
	if err != nil {
		return Config{}, nil, fmt.Errorf("checkpoint: %w", err)
	}
	defer c.Close()
	vals, err := loadWeights(c, cfg)
	return cfg, vals, err
}

// LoadWeights reads every parameter of cfg from a safetensors file,
// checking each shape against the config.
// The file's size bounds what the config may claim (checkWeightsSize), and its
// tensor count bounds the layout, before either is allocated.
func LoadWeights(path string, cfg Config) ([]float32, error) {
	c, err := openWeights(path, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return loadWeights(c, cfg)
}

// LoadInto is LoadWeights straight into dst (cfg's Layout, F32 or BF16)
// on stream s of be, a chunk at a time (hf.Checkpoint.Load), with no
// host copy of the model; nothing is written unless every check passes.
func LoadInto(path string, cfg Config, be backend.Backend, s backend.Stream, dst backend.Tensor) error {
	if dst.Len() != cfg.NumParams() {
		return fmt.Errorf("checkpoint %s: %d parameters into %v of %d elements", path, cfg.NumParams(), dst, dst.Len())
	}
	return LoadEach(path, cfg, func(off int, vals []float32) error {
		return backend.Upload(be, s, dst.Slice(off, len(vals)), vals)
	})
}

// LoadEach is LoadInto handing each chunk to sink (hf.Checkpoint.LoadEach)
// instead of uploading it.
func LoadEach(path string, cfg Config, sink func(off int, vals []float32) error) error {
	c, err := openWeights(path, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := checkWeights(c, cfg); err != nil {
		return err
	}
	if err := c.LoadEach(cfg.Layout(), loadOptions, sink); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// openWeights opens the safetensors file path of cfg's weights, its size
// checked against the config first.
func openWeights(path string, cfg Config) (*hf.Checkpoint, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	if err := checkWeightsSize(st.Size(), path, cfg); err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", path, err)
	}
	c, err := hf.OpenFile(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return c, nil
}

// loadOptions: the hub's bare names, and a stored lm_head.weight, which
// checkWeights checks against wte itself.
var loadOptions = hf.LoadOptions{
	Alt:   func(name string) []string { return []string{strings.TrimPrefix(name, "transformer.")} },
	Extra: func(name string) bool { return name == "lm_head.weight" },
}

// loadWeights reads cfg's parameters from an opened checkpoint.
func loadWeights(c *hf.Checkpoint, cfg Config) ([]float32, error) {
	if err := checkWeights(c, cfg); err != nil {
		return nil, err
	}
	vals, err := c.LoadFloat32(cfg.Layout(), loadOptions)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: %w", err)
	}
	return vals, nil
}

// checkWeights checks what hf's load does not: enough tensors for the
// layers, and a stored lm_head.weight equal to the embedding it is tied
// to (compared a chunk at a time).
func checkWeights(c *hf.Checkpoint, cfg Config) error {
	where := c.Dir
	if files := c.Files(); c.Index == "" && len(files) == 1 {
		where = files[0]
	} else if c.Index != "" {
		where = c.Index
	}
	// Every layer has perLayer tensors, plus wte, wpe and ln_f's two.
	if have := len(c.Names()); cfg.L > (have-4)/perLayer {
		return fmt.Errorf("checkpoint %s: %d tensors, too few for n_layer=%d (%d per layer)", where, have, cfg.L, perLayer)
	}
	lm, file, ok := c.Info("lm_head.weight")
	if !ok {
		return nil
	}
	wte := cfg.Layout()[0]
	if !slices.Equal(lm.Shape, wte.Shape) {
		return fmt.Errorf("checkpoint %s: lm_head.weight has shape %v, transformer.wte.weight %v", file, lm.Shape, wte.Shape)
	}
	name := wte.Name
	if _, _, ok := c.Info(name); !ok {
		name = strings.TrimPrefix(name, "transformer.")
	}
	if _, _, ok := c.Info(name); !ok {
		return nil // no embedding: the load says so
	}
	same, err := c.SameValues(lm.Name, name)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if !same {
		return fmt.Errorf("checkpoint %s: lm_head.weight differs from transformer.wte.weight; untied heads are not supported", file)
	}
	return nil
}

// ExportHF writes cfg and vals (Layout order) as a Hugging Face GPT-2
// directory that transformers' GPT2LMHeadModel.from_pretrained loads.
func ExportHF(dir string, cfg Config, vals []float32) error {
	if len(vals) != cfg.NumParams() {
		return fmt.Errorf("export: %d values for a model of %d parameters", len(vals), cfg.NumParams())
	}
	return ExportHFFrom(dir, cfg, hf.FetchFloat32(vals))
}

// ExportHFFrom is ExportHF from a source of the values in chunks (a
// device tensor: hf.FetchTensor), holding ExportBytes on the host.
func ExportHFFrom(dir string, cfg Config, fetch hf.Fetch) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := writeHFConfig(dir, cfg); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := hf.ExportFrom(dir, cfg.Layout(), exportOptions, fetch); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

// exportOptions: GPT-2's exports are fp32 and store every parameter.
var exportOptions = hf.ExportOptions{DType: backend.F32}

// ExportBytes is the host memory ExportHFFrom holds at most (its
// writer's buffers; a fetch's own are its source's).
func ExportBytes(cfg Config) int64 { return hf.ExportBytes(cfg.Layout(), exportOptions) }

// writeHFConfig writes cfg as dir/config.json, as transformers' GPT2Config
// (the bytes of Config.HFConfig).
func writeHFConfig(dir string, cfg Config) error {
	raw, err := cfg.HFConfig()
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, "config.json"), 0o644, func(w io.Writer) error {
		_, err := w.Write(raw)
		return err
	})
}

// Init returns GPT-2's initialisation for training from scratch, drawn from
// seed (InitEach's values in one slice).
func Init(cfg Config, seed uint64) []float32 {
	vals := make([]float32, cfg.NumParams())
	_ = InitEach(cfg, seed, func(p model.Param, v []float32) error { // fn never fails
		copy(vals[p.Offset:], v)
		return nil
	})
	return vals
}

// InitEach is Init parameter by parameter, in Layout order (model.Spec's
// InitEach): weights N(0, 0.02), residual projections N(0, 0.02/sqrt(2L))
// as in the GPT-2 paper, biases 0, LayerNorm weights 1, drawn from one
// generator in layout order.
func InitEach(cfg Config, seed uint64, fn func(p model.Param, v []float32) error) error {
	rng := rand.New(rand.NewPCG(seed, 0x6770_7432))
	buf := model.InitBuffer(cfg)
	for _, p := range cfg.Layout() {
		v := buf[:p.Len()]
		switch {
		case strings.HasSuffix(p.Name, "ln_1.weight"), strings.HasSuffix(p.Name, "ln_2.weight"), strings.HasSuffix(p.Name, "ln_f.weight"):
			for i := range v {
				v[i] = 1
			}
		case len(p.Shape) == 2:
			std := 0.02
			if strings.HasSuffix(p.Name, "c_proj.weight") {
				std /= math.Sqrt(2 * float64(cfg.L))
			}
			for i := range v {
				v[i] = float32(rng.NormFloat64() * std)
			}
		default:
			clear(v) // the buffer holds the previous parameter's values
		}
		if err := fn(p, v); err != nil {
			return err
		}
	}
	return nil
}
