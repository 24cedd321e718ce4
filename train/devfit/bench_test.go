package devfit

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/lsp"
)

// BenchmarkFitGPT2 fits one GPT-2 (124M) c_attn-shaped group (P 768 x
// 512, Q 2304 x 512, r 16, one gradient sample) for a few Adam steps, on
// the host (float64, train/lsp) and on the CPU backend (this package).
func BenchmarkFitGPT2(b *testing.B) {
	pr := problem{m: 768, d: 512, r: 16, ns: []int{2304}, samples: 1}
	t := &testing.T{}
	P, Qs, samples := pr.build(t, 7)
	opts := lsp.FitOptions{LR: 0.05, MaxIters: 3, Seed: 1}
	const alpha = 1e-3 // never reached: every step runs
	b.Run("host", func(b *testing.B) {
		for range b.N {
			if _, err := lsp.FitSamples(P.Clone(), clones(Qs), samples, alpha, opts); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cpu", func(b *testing.B) {
		be := cpu.New(cpu.Config{})
		defer be.Close()
		for range b.N {
			if _, err := FitSamples(be, be.DefaultStream(), P.Clone(), clones(Qs), samples, alpha, opts); err != nil {
				b.Fatal(err)
			}
		}
	})
}
