// gemm_test.go: tests of Sgemm on every SIMD path this CPU supports against
// a float64 reference (ragged shapes, strides, all transposes, alpha/beta),
// bit-for-bit invariance under thread count and K super-blocking, argument
// errors, and benchmarks on GPT-2 124M shapes reporting GFLOP/s.

package host

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// gemmCase is one product; the pads add unused columns to each stride.
type gemmCase struct {
	M, N, K          int
	padA, padB, padC int
}

var gemmShapes = []gemmCase{
	{1, 1, 1, 0, 0, 0},
	{7, 5, 3, 0, 0, 0},
	{17, 33, 65, 0, 0, 0},
	{64, 64, 64, 0, 0, 0},
	{100, 257, 31, 0, 0, 0},
	{15, 33, 300, 0, 0, 0}, // more than one K-block on every path
	{29, 47, 13, 3, 5, 7},
	{64, 64, 64, 1, 16, 9},
	{5, 3100, 20, 0, 0, 0}, // several column blocks and chunks
	{180, 40, 50, 2, 0, 1}, // several row tasks
}

// gemmMats builds A, B, C for c with strides padded by c.pad*; the padding
// holds NaN so reading it shows up in the result.
type gemmMats struct {
	A, B, C       []float32
	lda, ldb, ldc int
}

func newGemmMats(rng *rand.Rand, c gemmCase, transA, transB bool, cFill float32, cRandom bool) gemmMats {
	ar, ac := c.M, c.K
	if transA {
		ar, ac = c.K, c.M
	}
	br, bc := c.K, c.N
	if transB {
		br, bc = c.N, c.K
	}
	m := gemmMats{lda: ac + c.padA, ldb: bc + c.padB, ldc: c.N + c.padC}
	fill := func(rows, cols, ld int, random bool, v float32) []float32 {
		s := make([]float32, max(0, (rows-1)*ld+cols))
		for i := range s {
			s[i] = float32(math.NaN())
		}
		for i := range rows {
			for j := range cols {
				if random {
					s[i*ld+j] = float32(rng.Float64()*2 - 1)
				} else {
					s[i*ld+j] = v
				}
			}
		}
		return s
	}
	m.A = fill(ar, ac, m.lda, true, 0)
	m.B = fill(br, bc, m.ldb, true, 0)
	m.C = fill(c.M, c.N, m.ldc, cRandom, cFill)
	return m
}

// refGemm returns the float64 result and, per element, the scale
// |alpha| sum_k |a||b| + |beta c| its rounding error is measured against.
func refGemm(c gemmCase, transA, transB bool, alpha float32, m gemmMats, beta float32) (ref, scale []float64) {
	ref = make([]float64, c.M*c.N)
	scale = make([]float64, c.M*c.N)
	for i := range c.M {
		for j := range c.N {
			var s, sa float64
			for k := range c.K {
				var a, b float64
				if transA {
					a = float64(m.A[k*m.lda+i])
				} else {
					a = float64(m.A[i*m.lda+k])
				}
				if transB {
					b = float64(m.B[j*m.ldb+k])
				} else {
					b = float64(m.B[k*m.ldb+j])
				}
				s += a * b
				sa += math.Abs(a * b)
			}
			r := float64(alpha) * s
			sc := math.Abs(float64(alpha)) * sa
			if beta != 0 {
				cv := float64(beta) * float64(m.C[i*m.ldc+j])
				r += cv
				sc += math.Abs(cv)
			}
			ref[i*c.N+j], scale[i*c.N+j] = r, sc
		}
	}
	return ref, scale
}

// gemmTol is the error allowed relative to scale: float32 sums over at
// most a few hundred terms, blocked, stay well inside 1e-5.
const gemmTol = 1e-5

// withSIMD runs fn with path s active, restoring the previous path.
func withSIMD(t testing.TB, s SIMD, fn func()) {
	t.Helper()
	prev, err := SetSIMD(s)
	if err != nil {
		t.Fatal(err)
	}
	defer SetSIMD(prev)
	fn()
}

// eachSIMD runs fn once with each supported SIMD path active (scalar
// first), and leaves the path that was active before.
func eachSIMD(t testing.TB, fn func(s SIMD)) {
	t.Helper()
	for _, s := range SupportedSIMD() {
		withSIMD(t, s, func() { fn(s) })
	}
}

func TestSgemmMatchesReference(t *testing.T) {
	betas := []struct {
		name    string
		alpha   float32
		beta    float32
		cRandom bool
	}{
		{"beta0-nanC", 1, 0, false},
		{"beta1", 1, 1, true},
		{"alpha-0.5-beta0.25", -0.5, 0.25, true},
	}
	for _, c := range gemmShapes {
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			for _, ab := range betas {
				name := fmt.Sprintf("%dx%dx%d-pad%d.%d.%d/t%v%v/%s", c.M, c.N, c.K, c.padA, c.padB, c.padC, tr[0], tr[1], ab.name)
				t.Run(name, func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(c.M*1000+c.N), uint64(c.K)))
					m := newGemmMats(rng, c, tr[0], tr[1], float32(math.NaN()), ab.cRandom)
					ref, scale := refGemm(c, tr[0], tr[1], ab.alpha, m, ab.beta)
					c0 := m.C
					for _, s := range SupportedSIMD() {
						m.C = append([]float32(nil), c0...)
						withSIMD(t, s, func() {
							if err := Sgemm(tr[0], tr[1], c.M, c.N, c.K, ab.alpha, m.A, m.lda, m.B, m.ldb, ab.beta, m.C, m.ldc); err != nil {
								t.Fatalf("%v: %v", s, err)
							}
						})
						checkGemm(t, s, c, m, ref, scale)
					}
				})
			}
		}
	}
}

// checkGemm compares m.C with ref and checks that the padding of C kept
// its NaNs (Sgemm wrote nothing outside the matrix).
func checkGemm(t *testing.T, s SIMD, c gemmCase, m gemmMats, ref, scale []float64) {
	t.Helper()
	bad := 0
	for i := range c.M {
		for j := range c.N {
			got := float64(m.C[i*m.ldc+j])
			want := ref[i*c.N+j]
			if !(math.Abs(got-want) <= gemmTol*scale[i*c.N+j]+1e-30) {
				if bad++; bad <= 3 {
					t.Errorf("%v: C[%d][%d] = %g, want %g (tol %g)", s, i, j, got, want, gemmTol*scale[i*c.N+j])
				}
			}
		}
		for j := c.N; j < m.ldc && i*m.ldc+j < len(m.C); j++ {
			if v := m.C[i*m.ldc+j]; !math.IsNaN(float64(v)) {
				t.Fatalf("%v: padding C[%d][%d] overwritten with %g", s, i, j, v)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%v: %d of %d elements out of tolerance", s, bad, c.M*c.N)
	}
}

// TestSgemmThreadInvariance checks that results are bit-identical for any
// thread count and any K super-block size, on every path and layout.
func TestSgemmThreadInvariance(t *testing.T) {
	c := gemmCase{M: 150, N: 300, K: 700, padA: 1, padB: 2, padC: 3}
	if testing.Short() {
		c = gemmCase{M: 71, N: 150, K: 600, padA: 1, padB: 2, padC: 3}
	}
	defer SetThreads(SetThreads(1))
	defer func(v int) { gemmPackFloats = v }(gemmPackFloats)
	for _, s := range SupportedSIMD() {
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			t.Run(fmt.Sprintf("%v/t%v%v", s, tr[0], tr[1]), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(1, 2))
				base := newGemmMats(rng, c, tr[0], tr[1], 0, true)
				run := func(threads, packFloats int) []float32 {
					SetThreads(threads)
					gemmPackFloats = packFloats
					out := append([]float32(nil), base.C...)
					withSIMD(t, s, func() {
						if err := Sgemm(tr[0], tr[1], c.M, c.N, c.K, 0.75, base.A, base.lda, base.B, base.ldb, 1.5, out, base.ldc); err != nil {
							t.Fatal(err)
						}
					})
					return out
				}
				want := run(1, 1<<21)
				for _, cfg := range [][2]int{{2, 1 << 21}, {3, 1 << 21}, {7, 1 << 21}, {1, 1}, {3, 1}} {
					got := run(cfg[0], cfg[1])
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
							t.Fatalf("threads=%d packFloats=%d: C[%d] = %08x, 1 thread gives %08x", cfg[0], cfg[1], i, math.Float32bits(got[i]), math.Float32bits(want[i]))
						}
					}
				}
			})
		}
	}
}

func TestSgemmDegenerate(t *testing.T) {
	nan := float32(math.NaN())
	tests := []struct {
		name    string
		M, N, K int
		alpha   float32
		beta    float32
		c       []float32
		want    []float32
	}{
		{"K0-beta0-nan", 2, 2, 0, 1, 0, []float32{nan, nan, nan, nan}, []float32{0, 0, 0, 0}},
		{"K0-beta2", 2, 2, 0, 1, 2, []float32{1, 2, 3, 4}, []float32{2, 4, 6, 8}},
		{"alpha0-beta0.5", 2, 2, 3, 0, 0.5, []float32{1, 2, 3, 4}, []float32{0.5, 1, 1.5, 2}},
		{"M0", 0, 3, 4, 1, 1, nil, nil},
		{"N0", 3, 0, 4, 1, 1, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			A := make([]float32, tc.M*tc.K)
			for i := range A {
				A[i] = nan // alpha == 0 or K == 0: A is not read
			}
			B := make([]float32, tc.K*tc.N)
			if err := Sgemm(false, false, tc.M, tc.N, tc.K, tc.alpha, A, max(1, tc.K), B, max(1, tc.N), tc.beta, tc.c, max(1, tc.N)); err != nil {
				t.Fatal(err)
			}
			for i := range tc.want {
				if tc.c[i] != tc.want[i] {
					t.Fatalf("C = %v, want %v", tc.c, tc.want)
				}
			}
		})
	}
}

func TestSgemmArgErrors(t *testing.T) {
	buf := func(n int) []float32 { return make([]float32, n) }
	tests := []struct {
		name           string
		transA, transB bool
		M, N, K        int
		A              []float32
		lda            int
		B              []float32
		ldb            int
		C              []float32
		ldc            int
	}{
		{"negative M", false, false, -1, 2, 2, buf(4), 2, buf(4), 2, buf(4), 2},
		{"A short", false, false, 3, 4, 5, buf(14), 5, buf(20), 4, buf(12), 4},
		{"A short transA", true, false, 3, 4, 5, buf(14), 3, buf(20), 4, buf(12), 4},
		{"lda small", false, false, 3, 4, 5, buf(100), 4, buf(20), 4, buf(12), 4},
		{"B short", false, false, 3, 4, 5, buf(15), 5, buf(19), 4, buf(12), 4},
		{"B short transB", false, true, 3, 4, 5, buf(15), 5, buf(19), 5, buf(12), 4},
		{"ldb small transB", false, true, 3, 4, 5, buf(15), 5, buf(100), 4, buf(12), 4},
		{"C short", false, false, 3, 4, 5, buf(15), 5, buf(20), 4, buf(11), 4},
		{"C short with stride", false, false, 3, 4, 5, buf(15), 5, buf(20), 4, buf(13), 5},
		{"ldc small", false, false, 3, 4, 5, buf(15), 5, buf(20), 4, buf(100), 3},
		{"ldc zero", false, false, 0, 0, 0, nil, 1, nil, 1, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Sgemm(tc.transA, tc.transB, tc.M, tc.N, tc.K, 1, tc.A, tc.lda, tc.B, tc.ldb, 0, tc.C, tc.ldc)
			if !errors.Is(err, ErrGemmArgs) {
				t.Fatalf("err = %v, want ErrGemmArgs", err)
			}
		})
	}
	// Exact lengths (the last row needs no padding) are fine.
	if err := Sgemm(false, false, 3, 4, 5, 1, buf(15), 5, buf(20), 4, 0, buf(14), 5); err != nil {
		t.Fatalf("C of 14 with ldc 5 for 3x4: %v", err)
	}
}

// TestSplitTiles checks that the tiles of a column block cover every row
// and panel exactly once, in whole micropanels of at most mc rows and nc
// columns, and give every thread work when there is enough; and that the
// schedule packs every panel once, before the tiles that read it.
func TestSplitTiles(t *testing.T) {
	p := gemmParams{mr: 14, nr: 32, kc: 384, mc: 168, nc: 768}
	tests := []struct{ M, npanels, threads int }{
		{1024, 24, 2}, {1024, 96, 2}, {1, 1, 1}, {1, 5, 7}, {13, 3, 2}, {15, 24, 7}, {3072, 24, 16}, {50257, 24, 3}, {100, 1, 3}, {30, 97, 5},
	}
	for _, tc := range tests {
		tiles := splitTiles(nil, tc.M, tc.npanels, tc.threads, p)
		seen := make([]int, tc.M*tc.npanels)
		for _, tl := range tiles {
			if tl.rows <= 0 || tl.rows > p.mc || tl.i0%p.mr != 0 || tl.np <= 0 || tl.np > p.nc/p.nr {
				t.Fatalf("M=%d panels=%d threads=%d: bad tile %+v", tc.M, tc.npanels, tc.threads, tl)
			}
			for i := tl.i0; i < tl.i0+tl.rows; i++ {
				for q := tl.p0; q < tl.p0+tl.np; q++ {
					seen[i*tc.npanels+q]++
				}
			}
		}
		for i, n := range seen {
			if n != 1 {
				t.Fatalf("M=%d panels=%d threads=%d: row %d panel %d covered %d times", tc.M, tc.npanels, tc.threads, i/tc.npanels, i%tc.npanels, n)
			}
		}
		if want := min(tc.threads, ceilDiv(tc.M, p.mr)*tc.npanels); len(tiles) < want {
			t.Errorf("M=%d panels=%d threads=%d: %d tiles, want at least %d", tc.M, tc.npanels, tc.threads, len(tiles), want)
		}

		// schedule: the same tiles, each chunk packed exactly once by
		// pieces listed before any of its tiles.
		sched, nchunks := schedule(nil, tc.M, tc.npanels, tc.threads, p)
		packed := make([]int, tc.npanels)
		var ntiles int
		for _, tk := range sched {
			if tk.pack {
				for q := tk.p0; q < tk.p0+tk.np; q++ {
					packed[q]++
				}
				continue
			}
			ntiles++
			for q := tk.p0; q < tk.p0+tk.np; q++ {
				if packed[q] != 1 {
					t.Fatalf("M=%d panels=%d threads=%d: tile %+v before panel %d is packed once", tc.M, tc.npanels, tc.threads, tk, q)
				}
			}
		}
		for q, n := range packed {
			if n != 1 {
				t.Fatalf("M=%d panels=%d threads=%d: panel %d packed %d times", tc.M, tc.npanels, tc.threads, q, n)
			}
		}
		if ntiles != len(tiles) || nchunks != tiles[len(tiles)-1].chunk+1 {
			t.Fatalf("M=%d panels=%d threads=%d: schedule has %d tiles in %d chunks, splitTiles %d", tc.M, tc.npanels, tc.threads, ntiles, nchunks, len(tiles))
		}
	}
}

// gpt2Shapes are the GPT-2 124M matmuls at B*T = 1024 (C=768, V=50257):
// forward y = x W (NN), backward dX = dY W^T (NT) and dW = X^T dY (TN).
var gpt2Shapes = []struct {
	name           string
	transA, transB bool
	M, N, K        int
}{
	{"qkv-fwd", false, false, 1024, 2304, 768},
	{"attproj-fwd", false, false, 1024, 768, 768},
	{"fc-fwd", false, false, 1024, 3072, 768},
	{"fcproj-fwd", false, false, 1024, 768, 3072},
	{"qkv-dX", false, true, 1024, 768, 2304},
	{"fc-dX", false, true, 1024, 768, 3072},
	{"qkv-dW", true, false, 768, 2304, 1024},
	{"fcproj-dW", true, false, 3072, 768, 1024},
}

func BenchmarkSgemm(b *testing.B) {
	for _, s := range gpt2Shapes {
		b.Run(s.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(3, 4))
			c := gemmCase{M: s.M, N: s.N, K: s.K}
			m := newGemmMats(rng, c, s.transA, s.transB, 0, true)
			b.ResetTimer()
			for b.Loop() {
				if err := Sgemm(s.transA, s.transB, s.M, s.N, s.K, 1, m.A, m.lda, m.B, m.ldb, 0, m.C, m.ldc); err != nil {
					b.Fatal(err)
				}
			}
			flops := 2 * float64(s.M) * float64(s.N) * float64(s.K)
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
