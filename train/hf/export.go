// export.go: a model's parameters out as a Hugging Face weights directory
// (what transformers' save_pretrained writes): model.safetensors, or
// model-0000i-of-0000N.safetensors shards and model.safetensors.index.json
// when the weights exceed ExportOptions.ShardBytes.
//
// Every file is written to a temp file and renamed (train/atomicfile),
// shards first and the index last; files of an earlier export that the
// new one does not replace (a single file after a sharded export, extra
// shards) are removed after, so that from_pretrained, which prefers
// model.safetensors to an index, reads the new weights.
//
// Limits: parameters stream from the source (ExportFrom's fetch: a device
// tensor, host values) in chunks; a transposed one is written in blocks
// of at most blockElems of its Hugging Face rows, each block one pass
// over the parameter, so host memory stays bounded (ExportBytes:
// blockElems float32 plus a few chunks) whatever the model's size.

package hf

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// DefaultShardBytes is transformers' default max_shard_size ("5GB").
const DefaultShardBytes = 5_000_000_000

// blockElems bounds the host block of a transposed parameter (256 MB of
// float32): one block is a Llama layer's largest matrix in one pass, a
// 128k-vocabulary head in eight.
var blockElems = 64 << 20

// ExportOptions say how to write the weights.
type ExportOptions struct {
	// DType of the written tensors: backend.F32 (the zero value) or
	// backend.BF16 (rounded to nearest even).
	DType backend.DType
	// ShardBytes: weights larger than this are split into shards of at
	// most this many bytes (a tensor larger than it gets a shard of its
	// own), as save_pretrained's max_shard_size. 0: DefaultShardBytes.
	ShardBytes int64
	// Skip leaves parameters out (a head tied to the embedding, which
	// transformers re-ties at load). Nil: none.
	Skip func(p model.Param) bool
	// Metadata of every file; nil: {"format": "pt"}, which transformers
	// expects.
	Metadata map[string]string
}

// Export writes the parameters in src (a backend tensor of layout's
// element count, F32 or BF16), downloaded on stream s of be in chunks
// through its staging buffer, to dir, which is created if needed.
// config.json is the caller's.
func Export(dir string, be backend.Backend, s backend.Stream, src backend.Tensor, layout []model.Param, opt ExportOptions) error {
	n, err := layoutLen(layout)
	if err != nil {
		return err
	}
	if src.Len() != n {
		return fmt.Errorf("hf: export to %s from %v: %d elements, the layout has %d", dir, src, src.Len(), n)
	}
	return ExportFrom(dir, layout, opt, FetchTensor(be, s, src))
}

// ExportFloat32 is Export from host values in layout order.
func ExportFloat32(dir string, vals []float32, layout []model.Param, opt ExportOptions) error {
	n, err := layoutLen(layout)
	if err != nil {
		return err
	}
	if len(vals) != n {
		return fmt.Errorf("hf: export to %s: %d values, the layout has %d", dir, len(vals), n)
	}
	return ExportFrom(dir, layout, opt, FetchFloat32(vals))
}

// Fetch fills dst with the parameter elements [off, off+len(dst)) of
// layout order: the source an export streams from, a chunk at a time.
type Fetch = func(off int, dst []float32) error

// FetchTensor fetches from src (F32 or BF16) on stream s of be, through
// its staging buffer: no host copy of the tensor.
func FetchTensor(be backend.Backend, s backend.Stream, src backend.Tensor) Fetch {
	st := be.Staging()
	return func(off int, dst []float32) error {
		return st.DownloadInto(s, dst, src.Slice(off, len(dst)))
	}
}

// FetchFloat32 fetches from host values.
func FetchFloat32(vals []float32) Fetch {
	return func(off int, dst []float32) error {
		if off < 0 || off+len(dst) > len(vals) {
			return fmt.Errorf("hf: elements [%d, %d) of %d values", off, off+len(dst), len(vals))
		}
		copy(dst, vals[off:])
		return nil
	}
}

// ExportFrom is Export from any source of the parameters' values:
// fetch is asked for chunks of them, parameter by parameter, and the
// host holds the writer's buffers (ExportBytes), never the model.
func ExportFrom(dir string, layout []model.Param, opt ExportOptions, fetch Fetch) error {
	if _, err := layoutLen(layout); err != nil {
		return err
	}
	return export(dir, layout, opt, fetch)
}

// ExportBytes is the most host memory ExportFrom's writer holds for
// layout: its fetch buffer (a chunk, or the rows of a transposed
// parameter that make one), the block of a transposed parameter's
// Hugging Face rows (up to blockElems), the encoded chunk and the file's
// write buffer. A fetch's own memory (the backend's staging) is not
// counted.
func ExportBytes(layout []model.Param, opt ExportOptions) int64 {
	var vals, block, emit int
	for _, p := range layout {
		if opt.Skip != nil && opt.Skip(p) {
			continue
		}
		n := p.Len()
		if !p.Transposed {
			vals = max(vals, min(n, chunkElems))
			emit = max(emit, min(n, chunkElems))
			continue
		}
		in, cols := p.Shape[0], p.Shape[1]
		k := transposeBlockRows(in, cols)
		vals = max(vals, transposeFetchRows(in, cols)*cols)
		block = max(block, k*in)
		emit = max(emit, min(k*in, chunkElems))
	}
	return 4*int64(vals+block) + int64(opt.DType.Size())*int64(emit) + atomicfile.BufferBytes
}

// transposeBlockRows is the Hugging Face rows of a transposed parameter
// (ours in x cols) that one block holds: as many as blockElems allows,
// at least one.
func transposeBlockRows(in, cols int) int { return max(1, min(cols, blockElems/max(1, in))) }

// transposeFetchRows is the rows of ours that one fetch of a transposed
// parameter reads: a chunk's worth, at least one.
func transposeFetchRows(in, cols int) int { return min(in, max(1, chunkElems/max(1, cols))) }

// shard is one output file and the layout indices it holds.
type shard struct {
	name   string
	params []int
}

// planShards groups the written parameters into shards in layout order,
// greedily, as save_pretrained does.
func planShards(layout []model.Param, write []int, es, limit int64) []shard {
	var out []shard
	var cur []int
	var size int64
	for _, i := range write {
		b := int64(layout[i].Len()) * es
		if len(cur) > 0 && size+b > limit {
			out = append(out, shard{params: cur})
			cur, size = nil, 0
		}
		cur = append(cur, i)
		size += b
	}
	if len(cur) > 0 || len(out) == 0 {
		out = append(out, shard{params: cur})
	}
	if len(out) == 1 {
		out[0].name = SingleFile
		return out
	}
	for k := range out {
		out[k].name = fmt.Sprintf("model-%05d-of-%05d.safetensors", k+1, len(out))
	}
	return out
}

func export(dir string, layout []model.Param, opt ExportOptions, fetch func(off int, dst []float32) error) error {
	var dt safetensors.DType
	switch opt.DType {
	case backend.F32:
		dt = safetensors.F32
	case backend.BF16:
		dt = safetensors.BF16
	default:
		return fmt.Errorf("hf: export to %s: dtype %v, want F32 or BF16", dir, opt.DType)
	}
	es := int64(opt.DType.Size())
	limit := opt.ShardBytes
	if limit <= 0 {
		limit = DefaultShardBytes
	}
	meta := opt.Metadata
	if meta == nil {
		meta = map[string]string{"format": "pt"}
	}
	var write []int
	for i, p := range layout {
		if opt.Skip == nil || !opt.Skip(p) {
			write = append(write, i)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("hf: export: %w", err)
	}
	shards := planShards(layout, write, es, limit)
	w := &paramWriter{dt: dt, fetch: fetch}
	weightMap := map[string]string{}
	var total int64
	for _, sh := range shards {
		specs := make([]safetensors.Spec, len(sh.params))
		for k, i := range sh.params {
			p := layout[i]
			specs[k] = safetensors.Spec{Name: p.Name, DType: dt, Shape: hfShape(p)}
			weightMap[p.Name] = sh.name
			total += int64(p.Len()) * es
		}
		path := filepath.Join(dir, sh.name)
		err := safetensors.WriteStream(path, specs, meta, func(k int, out io.Writer) error {
			return w.write(out, layout[sh.params[k]])
		})
		if err != nil {
			return fmt.Errorf("hf: export: %w", err)
		}
	}
	if len(shards) > 1 {
		idx := struct {
			Metadata  map[string]int64  `json:"metadata"`
			WeightMap map[string]string `json:"weight_map"`
		}{map[string]int64{"total_size": total}, weightMap}
		raw, err := json.MarshalIndent(idx, "", "  ")
		if err != nil {
			return fmt.Errorf("hf: export: %w", err)
		}
		err = atomicfile.WriteFile(filepath.Join(dir, IndexFile), 0o644, func(w io.Writer) error {
			_, err := w.Write(append(raw, '\n'))
			return err
		})
		if err != nil {
			return fmt.Errorf("hf: export: %w", err)
		}
	}
	return removeStale(dir, shards)
}

// removeStale removes weight files of an earlier export that shards do not
// replace.
func removeStale(dir string, shards []shard) error {
	keep := map[string]bool{}
	for _, sh := range shards {
		keep[sh.name] = true
	}
	if len(shards) > 1 {
		keep[IndexFile] = true
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("hf: export: %w", err)
	}
	for _, e := range ents {
		n := e.Name()
		if keep[n] || !(n == SingleFile || n == IndexFile || isShardName(n)) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, n)); err != nil {
			return fmt.Errorf("hf: export: removing the stale %w", err)
		}
	}
	return nil
}

// paramWriter encodes parameters, keeping its buffers between them.
type paramWriter struct {
	dt    safetensors.DType
	fetch func(off int, dst []float32) error
	vals  []float32
	block []float32
	bytes []byte
}

// write writes p in the Hugging Face layout and the output dtype.
func (w *paramWriter) write(out io.Writer, p model.Param) error {
	n := p.Len()
	if !p.Transposed {
		if len(w.vals) < min(n, chunkElems) {
			w.vals = make([]float32, min(n, chunkElems))
		}
		for off := 0; off < n; off += chunkElems {
			v := w.vals[:min(chunkElems, n-off)]
			if err := w.fetch(p.Offset+off, v); err != nil {
				return err
			}
			if err := w.emit(out, v); err != nil {
				return err
			}
		}
		return nil
	}
	// Ours is in x out; the file's row j is our column j. Each block of
	// file rows [j0, j0+k) is one pass over our rows.
	in, cols := p.Shape[0], p.Shape[1]
	k := transposeBlockRows(in, cols)
	if len(w.block) < k*in {
		w.block = make([]float32, k*in)
	}
	rows := transposeFetchRows(in, cols)
	if len(w.vals) < rows*cols {
		w.vals = make([]float32, rows*cols)
	}
	for j0 := 0; j0 < cols; j0 += k {
		kk := min(k, cols-j0)
		blk := w.block[:kk*in]
		for i0 := 0; i0 < in; i0 += rows {
			r := min(rows, in-i0)
			v := w.vals[:r*cols]
			if err := w.fetch(p.Offset+i0*cols, v); err != nil {
				return err
			}
			for i := range r {
				row := v[i*cols+j0 : i*cols+j0+kk]
				for j, x := range row {
					blk[j*in+i0+i] = x
				}
			}
		}
		for off := 0; off < len(blk); off += chunkElems {
			if err := w.emit(out, blk[off:min(len(blk), off+chunkElems)]); err != nil {
				return err
			}
		}
	}
	return nil
}

// emit encodes v in the output dtype and writes it.
func (w *paramWriter) emit(out io.Writer, v []float32) error {
	es := 4
	if w.dt == safetensors.BF16 {
		es = 2
	}
	if cap(w.bytes) < es*len(v) {
		w.bytes = make([]byte, es*len(v))
	}
	b := w.bytes[:es*len(v)]
	if w.dt == safetensors.BF16 {
		for i, x := range v {
			binary.LittleEndian.PutUint16(b[2*i:], bf16.FromFloat32(x))
		}
	} else {
		for i, x := range v {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		}
	}
	_, err := out.Write(b)
	return err
}

// TokenizerFiles are the files besides the weights and config.json that
// make a directory usable by transformers' AutoTokenizer and generate().
var TokenizerFiles = []string{
	"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
	"added_tokens.json", "vocab.json", "merges.txt", "generation_config.json",
}

// CopyTokenizerFiles copies those of TokenizerFiles that src has into dst
// (each atomically, following symbolic links) and returns their names.
func CopyTokenizerFiles(src, dst string) ([]string, error) {
	var copied []string
	for _, name := range TokenizerFiles {
		in, err := os.Open(filepath.Join(src, name))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return copied, fmt.Errorf("hf: tokenizer files: %w", err)
		}
		err = atomicfile.WriteFile(filepath.Join(dst, name), 0o644, func(w io.Writer) error {
			_, err := io.Copy(w, in)
			return err
		})
		in.Close()
		if err != nil {
			return copied, fmt.Errorf("hf: tokenizer files: copying %s: %w", filepath.Join(src, name), err)
		}
		copied = append(copied, name)
	}
	return copied, nil
}
