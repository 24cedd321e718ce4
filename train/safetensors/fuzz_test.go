// Fuzzing of Open, the parser of files users download: every input either
// loads and round-trips through Write, or is refused with an error that
// names the file; and whatever the header claims, parsing allocates no more
// than a small multiple of the file's real size. The seeds (below and in
// testdata/fuzz/FuzzOpen) run in every `go test`; `make fuzz` mutates them.

package safetensors

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/internal/alloc"
)

// allocSlack is the fixed part of the allocation bound: the test's own
// bookkeeping (MemStats, error strings, a temp path) and small maps.
const allocSlack = 1 << 20

// allocPerByte is the variable part: bytes allocated per byte of input,
// conversions of every tensor included. The file is read once (1x) and each
// tensor widened at most once (2x for BF16/F16); a header can cost more per
// byte than that: measured 40x for one tensor of rank 50,000 written as
// "shape":[0,0,...] (2 bytes of JSON per dimension decode to 8-byte ints,
// and each Info call copies the shape), 9x for 5,000 empty tensors, under 3x
// for the GPT-2 fixture. What matters is that it is a constant.
const allocPerByte = 128

// seedFiles are hand-made files, good and bad: one per rule of the format.
func seedFiles() [][]byte {
	f32 := make([]byte, 8)
	return [][]byte{
		nil,
		{1, 2, 3},
		mkFile(`{}`, nil),
		mkFile(`{"__metadata__":{"format":"pt"}}`, nil),
		mkFile(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}       `, f32),
		mkFile(`{"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"BF16","shape":[0,3],"data_offsets":[4,4]}}`, f32[:4]),
		mkFile(`{"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"i":{"dtype":"I64","shape":[1],"data_offsets":[4,12]},"j":{"dtype":"I32","shape":[1],"data_offsets":[12,16]}}`, make([]byte, 16)),
		mkFile(`{"b":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]},"u":{"dtype":"U8","shape":[1],"data_offsets":[3,4]},"f4":{"dtype":"F4","shape":[2,2],"data_offsets":[4,6]}}`, make([]byte, 6)),
		mkFile(`{"f6":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]},"c":{"dtype":"C64","shape":[1],"data_offsets":[3,11]}}`, make([]byte, 11)),
		mkFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, make([]byte, 12)),
		mkFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32),
		mkFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32),
		mkFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, make([]byte, 16)),
		// A header claiming a petabyte tensor in a file of a few bytes.
		mkFile(`{"w":{"dtype":"F32","shape":[250000000000000],"data_offsets":[0,1000000000000000]}}`, f32),
		mkFile(`{"w":{"dtype":"F64","shape":[9223372036854775807],"data_offsets":[0,9223372036854775807]}}`, f32),
		mkFile(`{"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, f32),
		mkFile(`{"w":{"dtype":"U8","shape":[0,9223372036854775807,9223372036854775807],"data_offsets":[0,0]}}`, nil),
		mkFile(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551615,4]}}`, f32),
		mkFile(`{"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, f32),
		mkFile(`{"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}}`, f32),
		mkFile(`{"w":null}`, nil),
		mkFile(`{"__metadata__":{"k":"v","k":"w"}}`, nil),
		mkFile(`{"__metadata__":[1]}`, nil),
		mkFile(`{"\u00e9\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{1}),
		mkFile("{\"\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"\xfe\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", []byte{1, 2}),
		func() []byte { // a header length beyond the file
			b := mkFile(`{}`, nil)
			binary.LittleEndian.PutUint64(b, 1<<62)
			return b
		}(),
	}
}

func FuzzOpen(f *testing.F) {
	for _, b := range seedFiles() {
		f.Add(b)
	}
	// The header of the PyTorch-written GPT-2 fixture alone: real
	// formatting, padding and key order. The whole file (half a megabyte)
	// would slow the fuzzer's mutation and minimization to a crawl, so
	// TestFixtureProperties checks the same properties on it instead.
	real := readFixture(f)
	f.Add(real[:8+binary.LittleEndian.Uint64(real)])
	f.Fuzz(checkOpen)
}

func readFixture(tb testing.TB) []byte {
	b, err := os.ReadFile(filepath.Join("..", "testdata", "gpt2-tiny", "model.safetensors"))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestFixtureProperties runs FuzzOpen's checks on the whole GPT-2 fixture.
func TestFixtureProperties(t *testing.T) { checkOpen(t, readFixture(t)) }

// checkOpen is the property FuzzOpen checks on each input.
func checkOpen(t *testing.T, data []byte) {
	dir := t.TempDir()
	path := filepath.Join(dir, "in.safetensors")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	var file *File
	var openErr error
	used := alloc.Bytes(func() {
		file, openErr = Open(path)
		if openErr == nil {
			convertAll(t, file)
		}
	})
	if limit := allocPerByte*uint64(len(data)) + allocSlack; used > limit {
		t.Fatalf("a %d-byte file allocated %d bytes (limit %d); err = %v", len(data), used, limit, openErr)
	}
	// OpenMapped parses the same bytes from a mapping: the same verdict,
	// the same tensors, and its header parse allocates no more.
	var mapped *File
	var mapErr error
	used = alloc.Bytes(func() { mapped, mapErr = OpenMapped(path) })
	if limit := allocPerByte*uint64(len(data)) + allocSlack; used > limit {
		t.Fatalf("OpenMapped of a %d-byte file allocated %d bytes (limit %d); err = %v", len(data), used, limit, mapErr)
	}
	if (mapErr == nil) != (openErr == nil) {
		t.Fatalf("Open says %v, OpenMapped says %v", openErr, mapErr)
	}
	if mapped != nil {
		for _, n := range file.Names() {
			a, ti, _ := file.Raw(n)
			b, tj, _ := mapped.Raw(n)
			if !bytes.Equal(a, b) || !reflect.DeepEqual(ti, tj) {
				t.Fatalf("tensor %q: OpenMapped reads differently from Open", n)
			}
		}
		if err := mapped.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if openErr != nil {
		if !strings.Contains(openErr.Error(), path) {
			t.Fatalf("error %q does not name the file %s", openErr, path)
		}
		return
	}
	roundTrip(t, file, filepath.Join(dir, "out.safetensors"))
}

// convertAll converts every tensor whose dtype has a conversion and checks
// that the others are refused, naming the file.
func convertAll(t *testing.T, f *File) {
	for _, name := range f.Names() {
		ti, _ := f.Info(name)
		v, shape, err := f.Float32(name)
		switch ti.DType {
		case F32, BF16, F16:
			if err != nil || int64(len(v)) != ti.NumElements() || !slices.Equal(shape, ti.Shape) {
				t.Fatalf("Float32(%q) of %s %v: %d values, shape %v, err %v", name, ti.DType, ti.Shape, len(v), shape, err)
			}
		default:
			if err == nil || !strings.Contains(err.Error(), f.Path) {
				t.Fatalf("Float32(%q) of %s: err = %v, want one naming %s", name, ti.DType, err, f.Path)
			}
		}
		iv, shape, err := f.Int64(name)
		switch ti.DType {
		case I64, I32:
			if err != nil || int64(len(iv)) != ti.NumElements() || !slices.Equal(shape, ti.Shape) {
				t.Fatalf("Int64(%q) of %s %v: %d values, shape %v, err %v", name, ti.DType, ti.Shape, len(iv), shape, err)
			}
		default:
			if err == nil || !strings.Contains(err.Error(), f.Path) {
				t.Fatalf("Int64(%q) of %s: err = %v, want one naming %s", name, ti.DType, err, f.Path)
			}
		}
	}
}

// roundTrip writes f back in its data order and checks that the copy holds
// the same tensors (names, dtypes, shapes, offsets, bytes) and metadata, and
// that writing the copy again gives the same bytes.
func roundTrip(t *testing.T, f *File, out string) {
	names := f.Names()
	infos := make([]TensorInfo, len(names))
	for i, n := range names {
		infos[i], _ = f.Info(n)
	}
	slices.SortStableFunc(infos, func(a, b TensorInfo) int {
		if a.Begin != b.Begin {
			return cmpInt64(a.Begin, b.Begin)
		}
		return cmpInt64(a.End, b.End)
	})
	ts := make([]Tensor, len(infos))
	for i, ti := range infos {
		raw, _, err := f.Raw(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		ts[i] = Tensor{Name: ti.Name, DType: ti.DType, Shape: ti.Shape, Data: raw}
	}
	if err := Write(out, ts, f.Metadata); err != nil {
		t.Fatalf("writing back a file that loaded: %v", err)
	}
	g, err := Open(out)
	if err != nil {
		t.Fatalf("reading back a file that loaded: %v", err)
	}
	if !reflect.DeepEqual(g.Metadata, f.Metadata) {
		t.Fatalf("metadata %v, after the round trip %v", f.Metadata, g.Metadata)
	}
	if !slices.Equal(g.Names(), names) {
		t.Fatalf("names %q, after the round trip %q", names, g.Names())
	}
	for _, n := range names {
		a, _ := f.Info(n)
		b, _ := g.Info(n)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("tensor %q: %+v, after the round trip %+v", n, a, b)
		}
		ra, _, _ := f.Raw(n)
		rb, _, _ := g.Raw(n)
		if !bytes.Equal(ra, rb) {
			t.Fatalf("tensor %q: data differs after the round trip", n)
		}
	}
	first, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	again := out + ".again"
	if err := Write(again, ts, g.Metadata); err != nil {
		t.Fatal(err)
	}
	if second, _ := os.ReadFile(again); !bytes.Equal(first, second) {
		t.Fatalf("writing the same tensors twice gave different bytes")
	}
}

// A header that claims a petabyte tensor in a 24-byte file is refused
// without allocating anything near it: the bound is the file's real size.
func TestHugeClaimsRefusedBeforeAllocation(t *testing.T) {
	for i, b := range [][]byte{
		mkFile(`{"w":{"dtype":"F32","shape":[250000000000000],"data_offsets":[0,1000000000000000]}}`, make([]byte, 8)),
		mkFile(`{"w":{"dtype":"F64","shape":[125000000000000],"data_offsets":[0,1000000000000000]}}`, nil),
		mkFile(`{"w":{"dtype":"U8","shape":[1000000000000000],"data_offsets":[0,1000000000000000]}}`, []byte{1}),
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			p := writeTemp(t, b)
			var err error
			used := alloc.Bytes(func() { _, err = Open(p) })
			if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "truncated") {
				t.Fatalf("err = %v, want a truncation error naming %s", err, p)
			}
			if used > allocSlack {
				t.Fatalf("refusing a %d-byte file allocated %d bytes", len(b), used)
			}
		})
	}
}

// Converting a tensor of the wrong dtype is refused before the output is
// allocated: a 1 MiB U8 tensor used to cost 4 MiB (Float32) or 8 MiB
// (Int64) on its way to the error.
func TestWrongDTypeAllocatesNothing(t *testing.T) {
	const n = 1 << 20
	p := filepath.Join(t.TempDir(), "u8.safetensors")
	if err := Write(p, []Tensor{{Name: "w", DType: U8, Shape: []int{n}, Data: make([]byte, n)}}, nil); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	var ferr, ierr error
	used := alloc.Bytes(func() {
		_, _, ferr = f.Float32("w")
		_, _, ierr = f.Int64("w")
	})
	if ferr == nil || ierr == nil {
		t.Fatalf("U8 converted: Float32 err %v, Int64 err %v", ferr, ierr)
	}
	if used > n/4 {
		t.Fatalf("refusing to convert a %d-byte U8 tensor allocated %d bytes", n, used)
	}
}
