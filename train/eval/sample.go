// Sampling from a model, for the sample command: find the Hugging Face
// directory, check the options (naming their flags), open the backend,
// generate with the KV cache (or without, for comparisons), time it.

package eval

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/chattmpl"
	"github.com/lsp-offload/lsp-offload/train/checkpoint"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/device"
	"github.com/lsp-offload/lsp-offload/train/flagerr"
	"github.com/lsp-offload/lsp-offload/train/llama2c"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// SampleOptions configure Sample.
type SampleOptions struct {
	// Model is a Hugging Face directory, a training output directory
	// (its hf/ export, or without one its checkpoint), or a checkpoint
	// file.
	Model     string
	Tokenizer string // --tokenizer: instead of the model directory's (see catalog.Tokenizer)
	Prompt    string
	Alpaca    bool   // wrap Prompt in the Alpaca template
	Adapter   string // a PEFT LoRA adapter directory merged into Model's weights
	// Chat renders Prompt as one user turn with the generation prompt,
	// as training renders conversations (data.ChatPrompt): with
	// ChatTemplate (a file) when not "", else the chat_template beside
	// the tokenizer's files, else the fixed format.
	Chat              bool
	ChatTemplate      string
	MaxNew            int
	Temperature       float64
	TopK              int
	TopP              float64
	RepetitionPenalty float64 // 0 or 1: none
	Seed              uint64
	NoCache           bool        // generate without the KV cache (the reference path)
	Device            device.Kind // "": cpu
	Threads           int
}

// SampleResult is what Sample generated.
type SampleResult struct {
	Text         string
	IDs          []int32 // the new tokens, without the prompt and the stop id
	PromptTokens int
	Elapsed      time.Duration // the generation (prompt and new tokens), not the loading
}

// TokensPerSecond is the new tokens per second of generation.
func (r SampleResult) TokensPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(len(r.IDs)) / r.Elapsed.Seconds()
}

var flagErr = flagerr.New

// Sample loads a model and continues the prompt.
func Sample(o SampleOptions) (SampleResult, error) {
	var res SampleResult
	switch {
	case o.TopP < 0 || o.TopP > 1:
		return res, flagErr("top-p", "must be in (0, 1], got %g", o.TopP)
	case o.Temperature < 0:
		return res, flagErr("temperature", "must be >= 0, got %g", o.Temperature)
	case o.TopK < 0:
		return res, flagErr("top-k", "must be >= 0, got %d", o.TopK)
	case o.RepetitionPenalty < 0:
		return res, flagErr("repetition-penalty", "must be > 0, got %g", o.RepetitionPenalty)
	case o.Chat && o.Alpaca:
		return res, flagErr("chat", "contradicts --alpaca: give one template")
	case o.ChatTemplate != "" && !o.Chat:
		return res, flagErr("chat-template", "renders --chat prompts: give --chat too")
	}
	kind := o.Device
	if kind == "" {
		kind = device.CPU
	}
	if err := device.Check(kind); err != nil {
		return res, flagErr("device", "%v", err)
	}
	src, err := loadSampleModel(o.Model)
	if err != nil {
		return res, err
	}
	spec := src.spec
	if o.Adapter != "" {
		idx, err := model.NewIndex(spec)
		if err != nil {
			return res, err
		}
		ad, err := lora.ReadAdapter(o.Adapter, idx)
		if err != nil {
			return res, flagErr("adapter", "%v", err)
		}
		if err := lora.MergeAll(src.vals, idx, ad); err != nil {
			return res, flagErr("adapter", "%v", err)
		}
	}
	override := o.Tokenizer
	if override == "" {
		override = src.tokenizer
	}
	tok, err := catalog.Tokenizer(spec, src.dir, override)
	switch {
	case err != nil && o.Tokenizer != "":
		return res, flagErr("tokenizer", "%v", err)
	case err != nil && override != "":
		return res, flagErr("model", "the tokenizer the checkpoint was trained with (--tokenizer %s): %v; give --tokenizer", override, err)
	case err != nil:
		return res, flagErr("model", "%v", err)
	}
	prompt := o.Prompt
	if o.Alpaca {
		prompt = data.AlpacaPrompt(o.Prompt, "")
	}
	ids := append(tokenizer.Prefix(tok), tok.Encode(prompt)...)
	if o.Chat {
		tm, err := chattmpl.Load(tokenizer.Dir(tok), o.ChatTemplate)
		if err != nil {
			if o.ChatTemplate != "" {
				return res, flagErr("chat-template", "%s", strings.TrimPrefix(err.Error(), "chat template: "))
			}
			return res, flagErr("chat", "%v", err)
		}
		if ids, err = data.ChatPrompt(o.Prompt, tok, tm); err != nil {
			return res, flagErr("chat", "%v", err)
		}
	}
	be, err := device.Open(device.Config{Kind: kind, Threads: o.Threads})
	if err != nil {
		return res, fmt.Errorf("sample: %w", err)
	}
	defer be.Close()
	s := be.DefaultStream()
	T := spec.MaxSeqLen()
	// With the cache the model's own batch buffers are never used: one
	// position keeps them small.
	B, MT := 1, 1
	if o.NoCache {
		MT = T
	}
	mm, err := spec.NewModel(be, B, MT, kind.DefaultDType(), model.Options{})
	if err != nil {
		return res, err
	}
	defer mm.Free()
	m := Model{Model: mm, Spec: spec, B: B, T: MT}
	if err := backend.Upload(be, s, m.Buffers().Params, src.vals); err != nil {
		return res, err
	}
	if len(ids) >= T {
		return res, flagErr("prompt", "%d tokens, the model context is %d", len(ids), T)
	}
	res.PromptTokens = len(ids)
	smp := NewSampler(o.Temperature, o.TopP, o.Seed)
	smp.TopK, smp.RepetitionPenalty = o.TopK, o.RepetitionPenalty
	maxNew := max(o.MaxNew, 1)
	start := time.Now()
	if o.NoCache {
		out, err := Generate(be, s, m, [][]int32{ids}, maxNew, tokenizer.StopIDs(tok), smp)
		if err != nil {
			return res, fmt.Errorf("sample: %w", err)
		}
		res.IDs = out[0]
	} else {
		c, ok := mm.(model.Cached)
		if !ok {
			return res, flagErr("no-cache", "the %s model has no KV-cache decoder; pass --no-cache", spec.Family())
		}
		// The cache holds what this call can reach, not the whole context
		// (8192 positions of a Llama 3 are gigabytes).
		dec, err := c.NewDecoder(min(T, max(len(ids), 1)+maxNew)) // an empty prompt becomes EOS
		if err != nil {
			return res, fmt.Errorf("sample: %w", err)
		}
		defer dec.Free()
		g, err := NewGenerator(be, s, dec)
		if err != nil {
			return res, fmt.Errorf("sample: %w", err)
		}
		defer g.Close()
		if res.IDs, err = g.Generate(ids, maxNew, tokenizer.StopIDs(tok), smp); err != nil {
			return res, fmt.Errorf("sample: %w", err)
		}
	}
	res.Elapsed = time.Since(start)
	res.Text = tok.Decode(res.IDs)
	return res, nil
}

// sampleSource is the model Sample continues from: its spec and
// parameters, where its tokenizer is looked for (catalog.Tokenizer's src),
// and the --tokenizer a training checkpoint records it was trained with
// ("" when none was given).
type sampleSource struct {
	dir       string
	spec      model.Spec
	vals      []float32
	tokenizer string
}

// loadSampleModel finds the weights path names, trying in order a
// llama2.c model file, a checkpoint file, a Hugging Face directory, a
// training output directory's hf/ export, then its checkpoint. The
// tokenizer of a checkpoint is the one its run trained with: the
// --tokenizer it records, else the tokenizer of the --model it records
// (when that still resolves to the same architecture), else the files
// of the checkpoint's directory.
func loadSampleModel(path string) (sampleSource, error) {
	fromHF := func(dir string) (sampleSource, error) {
		spec, vals, err := catalog.Load(dir)
		if err != nil {
			return sampleSource{}, flagErr("model", "%v", err)
		}
		return sampleSource{dir: dir, spec: spec, vals: vals}, nil
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	ckpt := path
	switch info, statErr := os.Stat(path); {
	case statErr == nil && !info.IsDir() && llama2c.IsModel(path):
		spec, src, err := catalog.Resolve(path)
		if err != nil {
			return sampleSource{}, flagErr("model", "%v", err)
		}
		vals, err := catalog.LoadWeights(spec, src)
		if err != nil {
			return sampleSource{}, flagErr("model", "%v", err)
		}
		return sampleSource{dir: src, spec: spec, vals: vals}, nil
	case statErr == nil && !info.IsDir() && !isSafetensors(path):
		// Not a checkpoint: read as training reads --model's file (a
		// llama2.c .bin), so that a truncated or version-1 export gets
		// the same error, not a bad safetensors header.
		if _, _, err := catalog.Resolve(path); err != nil {
			return sampleSource{}, flagErr("model", "%v", err)
		}
		return sampleSource{}, flagErr("model", "%s is neither a checkpoint nor a llama2.c model", path)
	case statErr == nil && !info.IsDir():
		// A checkpoint file.
	case exists(filepath.Join(path, "config.json")):
		return fromHF(path)
	case exists(filepath.Join(path, "hf", "config.json")):
		return fromHF(filepath.Join(path, "hf"))
	case exists(filepath.Join(path, checkpoint.FileName)):
		ckpt = filepath.Join(path, checkpoint.FileName)
	default:
		return sampleSource{}, flagErr("model", "%s holds no config.json, hf/config.json or %s", path, checkpoint.FileName)
	}
	f, err := safetensors.Open(ckpt)
	if err != nil {
		return sampleSource{}, flagErr("model", "%v", err)
	}
	st, err := checkpoint.ReadState(f)
	if err != nil {
		return sampleSource{}, flagErr("model", "%v", err)
	}
	// Load verifies the checksums and that every value is finite.
	ck, err := checkpoint.Load(ckpt, st.Model, nil)
	if err != nil {
		return sampleSource{}, flagErr("model", "%v", err)
	}
	vals, err := ck.Params()
	ck.Close()
	if err != nil {
		return sampleSource{}, flagErr("model", "%v", err)
	}
	src := sampleSource{dir: filepath.Dir(ckpt), spec: st.Model, vals: vals, tokenizer: st.Settings["tokenizer"]}
	if m := st.Settings["model"]; src.tokenizer == "" && m != "" {
		if spec, dir, err := catalog.Resolve(m); err == nil && dir != "" && catalog.Equal(spec, st.Model) {
			src.dir = dir
		}
	}
	return src, nil
}

// isSafetensors says whether the file at path starts as a safetensors
// file does: an 8-byte header length, then the header's JSON object.
func isSafetensors(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return true // let the checkpoint reader report it
	}
	defer f.Close()
	var head [9]byte
	if _, err := io.ReadFull(f, head[:]); err != nil {
		return false
	}
	return head[8] == '{'
}
