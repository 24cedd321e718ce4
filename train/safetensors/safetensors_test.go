// Tests for safetensors: round trips of every writer, golden bytes of the
// layout, conversions (BF16, F16, I32), each validation error on hand-made bad
// files, and the committed PyTorch-written GPT-2 fixture.

package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// mkFile assembles a safetensors file from a raw header and data section.
func mkFile(header string, data []byte) []byte {
	b := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

func writeTemp(t *testing.T, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "m.safetensors")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rt.safetensors")
	f32 := []float32{1, -2.5, 3e-8, float32(math.Inf(1)), 0, 7}
	b16 := []uint16{0x3f80, 0xc020, 0x7f80, 0x0001}
	i64 := []int64{-1, 0, 1 << 40}
	in := []Tensor{
		F32Tensor("z.weight", []int{2, 3}, f32),
		BF16Tensor("a.bf16", []int{4}, b16),
		I64Tensor("ids", []int{3, 1}, i64),
		F32Tensor("scalar", nil, []float32{42}),
		F32Tensor("empty", []int{0, 5}, nil),
	}
	meta := map[string]string{"format": "pt", "step": "12"}
	if err := Write(path, in, meta); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f.Metadata, meta) {
		t.Errorf("metadata = %v, want %v", f.Metadata, meta)
	}
	wantNames := []string{"a.bf16", "empty", "ids", "scalar", "z.weight"}
	if got := f.Names(); !reflect.DeepEqual(got, wantNames) {
		t.Errorf("names = %v, want %v", got, wantNames)
	}
	got, shape, err := f.Float32("z.weight")
	if err != nil || !reflect.DeepEqual(got, f32) || !reflect.DeepEqual(shape, []int{2, 3}) {
		t.Errorf("Float32(z.weight) = %v %v %v", got, shape, err)
	}
	gb, _, err := f.Float32("a.bf16")
	wantB := []float32{1, -2.5, float32(math.Inf(1)), math.Float32frombits(0x00010000)}
	if err != nil || !reflect.DeepEqual(gb, wantB) {
		t.Errorf("Float32(a.bf16) = %v %v, want %v", gb, err, wantB)
	}
	gi, shape, err := f.Int64("ids")
	if err != nil || !reflect.DeepEqual(gi, i64) || !reflect.DeepEqual(shape, []int{3, 1}) {
		t.Errorf("Int64(ids) = %v %v %v", gi, shape, err)
	}
	if s, shape, err := f.Float32("scalar"); err != nil || len(s) != 1 || s[0] != 42 || len(shape) != 0 {
		t.Errorf("Float32(scalar) = %v %v %v", s, shape, err)
	}
	if e, shape, err := f.Float32("empty"); err != nil || len(e) != 0 || !reflect.DeepEqual(shape, []int{0, 5}) {
		t.Errorf("Float32(empty) = %v %v %v", e, shape, err)
	}
	// Data is laid out in the given order.
	infoZ, _ := f.Info("z.weight")
	infoA, _ := f.Info("a.bf16")
	if infoZ.Begin != 0 || infoZ.End != 24 || infoA.Begin != 24 || infoA.End != 32 {
		t.Errorf("offsets z=[%d,%d] a=[%d,%d]", infoZ.Begin, infoZ.End, infoA.Begin, infoA.End)
	}
	raw, ti, err := f.Raw("ids")
	if err != nil || ti.DType != I64 || len(raw) != 24 || int64(binary.LittleEndian.Uint64(raw[16:])) != 1<<40 {
		t.Errorf("Raw(ids) = %v %+v %v", raw, ti, err)
	}
	// Header length is a multiple of 8 so the data section is aligned.
	b, _ := os.ReadFile(path)
	if n := binary.LittleEndian.Uint64(b); n%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", n)
	}
}

// The writer's bytes match what the Hugging Face library writes for the
// same input: compact JSON, metadata first, space padding.
func TestGoldenBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g.safetensors")
	if err := Write(path, []Tensor{F32Tensor("a", []int{2}, []float32{1, 2})}, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	hdr := `{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	want := mkFile(hdr, []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40})
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("bytes:\n got %q\nwant %q", got, want)
	}
}

func TestConversions(t *testing.T) {
	// F16: 1.0, -2.0, 65504 (max), smallest subnormal, -0, +Inf, NaN.
	f16 := []uint16{0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x7c00, 0x7e00, 0x03ff}
	data := make([]byte, 0, 64)
	for _, h := range f16 {
		data = binary.LittleEndian.AppendUint16(data, h)
	}
	i32 := []int32{-7, 1 << 30}
	for _, v := range i32 {
		data = binary.LittleEndian.AppendUint32(data, uint32(v))
	}
	hdr := `{"h":{"dtype":"F16","shape":[8],"data_offsets":[0,16]},"i":{"dtype":"I32","shape":[2],"data_offsets":[16,24]}}`
	f, err := Open(writeTemp(t, mkFile(hdr, data)))
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := f.Float32("h")
	if err != nil {
		t.Fatal(err)
	}
	want := []float32{1, -2, 65504, float32(math.Ldexp(1, -24)), 0, float32(math.Inf(1)), 0, float32(1023 * math.Ldexp(1, -24))}
	for i := range want {
		if i == 6 {
			if !math.IsNaN(float64(h[i])) {
				t.Errorf("F16 NaN -> %v", h[i])
			}
			continue
		}
		if h[i] != want[i] {
			t.Errorf("F16[%d] %#04x -> %v, want %v", i, f16[i], h[i], want[i])
		}
	}
	if math.Signbit(float64(h[4])) != true {
		t.Errorf("F16 -0 lost its sign")
	}
	iv, _, err := f.Int64("i")
	if err != nil || !reflect.DeepEqual(iv, []int64{-7, 1 << 30}) {
		t.Errorf("Int64(i) = %v %v", iv, err)
	}
	// Wrong-dtype and missing-name errors name the file and the tensor.
	for _, fn := range []func() error{
		func() error { _, _, err := f.Float32("i"); return err },
		func() error { _, _, err := f.Int64("h"); return err },
		func() error { _, _, err := f.Float32("nope"); return err },
	} {
		err := fn()
		if err == nil || !strings.Contains(err.Error(), f.Path) {
			t.Errorf("want an error naming %s, got %v", f.Path, err)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	eightF32 := make([]byte, 8)
	tests := []struct {
		name string
		file []byte
		want string // substring of the error
	}{
		{"empty file", nil, "shorter than the 8-byte header"},
		{"seven bytes", []byte{1, 2, 3, 4, 5, 6, 7}, "shorter than the 8-byte header"},
		{"header length beyond file", func() []byte {
			b := mkFile(`{}`, nil)
			binary.LittleEndian.PutUint64(b, 1000)
			return b
		}(), "header length 1000 is larger"},
		{"header length huge", func() []byte {
			b := mkFile(`{}`, nil)
			binary.LittleEndian.PutUint64(b, math.MaxUint64)
			return b
		}(), "is larger than"},
		{"bad JSON", mkFile(`{"a":{"dtype":`, nil), "bad JSON"},
		{"empty header", mkFile(``, nil), "bad JSON"},
		{"not an object", mkFile(`[1,2]`, nil), "want a JSON object"},
		{"trailing junk", mkFile(`{} x`, nil), "after the JSON object"},
		{"unknown dtype", mkFile(`{"w":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}`, make([]byte, 16)), `tensor "w": unknown dtype "F128"`},
		{"missing dtype", mkFile(`{"w":{"shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4)), `tensor "w": missing "dtype"`},
		{"missing offsets", mkFile(`{"w":{"dtype":"F32","shape":[1]}}`, make([]byte, 4)), `missing "data_offsets"`},
		{"negative dim", mkFile(`{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, make([]byte, 4)), "out of range"},
		{"three offsets", mkFile(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, make([]byte, 4)), "3 entries, want 2"},
		{"reversed offsets", mkFile(`{"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, make([]byte, 4)), "out of range"},
		{"negative offset", mkFile(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}`, make([]byte, 4)), "out of range"},
		{"size mismatch", mkFile(`{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,8]}}`, eightF32), `tensor "w": data_offsets [0, 8] span 8 bytes, but F32 [2 3] needs 24`},
		{"truncated", mkFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}`, make([]byte, 20)),
			"truncated: header says 24 bytes of data, file has 20"},
		{"overlap", mkFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}`, make([]byte, 12)),
			`tensor "b": data_offsets [4, 12] overlap tensor "a"`},
		{"same range twice", mkFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)),
			"overlap"},
		{"gap", mkFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)), "gap of 4 bytes"},
		{"trailing data", mkFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, make([]byte, 8)), "4 trailing bytes"},
		{"duplicate names", mkFile(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)),
			`duplicate name "a"`},
		{"metadata not strings", mkFile(`{"__metadata__":{"k":1}}`, nil), `value of "k" is not a string`},
		{"duplicate metadata key", mkFile(`{"__metadata__":{"k":"a","k":"b"}}`, nil), `duplicate name "k"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := writeTemp(t, tc.file)
			f, err := Open(p)
			if err == nil {
				t.Fatalf("Open succeeded (%v), want error containing %q", f.Names(), tc.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) {
				t.Fatalf("error %q does not contain %q", msg, tc.want)
			}
			if !strings.Contains(msg, p) {
				t.Fatalf("error %q does not name the file %s", msg, p)
			}
		})
	}
}

func TestOpenMissing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "absent.safetensors")
	if _, err := Open(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("err = %v", err)
	}
}

func TestWriteErrors(t *testing.T) {
	tests := []struct {
		name    string
		tensors []Tensor
		want    string
	}{
		{"length mismatch", []Tensor{F32Tensor("a", []int{3}, []float32{1, 2})}, `tensor "a": 8 bytes of data`},
		{"duplicate", []Tensor{F32Tensor("a", nil, []float32{1}), F32Tensor("a", nil, []float32{2})}, `duplicate tensor name "a"`},
		{"empty name", []Tensor{F32Tensor("", nil, []float32{1})}, "empty name"},
		{"reserved name", []Tensor{F32Tensor(metaKey, nil, []float32{1})}, "reserved"},
		{"unknown dtype", []Tensor{{Name: "x", DType: "F3", Data: []byte{0}}}, `unknown dtype "F3"`},
		{"negative dim", []Tensor{{Name: "x", DType: U8, Shape: []int{-1}}}, "negative dimension"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "w.safetensors")
			err := Write(p, tc.tensors, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), p) {
				t.Fatalf("err = %v, want one naming %s and containing %q", err, p, tc.want)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Fatalf("failed Write left files behind: %v", ents)
			}
		})
	}
}

// The fixture written by PyTorch + transformers (scripts/fixtures/gpt2_tiny.py),
// committed under train/testdata: a missing file is a failure, not a skip,
// or this test would pass without reading anything.
func TestGPT2TinyFixture(t *testing.T) {
	p := filepath.Join("..", "testdata", "gpt2-tiny", "model.safetensors")
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	// transformers' save_pretrained records the framework.
	if f.Metadata["format"] != "pt" {
		t.Errorf("metadata = %v, want format=pt", f.Metadata)
	}
	// Shapes fixed by n_embd = 64 and the 320-token vocabulary; Conv1D stores
	// weights as in x out, so c_attn is 64 x 3*64.
	tests := []struct {
		name  string
		shape []int
	}{
		{"transformer.wte.weight", []int{320, 64}},
		{"transformer.h.0.attn.c_attn.weight", []int{64, 192}},
		{"transformer.ln_f.bias", []int{64}},
	}
	for _, tc := range tests {
		ti, ok := f.Info(tc.name)
		if !ok {
			t.Errorf("no tensor %q (have %v)", tc.name, f.Names())
			continue
		}
		if !reflect.DeepEqual(ti.Shape, tc.shape) {
			t.Errorf("%s shape = %v, want %v", tc.name, ti.Shape, tc.shape)
		}
		v, _, err := f.Float32(tc.name)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				t.Errorf("%s holds a non-finite value", tc.name)
				break
			}
		}
	}
}

func BenchmarkFloat32BF16(b *testing.B) {
	const n = 1 << 20
	path := filepath.Join(b.TempDir(), "b.safetensors")
	if err := Write(path, []Tensor{BF16Tensor("w", []int{n}, make([]uint16, n))}, nil); err != nil {
		b.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(2 * n)
	for b.Loop() {
		if _, _, err := f.Float32("w"); err != nil {
			b.Fatal(err)
		}
	}
}

// OpenMapped reads what Open reads, Release keeps the bytes readable, and
// Raw after Close is an error, not a fault.
func TestOpenMapped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.safetensors")
	big := make([]float32, 3000) // spans pages, so Release drops some
	for i := range big {
		big[i] = float32(i) - 0.5
	}
	ts := []Tensor{F32Tensor("a", []int{2}, []float32{1, 2}), F32Tensor("big", []int{3000}, big), BF16Tensor("c", []int{1}, []uint16{0x3f80})}
	if err := Write(path, ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	want, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := OpenMapped(path)
	if err != nil {
		t.Fatal(err)
	}
	if !f.Mapped() {
		t.Log("not mapped on this system")
	}
	for _, n := range want.Names() {
		a, _, err1 := want.Float32(n)
		f.Release(n)
		b, _, err2 := f.Float32(n)
		f.Release(n)
		c, _, err3 := f.Float32(n)
		if err1 != nil || err2 != nil || err3 != nil || !slices.Equal(a, b) || !slices.Equal(a, c) {
			t.Fatalf("%s: mapped read differs: %v %v %v", n, err1, err2, err3)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Raw("a"); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("Raw after Close: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// A header claiming more than the file holds is refused from the
	// mapping as from the heap.
	bad := mkFile(`{"w":{"dtype":"F32","shape":[250000000000000],"data_offsets":[0,1000000000000000]}}`, make([]byte, 4))
	if err := os.WriteFile(path, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenMapped(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("OpenMapped of a lying header: %v", err)
	}
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenMapped(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("OpenMapped of an empty file: %v", err)
	}
}

// WriteStream writes the same file as Write, and refuses a callback that
// writes too few or too many bytes, leaving the old file in place.
func TestWriteStream(t *testing.T) {
	dir := t.TempDir()
	ts := []Tensor{F32Tensor("a", []int{2, 2}, []float32{1, 2, 3, 4}), BF16Tensor("b", []int{3}, []uint16{1, 2, 3}), I64Tensor("c", []int{}, []int64{7})}
	specs := make([]Spec, len(ts))
	for i, x := range ts {
		specs[i] = Spec{Name: x.Name, DType: x.DType, Shape: x.Shape}
	}
	meta := map[string]string{"format": "pt"}
	p1, p2 := filepath.Join(dir, "w.safetensors"), filepath.Join(dir, "s.safetensors")
	if err := Write(p1, ts, meta); err != nil {
		t.Fatal(err)
	}
	err := WriteStream(p2, specs, meta, func(i int, w io.Writer) error {
		for _, b := range ts[i].Data { // byte by byte: chunking is the caller's
			if _, err := w.Write([]byte{b}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(p1)
	b, _ := os.ReadFile(p2)
	if !bytes.Equal(a, b) {
		t.Fatal("WriteStream and Write wrote different files")
	}
	for _, delta := range []int{-1, 1} {
		err := WriteStream(p2, specs, meta, func(i int, w io.Writer) error {
			d := ts[i].Data
			if i == 1 {
				d = append(slices.Clone(d), 0)[:len(d)+delta]
			}
			_, err := w.Write(d)
			return err
		})
		if err == nil || !strings.Contains(err.Error(), `"b"`) || !strings.Contains(err.Error(), p2) {
			t.Errorf("delta %d: err = %v, want one naming %s and tensor b", delta, err, p2)
		}
		if c, _ := os.ReadFile(p2); !bytes.Equal(c, a) {
			t.Errorf("delta %d: a failed WriteStream changed the file", delta)
		}
	}
}

// Chunks hands a tensor's bytes over in order, in chunks of the size
// asked (the last shorter), from a mapped file (still readable after the
// pages are released) and one opened for streaming as from one read in; a chunk size that could
// split an element is refused, and fn's error stops the walk.
func TestChunks(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.safetensors")
	big := make([]float32, 5000) // several pages, not a whole number of chunks
	for i := range big {
		big[i] = float32(i) * 0.25
	}
	if err := Write(path, []Tensor{F32Tensor("a", []int{1}, []float32{7}), F32Tensor("big", []int{5000}, big)}, nil); err != nil {
		t.Fatal(err)
	}
	whole, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	raw, _, err := whole.Raw("big")
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(raw)
	for _, open := range []func(string) (*File, error){Open, OpenMapped, OpenStream} {
		f, err := open(path)
		if err != nil {
			t.Fatal(err)
		}
		for pass := range 2 { // again after the release: paged back in
			var got []byte
			var sizes []int
			if err := f.Chunks("big", 4096, func(b []byte) error {
				got, sizes = append(got, b...), append(sizes, len(b))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) || !slices.Equal(sizes, []int{4096, 4096, 4096, 4096, 3616}) {
				t.Fatalf("pass %d (mapped %v): chunks of %v, bytes equal %v", pass, f.Mapped(), sizes, slices.Equal(got, want))
			}
		}
		if err := f.Chunks("big", 12, func([]byte) error { return nil }); err == nil || !strings.Contains(err.Error(), "multiple of 8") {
			t.Errorf("chunk of 12 bytes: %v", err)
		}
		stop := errors.New("stop")
		calls := 0
		if err := f.Chunks("big", 8, func([]byte) error { calls++; return stop }); !errors.Is(err, stop) || calls != 1 {
			t.Errorf("fn's error: %v after %d calls, want stop after 1", err, calls)
		}
		if err := f.Chunks("nope", 8, func([]byte) error { return nil }); err == nil || !strings.Contains(err.Error(), `"nope"`) {
			t.Errorf("missing tensor: %v", err)
		}
		f.Close()
		if err := f.Chunks("big", 8, func([]byte) error { return nil }); err == nil {
			t.Errorf("Chunks after Close succeeded")
		}
	}
	f, err := OpenStream(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, _, err := f.Raw("a"); err == nil || !strings.Contains(err.Error(), "OpenStream") {
		t.Errorf("Raw of a streamed file: %v", err)
	}
	if err := os.WriteFile(path, []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenStream(path); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "shorter than the 8-byte header") {
		t.Errorf("OpenStream of a 5-byte file: %v", err)
	}
}

// WriteStreamMeta writes the draft header, then the final metadata in its
// place: the file is what Write of the final metadata writes; a final
// metadata of another length is refused, naming the file, and leaves the
// file there as it was.
func TestWriteStreamMeta(t *testing.T) {
	dir := t.TempDir()
	ts := []Tensor{F32Tensor("a", []int{3}, []float32{1, 2, 3}), BF16Tensor("b", []int{2}, []uint16{5, 6})}
	specs := []Spec{{Name: "a", DType: F32, Shape: []int{3}}, {Name: "b", DType: BF16, Shape: []int{2}}}
	final := map[string]string{"sum": "0badf00d"}
	p1, p2 := filepath.Join(dir, "w.safetensors"), filepath.Join(dir, "m.safetensors")
	if err := Write(p1, ts, final); err != nil {
		t.Fatal(err)
	}
	fill := func(i int, w io.Writer) error { _, err := w.Write(ts[i].Data); return err }
	if err := WriteStreamMeta(p2, specs, map[string]string{"sum": "00000000"}, fill, func() map[string]string { return final }); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(p1)
	b, _ := os.ReadFile(p2)
	if !bytes.Equal(a, b) {
		t.Fatalf("WriteStreamMeta wrote\n%q\nWrite of the final metadata\n%q", b, a)
	}
	err := WriteStreamMeta(p2, specs, map[string]string{"sum": "0"}, fill, func() map[string]string { return final })
	if err == nil || !strings.Contains(err.Error(), p2) || !strings.Contains(err.Error(), "draft") {
		t.Errorf("final metadata longer than the draft: %v", err)
	}
	if c, _ := os.ReadFile(p2); !bytes.Equal(c, a) {
		t.Errorf("a refused write changed the file")
	}
}
