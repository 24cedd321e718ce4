// Package hf reads and writes Hugging Face model directories for every
// model family of this project: the weights as one model.safetensors or as
// shards listed by model.safetensors.index.json, checked against and
// converted to a family's parameter layout (train/model). config.json is
// each family's own business; this package only moves weights (and copies
// tokenizer files along).
//
// Loading maps the shards (safetensors.OpenMapped), checks every tensor
// (presence, shape, dtype, finite values) before the destination receives
// a byte, then converts tensor by tensor in bounded chunks, handing each
// tensor's pages back once read, so that peak resident memory stays near
// the size of the loaded weights, not twice it. A tensor that no parameter
// reads is refused, naming it (it means the checkpoint holds a different
// model than the layout describes), unless it is a buffer transformers
// recomputes (Harmless: rotary inv_freq, GPT-2's attention masks) or the
// family accepts it (LoadOptions.Extra).
//
// Paths: names of shards come from a file (the index), so each must stay
// inside the directory: no "..", no absolute path, and no symbolic link
// resolving outside it, except into the blobs/ folder of a Hugging Face
// cache (models--org--name/snapshots/<rev>/X links to ../../blobs/<hash>,
// which every download by transformers has). model.safetensors itself is a
// fixed name, not read from a file, and may link anywhere.
//
// Limits: the index is read whole (bounded at maxIndexBytes); shards are
// mapped on Linux and read into memory elsewhere.
package hf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// The file names of a Hugging Face directory.
const (
	SingleFile = "model.safetensors"
	IndexFile  = "model.safetensors.index.json"
)

// maxIndexBytes bounds the index JSON: a real one lists a few thousand
// names (a 70B model's is under 100 KB).
const maxIndexBytes = 64 << 20

// Checkpoint is an opened weights directory: every shard mapped and
// validated, every tensor name indexed to its shard.
type Checkpoint struct {
	Dir   string
	Index string // the index file's path; "" for a single model.safetensors

	files []*safetensors.File // in the order first listed
	where map[string]*safetensors.File
	names []string // sorted
}

// Open opens dir's weights: model.safetensors when present, otherwise the
// shards that model.safetensors.index.json lists. Every error names the
// file and the field at fault.
func Open(dir string) (*Checkpoint, error) {
	single := filepath.Join(dir, SingleFile)
	if _, err := os.Stat(single); err == nil {
		return OpenFile(single)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("hf: %w", err)
	}
	index := filepath.Join(dir, IndexFile)
	raw, err := ReadBounded(index, maxIndexBytes)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("hf: %s: neither %s nor %s", dir, SingleFile, IndexFile)
	}
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	wm, err := ParseIndex(raw)
	if err != nil {
		return nil, fmt.Errorf("hf: %s: %w", index, err)
	}
	c := &Checkpoint{Dir: dir, Index: index, where: map[string]*safetensors.File{}}
	opened := map[string]*safetensors.File{}
	// Shards in a fixed order (sorted file names) so errors are stable.
	shards := make([]string, 0, len(wm))
	for name, s := range wm {
		// One file under two spellings (sub/./b, sub/b) is one shard.
		s = filepath.Clean(s)
		wm[name] = s
		if _, ok := opened[s]; !ok {
			opened[s] = nil
			shards = append(shards, s)
		}
	}
	sort.Strings(shards)
	for _, s := range shards {
		path, err := shardPath(dir, s)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("hf: %s: weight_map: shard %q: %w", index, s, err)
		}
		f, err := safetensors.OpenMapped(path)
		if err != nil {
			c.Close()
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("hf: %s: weight_map: shard %q is missing: %w", index, s, err)
			}
			return nil, fmt.Errorf("hf: %s: weight_map: shard %q: %w", index, s, err)
		}
		opened[s] = f
		c.files = append(c.files, f)
	}
	for _, name := range sortedKeys(wm) {
		f := opened[wm[name]]
		if _, ok := f.Info(name); !ok {
			c.Close()
			return nil, fmt.Errorf("hf: %s: weight_map: tensor %q is mapped to %s, which does not contain it", index, name, f.Path)
		}
		c.where[name] = f
		c.names = append(c.names, name)
	}
	// A tensor in a shard but not in the index is not part of the model
	// as transformers sees it (it loads by the index); a tensor in two
	// shards would be ambiguous.
	for _, f := range c.files {
		for _, n := range f.Names() {
			if g := c.where[n]; g != f {
				c.Close()
				if g == nil {
					return nil, fmt.Errorf("hf: %s: weight_map: tensor %q of %s is not listed", index, n, f.Path)
				}
				return nil, fmt.Errorf("hf: %s: weight_map: tensor %q is in %s and in %s", index, n, f.Path, g.Path)
			}
		}
	}
	sort.Strings(c.names)
	return c, nil
}

// OpenFile opens one safetensors file as a checkpoint.
func OpenFile(path string) (*Checkpoint, error) {
	f, err := safetensors.OpenMapped(path)
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	c := &Checkpoint{Dir: filepath.Dir(path), files: []*safetensors.File{f}, where: map[string]*safetensors.File{}, names: f.Names()}
	for _, n := range c.names {
		c.where[n] = f
	}
	return c, nil
}

// Close unmaps every shard.
func (c *Checkpoint) Close() error {
	var first error
	for _, f := range c.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Names lists every tensor, sorted.
func (c *Checkpoint) Names() []string { return slices.Clone(c.names) }

// Files lists the paths of the weight files, in the order opened.
func (c *Checkpoint) Files() []string {
	out := make([]string, len(c.files))
	for i, f := range c.files {
		out[i] = f.Path
	}
	return out
}

// Info describes the named tensor and names the file holding it.
func (c *Checkpoint) Info(name string) (ti safetensors.TensorInfo, file string, ok bool) {
	f, ok := c.where[name]
	if !ok {
		return safetensors.TensorInfo{}, "", false
	}
	ti, ok = f.Info(name)
	return ti, f.Path, ok
}

// Float32 returns the named tensor widened to float32, as stored (no
// transposition), for small tensors and tests.
func (c *Checkpoint) Float32(name string) ([]float32, []int, error) {
	f, ok := c.where[name]
	if !ok {
		return nil, nil, fmt.Errorf("hf: %s: no tensor %q", c.Dir, name)
	}
	return f.Float32(name)
}

// ParseIndex parses model.safetensors.index.json and returns its
// weight_map (tensor name -> shard file name). The index must be a JSON
// object with a weight_map object of non-empty string values; other keys
// (metadata) are ignored. Shard names are not checked here (Open does,
// against the directory).
func ParseIndex(raw []byte) (map[string]string, error) {
	var top map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&top); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	if top == nil {
		return nil, errors.New("not a JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("not valid JSON: data after the object")
	}
	wmRaw, ok := top["weight_map"]
	if !ok {
		return nil, errors.New("no weight_map")
	}
	var wm map[string]string
	if err := json.Unmarshal(wmRaw, &wm); err != nil {
		return nil, fmt.Errorf("weight_map: not an object of file names: %w", err)
	}
	if wm == nil {
		return nil, errors.New("weight_map is null")
	}
	if len(wm) == 0 {
		return nil, errors.New("weight_map is empty")
	}
	for name, s := range wm {
		if name == "" {
			return nil, errors.New("weight_map: empty tensor name")
		}
		if s == "" {
			return nil, fmt.Errorf("weight_map: tensor %q: empty file name", name)
		}
	}
	return wm, nil
}

// shardPath joins dir and a shard name read from the index, refusing a
// name that leaves dir: not local (absolute, "..", empty), or resolving
// through symbolic links outside dir (except into a Hugging Face cache's
// blobs, see the package comment). A missing file is returned as is, for
// the open to report.
func shardPath(dir, name string) (string, error) {
	if filepath.IsAbs(name) || !filepath.IsLocal(name) {
		return "", errors.New("leaves the model directory (absolute path or ..)")
	}
	path := filepath.Join(dir, name)
	realDir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(path)
	if errors.Is(err, os.ErrNotExist) {
		return path, nil
	}
	if err != nil {
		return "", err
	}
	if within(realDir, real) {
		return path, nil
	}
	// Hugging Face's cache: <repo>/snapshots/<rev>/<file> -> <repo>/blobs/<hash>.
	if filepath.Base(filepath.Dir(realDir)) == "snapshots" {
		blobs := filepath.Join(filepath.Dir(filepath.Dir(realDir)), "blobs")
		if within(blobs, real) {
			return path, nil
		}
	}
	return "", fmt.Errorf("is a symbolic link to %s, outside the model directory", real)
}

// within says whether path is inside dir (both cleaned, absolute or not).
func within(dir, path string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && filepath.IsLocal(rel)
}

// ReadBounded reads a file of at most limit bytes (a JSON file beside
// the weights, which a mistake could make huge).
func ReadBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, limit)
	}
	return b, nil
}

// WeightBytes is the total size of dir's weight files (model.safetensors,
// or the shards its index lists), following symbolic links, for judging
// what a config may claim and planning memory before loading. It checks
// the index and the shard paths as Open does, but reads no shard.
func WeightBytes(dir string) (int64, error) {
	single := filepath.Join(dir, SingleFile)
	st, err := os.Stat(single)
	if err == nil {
		return st.Size(), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("hf: %w", err)
	}
	index := filepath.Join(dir, IndexFile)
	raw, err := ReadBounded(index, maxIndexBytes)
	if errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("hf: %s: neither %s nor %s", dir, SingleFile, IndexFile)
	}
	if err != nil {
		return 0, fmt.Errorf("hf: %w", err)
	}
	wm, err := ParseIndex(raw)
	if err != nil {
		return 0, fmt.Errorf("hf: %s: %w", index, err)
	}
	seen := map[string]bool{} // by path: "sub/../a" and "a" are one shard, as Open counts them
	var total int64
	for _, s := range sortedValues(wm) {
		path, err := shardPath(dir, s)
		if err != nil {
			return 0, fmt.Errorf("hf: %s: weight_map: shard %q: %w", index, s, err)
		}
		if seen[path] {
			continue
		}
		seen[path] = true
		st, err := os.Stat(path)
		if err != nil {
			return 0, fmt.Errorf("hf: %s: weight_map: shard %q: %w", index, s, err)
		}
		total += st.Size()
	}
	return total, nil
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	sort.Strings(out)
	return out
}

// isShardName says whether name is one of save_pretrained's shard names
// (model-00001-of-00003.safetensors), which Export replaces.
func isShardName(name string) bool {
	var i, n int
	rest, ok := strings.CutPrefix(name, "model-")
	if !ok || !strings.HasSuffix(rest, ".safetensors") {
		return false
	}
	_, err := fmt.Sscanf(rest, "%05d-of-%05d.safetensors", &i, &n)
	return err == nil
}
