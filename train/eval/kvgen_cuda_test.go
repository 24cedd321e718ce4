//go:build cuda || cudasim

// The KV-cache decoder through the CUDA backend (on a GPU, or under -tags
// cudasim on the simulated runtime): its logits at every position of a
// fixed sequence against the same backend's whole-sequence forward pass
// and against the CPU backend's decoder with the kernels' dtypes, on the
// gpt2 and llama fixture checkpoints, in bf16 (the CUDA GEMM's only input
// type).

package eval

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/device/devicetest"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// cudaDecodeTol bounds |a - b| by this share of the logits' largest
// magnitude. The decoder stores the attention scores and probabilities in
// bf16 where the fused attention kernel keeps them in fp32 (kvcache's
// package doc). Measured under cudasim on 32 positions: 4.6e-3 (one bf16
// ulp of the largest logit) against the forward pass, and bit-identical
// to the CPU backend's decoder.
const cudaDecodeTol = 2e-2

// decodeLogits runs the whole-sequence forward pass of seq and the
// decoder over the same tokens on be, and returns both [T, V] logits.
func decodeLogits(t *testing.T, be backend.Backend, spec model.Spec, vals []float32, seq []int32) (full, dec []float32) {
	t.Helper()
	s := be.DefaultStream()
	T := len(seq)
	mm, err := spec.NewModel(be, 1, T, backend.BF16, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mm.Free()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(backend.Upload(be, s, mm.Buffers().Params, vals))
	must(backend.UploadInt32(be, s, mm.Buffers().Inputs, seq))
	must(mm.Forward(s))
	full, err = backend.Download(be, s, mm.Buffers().Logits)
	must(err)
	d, err := mm.(model.Cached).NewDecoder(T)
	must(err)
	defer d.Free()
	for pos, tok := range seq {
		must(backend.UploadInt32(be, s, d.Token(), []int32{tok}))
		must(d.Step(s, pos))
		lg, err := backend.Download(be, s, d.Logits())
		must(err)
		dec = append(dec, lg...)
	}
	return full, dec
}

func TestCUDADecoderMatchesCPU(t *testing.T) {
	devicetest.RequireCUDA(t)
	for _, name := range []string{"gpt2-tiny", "llama-tiny-gqa", "qwen2-tiny-gqa"} {
		t.Run(name, func(t *testing.T) {
			spec, vals, err := catalog.Load(filepath.Join("../testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			seq := make([]int32, 32)
			for i := range seq {
				seq[i] = int32(i*53+7) % int32(spec.VocabSize())
			}
			cb := cpu.New(cpu.Config{KernelDTypes: true})
			defer cb.Close()
			gb := devicetest.OpenCUDA(t)
			_, cpuDec := decodeLogits(t, cb, spec, vals, seq)
			full, dec := decodeLogits(t, gb, spec, vals, seq)
			diff := func(a, b []float32) (d, sc float64) {
				for i := range b {
					sc = max(sc, math.Abs(float64(b[i])))
					d = max(d, math.Abs(float64(a[i]-b[i])))
				}
				return d, sc
			}
			d1, sc := diff(dec, full)
			d2, _ := diff(dec, cpuDec)
			t.Logf("logits scale %.3g: cuda decoder vs cuda forward %.3g, vs cpu decoder %.3g", sc, d1, d2)
			if d1 > cudaDecodeTol*sc {
				t.Errorf("CUDA decoder logits differ from the CUDA forward pass's by %.3g (scale %.3g)", d1, sc)
			}
			if d2 > cudaDecodeTol*sc {
				t.Errorf("CUDA decoder logits differ from the CPU decoder's by %.3g (scale %.3g)", d2, sc)
			}
		})
	}
}
