package lsp

import (
	"fmt"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// BenchmarkFitGPT2 fits the four input groups of one GPT-2 (124M) block
// at d 512, r 16 (c_attn 768 x 2304, attn c_proj 768 x 768, c_fc 768 x
// 3072, mlp c_proj 3072 x 768; one gradient sample, 3 Adam steps: a
// check's fits are 12 of these) on the host (float64, train/lsp) and on
// the CPU backend (this package). -bench FitGPT2 -benchtime 1x.
func BenchmarkFitGPT2(b *testing.B) {
	var groups []problem
	for _, s := range [][2]int{{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}} {
		groups = append(groups, problem{m: s[0], d: 512, r: 16, ns: []int{s[1]}, samples: 1})
	}
	t := &testing.T{}
	opts := FitOptions{LR: 0.05, MaxIters: 3, Seed: 1}
	const alpha = 1e-3 // never reached: every step runs
	for _, on := range []string{"host", "cpu"} {
		b.Run(on, func(b *testing.B) {
			be := cpu.New(cpu.Config{})
			defer be.Close()
			for range b.N {
				for _, pr := range groups {
					b.StopTimer()
					P, Qs, samples := pr.build(t, 7)
					b.StartTimer()
					var err error
					if on == "host" {
						_, err = FitSamples(P, Qs, samples, alpha, opts)
					} else {
						_, err = FitSamplesOn(be, be.DefaultStream(), P, Qs, samples, alpha, opts)
					}
					if err != nil {
						b.Fatal(fmt.Errorf("%v: %w", pr, err))
					}
				}
			}
		})
	}
}
