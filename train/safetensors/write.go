// write.go: builds tensors from Go slices and writes safetensors files
// atomically.
//
// Limits: the whole header is built in memory; tensor data is streamed from
// the given slices. Tensors are laid out in the order given, back to back.

package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
)

// Tensor is one tensor to write: its bytes are little-endian, row-major, of
// exactly (element size x product of Shape) bytes.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// F32Tensor encodes v as an F32 tensor. A length that does not match shape is
// reported by Write.
func F32Tensor(name string, shape []int, v []float32) Tensor {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return Tensor{Name: name, DType: F32, Shape: slices.Clone(shape), Data: b}
}

// BF16Tensor encodes v (bfloat16 bit patterns) as a BF16 tensor.
func BF16Tensor(name string, shape []int, v []uint16) Tensor {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], x)
	}
	return Tensor{Name: name, DType: BF16, Shape: slices.Clone(shape), Data: b}
}

// I64Tensor encodes v as an I64 tensor.
func I64Tensor(name string, shape []int, v []int64) Tensor {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return Tensor{Name: name, DType: I64, Shape: slices.Clone(shape), Data: b}
}

// Write writes tensors and metadata to path atomically (via atomicfile):
// the data of the tensors in the given order, the JSON header listing
// "__metadata__" first (when non-empty) and then the tensors in that order,
// padded with spaces to a multiple of 8 bytes as Hugging Face does so the
// data section is 8-byte aligned.
func Write(path string, tensors []Tensor, metadata map[string]string) error {
	header, err := buildHeader(tensors, metadata)
	if err != nil {
		return fmt.Errorf("safetensors: %s: %w", path, err)
	}
	err = atomicfile.WriteFile(path, 0o644, func(w io.Writer) error {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(header)))
		if _, err := w.Write(n[:]); err != nil {
			return err
		}
		if _, err := w.Write(header); err != nil {
			return err
		}
		for _, t := range tensors {
			if _, err := w.Write(t.Data); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	return nil
}

// buildHeader validates the tensors and returns the padded JSON header.
func buildHeader(tensors []Tensor, metadata map[string]string) ([]byte, error) {
	var sb strings.Builder
	sb.WriteByte('{')
	first := true
	sep := func() {
		if !first {
			sb.WriteByte(',')
		}
		first = false
	}
	if len(metadata) > 0 {
		m, err := json.Marshal(metadata) // keys sorted: deterministic output
		if err != nil {
			return nil, fmt.Errorf("metadata: %w", err)
		}
		sep()
		sb.WriteString(`"` + metaKey + `":`)
		sb.Write(m)
	}
	seen := map[string]bool{}
	var off int64
	for i, t := range tensors {
		switch {
		case t.Name == "":
			return nil, fmt.Errorf("tensor %d has an empty name", i)
		case t.Name == metaKey:
			return nil, fmt.Errorf("tensor %d: name %q is reserved", i, metaKey)
		case seen[t.Name]:
			return nil, fmt.Errorf("duplicate tensor name %q", t.Name)
		}
		seen[t.Name] = true
		bits, ok := dtypeBits[t.DType]
		if !ok {
			return nil, fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		numel := int64(1)
		for _, d := range t.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %q: negative dimension in shape %v", t.Name, t.Shape)
			}
			numel *= int64(d)
		}
		if numel*bits%8 != 0 || numel*bits/8 != int64(len(t.Data)) {
			return nil, fmt.Errorf("tensor %q: %d bytes of data, but %s %v needs %d bits",
				t.Name, len(t.Data), t.DType, t.Shape, numel*bits)
		}
		name, _ := json.Marshal(t.Name)
		sep()
		sb.Write(name)
		sb.WriteString(`:{"dtype":"` + string(t.DType) + `","shape":` + shapeString(t.Shape) +
			`,"data_offsets":[` + strconv.FormatInt(off, 10) + "," + strconv.FormatInt(off+int64(len(t.Data)), 10) + "]}")
		off += int64(len(t.Data))
	}
	sb.WriteByte('}')
	for sb.Len()%8 != 0 {
		sb.WriteByte(' ')
	}
	return []byte(sb.String()), nil
}
