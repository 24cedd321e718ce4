//go:build cuda || cudasim

// The PyTorch fixtures through the CUDA backend (on a GPU, or under -tags
// cudasim on the simulated runtime, where the same kernels run on the
// CPU) against the CPU backend with the kernels' dtypes: every LLaMA op
// (GQA attention on the planar q|k|v, RoPE, RMSNorm, SwiGLU, the tied and
// untied head) end to end, held to the oracle.

package llama

import (
	"fmt"
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/device/devicetest"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/model/modeltest"
)

// Tolerances of the CUDA backend against the CPU backend, both bf16.
// Measured under cudasim: loss and logits bit-identical, gradients at most
// 1.5e-3 of their tensor's largest magnitude apart (GEMM and attention sum
// in other orders, so a bf16 rounding may land one ulp apart).
const (
	cudaLossTol  = 1e-3 // relative
	cudaLogitTol = 1e-2 // of the logits' largest magnitude
	cudaGradTol  = 2e-2 // of each gradient tensor's largest magnitude
)

func TestCUDAMatchesCPU(t *testing.T) {
	devicetest.RequireCUDA(t)
	for _, name := range fixtureNames {
		fx := loadFixture(t, name)
		for _, gdt := range []backend.DType{backend.F32, backend.BF16} {
			t.Run(fmt.Sprintf("%s/grads-%v", name, gdt), func(t *testing.T) {
				run := func(be backend.Backend) (loss float64, logits, grads []float32) {
					s := be.DefaultStream()
					m := fixtureModel(t, be, fx, backend.BF16, model.Options{GradDType: gdt})
					must(t, m.ZeroGrads(s))
					must(t, m.Forward(s))
					logits, err := backend.Download(be, s, m.Logits)
					must(t, err)
					must(t, m.CrossEntropy(s, 1/float32(fx.ValidTargets)))
					loss = modeltest.MeanLoss(t, be, m, fx.ValidTargets)
					must(t, m.Backward(s))
					grads, err = backend.Download(be, s, m.Grads)
					must(t, err)
					return loss, logits, grads
				}
				cb := cpu.New(cpu.Config{KernelDTypes: true})
				defer cb.Close()
				gb := devicetest.OpenCUDA(t)
				wantLoss, wantLogits, wantGrads := run(cb)
				loss, logits, grads := run(gb)
				t.Logf("loss: cuda %.7g, cpu %.7g, pytorch (fp32) %.7g", loss, wantLoss, fx.Loss)
				if math.Abs(loss-wantLoss) > cudaLossTol*wantLoss {
					t.Errorf("loss %v on CUDA, %v on the CPU backend", loss, wantLoss)
				}
				if d, sc := maxDiff(logits, wantLogits); d > cudaLogitTol*sc {
					t.Errorf("logits differ by %.3g (scale %.3g)", d, sc)
				}
				for _, p := range fx.cfg.Layout() {
					lo, hi := p.Offset, p.Offset+p.Len()
					if d, sc := maxDiff(grads[lo:hi], wantGrads[lo:hi]); d > cudaGradTol*sc {
						t.Errorf("gradient of %s differs by %.3g (scale %.3g)", p.Name, d, sc)
					}
				}
			})
		}
	}
}

// maxDiff is the largest |a - b| and the largest |b|.
func maxDiff(a, b []float32) (d, scale float64) {
	for i := range b {
		scale = max(scale, math.Abs(float64(b[i])))
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d, scale
}
