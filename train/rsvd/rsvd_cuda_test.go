//go:build cuda || cudasim

// The randomized SVD on the CUDA backend (the simulated runtime under
// -tags cudasim: the same kernels compiled by g++), through the hazard
// wrapper: bf16 storage, as the GPU's Gemm requires, against the float64
// reference with TestKernelDTypes' tolerances, and the CPU backend's
// KernelDTypes result within twice them.

package rsvd

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/device/devicetest"
)

func TestCUDAMatchesReference(t *testing.T) {
	for _, sh := range shapes {
		const k = 16
		t.Run(fmt.Sprintf("%dx%d_k%d", sh.m, sh.n, k), func(t *testing.T) {
			// A backend per subtest: only the goroutine that created
			// it may use it, and each subtest runs on its own.
			be := devicetest.CheckedCUDA(t)
			ref := newCPU(t, true)
			rng := rand.New(rand.NewPCG(uint64(sh.m+sh.n), uint64(k)))
			g := matrix(rng, sh.m, sh.n, spectrum("gap", min(sh.m, sh.n), k), 1e-4)
			g, r := decompose(t, be, g, sh.m, sh.n, k, backend.BF16, backend.F32, 5)
			a := measure(g, sh.m, sh.n, k, r)
			t.Logf("cuda: %v; passes %v", a, r.passes)
			checkBF16(t, a)

			_, c := decompose(t, ref, g, sh.m, sh.n, k, backend.BF16, backend.F32, 5)
			sinU, sinV := sinTheta(c.u, r.u, sh.m, k), sinTheta(c.v, r.v, sh.n, k)
			t.Logf("cuda against cpu: sin U %.2g, sin V %.2g", sinU, sinV)
			if sinU > 3e-2 || sinV > 3e-2 {
				t.Errorf("cuda and cpu disagree: sin U %.3g, sin V %.3g", sinU, sinV)
			}
		})
	}
}
