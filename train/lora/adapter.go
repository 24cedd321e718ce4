// adapter.go: PEFT's LoRA adapter directory, read and written, the merge of
// an adapter into its base matrices and the initialisation of a new one.
//
// A PEFT adapter directory holds adapter_config.json (a LoraConfig) and
// adapter_model.safetensors, one lora_A.weight [r, in] and one
// lora_B.weight [out, r] per adapted module under the key
// "base_model.model.<module>.lora_X.weight" (the default adapter's name is
// not in the key). Both layouts are the same for GPT-2's Conv1D and
// LLaMA's Linear: only the base weight's differs (fan_in_fan_out).
//
// Limits: only plain LoRA is read. Every LoraConfig field that changes what
// the tensors mean (rsLoRA's scale, DoRA, patterns of ranks, layers or
// alphas, extra trained modules, biases, LoRA variants, initialisations
// that rewrite the base weights) is refused naming the field, and so is a
// field this reader does not know that holds a value, since it may be one
// of those from a newer PEFT. adapter_model.bin (a pickle) is not read.

package lora

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/hf"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// The file names of a PEFT adapter directory.
const (
	ConfigFile  = "adapter_config.json"
	WeightsFile = "adapter_model.safetensors"
)

// maxConfigBytes bounds adapter_config.json (PEFT's is about 1 KB).
const maxConfigBytes = 1 << 20

// Adapter is one LoRA adapter: its configuration, the matrices it adapts
// (Sites(idx, Cfg), in that order) and per site A (row-major R x M, PEFT's
// lora_A.weight as stored) and B (row-major N x R, lora_B.weight).
type Adapter struct {
	Cfg   Config
	Sites []Site
	A, B  [][]float32
	// BaseModel is adapter_config.json's base_model_name_or_path as read
	// ("" when null); WriteAdapter takes its own.
	BaseModel string
}

// KeyA is the name of a site's A in adapter_model.safetensors.
func KeyA(s Site) string { return "base_model.model." + s.Module + ".lora_A.weight" }

// KeyB is the name of a site's B in adapter_model.safetensors.
func KeyB(s Site) string { return "base_model.model." + s.Module + ".lora_B.weight" }

// NewAdapter makes a fresh adapter of cfg over idx's matrices with PEFT's
// initialisation: A Kaiming-uniform (Init), B zero, so the adapted model
// starts as the base model. Site i draws from its own stream of seed, so
// a site's A does not depend on which other sites are adapted.
func NewAdapter(idx *model.Index, cfg Config, seed uint64) (*Adapter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	sites, err := Sites(idx, cfg)
	if err != nil {
		return nil, err
	}
	ad := &Adapter{Cfg: cfg, Sites: sites, A: make([][]float32, len(sites)), B: make([][]float32, len(sites))}
	for i, s := range sites {
		ad.A[i] = make([]float32, cfg.R*s.M)
		ad.B[i] = make([]float32, s.N*cfg.R)
		rng := rand.New(rand.NewPCG(seed, 0x6c6f_7261_0000_0000+uint64(i))) // "lora"
		if err := Init(rng, ad.A[i], s.M, cfg.R); err != nil {
			return nil, fmt.Errorf("lora: %s: %w", s.Module, err)
		}
	}
	return ad, nil
}

// Init fills a (R x M, row-major) as PEFT initialises lora_A: torch's
// kaiming_uniform_ with a = sqrt(5), whose gain sqrt(2 / (1 + 5)) times
// sqrt(3 / fan_in) makes the bound 1 / sqrt(fan_in), fan_in being the
// row length m (the module's input width). B starts at zero (the caller's
// fresh slice), so the term is zero until B trains.
func Init(rng *rand.Rand, a []float32, m, r int) error {
	if rng == nil {
		return errors.New("lora init: nil random source")
	}
	if m < 1 || r < 1 || len(a) != m*r {
		return fmt.Errorf("lora init: A has %d elements, want r x m = %d x %d", len(a), r, m)
	}
	bound := 1 / math.Sqrt(float64(m))
	for i := range a {
		a[i] = float32((2*rng.Float64() - 1) * bound)
	}
	return nil
}

// Merge adds scale * (B A)^T to w, a base matrix in this project's layout
// (in x out, row-major: M x N), as PEFT's merge_and_unload adds the term to
// the weight: w[i*N + j] += scale * sum_k A[k, i] B[j, k]. Each sum is
// taken in float64 in order of k, so the result does not depend on the
// machine. a is R x M and b is N x R, row-major.
func Merge(w []float32, site Site, a, b []float32, scale float32) error {
	if _, err := checkShapes("merge", "the base matrix", w, site, a, b); err != nil {
		return err
	}
	mergeInto(w, 0, site, a, b, scale)
	return nil
}

// checkShapes checks that w (named what) is site's m x n matrix, a is
// r x m and b n x r, and returns r; op names the caller in errors.
func checkShapes(op, what string, w []float32, site Site, a, b []float32) (r int, err error) {
	m, n := site.M, site.N
	if m < 1 || n < 1 || len(w) != m*n {
		return 0, fmt.Errorf("lora %s %s: %s has %d elements, want %d x %d", op, site.Module, what, len(w), m, n)
	}
	if len(a) == 0 || len(a)%m != 0 {
		return 0, fmt.Errorf("lora %s %s: A has %d elements, not r x %d", op, site.Module, len(a), m)
	}
	r = len(a) / m
	if len(b) != n*r {
		return 0, fmt.Errorf("lora %s %s: B has %d elements, want %d x %d", op, site.Module, len(b), n, r)
	}
	return r, nil
}

// mergeInto is Merge of the elements [first, first+len(w)) of the matrix,
// which w holds: a chunk of an export's stream, row by row.
func mergeInto(w []float32, first int, site Site, a, b []float32, scale float32) {
	m, n := site.M, site.N
	r := len(a) / m
	s := float64(scale)
	col := make([]float64, r) // A's column i
	for e := 0; e < len(w); {
		i, j0 := (first+e)/n, (first+e)%n
		for k := range r {
			col[k] = float64(a[k*m+i])
		}
		for j := j0; j < n && e < len(w); j, e = j+1, e+1 {
			bj := b[j*r : (j+1)*r]
			var sum float64
			for k := range r {
				sum += col[k] * float64(bj[k])
			}
			w[e] = float32(float64(w[e]) + s*sum)
		}
	}
}

// MergeFetch wraps fetch, a source of a model's parameters in idx's
// Layout order a chunk at a time (an export's, hf.Fetch), so that the
// adapted matrices come out with ad merged into them, as MergeAll would
// leave them: the merged model streams to its files with no host copy of
// it.
func MergeFetch(fetch func(off int, dst []float32) error, idx *model.Index, ad *Adapter) (func(off int, dst []float32) error, error) {
	total := 0
	if n := len(idx.Layout); n > 0 {
		total = idx.Layout[n-1].Offset + idx.Layout[n-1].Len()
	}
	params := make([]model.Param, len(ad.Sites))
	for i, s := range ad.Sites {
		p, err := siteParam(idx, s, total)
		if err != nil {
			return nil, err
		}
		if len(ad.A[i]) != ad.Cfg.R*s.M || len(ad.B[i]) != s.N*ad.Cfg.R {
			return nil, fmt.Errorf("lora merge %s: A and B of %d and %d elements for rank %d", s.Module, len(ad.A[i]), len(ad.B[i]), ad.Cfg.R)
		}
		params[i] = p
	}
	return func(off int, dst []float32) error {
		if err := fetch(off, dst); err != nil {
			return err
		}
		for i, p := range params {
			lo, hi := max(off, p.Offset), min(off+len(dst), p.Offset+p.Len())
			if lo < hi {
				mergeInto(dst[lo-off:hi-off], lo-p.Offset, ad.Sites[i], ad.A[i], ad.B[i], ad.Cfg.Scale())
			}
		}
		return nil
	}, nil
}

// siteParam is the matrix parameter of site s in idx, checked to be the
// module the adapter names, within a model of total elements.
func siteParam(idx *model.Index, s Site, total int) (model.Param, error) {
	if s.Layer < 0 || s.Layer >= len(idx.MatParam) || s.K < 0 || s.K >= len(idx.MatParam[s.Layer]) {
		return model.Param{}, fmt.Errorf("lora merge %s: block %d matrix %d is not in the model", s.Module, s.Layer, s.K)
	}
	p := idx.Layout[idx.MatParam[s.Layer][s.K]]
	if p.Name != s.Module+".weight" || p.Offset+p.Len() > total {
		return model.Param{}, fmt.Errorf("lora merge %s: the model's matrix %d of block %d is %s (at %d of %d parameters): the adapter is another model's",
			s.Module, s.K, s.Layer, p.Name, p.Offset, total)
	}
	return p, nil
}

// MergeAll merges every site of ad into params, a whole model's
// parameters in idx's Layout order (matrices in x out): the weights that
// merge_and_unload leaves, for an export of the merged model.
func MergeAll(params []float32, idx *model.Index, ad *Adapter) error {
	for i, s := range ad.Sites {
		p, err := siteParam(idx, s, len(params))
		if err != nil {
			return err
		}
		if err := Merge(params[p.Offset:p.Offset+p.Len()], s, ad.A[i], ad.B[i], ad.Cfg.Scale()); err != nil {
			return err
		}
	}
	return nil
}

// ReadAdapter reads the PEFT LoRA adapter in dir for the model idx
// describes. Every error names the file and the field or tensor at fault.
func ReadAdapter(dir string, idx *model.Index) (*Adapter, error) {
	cfgPath := filepath.Join(dir, ConfigFile)
	cfg, base, fanInFanOut, err := readConfig(cfgPath)
	if err != nil {
		return nil, err
	}
	if err := checkTargets(cfgPath, idx, cfg.Targets); err != nil {
		return nil, err
	}
	sites, err := Sites(idx, cfg)
	if err != nil {
		return nil, fmt.Errorf("lora: %s: target_modules: %w", cfgPath, err)
	}
	if want := sites[0].FanInFanOut; fanInFanOut != want {
		return nil, fmt.Errorf("lora: %s: fan_in_fan_out: %t, but the model's matrices are stored %s in Hugging Face files (want %t)",
			cfgPath, fanInFanOut, layoutWords(want), want)
	}
	ad := &Adapter{Cfg: cfg, Sites: sites, BaseModel: base, A: make([][]float32, len(sites)), B: make([][]float32, len(sites))}
	if err := readWeights(filepath.Join(dir, WeightsFile), ad); err != nil {
		return nil, err
	}
	return ad, nil
}

func layoutWords(fanInFanOut bool) string {
	if fanInFanOut {
		return "in x out (Conv1D)"
	}
	return "out x in (Linear)"
}

// readWeights fills ad.A and ad.B from the safetensors file at path,
// checking that it holds exactly the sites' tensors, of the right shapes,
// finite.
func readWeights(path string, ad *Adapter) error {
	f, err := safetensors.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if _, berr := os.Stat(filepath.Join(filepath.Dir(path), "adapter_model.bin")); berr == nil {
				return fmt.Errorf("lora: %s is missing; adapter_model.bin (a pickle) is not read: save the adapter with safe_serialization", path)
			}
		}
		return fmt.Errorf("lora: %w", err)
	}
	defer f.Close()
	used := map[string]bool{}
	r := ad.Cfg.R
	for i, s := range ad.Sites {
		for _, t := range []struct {
			key  string
			rows int
			cols int
			dst  *[]float32
		}{{KeyA(s), r, s.M, &ad.A[i]}, {KeyB(s), s.N, r, &ad.B[i]}} {
			ti, ok := f.Info(t.key)
			if !ok {
				return fmt.Errorf("lora: %s: tensor %s is missing (module %s is a target)", path, t.key, s.Module)
			}
			if !slices.Equal(ti.Shape, []int{t.rows, t.cols}) {
				return fmt.Errorf("lora: %s: tensor %s is %v, want [%d, %d] (r = %d, the module is %d in x %d out)",
					path, t.key, ti.Shape, t.rows, t.cols, r, s.M, s.N)
			}
			v, _, err := f.Float32(t.key)
			if err != nil {
				return fmt.Errorf("lora: %w", err)
			}
			for j, x := range v {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					return fmt.Errorf("lora: %s: tensor %s: element %d is %v", path, t.key, j, x)
				}
			}
			*t.dst = v
			used[t.key] = true
		}
	}
	var extra []string
	for _, name := range f.Names() {
		if !used[name] {
			extra = append(extra, name)
		}
	}
	if len(extra) > 0 {
		const show = 4
		more := ""
		if len(extra) > show {
			more = fmt.Sprintf(" and %d more", len(extra)-show)
			extra = extra[:show]
		}
		return fmt.Errorf("lora: %s: tensor %s%s: no target module of adapter_config.json has it (a bias, a saved module or another adapter's tensor is not read)",
			path, strings.Join(extra, ", "), more)
	}
	return nil
}

// checkTargets requires every target to name at least one block matrix,
// in the file's words (Sites' error speaks of the flag).
func checkTargets(path string, idx *model.Index, targets []string) error {
	var missing []string
	for _, t := range targets {
		hit := false
		for _, row := range idx.MatParam {
			for _, pi := range row {
				if matches(strings.TrimSuffix(idx.Layout[pi].Name, ".weight"), t) {
					hit = true
				}
			}
		}
		if !hit {
			missing = append(missing, strconv.Quote(t))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("lora: %s: target_modules: the model has no block matrix %s (its block matrices: %s)",
			path, strings.Join(missing, ", "), strings.Join(matrixModules(idx), ", "))
	}
	return nil
}

// matches is PEFT's test of a module path against a name in a list of
// target_modules: equal, or ending with "." and the name.
func matches(module, target string) bool {
	return module == target || strings.HasSuffix(module, "."+target)
}

// ignoredFields are LoraConfig fields that do not change what the tensors
// mean: bookkeeping, and initialisations whose result is the stored
// tensors (those that rewrite the base weights are refused by
// init_lora_weights itself).
var ignoredFields = map[string]bool{
	"base_model_name_or_path": true, "revision": true, "inference_mode": true,
	"auto_mapping": true, "peft_version": true, "megatron_core": true,
	"qalora_group_size": true, "loftq_config": true, "eva_config": true,
	"corda_config": true, "ensure_weight_tying": true,
}

// unsetFields must be absent, null or empty: each set changes the model
// beyond plain LoRA on the target modules.
var unsetFields = map[string]string{
	"rank_pattern":            "per-module ranks are not supported",
	"alpha_pattern":           "per-module alphas are not supported",
	"modules_to_save":         "fully trained extra modules are not supported",
	"layers_to_transform":     "adapting only some layers is not supported",
	"layers_pattern":          "adapting only some layers is not supported",
	"layer_replication":       "replicated layers are not supported",
	"target_parameters":       "adapted parameters (not modules) are not supported",
	"exclude_modules":         "excluded modules are not supported",
	"trainable_token_indices": "trained token embeddings are not supported",
	"alora_invocation_tokens": "activated LoRA is not supported",
	"use_bdlora":              "block-diagonal LoRA is not supported",
	"arrow_config":            "Arrow routing is not supported",
	"megatron_config":         "Megatron layers are not supported",
	"kasa_config":             "this LoRA variant is not supported",
	"velora_config":           "this LoRA variant is not supported",
	"monteclora_config":       "this LoRA variant is not supported",
	"lora_ga_config":          "LoRA-GA is not supported",
}

// falseFields must be absent, null or false.
var falseFields = map[string]string{
	"use_rslora": "rank-stabilised LoRA scales by alpha / sqrt(r), not alpha / r",
	"use_dora":   "DoRA (weight-decomposed LoRA) is not supported",
	"lora_bias":  "a bias on lora_B is not supported",
	"use_qalora": "QA-LoRA is not supported",
}

// readConfig reads and checks adapter_config.json, with PEFT's defaults
// for absent fields (r 8, lora_alpha 8, lora_dropout 0, bias "none",
// fan_in_fan_out false).
func readConfig(path string) (cfg Config, base string, fanInFanOut bool, err error) {
	raw, err := hf.ReadBounded(path, maxConfigBytes)
	if err != nil {
		return cfg, "", false, fmt.Errorf("lora: %w", err)
	}
	fields := map[string]json.RawMessage{}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&fields); err != nil {
		return cfg, "", false, fmt.Errorf("lora: %s: not a JSON object: %w", path, err)
	}
	bad := func(field, format string, a ...any) error {
		return fmt.Errorf("lora: %s: %s: %s", path, field, fmt.Sprintf(format, a...))
	}
	// Fields in sorted order, so that the first error is always the same.
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	cfg = Config{R: 8, Alpha: 8}
	var sawPeftType, sawTargets bool
	for _, k := range names {
		v := fields[k]
		switch {
		case k == "peft_type":
			var s string
			if json.Unmarshal(v, &s) != nil || s != "LORA" {
				return cfg, "", false, bad(k, "%s, want \"LORA\" (only LoRA adapters are read)", v)
			}
			sawPeftType = true
		case k == "task_type":
			var s *string
			if json.Unmarshal(v, &s) != nil || (s != nil && *s != "CAUSAL_LM") {
				return cfg, "", false, bad(k, "%s, want \"CAUSAL_LM\" (a causal language model's adapter)", v)
			}
		case k == "r":
			n, err := strconv.Atoi(string(v))
			if err != nil || n < 1 {
				return cfg, "", false, bad(k, "%s, want a whole number at least 1", v)
			}
			cfg.R = n
		case k == "lora_alpha":
			x, err := strconv.ParseFloat(string(v), 64)
			if err != nil || !(x > 0) || math.IsInf(x, 0) {
				return cfg, "", false, bad(k, "%s, want a positive number", v)
			}
			cfg.Alpha = x
		case k == "lora_dropout":
			x, err := strconv.ParseFloat(string(v), 64)
			if err != nil || !(x >= 0 && x < 1) {
				return cfg, "", false, bad(k, "%s, want a number in [0, 1)", v)
			}
			cfg.Dropout = x
		case k == "target_modules":
			var list []string
			if err := json.Unmarshal(v, &list); err != nil || list == nil {
				var s string
				if json.Unmarshal(v, &s) == nil {
					return cfg, "", false, bad(k, "%s is a regular expression (or PEFT's \"all-linear\"); name the modules in a list", v)
				}
				return cfg, "", false, bad(k, "%s, want a list of module names", v)
			}
			if len(list) == 0 {
				return cfg, "", false, bad(k, "empty, want the names of the modules to adapt")
			}
			for _, t := range list {
				if t == "" {
					return cfg, "", false, bad(k, "an empty module name")
				}
			}
			cfg.Targets = list
			sawTargets = true
		case k == "fan_in_fan_out":
			if json.Unmarshal(v, &fanInFanOut) != nil {
				return cfg, "", false, bad(k, "%s, want true or false", v)
			}
		case k == "bias":
			var s string
			if json.Unmarshal(v, &s) != nil || s != "none" {
				return cfg, "", false, bad(k, "%s, want \"none\" (trained biases are not supported)", v)
			}
		case k == "init_lora_weights":
			var b bool
			if json.Unmarshal(v, &b) == nil {
				break
			}
			var s string
			if json.Unmarshal(v, &s) != nil {
				return cfg, "", false, bad(k, "%s, want true, false or an initialisation's name", v)
			}
			switch s {
			case "gaussian", "eva", "orthogonal":
			default:
				// pissa, olora, corda and loftq rewrite the base weights
				// (the adapter only fits the rewritten ones); mica is a
				// variant with its own forward.
				return cfg, "", false, bad(k, "%q changes the base model's weights or the forward; only true, false, \"gaussian\", \"eva\" and \"orthogonal\" are read", s)
			}
		case k == "base_model_name_or_path":
			var s *string
			if json.Unmarshal(v, &s) != nil {
				return cfg, "", false, bad(k, "%s, want a string or null", v)
			}
			if s != nil {
				base = *s
			}
		case ignoredFields[k]:
		case unsetFields[k] != "":
			if !empty(v) {
				return cfg, "", false, bad(k, "%s: %s", clip(v), unsetFields[k])
			}
		case falseFields[k] != "":
			var b *bool
			if json.Unmarshal(v, &b) != nil {
				return cfg, "", false, bad(k, "%s, want true or false", clip(v))
			}
			if b != nil && *b {
				return cfg, "", false, bad(k, "true: %s", falseFields[k])
			}
		default:
			if !empty(v) {
				return cfg, "", false, bad(k, "%s: a field this reader does not know, set; it may change the adapter's meaning", clip(v))
			}
		}
	}
	if !sawPeftType {
		return cfg, "", false, bad("peft_type", "missing, want \"LORA\"")
	}
	if !sawTargets {
		return cfg, "", false, bad("target_modules", "missing or null, want the names of the modules to adapt")
	}
	return cfg, base, fanInFanOut, nil
}

// empty reports whether a JSON value is null, false, "" or an empty list
// or object: what a LoraConfig field holds when unused. Not 0: PEFT reads
// layers_to_transform 0 as "layer 0 only".
func empty(v json.RawMessage) bool {
	switch s := string(bytes.TrimSpace(v)); s {
	case "null", "false", `""`:
		return true
	default:
		var x any
		if json.Unmarshal(v, &x) != nil {
			return false
		}
		switch x := x.(type) {
		case []any:
			return len(x) == 0
		case map[string]any:
			return len(x) == 0
		}
		return false
	}
}

// clip shortens a JSON value for a message.
func clip(v json.RawMessage) string {
	s := string(bytes.TrimSpace(v))
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}

// peftConfig is the adapter_config.json WriteAdapter writes: the fields
// PEFT has written since 0.9 (DoRA's release), in its order (sorted), so
// that every PEFT from then on reads it without a warning about unknown
// fields, with PEFT's value for each field this package does not use.
type peftConfig struct {
	AlphaPattern      struct{}  `json:"alpha_pattern"`
	AutoMapping       *struct{} `json:"auto_mapping"`
	BaseModel         *string   `json:"base_model_name_or_path"`
	Bias              string    `json:"bias"`
	FanInFanOut       bool      `json:"fan_in_fan_out"`
	InferenceMode     bool      `json:"inference_mode"`
	InitLoraWeights   bool      `json:"init_lora_weights"`
	LayersPattern     *string   `json:"layers_pattern"`
	LayersToTransform *[]int    `json:"layers_to_transform"`
	LoraAlpha         pyNumber  `json:"lora_alpha"`
	LoraDropout       pyNumber  `json:"lora_dropout"`
	ModulesToSave     *[]string `json:"modules_to_save"`
	PeftType          string    `json:"peft_type"`
	R                 int       `json:"r"`
	RankPattern       struct{}  `json:"rank_pattern"`
	Revision          *string   `json:"revision"`
	TargetModules     []string  `json:"target_modules"`
	TaskType          string    `json:"task_type"`
	UseDora           bool      `json:"use_dora"`
	UseRslora         bool      `json:"use_rslora"`
}

// pyNumber is a number as Python's json writes it: an integral alpha as
// an int (as PEFT keeps the user's int), anything else as a float's repr
// (0.0, not 0, for a dropout). Go's shortest float64 digits are Python's.
type pyNumber struct {
	v       float64
	integer bool // write an integral v without a point
}

func (p pyNumber) MarshalJSON() ([]byte, error) {
	if math.IsNaN(p.v) || math.IsInf(p.v, 0) {
		return nil, fmt.Errorf("%v is not a JSON number", p.v)
	}
	if p.integer && p.v == math.Trunc(p.v) && math.Abs(p.v) < 1<<53 {
		return []byte(strconv.FormatInt(int64(p.v), 10)), nil
	}
	s := strconv.FormatFloat(p.v, 'e', -1, 64)
	exp, err := strconv.Atoi(s[strings.IndexByte(s, 'e')+1:])
	if err != nil {
		return nil, err
	}
	// repr writes decimal exponents -4 to 15 positionally.
	if exp >= -4 && exp < 16 {
		s = strconv.FormatFloat(p.v, 'f', -1, 64)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
	}
	return []byte(s), nil
}

// WriteAdapter writes a as a PEFT adapter directory: adapter_config.json
// and adapter_model.safetensors (fp32, PEFT's keys) in dir, created if
// need be. a.Sites must be Sites(idx, a.Cfg) of the model it adapts, so
// that ReadAdapter reads it back. Each file is written to a temp file and
// renamed over the old one (train/atomicfile), the weights first: a crash
// leaves each file whole, old or new, and other files in dir untouched.
// baseModel goes to base_model_name_or_path ("" writes null).
func WriteAdapter(dir string, a *Adapter, baseModel string) error {
	if err := checkAdapter(a); err != nil {
		return fmt.Errorf("lora: write %s: %w", dir, err)
	}
	pc := peftConfig{
		Bias: "none", FanInFanOut: a.Sites[0].FanInFanOut, InferenceMode: true, InitLoraWeights: true,
		LoraAlpha: pyNumber{a.Cfg.Alpha, true}, LoraDropout: pyNumber{a.Cfg.Dropout, false},
		PeftType: "LORA", R: a.Cfg.R, TargetModules: slices.Clone(a.Cfg.Targets), TaskType: "CAUSAL_LM",
	}
	if baseModel != "" {
		pc.BaseModel = &baseModel
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(pc); err != nil {
		return fmt.Errorf("lora: write %s: %s: %w", dir, ConfigFile, err)
	}
	tensors := make([]safetensors.Tensor, 0, 2*len(a.Sites))
	for i, s := range a.Sites {
		tensors = append(tensors,
			safetensors.F32Tensor(KeyA(s), []int{a.Cfg.R, s.M}, a.A[i]),
			safetensors.F32Tensor(KeyB(s), []int{s.N, a.Cfg.R}, a.B[i]))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("lora: write %s: %w", dir, err)
	}
	if err := safetensors.Write(filepath.Join(dir, WeightsFile), tensors, map[string]string{"format": "pt"}); err != nil {
		return fmt.Errorf("lora: write %s: %w", dir, err)
	}
	err := atomicfile.WriteFile(filepath.Join(dir, ConfigFile), 0o644, func(w io.Writer) error {
		_, err := w.Write(buf.Bytes())
		return err
	})
	if err != nil {
		return fmt.Errorf("lora: write %s: %w", dir, err)
	}
	return nil
}

// checkAdapter checks that a is whole and that ReadAdapter will read what
// WriteAdapter writes of it.
func checkAdapter(a *Adapter) error {
	if a == nil {
		return errors.New("nil adapter")
	}
	if err := a.Cfg.Validate(); err != nil {
		return err
	}
	if len(a.Cfg.Targets) == 0 {
		return errors.New("no target modules")
	}
	if len(a.Sites) == 0 || len(a.A) != len(a.Sites) || len(a.B) != len(a.Sites) {
		return fmt.Errorf("%d sites, %d A and %d B matrices, want as many, at least one", len(a.Sites), len(a.A), len(a.B))
	}
	r := a.Cfg.R
	seen := map[string]bool{}
	for i, s := range a.Sites {
		switch {
		case s.FanInFanOut != a.Sites[0].FanInFanOut:
			return fmt.Errorf("site %s: fan_in_fan_out %t, site %s has %t", s.Module, s.FanInFanOut, a.Sites[0].Module, a.Sites[0].FanInFanOut)
		case seen[s.Module]:
			return fmt.Errorf("site %s listed twice", s.Module)
		case len(a.A[i]) != r*s.M:
			return fmt.Errorf("site %s: A has %d elements, want %d x %d", s.Module, len(a.A[i]), r, s.M)
		case len(a.B[i]) != s.N*r:
			return fmt.Errorf("site %s: B has %d elements, want %d x %d", s.Module, len(a.B[i]), s.N, r)
		}
		seen[s.Module] = true
		for _, v := range [][]float32{a.A[i], a.B[i]} {
			for j, x := range v {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					return fmt.Errorf("site %s: element %d is %v (ReadAdapter refuses it)", s.Module, j, x)
				}
			}
		}
	}
	return nil
}
