// sparse_test.go: the sparse cores on every SIMD path this CPU supports
// against plain Go loops (the train/cpu cores they replace) and against the
// scalar path, bit for bit: ragged shapes and token ranges, both compress
// layouts and odd strides, empty and long columns, values spanning denormals
// to overflow. Inputs end at a guard page, so a read past them faults.
// Also: invariance under splitting the range (threads), Inf/NaN inputs,
// argument errors, a float64 sanity check of the Go loops themselves, and
// benchmarks on the tiny and GPT-2 124M LSP shapes against the Go loops.

package host

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// goGather is the plain Go loop of compress (train/cpu before the C cores):
// colptr == nil means entries [a*r, (a+1)*r).
func goGather(out, x []float32, colptr []int32, r int, rowidx []int32, colval []float32, rows, d, sa, st, lo, hi int) {
	for t := lo; t < hi; t++ {
		xt := x[t*rows : (t+1)*rows]
		for a := range d {
			k0, k1 := a*r, (a+1)*r
			if colptr != nil {
				k0, k1 = int(colptr[a]), int(colptr[a+1])
			}
			var acc float32
			for k := k0; k < k1; k++ {
				acc += float32(colval[k] * xt[rowidx[k]])
			}
			out[a*sa+t*st] = acc
		}
	}
}

// goApplyT is the plain Go loop of T = Delta Q^T.
func goApplyT(T, Delta []float32, qidx []int32, qval []float32, n, d, r, lo, hi int) {
	for a := lo; a < hi; a++ {
		da := Delta[a*d : (a+1)*d]
		for j := range n {
			var acc float32
			for s := range r {
				acc += float32(da[qidx[j*r+s]] * qval[j*r+s])
			}
			T[a*n+j] = acc
		}
	}
}

// goS is the plain Go loop of S = A B.
func goS(S, A, B []float32, BT, d int, accumulate bool, lo, hi int) {
	acc := make([]float32, d)
	for a := lo; a < hi; a++ {
		clear(acc)
		for t, x := range A[a*BT : (a+1)*BT] {
			for b, y := range B[t*d : (t+1)*d] {
				acc[b] += float32(x * y)
			}
		}
		sa := S[a*d : (a+1)*d]
		for b := range sa {
			if accumulate {
				acc[b] += sa[b]
			}
			sa[b] = acc[b]
		}
	}
}

// goApplyW is the plain Go loop of the W update.
func goApplyW(w, T []float32, pidx []int32, pval []float32, n, r int, decay float32, lo, hi int) {
	upd := make([]float32, n)
	for i := lo; i < hi; i++ {
		clear(upd)
		for s := range r {
			p, ts := pval[i*r+s], T[int(pidx[i*r+s])*n:][:n]
			for j, x := range ts {
				upd[j] += float32(p * x)
			}
		}
		wi := w[i*n : (i+1)*n]
		for j := range wi {
			wi[j] = float32(decay*wi[j]) + upd[j]
		}
	}
}

// guarded returns n float32s (zeroed) that end right before an
// inaccessible page, so any read or write past them faults.
func guarded(t testing.TB, n int) []float32 {
	t.Helper()
	page := unix.Getpagesize()
	data := (n*4 + page - 1) / page * page
	mem, err := unix.Mmap(-1, 0, data+page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	if err := unix.Mprotect(mem[data:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		return nil
	}
	b := mem[data-n*4 : data]
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

// spValue draws a float32 of a kind chosen by mix: mostly moderate values,
// and some zeros (of both signs), denormals, tiny and huge magnitudes, so
// that sums underflow, round through denormals and overflow to Inf (and
// Inf - Inf to NaN, the one NaN x86 makes, so bits still compare).
func spValue(rng *rand.Rand, wild bool) float32 {
	sign := float32(1)
	if rng.IntN(2) == 0 {
		sign = -1
	}
	k := rng.IntN(100)
	if !wild {
		k = 99
	}
	switch {
	case k < 4:
		return sign * 0
	case k < 12: // denormal
		return sign * math.Float32frombits(uint32(1+rng.IntN(1<<23-1)))
	case k < 20: // near the smallest normals
		return sign * float32(rng.Float64()) * 1e-37
	case k < 26: // near overflow
		return sign * float32(1+rng.Float64()) * 1e37
	case k < 40: // any exponent
		return sign * math.Float32frombits(uint32(1+rng.IntN(254))<<23|uint32(rng.IntN(1<<23)))
	}
	return sign * float32(rng.Float64()*2)
}

func spFill(rng *rand.Rand, s []float32, wild bool) {
	for i := range s {
		s[i] = spValue(rng, wild)
	}
}

// spColumns draws column storage of d columns over rows rows: ragged
// lengths (empty columns included), row indices ascending when sorted, else
// in random order with repeats.
func spColumns(rng *rand.Rand, rows, d int, sorted, wild bool) (colptr, rowidx []int32, colval []float32) {
	colptr = make([]int32, d+1)
	for a := range d {
		var n int
		switch rng.IntN(6) {
		case 0:
			n = 0
		case 1:
			n = rows
		default:
			n = rng.IntN(rows + 1)
		}
		if sorted {
			for _, i := range rng.Perm(rows)[:n] {
				rowidx = append(rowidx, int32(i))
			}
			col := rowidx[len(rowidx)-n:]
			for i := 1; i < len(col); i++ { // insertion sort
				for j := i; j > 0 && col[j-1] > col[j]; j-- {
					col[j-1], col[j] = col[j], col[j-1]
				}
			}
		} else {
			for range n {
				rowidx = append(rowidx, int32(rng.IntN(rows)))
			}
		}
		colptr[a+1] = int32(len(rowidx))
	}
	colval = make([]float32, len(rowidx))
	spFill(rng, colval, wild)
	return colptr, rowidx, colval
}

// spPaths lists the paths to check, scalar first.
func spPaths() []SIMD { return SupportedSIMD() }

func bitsEqual(what string, got, want []float32) error {
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return fmt.Errorf("%s: element %d = %v (%#08x), want %v (%#08x)", what, i, got[i],
				math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
	return nil
}

// nanEqual is bitsEqual, except that any two NaNs match: with NaN inputs
// the payload that survives depends on operand order, which neither Go nor
// C fixes.
func nanEqual(what string, got, want []float32) error {
	for i := range want {
		g, w := got[i], want[i]
		if g != g && w != w {
			continue
		}
		if math.Float32bits(g) != math.Float32bits(w) {
			return fmt.Errorf("%s: element %d = %v, want %v", what, i, g, w)
		}
	}
	return nil
}

// checkPaths runs a core on every path, each time into a guarded copy of
// init, and fails the test unless every path gives want (the Go loop's
// bits) and the scalar path's bits.
func checkPaths(t *testing.T, name string, init, want []float32, run func(path SIMD, got []float32) error) {
	t.Helper()
	var scalar []float32
	for _, path := range spPaths() {
		got := guarded(t, len(init))
		copy(got, init)
		if err := run(path, got); err != nil {
			t.Fatalf("%s %v: %v", name, path, err)
		}
		if err := bitsEqual(fmt.Sprintf("%s %v vs Go", name, path), got, want); err != nil {
			t.Fatal(err)
		}
		if path == Scalar {
			scalar = got
		} else if err := bitsEqual(fmt.Sprintf("%s %v vs scalar", name, path), got, scalar); err != nil {
			t.Fatal(err)
		}
	}
}

type gatherCase struct {
	rows, d, BT, lo, hi int
	layout              string // "A" (sa = BT, st = 1), "B" (sa = 1, st = d) or "odd"
}

var gatherCases = []gatherCase{
	{1, 1, 1, 0, 1, "A"},
	{5, 3, 7, 2, 7, "A"},
	{5, 3, 7, 0, 7, "B"},
	{16, 16, 64, 0, 64, "A"},
	{16, 16, 64, 0, 64, "B"},
	{17, 33, 65, 0, 65, "A"},
	{17, 33, 65, 1, 65, "B"},
	{33, 17, 130, 3, 127, "A"},
	{33, 17, 130, 3, 127, "B"},
	{100, 40, 200, 0, 200, "A"},
	{100, 40, 200, 5, 170, "B"},
	{64, 128, 96, 0, 96, "B"},
	{9, 21, 50, 4, 45, "odd"},
	{24, 20, 33, 10, 10, "A"}, // empty range
}

// strides returns sa, st and the out length of c's layout.
func (c gatherCase) strides() (sa, st, n int) {
	switch c.layout {
	case "A":
		return c.BT, 1, c.d * c.BT
	case "B":
		return 1, c.d, c.BT * c.d
	}
	sa, st = 3, 3*c.d+2 // interleaved, with gaps
	return sa, st, (c.d-1)*sa + (c.BT-1)*st + 1
}

func TestSparseGatherBitExact(t *testing.T) {
	for ci, c := range gatherCases {
		for _, sorted := range []bool{true, false} {
			for _, wild := range []bool{false, true} {
				name := fmt.Sprintf("%d/%dx%d/BT%d[%d,%d)/%s/sorted=%v/wild=%v", ci, c.rows, c.d, c.BT, c.lo, c.hi, c.layout, sorted, wild)
				rng := rand.New(rand.NewPCG(uint64(ci), 7))
				colptr, rowidx, colval := spColumns(rng, c.rows, c.d, sorted, wild)
				x := guarded(t, c.hi*c.rows) // exactly the tokens read
				spFill(rng, x, wild)
				sa, st, n := c.strides()
				init := make([]float32, n)
				for i := range init {
					init[i] = float32(i) + 0.5 // untouched elements must keep this
				}
				want := append([]float32(nil), init...)
				goGather(want, x, colptr, 0, rowidx, colval, c.rows, c.d, sa, st, c.lo, c.hi)
				checkPaths(t, name, init, want, func(path SIMD, got []float32) error {
					return sparseGather(path, got, x, colptr, 0, rowidx, colval, c.rows, c.d, sa, st, c.lo, c.hi)
				})
			}
		}
	}
}

func TestSparseApplyTBitExact(t *testing.T) {
	for ci, c := range []struct{ n, d, r, lo, hi int }{
		{1, 1, 1, 0, 1}, {7, 5, 3, 1, 5}, {16, 16, 4, 0, 16}, {33, 17, 5, 0, 17},
		{130, 64, 16, 3, 61}, {384, 128, 16, 0, 128}, {20, 70, 7, 0, 70},
	} {
		for _, wild := range []bool{false, true} {
			name := fmt.Sprintf("%d/n%d/d%d/r%d[%d,%d)/wild=%v", ci, c.n, c.d, c.r, c.lo, c.hi, wild)
			rng := rand.New(rand.NewPCG(uint64(ci), 11))
			qidx := spDistinct(rng, c.n, c.d, c.r)
			qval := make([]float32, c.n*c.r)
			spFill(rng, qval, wild)
			Delta := guarded(t, c.hi*c.d)
			spFill(rng, Delta, wild)
			want := make([]float32, c.d*c.n)
			for i := range want {
				want[i] = -1
			}
			init := append([]float32(nil), want...)
			goApplyT(want, Delta, qidx, qval, c.n, c.d, c.r, c.lo, c.hi)
			checkPaths(t, name, init, want, func(path SIMD, got []float32) error {
				return sparseGather(path, got, Delta, nil, c.r, qidx, qval, c.d, c.n, 1, c.n, c.lo, c.hi)
			})
		}
	}
}

func TestSparseSBitExact(t *testing.T) {
	for ci, c := range []struct{ BT, d, lo, hi int }{
		{1, 1, 0, 1}, {3, 5, 0, 5}, {7, 16, 2, 13}, {16, 17, 0, 17}, {40, 33, 1, 33},
		{65, 64, 0, 64}, {9, 65, 5, 60}, {100, 130, 0, 130}, {31, 100, 7, 7}, {12, 200, 3, 200},
	} {
		for _, acc := range []bool{false, true} {
			for _, wild := range []bool{false, true} {
				name := fmt.Sprintf("%d/BT%d/d%d[%d,%d)/acc=%v/wild=%v", ci, c.BT, c.d, c.lo, c.hi, acc, wild)
				rng := rand.New(rand.NewPCG(uint64(ci), 13))
				checkSCore(t, name, rng, c.BT, c.d, acc, wild, c.lo, c.hi, func(path SIMD, got, A, B []float32) error {
					return sparseS(path, got, A, B, c.BT, c.d, acc, c.lo, c.hi)
				})
			}
		}
	}
}

// checkSCore checks core, a kernel of the S core's shape (rows [lo, hi)
// of A^T B, A K x hi, B K x N; acc adds to out), on every path against the
// Go loops' bits (goS), on random operands (wild: with specials).
func checkSCore(t *testing.T, name string, rng *rand.Rand, K, N int, acc, wild bool, lo, hi int,
	core func(path SIMD, got, A, B []float32) error) {
	t.Helper()
	A, B := guarded(t, hi*K), guarded(t, K*N)
	spFill(rng, A, wild)
	spFill(rng, B, wild)
	init := make([]float32, hi*N)
	spFill(rng, init, wild)
	want := append([]float32(nil), init...)
	goS(want, A, B, K, N, acc, lo, hi)
	checkPaths(t, name, init, want, func(path SIMD, got []float32) error { return core(path, got, A, B) })
}

// DenseRows is the S core at shapes S is never: more rows than columns
// (and fewer), on every path, the Go loops' bits.
func TestDenseRowsBitExact(t *testing.T) {
	for ci, c := range []struct{ K, N, lo, hi int }{
		{1, 1, 0, 3}, {5, 3, 0, 40}, {64, 7, 3, 130}, {9, 65, 0, 200}, {100, 16, 17, 23}, {3, 129, 0, 6},
	} {
		for _, acc := range []bool{false, true} {
			name := fmt.Sprintf("%d/K%d/N%d[%d,%d)/acc=%v", ci, c.K, c.N, c.lo, c.hi, acc)
			rng := rand.New(rand.NewPCG(uint64(ci), 19))
			checkSCore(t, name, rng, c.K, c.N, acc, true, c.lo, c.hi, func(path SIMD, got, A, B []float32) error {
				return denseRows(path, got, A, B, c.K, c.N, acc, c.lo, c.hi)
			})
		}
	}
}

func TestSparseApplyWBitExact(t *testing.T) {
	for ci, c := range []struct{ m, n, d, r, lo, hi int }{
		{1, 1, 1, 1, 0, 1}, {5, 7, 4, 2, 1, 5}, {16, 16, 16, 4, 0, 16}, {9, 17, 20, 16, 0, 9},
		{30, 65, 8, 3, 4, 30}, {12, 130, 64, 16, 0, 12}, {40, 384, 128, 16, 0, 40}, {6, 31, 5, 5, 2, 2},
	} {
		for _, wild := range []bool{false, true} {
			name := fmt.Sprintf("%d/m%d/n%d/d%d/r%d[%d,%d)/wild=%v", ci, c.m, c.n, c.d, c.r, c.lo, c.hi, wild)
			rng := rand.New(rand.NewPCG(uint64(ci), 17))
			pidx := spDistinct(rng, c.m, c.d, c.r)
			pval := make([]float32, c.m*c.r)
			spFill(rng, pval, wild)
			T := guarded(t, c.d*c.n)
			spFill(rng, T, wild)
			decay := 1 - float32(rng.Float64())*1e-3
			init := make([]float32, c.hi*c.n)
			spFill(rng, init, wild)
			want := append([]float32(nil), init...)
			goApplyW(want, T, pidx, pval, c.n, c.r, decay, c.lo, c.hi)
			checkPaths(t, name, init, want, func(path SIMD, got []float32) error {
				return sparseApplyW(path, got, T, pidx, pval, c.n, c.r, decay, c.lo, c.hi)
			})
		}
	}
}

// TestSparseSplitInvariance splits each core's range into random pieces
// (as the CPU backend's threads do): the bits must be those of one call.
func TestSparseSplitInvariance(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const rows, d, BT, r = 45, 70, 203, 5
	colptr, rowidx, colval := spColumns(rng, rows, d, true, true)
	x := make([]float32, BT*rows)
	spFill(rng, x, true)
	A, B := make([]float32, d*BT), make([]float32, BT*d)
	spFill(rng, A, true)
	spFill(rng, B, true)
	pidx, pval := spDistinct(rng, BT, d, r), make([]float32, BT*r)
	spFill(rng, pval, true)
	T := make([]float32, d*BT)
	spFill(rng, T, true)
	// cuts returns 0 = c0 < c1 < ... < n with pieces of random length.
	cuts := func(n int) []int {
		c := []int{0}
		for c[len(c)-1] < n {
			c = append(c, min(n, c[len(c)-1]+1+rng.IntN(70)))
		}
		return c
	}
	for _, path := range spPaths() {
		for _, core := range []struct {
			name string
			n    int // outputs to split
			size int
			run  func(out []float32, lo, hi int) error
		}{
			{"gather A", BT, d * BT, func(out []float32, lo, hi int) error {
				return sparseGather(path, out, x, colptr, 0, rowidx, colval, rows, d, BT, 1, lo, hi)
			}},
			{"gather B", BT, BT * d, func(out []float32, lo, hi int) error {
				return sparseGather(path, out, x, colptr, 0, rowidx, colval, rows, d, 1, d, lo, hi)
			}},
			{"S", d, d * d, func(out []float32, lo, hi int) error {
				return sparseS(path, out, A, B, BT, d, true, lo, hi)
			}},
			{"apply W", BT, BT * BT, func(out []float32, lo, hi int) error {
				return sparseApplyW(path, out, T[:d*BT], pidx, pval, BT, r, 0.75, lo, hi)
			}},
		} {
			init := make([]float32, core.size)
			spFill(rng, init, true)
			whole := append([]float32(nil), init...)
			if err := core.run(whole, 0, core.n); err != nil {
				t.Fatal(err)
			}
			split := append([]float32(nil), init...)
			c := cuts(core.n)
			for i := 1; i < len(c); i++ {
				if err := core.run(split, c[i-1], c[i]); err != nil {
					t.Fatal(err)
				}
			}
			if err := bitsEqual(fmt.Sprintf("%s %v split %v", core.name, path, c), split, whole); err != nil {
				t.Error(err)
			}
		}
	}
}

// TestSparseNonFinite feeds Inf and NaN inputs: results must agree with the
// Go loops, NaNs matched as NaNs.
func TestSparseNonFinite(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	special := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 0}
	fill := func(s []float32) {
		spFill(rng, s, true)
		for range len(s)/10 + 1 {
			s[rng.IntN(len(s))] = special[rng.IntN(len(special))]
		}
	}
	const rows, d, BT = 37, 23, 70
	colptr, rowidx, colval := spColumns(rng, rows, d, true, true)
	fill(colval)
	x := make([]float32, BT*rows)
	fill(x)
	A, B := make([]float32, d*BT), make([]float32, BT*d)
	fill(A)
	fill(B)
	for _, path := range spPaths() {
		want, got := make([]float32, d*BT), make([]float32, d*BT)
		goGather(want, x, colptr, 0, rowidx, colval, rows, d, BT, 1, 0, BT)
		if err := sparseGather(path, got, x, colptr, 0, rowidx, colval, rows, d, BT, 1, 0, BT); err != nil {
			t.Fatal(err)
		}
		if err := nanEqual(fmt.Sprintf("gather %v", path), got, want); err != nil {
			t.Error(err)
		}
		wantS, gotS := make([]float32, d*d), make([]float32, d*d)
		goS(wantS, A, B, BT, d, false, 0, d)
		if err := sparseS(path, gotS, A, B, BT, d, false, 0, d); err != nil {
			t.Fatal(err)
		}
		if err := nanEqual(fmt.Sprintf("S %v", path), gotS, wantS); err != nil {
			t.Error(err)
		}
	}
}

// TestSparseGoLoopsAgainstFloat64 checks the Go loops the paths are held to
// against float64 sums on moderate values, so a shared mistake in reading
// the layouts cannot pass unseen.
func TestSparseGoLoopsAgainstFloat64(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const rows, d, BT, r, n = 19, 11, 13, 3, 9
	colptr, rowidx, colval := spColumns(rng, rows, d, true, false)
	x := make([]float32, BT*rows)
	spFill(rng, x, false)
	out := make([]float32, BT*d)
	goGather(out, x, colptr, 0, rowidx, colval, rows, d, 1, d, 0, BT) // B layout
	near := func(what string, got float32, want, scale float64) {
		if math.Abs(float64(got)-want) > 1e-5*scale+1e-30 {
			t.Fatalf("%s = %v, want %v", what, got, want)
		}
	}
	for tok := range BT {
		for a := range d {
			var s, sc float64
			for k := colptr[a]; k < colptr[a+1]; k++ {
				p := float64(colval[k]) * float64(x[tok*rows+int(rowidx[k])])
				s, sc = s+p, sc+math.Abs(p)
			}
			near(fmt.Sprintf("gather[%d,%d]", tok, a), out[tok*d+a], s, sc)
		}
	}
	A, B := make([]float32, d*BT), make([]float32, BT*d)
	spFill(rng, A, false)
	spFill(rng, B, false)
	S := make([]float32, d*d)
	goS(S, A, B, BT, d, false, 0, d)
	for a := range d {
		for b := range d {
			var s, sc float64
			for tok := range BT {
				p := float64(A[a*BT+tok]) * float64(B[tok*d+b])
				s, sc = s+p, sc+math.Abs(p)
			}
			near(fmt.Sprintf("S[%d,%d]", a, b), S[a*d+b], s, sc)
		}
	}
	qidx, qval := spDistinct(rng, n, d, r), make([]float32, n*r)
	spFill(rng, qval, false)
	Delta := make([]float32, d*d)
	spFill(rng, Delta, false)
	T := make([]float32, d*n)
	goApplyT(T, Delta, qidx, qval, n, d, r, 0, d)
	w := make([]float32, n*n)
	spFill(rng, w, false)
	w0 := append([]float32(nil), w...)
	const decay = 0.99
	goApplyW(w, T, qidx, qval, n, r, decay, 0, n) // P = Q, m = n
	for a := range d {
		for j := range n {
			var s, sc float64
			for k := range r {
				p := float64(Delta[a*d+int(qidx[j*r+k])]) * float64(qval[j*r+k])
				s, sc = s+p, sc+math.Abs(p)
			}
			near(fmt.Sprintf("T[%d,%d]", a, j), T[a*n+j], s, sc)
		}
	}
	for i := range n {
		for j := range n {
			s, sc := decay*float64(w0[i*n+j]), math.Abs(decay*float64(w0[i*n+j]))
			for k := range r {
				p := float64(qval[i*r+k]) * float64(T[int(qidx[i*r+k])*n+j])
				s, sc = s+p, sc+math.Abs(p)
			}
			near(fmt.Sprintf("w[%d,%d]", i, j), w[i*n+j], s, sc)
		}
	}
}

func TestSparseArgErrors(t *testing.T) {
	colptr := []int32{0, 2, 3}
	rowidx := []int32{0, 3, 1}
	colval := []float32{1, 2, 3}
	x := make([]float32, 4*4)
	out := make([]float32, 2*4)
	ok := func() error { return SparseGather(out, x, colptr, rowidx, colval, 4, 2, 4, 1, 0, 4) }
	if err := ok(); err != nil {
		t.Fatalf("valid call: %v", err)
	}
	for _, c := range []struct {
		name string
		call func() error
	}{
		{"row out of range", func() error {
			return SparseGather(out, x, colptr, []int32{0, 4, 1}, colval, 4, 2, 4, 1, 0, 4)
		}},
		{"negative row", func() error {
			return SparseGather(out, x, colptr, []int32{0, -1, 1}, colval, 4, 2, 4, 1, 0, 4)
		}},
		{"colptr decreasing", func() error {
			return SparseGather(out, x, []int32{0, 3, 2}, rowidx, colval, 4, 2, 4, 1, 0, 4)
		}},
		{"colptr short", func() error { return SparseGather(out, x, colptr[:2], rowidx, colval, 4, 2, 4, 1, 0, 4) }},
		{"colval short", func() error { return SparseGather(out, x, colptr, rowidx, colval[:2], 4, 2, 4, 1, 0, 4) }},
		{"x short", func() error { return SparseGather(out, x[:15], colptr, rowidx, colval, 4, 2, 4, 1, 0, 4) }},
		{"out short", func() error { return SparseGather(out[:7], x, colptr, rowidx, colval, 4, 2, 4, 1, 0, 4) }},
		{"bad range", func() error { return SparseGather(out, x, colptr, rowidx, colval, 4, 2, 4, 1, 3, 2) }},
		{"apply T index", func() error {
			return SparseApplyT(make([]float32, 8), make([]float32, 4), []int32{0, 2}, []float32{1, 1}, 2, 2, 1, 0, 2)
		}},
		{"apply T r", func() error {
			return SparseApplyT(make([]float32, 8), make([]float32, 4), []int32{0, 1}, []float32{1, 1}, 2, 2, 0, 0, 2)
		}},
		{"S rows past d", func() error {
			return SparseS(make([]float32, 9), make([]float32, 9), make([]float32, 9), 3, 3, false, 0, 4)
		}},
		{"S short B", func() error {
			return SparseS(make([]float32, 9), make([]float32, 9), make([]float32, 8), 3, 3, false, 0, 3)
		}},
		{"apply W index", func() error {
			return SparseApplyW(make([]float32, 4), make([]float32, 4), []int32{0, 2}, []float32{1, 1}, 2, 1, 1, 0, 2)
		}},
		{"apply W short w", func() error {
			return SparseApplyW(make([]float32, 3), make([]float32, 4), []int32{0, 1}, []float32{1, 1}, 2, 1, 1, 0, 2)
		}},
	} {
		if err := c.call(); !errors.Is(err, ErrSparseArgs) {
			t.Errorf("%s: err = %v, want ErrSparseArgs", c.name, err)
		}
	}
}

// spBenchShape is one LSP shape: BT tokens, rows the projector's rows (m
// or n), d the projected size, r non-zeros per row.
type spBenchShape struct {
	name           string
	BT, rows, d, r int
}

var spBenchShapes = []spBenchShape{
	{"tiny", 768, 128, 128, 16},      // tiny preset, attention proj
	{"tiny-fc", 768, 512, 128, 16},   // tiny preset, MLP side
	{"gpt2", 1024, 768, 512, 16},     // GPT-2 124M, B 4 x T 256
	{"gpt2-fc", 1024, 3072, 512, 16}, // GPT-2 124M, MLP side
}

// BenchmarkSparse times one call of each core over its whole range on one
// goroutine, per path and for the plain Go loops ("go"), reporting
// Gprod/s, 10^9 rounded products (one multiply and one add) per second.
func BenchmarkSparse(b *testing.B) {
	type impl struct {
		name string
		path SIMD // -1: the Go loops
	}
	impls := []impl{{"go", -1}}
	for _, p := range spPaths() {
		impls = append(impls, impl{p.String(), p})
	}
	for _, sh := range spBenchShapes {
		rng := rand.New(rand.NewPCG(1, 2))
		colptr, rowidx, colval := spColumnsFixed(rng, sh.rows, sh.d, sh.r)
		x := make([]float32, sh.BT*sh.rows)
		spFill(rng, x, false)
		out := make([]float32, sh.BT*sh.d)
		A, B := make([]float32, sh.d*sh.BT), make([]float32, sh.BT*sh.d)
		spFill(rng, A, false)
		spFill(rng, B, false)
		S := make([]float32, sh.d*sh.d)
		Delta := make([]float32, sh.d*sh.d)
		spFill(rng, Delta, false)
		qidx, qval := spDistinct(rng, sh.rows, sh.d, sh.r), make([]float32, sh.rows*sh.r)
		spFill(rng, qval, false)
		T := make([]float32, sh.d*sh.rows)
		w := make([]float32, sh.rows*sh.rows)
		gather := float64(sh.BT * sh.rows * sh.r)
		for _, im := range impls {
			run := func(op string, prods float64, fn func() error) {
				b.Run(fmt.Sprintf("%s/%s/%s", op, sh.name, im.name), func(b *testing.B) {
					for b.Loop() {
						if err := fn(); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(prods*float64(b.N)/b.Elapsed().Seconds()/1e9, "Gprod/s")
				})
			}
			run("gatherA", gather, func() error {
				if im.path < 0 {
					goGather(out, x, colptr, 0, rowidx, colval, sh.rows, sh.d, sh.BT, 1, 0, sh.BT)
					return nil
				}
				return sparseGather(im.path, out, x, colptr, 0, rowidx, colval, sh.rows, sh.d, sh.BT, 1, 0, sh.BT)
			})
			run("gatherB", gather, func() error {
				if im.path < 0 {
					goGather(out, x, colptr, 0, rowidx, colval, sh.rows, sh.d, 1, sh.d, 0, sh.BT)
					return nil
				}
				return sparseGather(im.path, out, x, colptr, 0, rowidx, colval, sh.rows, sh.d, 1, sh.d, 0, sh.BT)
			})
			run("S", float64(sh.d*sh.d*sh.BT), func() error {
				if im.path < 0 {
					goS(S, A, B, sh.BT, sh.d, true, 0, sh.d)
					return nil
				}
				return sparseS(im.path, S, A, B, sh.BT, sh.d, true, 0, sh.d)
			})
			run("applyT", float64(sh.d*sh.rows*sh.r), func() error {
				if im.path < 0 {
					goApplyT(T, Delta, qidx, qval, sh.rows, sh.d, sh.r, 0, sh.d)
					return nil
				}
				return sparseGather(im.path, T, Delta, nil, sh.r, qidx, qval, sh.d, sh.rows, 1, sh.rows, 0, sh.d)
			})
			run("applyW", float64(sh.rows*sh.rows*sh.r), func() error {
				if im.path < 0 {
					goApplyW(w, T, qidx, qval, sh.rows, sh.r, 0.999, 0, sh.rows)
					return nil
				}
				return sparseApplyW(im.path, w, T, qidx, qval, sh.rows, sh.r, 0.999, 0, sh.rows)
			})
		}
	}
}

// spDistinct returns rows x r indices into [0, d), distinct within each
// row and in random order: the rows of a (d,r)-sparse projector.
func spDistinct(rng *rand.Rand, rows, d, r int) []int32 {
	idx := make([]int32, rows*r)
	for i := range rows {
		for s, a := range rng.Perm(d)[:r] {
			idx[i*r+s] = int32(a)
		}
	}
	return idx
}

// spColumnsFixed is the column storage of a (d,r)-sparse projector of rows
// rows (r distinct columns per row), rows ascending per column.
func spColumnsFixed(rng *rand.Rand, rows, d, r int) (colptr, rowidx []int32, colval []float32) {
	cols := make([][]int32, d)
	for i := range rows {
		for _, a := range rng.Perm(d)[:r] {
			cols[a] = append(cols[a], int32(i))
		}
	}
	colptr = make([]int32, d+1)
	for a, c := range cols {
		rowidx = append(rowidx, c...)
		colptr[a+1] = int32(len(rowidx))
	}
	colval = make([]float32, len(rowidx))
	spFill(rng, colval, false)
	return colptr, rowidx, colval
}
