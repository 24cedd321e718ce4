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
// magic, are refused with a message saying so. The weights are read into
// one fp32 host copy of the model before they go to the device (unlike a
// Hugging Face directory's, which stream), which the llama2.c models, up
// to stories110M's 440 MB, easily afford.
package llama2c

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/lsp-offload/lsp-offload/train/llama"
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

// Load reads path: its architecture and its weights in the layout of
// train/llama (c.Layout() order: matrices in x out, wq and wk in
// transformers' rotate-half order). A weight that is NaN or infinite is
// an error naming the tensor and the element.
func Load(path string) (llama.Config, []float32, error) {
	f, err := os.Open(path)
	if err != nil {
		return llama.Config{}, nil, fmt.Errorf("llama2c: %w", err)
	}
	defer f.Close()
	_, c, err := readHeader(f, path)
	if err != nil {
		return c, nil, err
	}
	vals, err := readWeights(bufio.NewReaderSize(f, 1<<20), c)
	if err != nil {
		return c, nil, fmt.Errorf("llama2c: %s: %w", path, err)
	}
	return c, vals, nil
}

// reader reads the file's tensors in order.
type reader struct {
	r   io.Reader
	buf []byte
	f   []float32
}

// next reads n float32s, checking that each is finite (name and layer l,
// -1 for none, say which tensor in an error).
func (r *reader) next(n int, name string, l int) ([]float32, error) {
	if cap(r.buf) < 4*n {
		r.buf, r.f = make([]byte, 4*n), make([]float32, n)
	}
	b, f := r.buf[:4*n], r.f[:n]
	if _, err := io.ReadFull(r.r, b); err != nil {
		return nil, fmt.Errorf("%s: %w", tensorName(name, l), err)
	}
	for i := range f {
		f[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		if math.IsNaN(float64(f[i])) || math.IsInf(float64(f[i]), 0) {
			return nil, fmt.Errorf("%s: element %d is %v", tensorName(name, l), i, f[i])
		}
	}
	return f, nil
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

func readWeights(in io.Reader, c llama.Config) ([]float32, error) {
	layout := c.Layout()
	byName := make(map[string]int, len(layout))
	for i, p := range layout {
		byName[p.Name] = i
	}
	vals := make([]float32, c.NumParams())
	r := &reader{r: in}
	// copyTo puts a tensor read as stored (out x in) into param name:
	// transposed to in x out when the layout says, rows permuted by perm.
	copyTo := func(name string, src []float32, perm func(int) int) error {
		i, ok := byName[name]
		if !ok {
			return fmt.Errorf("no parameter %s in the layout", name)
		}
		p := layout[i]
		dst := vals[p.Offset : p.Offset+p.Len()]
		if !p.Transposed {
			copy(dst, src)
			return nil
		}
		in, out := p.Shape[0], p.Shape[1]
		for o := range out {
			to := o
			if perm != nil {
				to = perm(o)
			}
			row := src[o*in : (o+1)*in]
			for k, v := range row {
				dst[k*out+to] = v
			}
		}
		return nil
	}
	C, I, L, hs := c.Hidden, c.Intermediate, c.NumLayers, c.HS()
	qw, kw := c.Heads*hs, c.KVHeads*hs
	perm := func(o int) int { return rowPerm(o, hs) }
	emb, err := r.next(c.Vocab*C, "token_embedding_table", -1)
	if err != nil {
		return nil, err
	}
	if err := copyTo("model.embed_tokens.weight", emb, nil); err != nil {
		return nil, err
	}
	sections := []struct {
		file, hf string
		n        int
		perm     func(int) int
	}{
		{"rms_att_weight", "input_layernorm.weight", C, nil},
		{"wq", "self_attn.q_proj.weight", qw * C, perm},
		{"wk", "self_attn.k_proj.weight", kw * C, perm},
		{"wv", "self_attn.v_proj.weight", kw * C, nil},
		{"wo", "self_attn.o_proj.weight", C * qw, nil},
		{"rms_ffn_weight", "post_attention_layernorm.weight", C, nil},
		{"w1", "mlp.gate_proj.weight", I * C, nil},
		{"w2", "mlp.down_proj.weight", C * I, nil},
		{"w3", "mlp.up_proj.weight", I * C, nil},
	}
	for _, s := range sections {
		for l := range L {
			t, err := r.next(s.n, s.file, l)
			if err != nil {
				return nil, err
			}
			if err := copyTo(fmt.Sprintf("model.layers.%d.%s", l, s.hf), t, s.perm); err != nil {
				return nil, err
			}
		}
	}
	norm, err := r.next(C, "rms_final_weight", -1)
	if err != nil {
		return nil, err
	}
	if err := copyTo("model.norm.weight", norm, nil); err != nil {
		return nil, err
	}
	// The RoPE tables: read past, never used (run.c computes RoPE itself).
	if _, err := io.CopyN(io.Discard, in, 4*int64(c.MaxPos)*int64(hs)); err != nil {
		return nil, fmt.Errorf("freq_cis: %w", err)
	}
	if !c.Tied {
		wcls, err := r.next(c.Vocab*C, "wcls", -1)
		if err != nil {
			return nil, err
		}
		if err := copyTo("lm_head.weight", wcls, nil); err != nil {
			return nil, err
		}
	}
	if n, _ := io.Copy(io.Discard, in); n != 0 {
		return nil, errors.New("bytes after the last tensor")
	}
	return vals, nil
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
