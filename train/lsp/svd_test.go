package lsp

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
)

// orthoCols returns rows x k (k <= rows) with orthonormal columns,
// row-major: Gram-Schmidt, twice, of a Gaussian matrix.
func orthoCols(rng *rand.Rand, rows, k int) []float64 {
	a := make([]float64, rows*k)
	for i := range a {
		a[i] = rng.NormFloat64()
	}
	for range 2 {
		for j := range k {
			for c := range j {
				var p float64
				for i := range rows {
					p += a[i*k+j] * a[i*k+c]
				}
				for i := range rows {
					a[i*k+j] -= p * a[i*k+c]
				}
			}
			var n float64
			for i := range rows {
				n += a[i*k+j] * a[i*k+j]
			}
			for i := range rows {
				a[i*k+j] /= math.Sqrt(n)
			}
		}
	}
	return a
}

// sinAngle is the sine of the largest principal angle between the
// column spaces of ref (rows x k, orthonormal) and got (rows x k,
// orthonormal), bounded by the Frobenius norm of got's part outside ref.
func sinAngle(ref []float64, got []float32, rows, k int) float64 {
	var out float64
	for j := range k {
		c := make([]float64, k) // ref^T got[:, j]
		for a := range k {
			for i := range rows {
				c[a] += ref[i*k+a] * float64(got[i*k+j])
			}
		}
		for i := range rows {
			r := float64(got[i*k+j])
			for a := range k {
				r -= ref[i*k+a] * c[a]
			}
			out += r * r
		}
	}
	return math.Sqrt(out)
}

// orthoErr is the largest entry of |X^T X - I| of rows x k X.
func orthoErr(x []float32, rows, k int) float64 {
	var worst float64
	for a := range k {
		for b := range k {
			var s float64
			for i := range rows {
				s += float64(x[i*k+a]) * float64(x[i*k+b])
			}
			if a == b {
				s--
			}
			worst = max(worst, math.Abs(s))
		}
	}
	return worst
}

// TestSVDRefresh: an svd refresh of an input read by three matrices of
// ragged widths makes P the top-d left singular vectors of their stacked
// gradient [G_1 | G_2 | G_3] and each Q_i G_i's top-d right ones. The
// gradients are G_i = U S_i V_i^T with one U (m x m) and orthonormal V_i:
// the stacked one's left singular vectors are U's columns in the order
// of sum_i S_i^2, G_i's right ones V_i's columns in the order of S_i.
// Compared with those references: the largest principal angle (its
// sine), and P and Q orthonormal, on the CPU backend in fp32.
func TestSVDRefresh(t *testing.T) {
	const m, d = 37, 4
	ns := []int{29, 23, 31}
	rng := rand.New(rand.NewPCG(3, 9))
	be := cpu.New(cpu.Config{Threads: 2})
	t.Cleanup(func() { be.Close() })
	s := be.DefaultStream()
	c := Config{Projector: KindSVD}
	st := &State{Config: c, env: Env{Backend: be, Stream: s, DType: backend.F32, Seed: 5}}
	in := &Input{M: m, D: d, R: d}
	var err error
	if in.P, err = NewProjector(m, d, d, rng); err != nil {
		t.Fatal(err)
	}
	alloc := func(n int) *backend.Carver {
		tt, err := be.Alloc("test", n, backend.F32)
		if err != nil {
			t.Fatal(err)
		}
		return &backend.Carver{T: tt}
	}
	in.pDev = carveProjector(nil, alloc(m*d), m, d, d, true)
	U := orthoCols(rng, m, m)
	gs := make([][]float32, len(ns))
	var stacked []float64 // sum_i S_i^2 on U's columns
	stacked = make([]float64, m)
	refV := make([][]float64, len(ns))
	for i, n := range ns {
		x := &Matrix{Name: "w", K: i, ID: uint32(i), M: m, N: n, D: d, R: d, In: in}
		if x.Q, err = NewProjector(n, d, d, rng); err != nil {
			t.Fatal(err)
		}
		x.qDev = carveProjector(nil, alloc(n*d), n, d, d, true)
		in.Mats = append(in.Mats, x)
		// S_i: decaying, each reader's in its own order of U's columns.
		V := orthoCols(rng, n, n)
		r := min(m, n)
		perm := rng.Perm(r)
		sv := make([]float64, r)
		for j := range r {
			sv[j] = math.Pow(0.6, float64(j)) * float64(i+1)
		}
		g := make([]float32, m*n)
		for a := range m {
			for b := range n {
				var v float64
				for j := range r {
					v += U[a*m+perm[j]] * sv[j] * V[b*n+j]
				}
				g[a*n+b] = float32(v)
			}
		}
		for j := range r {
			stacked[perm[j]] += sv[j] * sv[j]
		}
		gs[i] = g
		refV[i] = make([]float64, n*d) // V_i's first d columns
		for b := range n {
			copy(refV[i][b*d:(b+1)*d], V[b*n:b*n+d])
		}
	}
	// U's columns by descending stacked energy: the first d.
	order := make([]int, m)
	for j := range order {
		order[j] = j
	}
	for a := range order {
		for b := a + 1; b < len(order); b++ {
			if stacked[order[b]] > stacked[order[a]] {
				order[a], order[b] = order[b], order[a]
			}
		}
	}
	if !(stacked[order[d-1]] > 1.2*stacked[order[d]]) {
		t.Fatalf("no gap after d in the stacked spectrum: %v", stacked)
	}
	refP := make([]float64, m*d)
	for a := range m {
		for j := range d {
			refP[a*d+j] = U[a*m+order[j]]
		}
	}
	reps, err := st.svdInput(in, gs, 1)
	if err != nil {
		t.Fatal(err)
	}
	if e := orthoErr(in.P.Val, m, d); e > 1e-5 {
		t.Errorf("P^T P - I: %.2g, want <= 1e-5", e)
	}
	if sn := sinAngle(refP, in.P.Val, m, d); sn > 1e-3 {
		t.Errorf("P: sin of the largest angle to the stacked gradient's top-%d left subspace %.2g, want <= 1e-3", d, sn)
	}
	for i, x := range in.Mats {
		if e := orthoErr(x.Q.Val, ns[i], d); e > 1e-5 {
			t.Errorf("Q_%d^T Q_%d - I: %.2g, want <= 1e-5", i, i, e)
		}
		if sn := sinAngle(refV[i], x.Q.Val, ns[i], d); sn > 1e-3 {
			t.Errorf("Q_%d: sin of the largest angle to G_%d's top-%d right subspace %.2g, want <= 1e-3", i, i, d, sn)
		}
		// The largest reader dominates the stacked gradient, so the new
		// pair captures most of its gradient (a small reader's
		// directions may lie outside the shared P).
		if r := reps[i]; !r.Resampled || (i == len(ns)-1 && !(r.CaptureAfter > 0.5 && r.CaptureAfter > r.CaptureBefore)) {
			t.Errorf("report %d: %+v, want resampled (and for the largest, most of its gradient captured)", i, r)
		}
		// The device holds the new Q: its values as they are.
		got, err := backend.Download(be, s, x.qDev.val)
		if err != nil {
			t.Fatal(err)
		}
		for e, v := range got {
			if v != x.Q.Val[e] {
				t.Fatalf("Q_%d on the device differs from the host's at %d", i, e)
			}
		}
	}
}
