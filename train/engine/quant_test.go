package engine

import (
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/quant"
)

// TestQuantizedBaseIsItsValues: lora with a quantized base (--base-dtype)
// trains exactly as lora does on a base whose block matrices hold the
// quantized values (train/quant's host dequantization, rounded to the
// model dtype): the same losses, adapters and dense parameters, bit for
// bit, on the backend the device tests run on. So the GemmQ path reads
// the values the quantizer wrote, in both GEMMs (the forward's and the
// input gradient's), and Fetch (checkpoints, the export) gives them back.
func TestQuantizedBaseIsItsValues(t *testing.T) {
	const steps = 4
	for _, tc := range []struct {
		name string
		f    backend.QFormat
		dt   backend.DType
	}{{"nf4-fp32", backend.NF4, backend.F32}, {"int8-bf16", backend.Int8, backend.BF16}, {"nf4-bf16", backend.NF4, backend.BF16}} {
		t.Run(tc.name, func(t *testing.T) {
			dt := deviceDType(tc.dt)
			cfg := testConfig(LoRA)
			cfg.LoRA.Base = tc.f
			w := gpt2.Init(small, 11)
			deq := dequantized(t, w, tc.f, dt)

			q := newDeviceTrainer(t, cfg, dt, 2, false, 0) // its base from w
			fetched := make([]float32, len(w))
			if err := q.e.Fetch(q.be.DefaultStream(), 0, fetched); err != nil {
				t.Fatal(err)
			}
			for i := range deq {
				if math.Float32bits(fetched[i]) != math.Float32bits(deq[i]) {
					t.Fatalf("Fetch: element %d is %v, the host's dequantization %v", i, fetched[i], deq[i])
				}
			}
			plainCfg := cfg
			plainCfg.LoRA.Base = 0
			plain := newDeviceTrainer(t, plainCfg, dt, 2, false, 0)
			if err := plain.e.Store(plain.be.DefaultStream(), 0, deq); err != nil {
				t.Fatal(err)
			}
			sameRun(t, plain, q, steps, "lora on the dequantized base", "lora on the quantized base")
		})
	}
}

// dequantized is w with every block matrix of small quantized in format f
// and dequantized on the host, rounded to dt.
func dequantized(t *testing.T, w []float32, f backend.QFormat, dt backend.DType) []float32 {
	t.Helper()
	idx, err := model.NewIndex(small)
	if err != nil {
		t.Fatal(err)
	}
	out := append([]float32(nil), w...)
	for _, row := range idx.MatParam {
		for _, i := range row {
			p := idx.Layout[i]
			v := out[p.Offset : p.Offset+p.Len()]
			q, err := quant.Quantize(f, p.Shape[0], p.Shape[1], v)
			if err != nil {
				t.Fatal(err)
			}
			if err := q.Dequantize(0, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if dt == backend.BF16 {
		for i, x := range out {
			out[i] = bf16.ToFloat32(bf16.FromFloat32(x))
		}
	}
	return out
}

// TestQuantizedBaseMemory: the quantized base holds what quant.Bytes
// says, and in NF4 at most 0.6 bytes an element of the block matrices (the
// codes' half byte, the double-quantized absmax and the scales), against
// 2 for a bf16 base.
func TestQuantizedBaseMemory(t *testing.T) {
	idx, err := model.NewIndex(small)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(cpu.Config{Threads: 1})
	defer be.Close()
	before := be.MemStats().InUse
	b, err := quant.NewBase(be, idx, backend.NF4, backend.BF16)
	if err != nil {
		t.Fatal(err)
	}
	got := be.MemStats().InUse - before
	b.Free()
	if want := quant.Bytes(idx, backend.NF4, backend.BF16); got != want {
		t.Errorf("NewBase allocated %d bytes, Bytes says %d", got, want)
	}
	// The codebook and the fetch scratch aside, which every model has once.
	scratch := int64(min(idx.Layout[idx.MatParam[0][0]].Len(), 1<<20))
	for _, row := range idx.MatParam {
		for _, i := range row {
			scratch = max(scratch, int64(idx.Layout[i].Len()))
		}
	}
	per := float64(quant.Bytes(idx, backend.NF4, backend.BF16)-4*backend.QBookLen-2*scratch) / float64(idx.MatrixElems())
	if per > 0.6 {
		t.Errorf("NF4 base: %.3f bytes an element, want at most 0.6", per)
	}
}
