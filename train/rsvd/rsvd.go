// The top-k singular triplets of an m x n device matrix G (a weight
// gradient: the svd projectors' and GaLore's refresh) by the randomized
// range finder of Halko, Martinsson and Tropp (2011, algorithms 4.4 and
// 5.1), every m- or n-sized product a Backend Gemm, so that no full SVD
// runs and nothing of G's size leaves the device.
//
// Shapes (l = k + p oversampled columns, capped at min(m, n); q power
// iterations):
//
//	Omega  n x l   Gaussian, drawn on the host (PCG of math/rand/v2, keyed
//	               by the caller's seed) and uploaded
//	Y      m x l   Y = G Omega, then orthonormalised: Q
//	Z      n x l   q times: Z = G^T Q, orthonormalised; Y = G Z,
//	               orthonormalised: Q
//	Bt     n x l   Bt = G^T Q (B = Q^T G, stored transposed)
//	B B^T  l x l   Bt^T Bt (Gemm, fp32), eigendecomposed on the host:
//	               B B^T = U_B diag(sigma^2) U_B^T (cyclic Jacobi, float64)
//	U      m x k   Q U_B[:, :k]
//	V      n x k   Bt U_B[:, :k] diag(1/sigma)
//	sigma  k       descending, returned to the host
//
// Orthonormalisation is Cholesky-QR on the device: Gram = X^T X (Gemm,
// fp32 output), downloaded; its Cholesky factor R (Gram = R^T R) in
// float64 on the host; R^-1 uploaded and X R^-1 by Gemm. One pass squares
// X's condition number, and Y = G Omega after power iterations is as
// ill-conditioned as G's spectrum is steep, so: the first pass is shifted
// (Gram + s I with s = 1e-6 of Gram's largest diagonal, raised tenfold
// until the factorisation succeeds: "shifted CholeskyQR", Fukaya et al.
// 2020), which bounds the first Q's condition number by about 10^3; then
// unshifted passes follow while the new Gram is further from the identity
// than the storage type allows (orthoTol), at most maxPasses in all: two
// (CholeskyQR2) for a well-conditioned X, three for a steep spectrum.
// Only l x l matrices cross the link: each pass's Gram down and R^-1 up,
// the final Gram down and two l x k factors up.
//
// Storage. The workspaces (Omega, Y, Z, Q, Bt: two ping-pong buffers of
// max(m, n) x l; R^-1 and the U_B factors: l x l) have G's dtype, since the
// CUDA Gemm takes bf16 A and B only (fp32 or bf16 C): a bf16 G runs
// everywhere, an fp32 G on the CPU backend (and is refused, as the GPU
// would, by its KernelDTypes mode). The Grams are fp32. U and V may be fp32
// or bf16.
//
// Accuracy (rsvd_test.go, against a float64 SVD, p = 10, q = 2, ragged
// shapes up to 300 x 200, k up to 16). With fp32 storage the largest
// principal angle of the top-k subspaces has sin < 1e-6 where the
// spectrum has a gap after k (or is steep), < 4e-5 for a gapless 0.8^j
// decay; singular values agree to 2e-7 of sigma_1, U and V are
// orthonormal to 4e-7. bf16 storage rounds every product's output to 8
// bits: sin < 4e-3, values within 3e-3 of sigma_1, orthonormal to 9e-3.
// Singular values come from B B^T's eigenvalues, sigma^2 in an fp32
// Gram: sigma_i carries an error of about 1e-7 sigma_1^2 / sigma_i, so
// values far below sigma_1 (sigma_i < 1e-3 sigma_1) are not resolved.
//
// Rank. A gradient of fewer tokens than k has rank below k. Values at or
// below 1e-6 sigma_1 (rankRel) are returned as 0 and their columns of V
// as zeros (V = B^T U_B / sigma would divide by them); U keeps k
// orthonormal columns, those beyond the rank an orthonormal completion
// inside the range found. A zero G (sigma_1 = 0) is ErrRankDeficient.
//
// Cost (FLOPs): 2 (q + 1) products with G and G^T of 2 m n l flops each,
// plus the orthonormalisations' l^2-sized Gemms. For a 7B MLP matrix
// (4096 x 11008, k = 512, p = 10, q = 2) about 3.8e11 flops, of which
// 2.8e11 the G products, against about 1.3e12 for a full SVD (4 m^2 n +
// 8 m^3, Golub and Van Loan); the host's share (Cholesky, l^3/3 each,
// and Jacobi, about 72 l^3 for l = 522) is about 1e10.
//
// Limits: one matrix at a time on one stream; every pass synchronizes the
// stream (the Gram is read back), so a refresh belongs outside a step's
// pipelined part. The host Jacobi costs about 9 l^3 flops a sweep, 5 to
// 10 sweeps: for l = 522 about 2 s on one core (2.8 s for a random
// symmetric matrix), more than the device's share on a GPU; a caller
// refreshing many matrices runs their Jacobis on host goroutines. The
// host keeps Omega (n x l fp32: 23 MB at 11008 x 522) beside the device
// workspace (24.6 MB bf16 at the 7B shape above).

package rsvd

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// Defaults for the oversampling p and the power iterations q: Halko et
// al. recommend p of 5 to 10, and q of 1 or 2 for slowly decaying
// spectra, as gradients' are.
const (
	DefaultOversample = 10
	DefaultPowerIters = 2
)

// maxPasses is the most Cholesky-QR passes of one orthonormalisation:
// a shifted one and two more.
const maxPasses = 3

// shiftRel is the first pass's shift relative to the Gram's largest
// diagonal entry: above the fp32 Gram's rounding (~1e-7 sqrt(rows)
// relative), far below any direction that matters for the top k.
const shiftRel = 1e-6

// rankRel is the smallest sigma_j / sigma_1 that Compute returns: at or
// below it the value is returned as 0 and V's column as zeros (the file
// header, "Rank"); the fp32 Gram of B B^T does not resolve it anyway.
const rankRel = 1e-6

// ErrRankDeficient is returned (wrapped) when G has no range to find:
// G (or G Omega) is zero, or a Gram stays indefinite with a shift of up
// to its whole diagonal.
var ErrRankDeficient = errors.New("matrix numerically rank deficient")

// orthoTol is how far from the identity (largest entry of |Q^T Q - I|) a
// Cholesky-QR pass may leave Q for the orthonormalisation to stop:
// above the storage type's rounding of Q (bf16: 8 bits; fp32: the Gram's
// fp32 sums), so that no pass is spent below what storage can hold.
func orthoTol(dt backend.DType) float64 {
	if dt == backend.BF16 {
		return 1e-2
	}
	return 1e-5
}

// oversampled is l = k + p capped at min(m, n).
func oversampled(m, n, k, p int) int { return min(k+p, m, n) }

// checkDims validates the shape arguments of a workspace.
func checkDims(m, n, k, p int, dt backend.DType) error {
	switch {
	case m < 1 || n < 1:
		return fmt.Errorf("rsvd: matrix %d x %d: both sizes must be positive", m, n)
	case k < 1 || k > min(m, n):
		return fmt.Errorf("rsvd: k = %d for a %d x %d matrix: want 1 <= k <= min(m, n) = %d", k, m, n, min(m, n))
	case p < 0:
		return fmt.Errorf("rsvd: oversampling p = %d: want p >= 0", p)
	case dt != backend.F32 && dt != backend.BF16:
		return fmt.Errorf("rsvd: dtype %v: want fp32 or bf16", dt)
	}
	return nil
}

// WorkspaceBytes is the device memory of NewWorkspace(be, m, n, k, p, dt)
// for a memory plan: two max(m, n) x l buffers and an l x l one of dt,
// and an fp32 l x l Gram (l = min(k+p, m, n)); 0 for arguments
// NewWorkspace refuses.
func WorkspaceBytes(m, n, k, p int, dt backend.DType) int64 {
	if checkDims(m, n, k, p, dt) != nil {
		return 0
	}
	l := int64(oversampled(m, n, k, p))
	es := int64(dt.Size())
	return 2*int64(max(m, n))*l*es + l*l*es + l*l*4
}

// FLOPs is the arithmetic of one Compute for an m x n matrix, rank k,
// oversampling p and q power iterations: the device Gemms (2 (q+1)
// products with G or G^T; each orthonormalisation counted as two
// Cholesky-QR passes of a Gram and a triangular product; the final Gram
// and U and V) and the host's Cholesky factorisations and inverses and
// Jacobi sweeps (estimated at 8 sweeps of 9 l^3). For 4096 x 11008, k =
// 512, p = 10, q = 2 it is about 3.8e11 (2.8e11 of it the products with
// G), against about 1.3e12 for a full SVD of the same matrix.
func FLOPs(m, n, k, p, q int) float64 {
	if checkDims(m, n, k, p, backend.F32) != nil || q < 0 {
		return 0
	}
	fm, fn, fk := float64(m), float64(n), float64(k)
	l := float64(oversampled(m, n, k, p))
	fq := float64(q)
	products := 2 * (fq + 1) * 2 * fm * fn * l
	const passes = 2
	orth := passes * 4 * l * l * ((fq+1)*fm + fq*fn)
	final := 2*fn*l*l + 2*fm*l*fk + 2*fn*l*fk
	return products + orth + final + HostFLOPs(m, n, k, p, q)
}

// HostFLOPs is the host's share of FLOPs: the Cholesky factorisations and
// inverses of the orthonormalisations' Grams and the Jacobi sweeps of the
// final one, all l x l (about 72 l^3, 1e10 at l = 522, which took 2 s on
// one core here: about 5e9 flops a second).
func HostFLOPs(m, n, k, p, q int) float64 {
	if checkDims(m, n, k, p, backend.F32) != nil || q < 0 {
		return 0
	}
	l := float64(oversampled(m, n, k, p))
	const passes = 2
	return (2*float64(q)+1)*passes*(2.0/3)*l*l*l + 8*9*l*l*l
}

// Workspace holds the device buffers of one (m, n, k, p, dtype) and the
// host scratch, allocated once and reused by every Compute. Only the
// backend's device goroutine may use it.
type Workspace struct {
	be         backend.Backend
	m, n, k, l int
	dt         backend.DType

	a, b  backend.Tensor // max(m, n) x l of dt each: Omega, Y, Z, Q, Bt in turn
	small backend.Tensor // l x l of dt: R^-1, then the U_B factors
	gram  backend.Tensor // l x l fp32

	omega []float32 // n x l host draw
	host  []float32 // l x l host scratch

	passes []int // Cholesky-QR passes of each orthonormalisation of the last Compute
}

// NewWorkspace allocates the buffers for the top-k triplets of m x n
// matrices of dtype dt (fp32 or bf16) with oversampling p (l = min(k+p,
// m, n) columns): WorkspaceBytes(m, n, k, p, dt) of device memory.
func NewWorkspace(be backend.Backend, m, n, k, p int, dt backend.DType) (*Workspace, error) {
	if err := checkDims(m, n, k, p, dt); err != nil {
		return nil, err
	}
	l := oversampled(m, n, k, p)
	w := &Workspace{be: be, m: m, n: n, k: k, l: l, dt: dt}
	var err error
	alloc := func(name string, n int, dt backend.DType) backend.Tensor {
		if err != nil {
			return backend.Tensor{}
		}
		var t backend.Tensor
		t, err = be.Alloc(name, n, dt)
		if err != nil {
			err = fmt.Errorf("rsvd: workspace for %d x %d, k = %d, l = %d (%d bytes): %w", m, n, k, l, WorkspaceBytes(m, n, k, p, dt), err)
		}
		return t
	}
	w.a = alloc("rsvd panel a", max(m, n)*l, dt)
	w.b = alloc("rsvd panel b", max(m, n)*l, dt)
	w.small = alloc("rsvd small", l*l, dt)
	w.gram = alloc("rsvd gram", l*l, backend.F32)
	if err != nil {
		w.Free()
		return nil, err
	}
	w.omega = make([]float32, n*l)
	w.host = make([]float32, l*l)
	return w, nil
}

// Free releases the device buffers; w may not be used afterwards.
func (w *Workspace) Free() {
	for _, t := range []*backend.Tensor{&w.a, &w.b, &w.small, &w.gram} {
		if t.Buf != nil {
			w.be.Free(*t)
			*t = backend.Tensor{}
		}
	}
}

// Bytes is the device memory w holds (WorkspaceBytes of its arguments).
func (w *Workspace) Bytes() int64 {
	return w.a.Bytes() + w.b.Bytes() + w.small.Bytes() + w.gram.Bytes()
}

// Columns is l, the oversampled width the range finder uses.
func (w *Workspace) Columns() int { return w.l }

// Passes is the number of Cholesky-QR passes each orthonormalisation of
// the last Compute took, in order (Y, then Z and Y per power iteration).
func (w *Workspace) Passes() []int { return append([]int(nil), w.passes...) }

// Compute writes G's top-k left singular vectors to U (m x k, row-major:
// column j is vector j) and right ones to V (n x k) and returns the k
// singular values, descending (those at or below 1e-6 of the first as 0,
// with zero columns of V: the file header, "Rank"). G is m x n row-major of the workspace's
// dtype; U and V are fp32 or bf16 and must not overlap G or the
// workspace. q >= 0 power iterations; seed keys Omega (the same seed, G
// and backend give the same bits). Compute enqueues on s and synchronizes
// it (every orthonormalisation reads a Gram back).
func (w *Workspace) Compute(s backend.Stream, G, U, V backend.Tensor, q int, seed uint64) ([]float64, error) {
	m, n, k, l := w.m, w.n, w.k, w.l
	where := fmt.Sprintf("rsvd of %d x %d, k = %d, l = %d", m, n, k, l)
	switch {
	case w.gram.Buf == nil:
		return nil, fmt.Errorf("%s: workspace used after Free", where)
	case G.Len() != m*n:
		return nil, fmt.Errorf("%s: G %v has %d elements, want %d", where, G, G.Len(), m*n)
	case G.DType != w.dt:
		return nil, fmt.Errorf("%s: G %v is %v, the workspace %v", where, G, G.DType, w.dt)
	case U.Len() != m*k || (U.DType != backend.F32 && U.DType != backend.BF16):
		return nil, fmt.Errorf("%s: U %v: want %d fp32 or bf16 elements (m x k)", where, U, m*k)
	case V.Len() != n*k || (V.DType != backend.F32 && V.DType != backend.BF16):
		return nil, fmt.Errorf("%s: V %v: want %d fp32 or bf16 elements (n x k)", where, V, n*k)
	case q < 0:
		return nil, fmt.Errorf("%s: %d power iterations: want q >= 0", where, q)
	}
	be := w.be
	w.passes = w.passes[:0]

	// Omega, n x l, in panel a.
	rng := rand.New(rand.NewPCG(seed, 0x5253_5644_0000_0001)) // "RSVD" stream
	for i := range w.omega {
		w.omega[i] = float32(rng.NormFloat64())
	}
	omega := w.a.Slice(0, n*l, n, l)
	if err := backend.Upload(be, s, omega, w.omega); err != nil {
		return nil, fmt.Errorf("%s: upload Omega: %w", where, err)
	}

	// Y = G Omega into panel b; Q into whichever panel orth leaves it in.
	Y := w.b.Slice(0, m*l, m, l)
	if err := be.Gemm(s, false, false, m, l, n, 1, G, omega, 0, Y); err != nil {
		return nil, fmt.Errorf("%s: Y = G Omega: %w", where, err)
	}
	Q, spare, err := w.orth(s, Y, w.a, m)
	if err != nil {
		return nil, fmt.Errorf("%s: Y: %w", where, err)
	}
	for it := range q {
		Z := spare.Slice(0, n*l, n, l)
		if err := be.Gemm(s, true, false, n, l, m, 1, G, Q, 0, Z); err != nil {
			return nil, fmt.Errorf("%s: power iteration %d: Z = G^T Q: %w", where, it+1, err)
		}
		Zq, spare2, err := w.orth(s, Z, panelOf(Q, w), n)
		if err != nil {
			return nil, fmt.Errorf("%s: power iteration %d: Z: %w", where, it+1, err)
		}
		Y := spare2.Slice(0, m*l, m, l)
		if err := be.Gemm(s, false, false, m, l, n, 1, G, Zq, 0, Y); err != nil {
			return nil, fmt.Errorf("%s: power iteration %d: Y = G Z: %w", where, it+1, err)
		}
		if Q, spare, err = w.orth(s, Y, panelOf(Zq, w), m); err != nil {
			return nil, fmt.Errorf("%s: power iteration %d: Y: %w", where, it+1, err)
		}
	}

	// Bt = G^T Q (n x l) and B B^T = Bt^T Bt (l x l).
	Bt := spare.Slice(0, n*l, n, l)
	if err := be.Gemm(s, true, false, n, l, m, 1, G, Q, 0, Bt); err != nil {
		return nil, fmt.Errorf("%s: B^T = G^T Q: %w", where, err)
	}
	bbt, err := w.gramOf(s, Bt, n)
	if err != nil {
		return nil, fmt.Errorf("%s: B B^T: %w", where, err)
	}
	lam, vecs := jacobiEigen(bbt, l)
	sigma := make([]float64, k)
	for i := range sigma {
		sigma[i] = math.Sqrt(max(lam[i], 0))
	}
	if !(sigma[0] > 0) || math.IsInf(sigma[0], 0) {
		return nil, fmt.Errorf("%s: sigma_1 = %g: %w", where, sigma[0], ErrRankDeficient)
	}
	for j := range sigma {
		if sigma[j] <= rankRel*sigma[0] {
			sigma[j] = 0
		}
	}

	// U = Q U_B[:, :k]; V = Bt U_B[:, :k] diag(1/sigma).
	fac := w.small.Slice(0, l*k, l, k)
	for i := range l {
		for j := range k {
			w.host[i*k+j] = float32(vecs[i*l+j])
		}
	}
	if err := backend.Upload(be, s, fac, w.host[:l*k]); err != nil {
		return nil, fmt.Errorf("%s: upload U_B: %w", where, err)
	}
	if err := be.Gemm(s, false, false, m, k, l, 1, Q, fac, 0, U); err != nil {
		return nil, fmt.Errorf("%s: U = Q U_B: %w", where, err)
	}
	for i := range l {
		for j := range k {
			if sigma[j] > 0 {
				w.host[i*k+j] = float32(vecs[i*l+j] / sigma[j])
			} else {
				w.host[i*k+j] = 0
			}
		}
	}
	// Upload enqueues its copy on s after U's Gemm, which reads fac.
	if err := backend.Upload(be, s, fac, w.host[:l*k]); err != nil {
		return nil, fmt.Errorf("%s: upload U_B / sigma: %w", where, err)
	}
	if err := be.Gemm(s, false, false, n, k, l, 1, Bt, fac, 0, V); err != nil {
		return nil, fmt.Errorf("%s: V = B^T U_B / sigma: %w", where, err)
	}
	if err := be.Synchronize(s); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return sigma, nil
}

// gramOf returns X^T X (X rows x l on the device) as a symmetric float64
// l x l host matrix: an fp32 Gemm, read back.
func (w *Workspace) gramOf(s backend.Stream, X backend.Tensor, rows int) ([]float64, error) {
	l := w.l
	if err := w.be.Gemm(s, true, false, l, l, rows, 1, X, X, 0, w.gram.Slice(0, l*l, l, l)); err != nil {
		return nil, fmt.Errorf("Gram X^T X: %w", err)
	}
	if err := w.be.Staging().DownloadInto(s, w.host, w.gram); err != nil {
		return nil, fmt.Errorf("download Gram: %w", err)
	}
	g := make([]float64, l*l)
	for i := range l {
		for j := range l {
			// Symmetrize: the Gemm's two triangles may round differently.
			g[i*l+j] = (float64(w.host[i*l+j]) + float64(w.host[j*l+i])) / 2
		}
	}
	return g, nil
}

// orth orthonormalises the columns of X (rows x l, a view of one panel)
// by Cholesky-QR passes (the file header), ping-ponging between X's panel
// and other. It returns the view holding Q and the panel left free.
func (w *Workspace) orth(s backend.Stream, X, other backend.Tensor, rows int) (Q, spare backend.Tensor, err error) {
	l := w.l
	cur, nxt := X, other.Slice(0, rows*l, rows, l)
	passes := 0
	defer func() { w.passes = append(w.passes, passes) }()
	for passes < maxPasses {
		g, err := w.gramOf(s, cur, rows)
		if err != nil {
			return Q, spare, fmt.Errorf("pass %d: %w", passes+1, err)
		}
		if passes > 0 && offIdentity(g, l) <= orthoTol(w.dt) {
			break
		}
		shift := 0.0
		if passes == 0 {
			shift = shiftRel
		}
		rinv, err := cholInverse(g, l, shift)
		if err != nil {
			return Q, spare, fmt.Errorf("pass %d: %w", passes+1, err)
		}
		for i, v := range rinv {
			w.host[i] = float32(v)
		}
		rt := w.small.Slice(0, l*l, l, l)
		if err := backend.Upload(w.be, s, rt, w.host); err != nil {
			return Q, spare, fmt.Errorf("pass %d: upload R^-1: %w", passes+1, err)
		}
		if err := w.be.Gemm(s, false, false, rows, l, l, 1, cur, rt, 0, nxt); err != nil {
			return Q, spare, fmt.Errorf("pass %d: Q = X R^-1: %w", passes+1, err)
		}
		cur, nxt = nxt, cur
		passes++
	}
	return cur, panelOf(nxt, w), nil
}

// panelOf is the whole panel (a or b) that view t lies in.
func panelOf(t backend.Tensor, w *Workspace) backend.Tensor {
	if t.Buf == w.a.Buf {
		return w.a
	}
	return w.b
}

// offIdentity is the largest |g_ij - delta_ij| of an l x l matrix.
func offIdentity(g []float64, l int) float64 {
	worst := 0.0
	for i := range l {
		for j := range l {
			d := g[i*l+j]
			if i == j {
				d -= 1
			}
			worst = max(worst, math.Abs(d))
		}
	}
	return worst
}

// cholInverse returns R^-1 (l x l, row-major, upper triangular) for the
// Cholesky factor R of g + shift*max(diag g)*I (g = R^T R). With shift 0
// it first tries no shift; on a non-positive pivot the shift grows
// tenfold from shiftRel, six times at most. A zero diagonal (X = 0) is
// ErrRankDeficient.
func cholInverse(g []float64, l int, shift float64) ([]float64, error) {
	dmax := 0.0
	for i := range l {
		dmax = max(dmax, g[i*l+i])
	}
	if math.IsNaN(dmax) || math.IsInf(dmax, 0) {
		return nil, fmt.Errorf("Gram's diagonal is not finite (%g): G holds a NaN or an infinity, or overflows fp32", dmax)
	}
	if !(dmax > 0) {
		return nil, fmt.Errorf("Gram's largest diagonal entry is %g: %w", dmax, ErrRankDeficient)
	}
	r := make([]float64, l*l)
	for try := 0; try < 7; try++ {
		if chol(g, r, l, shift*dmax) {
			return triInverse(r, l), nil
		}
		if shift == 0 {
			shift = shiftRel
		} else {
			shift *= 10
		}
	}
	return nil, fmt.Errorf("Cholesky of the %d x %d Gram failed with a shift of %g of its diagonal: %w", l, l, shift/10, ErrRankDeficient)
}

// chol writes the upper Cholesky factor of g + ridge*I into r (g = R^T
// R); false on a non-positive or non-finite pivot.
func chol(g, r []float64, l int, ridge float64) bool {
	clear(r)
	for j := range l {
		d := g[j*l+j] + ridge
		for k := range j {
			d -= r[k*l+j] * r[k*l+j]
		}
		if !(d > 0) || math.IsInf(d, 0) {
			return false
		}
		rjj := math.Sqrt(d)
		r[j*l+j] = rjj
		for i := j + 1; i < l; i++ {
			v := g[j*l+i]
			for k := range j {
				v -= r[k*l+j] * r[k*l+i]
			}
			r[j*l+i] = v / rjj
		}
	}
	return true
}

// triInverse returns the inverse of the upper triangular r (l x l).
func triInverse(r []float64, l int) []float64 {
	inv := make([]float64, l*l)
	// Column j of R^-1 solves R x = e_j, by back substitution.
	for j := range l {
		for i := j; i >= 0; i-- {
			v := 0.0
			if i == j {
				v = 1
			}
			for t := i + 1; t <= j; t++ {
				v -= r[i*l+t] * inv[t*l+j]
			}
			inv[i*l+j] = v / r[i*l+i]
		}
	}
	return inv
}

// jacobiEigen is the eigendecomposition of the symmetric l x l matrix a
// (row-major) by cyclic Jacobi rotations in float64: eigenvalues
// descending and the eigenvectors as the columns of an l x l row-major
// matrix, in the same order. Sweeps stop when the off-diagonal mass is
// below 1e-30 of the total (rounding level), 60 at most; a rotation whose
// a_pq no longer changes a_pp or a_qq at 100 times its size is dropped
// (a_pq set to 0, as Numerical Recipes' jacobi), so that the last sweeps
// are cheap. Each rotation updates rows p and q (contiguous) and mirrors
// them into columns p and q, and rotates rows p and q of V^T: about
// 9 l^3 flops a sweep, and 5 to 10 sweeps (8 for l = 522 on a
// gradient-like spectrum).
func jacobiEigen(a []float64, l int) ([]float64, []float64) {
	a = append([]float64(nil), a...)
	vt := make([]float64, l*l) // V^T: row i is eigenvector i
	for i := range l {
		vt[i*l+i] = 1
	}
	total := 0.0
	for _, x := range a {
		total += x * x
	}
	for sweep := 0; sweep < 60; sweep++ {
		off := 0.0
		for i := range l {
			for j := i + 1; j < l; j++ {
				off += a[i*l+j] * a[i*l+j]
			}
		}
		if off <= 1e-30*total {
			break
		}
		for p := range l {
			rp := a[p*l : (p+1)*l]
			for q := p + 1; q < l; q++ {
				apq := rp[q]
				if apq == 0 {
					continue
				}
				rq := a[q*l : (q+1)*l]
				app, aqq := rp[p], rq[q]
				if g := 100 * math.Abs(apq); math.Abs(app)+g == math.Abs(app) && math.Abs(aqq)+g == math.Abs(aqq) {
					rp[q], rq[p] = 0, 0
					continue
				}
				// Rotation zeroing a_pq (Golub and Van Loan, 8.5.2):
				// A' = J^T A J, rows p and q of J^T A for k != p, q,
				// then the 2 x 2 block, then the mirror.
				t, c, sn := jacobiRotation((aqq - app) / (2 * apq))
				rotate(rp, rq, c, sn)
				rp[p], rq[q] = app-t*apq, aqq+t*apq
				rp[q], rq[p] = 0, 0
				for k := range l {
					if k != p && k != q {
						a[k*l+p], a[k*l+q] = rp[k], rq[k]
					}
				}
				rotate(vt[p*l:(p+1)*l], vt[q*l:(q+1)*l], c, sn)
			}
		}
	}
	order := make([]int, l)
	for i := range order {
		order[i] = i
	}
	// Insertion sort by eigenvalue, descending (l is small).
	for i := 1; i < l; i++ {
		for j := i; j > 0 && a[order[j]*l+order[j]] > a[order[j-1]*l+order[j-1]]; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	lam := make([]float64, l)
	vecs := make([]float64, l*l)
	for c, o := range order {
		lam[c] = a[o*l+o]
		for r := range l {
			vecs[r*l+c] = vt[o*l+r]
		}
	}
	return lam, vecs
}

// jacobiRotation is the plane rotation that zeroes the off-diagonal entry
// of a symmetric 2 x 2 matrix [app apq; apq aqq], from tau = (aqq - app) /
// (2 apq): t = tan theta, the smaller root of t^2 + 2 tau t - 1 = 0 (so
// |theta| <= pi/4, the stable choice), c = cos theta, s = sin theta. The
// tests' reference SVD rotates with the same formula.
func jacobiRotation(tau float64) (t, c, s float64) {
	t = 1 / (math.Abs(tau) + math.Sqrt(1+tau*tau))
	if tau < 0 {
		t = -t
	}
	c = 1 / math.Sqrt(1+t*t)
	return t, c, t * c
}

// rotate applies the rotation (c, s) to the pair (x, y) in place: x' = c x
// - s y, y' = s x + c y, elementwise.
func rotate(x, y []float64, c, s float64) {
	for k := range x {
		a, b := x[k], y[k]
		x[k] = c*a - s*b
		y[k] = s*a + c*b
	}
}
