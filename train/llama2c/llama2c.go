// Package llama2c reads the model files of Karpathy's llama2.c (run.c's
// .bin, the legacy "version 0" layout that its export.py writes by
// default and that the stories15M/42M/110M and stories260K models come
// in) as a train/llama model.
//
// The file is seven int32s (dim, hidden_dim, n_layers, n_heads,
// n_kv_heads, vocab_size, seq_len; a negative vocab_size means the
// classifier is not tied to the embedding), then float32 tensors, each
// kind for every layer in turn: the token embedding, the attention
// RMSNorm weights, wq, wk, wv, wo, the FFN RMSNorm weights, w1 (gate),
// w2 (down), w3 (up), the final RMSNorm weight, two RoPE tables run.c no
// longer reads (skipped here), then the classifier when untied. Matrices
// are PyTorch Linear weights, out x in, row-major.
//
// RoPE: llama2.c rotates adjacent pairs (2i, 2i+1) of each head, Meta's
// layout; transformers' LLaMA, and so train/llama, rotates the halves (i,
// i+hs/2). A .bin written from a Hugging Face model had export.py's
// permute_reverse applied to wq and wk; the loader applies its inverse,
// row 2i+h of each head's block moving to row h*hs/2+i, so the model
// computes what run.c computes. RoPE theta is 10000 and the RMSNorm
// epsilon 1e-5, as run.c has them fixed; BOS is 1 and EOS 2.
//
// Limits: the v1 and v2 (int8) layouts of export.py, with their "ak42"
// magic, are refused with a message saying so. Each streams the weights
// tensor by tensor (the host holds the longest, converted, LoadBytes);
// Load gathers them into one fp32 slice for callers that want them all.
package llama2c

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// Header is a .bin file's seven int32s.
type Header struct {
	Dim, HiddenDim, Layers, Heads, KVHeads, Vocab, SeqLen int32
}

// headerBytes is the size of Header in the file.
const headerBytes = 7 * 4

// magic is the first uint32 of export.py's v1 and v2 files ("ak42").
const magic = 0x616b3432

// Tied reports whether the classifier is the embedding (vocab_size > 0).
func (h Header) Tied() bool { return h.Vocab > 0 }

// Config is the LLaMA architecture of the header: run.c's fixed RoPE
// theta and RMSNorm epsilon, and llama2.c's BOS and EOS ids.
func (h Header) Config() llama.Config {
	v := int(h.Vocab)
	if v < 0 {
		v = -v
	}
	return llama.Config{Vocab: v, Hidden: int(h.Dim), Intermediate: int(h.HiddenDim), NumLayers: int(h.Layers),
		Heads: int(h.Heads), KVHeads: int(h.KVHeads), Eps: 1e-5, RopeTheta: 10000, MaxPos: int(h.SeqLen),
		Tied: h.Tied(), BOS: llama.TokenIDs{1}, EOS: llama.TokenIDs{2}}
}

// fileFloats is the number of float32s after the header: the model's
// parameters and the two RoPE tables.
func fileFloats(c llama.Config) int64 {
	return int64(c.NumParams()) + int64(c.MaxPos)*int64(c.HS())
}

// ReadHeader reads path's header and checks it: a valid architecture,
// and a file of exactly the size the layout gives it.
func ReadHeader(path string) (Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, fmt.Errorf("llama2c: %w", err)
	}
	defer f.Close()
	h, _, err := readHeader(f, path)
	return h, err
}

func readHeader(f *os.File, path string) (Header, llama.Config, error) {
	var h Header
	if err := binary.Read(f, binary.LittleEndian, &h); err != nil {
		return h, llama.Config{}, fmt.Errorf("llama2c: %s: header: %w", path, err)
	}
	if uint32(h.Dim) == magic {
		return h, llama.Config{}, fmt.Errorf("llama2c: %s is a version %d export (export.py --version 1 or 2); only the legacy layout (--version 0) is read", path, h.HiddenDim)
	}
	if h.Vocab == 0 {
		return h, llama.Config{}, fmt.Errorf("llama2c: %s: header: vocab_size is 0", path)
	}
	c := h.Config()
	if err := c.Validate(); err != nil {
		return h, c, fmt.Errorf("llama2c: %s: header %+v: %w", path, h, err)
	}
	st, err := f.Stat()
	if err != nil {
		return h, c, fmt.Errorf("llama2c: %w", err)
	}
	if want := headerBytes + 4*fileFloats(c); st.Size() != want {
		return h, c, fmt.Errorf("llama2c: %s: %d bytes, but the header %+v gives a file of %d", path, st.Size(), h, want)
	}
	return h, c, nil
}

// IsModel reports whether path is a llama2.c model file: a regular file
// with a valid header and the size it gives.
func IsModel(path string) bool {
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() {
		return false
	}
	_, err = ReadHeader(path)
	return err == nil
}

// open opens path and reads and checks its header; the file is then at
// its first tensor.
func open(path string) (*os.File, llama.Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, llama.Config{}, fmt.Errorf("llama2c: %w", err)
	}
	_, c, err := readHeader(f, path)
	if err != nil {
		f.Close()
		return nil, c, err
	}
	return f, c, nil
}

// Load reads path: its architecture and its weights in the layout of
// train/llama (c.Layout() order: matrices in x out, wq and wk in
// transformers' rotate-half order), Each's tensors in one slice. A
// weight that is NaN or infinite is an error naming the tensor and the
// element.
func Load(path string) (llama.Config, []float32, error) {
	f, c, err := open(path)
	if err != nil {
		return c, nil, err
	}
	defer f.Close()
	vals := make([]float32, c.NumParams()) // bounded by the file's size: readHeader checked it
	err = scan(f, c, func(p model.Param, v []float32) error {
		copy(vals[p.Offset:], v)
		return nil
	})
	if err != nil {
		return c, nil, fmt.Errorf("llama2c: %s: %w", path, err)
	}
	return c, vals, nil
}

// Each reads path's weights tensor by tensor, in the file's order, and
// hands each to fn converted to the layout of train/llama (as Load
// does) with its parameter, whose Offset places it in Layout order. v
// is one buffer that the next tensor reuses (fn must not keep it): the
// host holds LoadBytes, not the model. A NaN or infinite weight stops
// it with an error naming the tensor and the element, after fn had the
// tensors before it; Check first where nothing may be written unless
// the whole file is good.
func Each(path string, fn func(p model.Param, v []float32) error) (llama.Config, error) {
	f, c, err := open(path)
	if err != nil {
		return c, err
	}
	defer f.Close()
	if err := scan(f, c, fn); err != nil {
		return c, fmt.Errorf("llama2c: %s: %w", path, err)
	}
	return c, nil
}

// Check reads path through once as Each does, converting and keeping
// nothing: its header, its size and every weight finite. It returns the
// architecture.
func Check(path string) (llama.Config, error) { return Each(path, nil) }

// readChunk is the bytes scan reads at a time (a multiple of 4: no
// float straddles two reads; tests make it tiny to cross every
// boundary).
var readChunk = 1 << 20

// LoadBytes is the host memory Each (and Load beyond its result) holds
// for a file of c: the read chunk and one tensor, the longest, as
// converted. Check holds the read chunk alone.
func LoadBytes(c llama.Config) int64 {
	return int64(readChunk) + 4*int64(model.LongestParam(c.Layout()))
}

func tensorName(name string, l int) string {
	if l < 0 {
		return name
	}
	return fmt.Sprintf("%s[layer %d]", name, l)
}

// rowPerm maps a row of a Meta-layout q or k projection (heads blocks of
// hs rows, pairs interleaved) to its row in transformers' layout.
func rowPerm(row, hs int) int {
	h, r := row/hs, row%hs
	return h*hs + (r%2)*(hs/2) + r/2
}

// tensor is one tensor of the file: the parameter it fills (Name ""
// for the RoPE tables, n floats read past), and whether its rows are
// permuted (wq, wk).
type tensor struct {
	file  string // llama2.c's name
	layer int    // -1: not a layer's
	p     model.Param
	n     int
	perm  bool
}

// fileTensors lists the file's tensors in the file's order.
func fileTensors(c llama.Config) ([]tensor, error) {
	layout := c.Layout()
	byName := make(map[string]model.Param, len(layout))
	for _, p := range layout {
		byName[p.Name] = p
	}
	var ts []tensor
	add := func(file string, l int, name string, perm bool) error {
		p, ok := byName[name]
		if !ok {
			return fmt.Errorf("no parameter %s in the layout", name)
		}
		ts = append(ts, tensor{file: file, layer: l, p: p, n: p.Len(), perm: perm})
		return nil
	}
	if err := add("token_embedding_table", -1, "model.embed_tokens.weight", false); err != nil {
		return nil, err
	}
	sections := []struct {
		file, hf string
		perm     bool
	}{
		{"rms_att_weight", "input_layernorm.weight", false},
		{"wq", "self_attn.q_proj.weight", true},
		{"wk", "self_attn.k_proj.weight", true},
		{"wv", "self_attn.v_proj.weight", false},
		{"wo", "self_attn.o_proj.weight", false},
		{"rms_ffn_weight", "post_attention_layernorm.weight", false},
		{"w1", "mlp.gate_proj.weight", false},
		{"w2", "mlp.down_proj.weight", false},
		{"w3", "mlp.up_proj.weight", false},
	}
	for _, s := range sections {
		for l := range c.NumLayers {
			if err := add(s.file, l, fmt.Sprintf("model.layers.%d.%s", l, s.hf), s.perm); err != nil {
				return nil, err
			}
		}
	}
	if err := add("rms_final_weight", -1, "model.norm.weight", false); err != nil {
		return nil, err
	}
	// The RoPE tables: read past, never used (run.c computes RoPE itself).
	ts = append(ts, tensor{file: "freq_cis", layer: -1, n: c.MaxPos * c.HS()})
	if !c.Tied {
		if err := add("wcls", -1, "lm_head.weight", false); err != nil {
			return nil, err
		}
	}
	return ts, nil
}

// scan reads the tensors after the header from in, in the file's
// order, checking that every weight is finite; with fn it converts each
// into one buffer of the longest parameter (stored out x in, it goes to
// in x out where the layout transposes it, rows permuted for wq and wk)
// and hands it over. It holds one read chunk besides.
func scan(in io.Reader, c llama.Config, fn func(p model.Param, v []float32) error) error {
	ts, err := fileTensors(c)
	if err != nil {
		return err
	}
	raw := make([]byte, readChunk)
	var dst []float32
	if fn != nil {
		dst = make([]float32, model.LongestParam(c.Layout()))
	}
	hs := c.HS()
	for _, t := range ts {
		name := tensorName(t.file, t.layer)
		convert := fn != nil && t.p.Name != ""
		v := dst[:0]
		var rowLen, out int // the stored row's length, the layout's row length
		if convert {
			v = dst[:t.n]
			rowLen, out = t.n, t.n
			if t.p.Transposed {
				rowLen, out = t.p.Shape[0], t.p.Shape[1]
			}
		}
		// row and col are the stored position of element e.
		row, col := 0, 0
		for e0 := 0; e0 < t.n; e0 += readChunk / 4 {
			k := min(readChunk/4, t.n-e0)
			b := raw[:4*k]
			if _, err := io.ReadFull(in, b); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			for i := range k {
				x := math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
				if t.p.Name != "" && (math.IsNaN(float64(x)) || math.IsInf(float64(x), 0)) {
					return fmt.Errorf("%s: element %d is %v", name, e0+i, x)
				}
				if !convert {
					continue
				}
				if !t.p.Transposed {
					v[e0+i] = x
					continue
				}
				to := row
				if t.perm {
					to = rowPerm(row, hs)
				}
				v[col*out+to] = x
				if col++; col == rowLen {
					row, col = row+1, 0
				}
			}
		}
		if convert {
			if err := fn(t.p, v); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	if n, _ := io.Copy(io.Discard, in); n != 0 {
		return errors.New("bytes after the last tensor")
	}
	return nil
}

// ReadConfig reads path's header and returns its architecture.
func ReadConfig(path string) (llama.Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return llama.Config{}, fmt.Errorf("llama2c: %w", err)
	}
	defer f.Close()
	_, c, err := readHeader(f, path)
	return c, err
}
