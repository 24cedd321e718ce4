//go:build cuda || cudasim

package llama

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/device/devicetest"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// TestCUDAMatchesCPUPacked: a packed batch (--pack: per-document RoPE
// positions and attention) through the CUDA backend against the CPU
// backend with the kernels' dtypes (bf16), Qwen2's biases included: the
// per-token losses and the gradients within the tolerances of
// TestCUDAMatchesCPU.
func TestCUDAMatchesCPUPacked(t *testing.T) {
	devicetest.RequireCUDA(t)
	cfg := hookCfg
	cfg.QKVBias = true
	const B, T = 2, 13
	docs := [][]int{{5, 1, 7}, {9, 3}} // row 1 ends with a token of padding
	rng := rand.New(rand.NewPCG(3, 4))
	inp, tgt, pos := make([]int32, B*T), make([]int32, B*T), make([]int32, B*T)
	for r, row := range docs {
		used := 0
		for _, n := range append(row, T-sum(row)) {
			for i := range n {
				k := r*T + used + i
				inp[k], tgt[k], pos[k] = int32(rng.IntN(cfg.Vocab)), int32(rng.IntN(cfg.Vocab)), int32(i)
			}
			used += n
		}
	}
	params := cfg.Init(5)
	run := func(be backend.Backend) (losses, grads []float32) {
		s := be.DefaultStream()
		m, err := cfg.NewModel(be, B, T, backend.BF16, model.Options{Packed: true})
		must(t, err)
		defer m.Free()
		bufs := m.Buffers()
		must(t, backend.Upload(be, s, bufs.Params, params))
		must(t, m.ZeroGrads(s))
		must(t, model.UploadBatch(be, s, bufs, T, inp, tgt, pos))
		must(t, model.ForwardBackward(m, s, cfg.NumLayers, 1/float32(B*T)))
		losses, err = backend.Download(be, s, bufs.Losses)
		must(t, err)
		grads, err = backend.Download(be, s, bufs.Grads)
		must(t, err)
		return losses, grads
	}
	cb := cpu.New(cpu.Config{KernelDTypes: true})
	defer cb.Close()
	gb := devicetest.OpenCUDA(t)
	wantL, wantG := run(cb)
	gotL, gotG := run(gb)
	for i := range wantL {
		if math.Abs(float64(gotL[i]-wantL[i])) > cudaLossTol*math.Abs(float64(wantL[i]))+1e-4 {
			t.Errorf("token %d: loss %v on CUDA, %v on the CPU backend", i, gotL[i], wantL[i])
		}
	}
	for _, p := range cfg.Layout() {
		lo, hi := p.Offset, p.Offset+p.Len()
		if d, sc := maxDiff(gotG[lo:hi], wantG[lo:hi]); d > cudaGradTol*sc {
			t.Errorf("gradient of %s differs by %.3g (scale %.3g)", p.Name, d, sc)
		}
	}
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}
