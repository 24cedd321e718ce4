package hf

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// sameFiles fails unless directories a and b hold the same files with
// the same bytes.
func sameFiles(t *testing.T, a, b string) {
	t.Helper()
	names := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var n []string
		for _, e := range ents {
			n = append(n, e.Name())
		}
		return n
	}
	na, nb := names(a), names(b)
	if !slices.Equal(na, nb) {
		t.Fatalf("%s holds %v, %s holds %v", a, na, b, nb)
	}
	for _, n := range na {
		x, err := os.ReadFile(filepath.Join(a, n))
		if err != nil {
			t.Fatal(err)
		}
		y, err := os.ReadFile(filepath.Join(b, n))
		if err != nil {
			t.Fatal(err)
		}
		if string(x) != string(y) {
			t.Errorf("%s differs between %s and %s", n, a, b)
		}
	}
}

// TestExportBytes: the writer's buffers after writing every parameter of
// a layout (plain, transposed wide and tall, one past blockElems) are at
// most ExportBytes less the file's write buffer, and reach it: the plan
// is the allocation, for any chunk and block size.
func TestExportBytes(t *testing.T) {
	defer func(c, b int) { chunkElems, blockElems = c, b }(chunkElems, blockElems)
	layout := []model.Param{
		{Name: "emb", Shape: []int{300, 16}},
		{Name: "norm", Shape: []int{16}},
		{Name: "q", Shape: []int{16, 48}, Transposed: true},
		{Name: "down", Shape: []int{120, 16}, Transposed: true},
		{Name: "head", Shape: []int{16, 300}, Transposed: true},
	}
	off := 0
	for i := range layout {
		layout[i].Offset = off
		off += layout[i].Len()
	}
	for _, sz := range [][2]int{{1, 1}, {7, 50}, {64, 1000}, {1 << 20, 64 << 20}} {
		chunkElems, blockElems = sz[0], sz[1]
		for _, dt := range []backend.DType{backend.F32, backend.BF16} {
			opt := ExportOptions{DType: dt}
			st := safetensors.F32
			if dt == backend.BF16 {
				st = safetensors.BF16
			}
			w := &paramWriter{dt: st, fetch: func(int, []float32) error { return nil }}
			for _, p := range layout {
				if err := w.write(io.Discard, p); err != nil {
					t.Fatal(err)
				}
			}
			held := 4*int64(cap(w.vals)+cap(w.block)) + int64(cap(w.bytes))
			if plan := ExportBytes(layout, opt) - atomicfile.BufferBytes; held != plan {
				t.Errorf("chunk %d, block %d, %v: the writer holds %d bytes, ExportBytes plans %d", sz[0], sz[1], dt, held, plan)
			}
		}
	}
}
