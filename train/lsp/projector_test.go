// Tests of projector construction, validation and the two storages.

package lsp

import (
	"math"
	"slices"
	"strings"
	"testing"
)

func TestNewProjectorShapes(t *testing.T) {
	for _, tc := range []struct {
		m, d, r int
		err     string
	}{
		{m: 70, d: 12, r: 3},
		{m: 64, d: 16, r: 4},
		{m: 16, d: 16, r: 16}, // fully dense rows
		{m: 5, d: 1, r: 1},
		{m: 10, d: 4, r: 5, err: "r=5 larger than d=4"},
		{m: 10, d: 0, r: 1, err: "d=0"},
		{m: 10, d: 4, r: 0, err: "r=0"},
		{m: 8, d: 12, r: 3, err: "larger than the matrix side m=8"},
	} {
		p, err := NewProjector(tc.m, tc.d, tc.r, newRNG(1))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("NewProjector(%d,%d,%d): error %v, want one containing %q", tc.m, tc.d, tc.r, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("NewProjector(%d,%d,%d): %v", tc.m, tc.d, tc.r, err)
		}
		if err := p.Validate(); err != nil {
			t.Errorf("fresh %dx%d r=%d: %v", tc.m, tc.d, tc.r, err)
		}
		for i := range p.M {
			row := p.Idx[i*p.R : (i+1)*p.R]
			if !slices.IsSorted(row) || len(slices.Compact(slices.Clone(row))) != p.R {
				t.Fatalf("row %d columns %v: want %d distinct, ascending", i, row, p.R)
			}
		}
		// The column storage, densified on its own, equals dense().
		cd := make([]float64, p.M*p.D)
		for a := range p.D {
			for k := p.ColPtr[a]; k < p.ColPtr[a+1]; k++ {
				cd[int(p.RowIdx[k])*p.D+a] = float64(p.ColVal[k])
			}
		}
		if !slices.Equal(cd, p.dense()) {
			t.Errorf("%dx%d r=%d: column storage disagrees with row storage", tc.m, tc.d, tc.r)
		}
	}
	if _, err := NewProjector(4, 2, 1, nil); err == nil {
		t.Error("nil rng accepted")
	}
}

// Every r-subset should be drawn: with d=4, r=2 all 6 column pairs appear
// about equally often (each with probability 1/6).
func TestPositionsUniform(t *testing.T) {
	const m = 6000
	p := mustProjector(t, m, 4, 2, newRNG(7))
	count := map[[2]int32]int{}
	for i := range m {
		count[[2]int32{p.Idx[2*i], p.Idx[2*i+1]}]++
	}
	if len(count) != 6 {
		t.Fatalf("%d distinct pairs, want 6: %v", len(count), count)
	}
	// Binomial(6000, 1/6): sd ~ 28.9; allow 5 sd.
	for pair, c := range count {
		if math.Abs(float64(c)-m/6.0) > 5*28.9 {
			t.Errorf("pair %v drawn %d times, want about %d", pair, c, m/6)
		}
	}
}

// E[P P^T] = I: averaged over N draws, the diagonal entries (variance 2/r
// each) and off-diagonal ones (variance 1/d) lie within 5 standard errors of
// 1 and 0 (sqrt(2/(rN)) and sqrt(1/(dN))).
func TestExpectationIdentity(t *testing.T) {
	const m, d, r = 24, 8, 2
	n := 2000
	if testing.Short() {
		n = 600
	}
	rng := newRNG(3)
	sum := make([]float64, m*m)
	for range n {
		pd := mustProjector(t, m, d, r, rng).dense()
		for e, v := range dMul(pd, transpose(pd, m, d), m, d, m) {
			sum[e] += v
		}
	}
	diagTol := 5 * math.Sqrt(2/float64(r*n))
	offTol := 5 * math.Sqrt(1/float64(d*n))
	for i := range m {
		for j := range m {
			mean := sum[i*m+j] / float64(n)
			want, tol := 0.0, offTol
			if i == j {
				want, tol = 1, diagTol
			}
			if math.Abs(mean-want) > tol {
				t.Errorf("mean (P P^T)[%d,%d] = %.4f over %d draws, want %v +- %.4f", i, j, mean, n, want, tol)
			}
		}
	}
}

func TestValidateCatches(t *testing.T) {
	base := mustProjector(t, 20, 6, 3, newRNG(2))
	for _, tc := range []struct {
		name   string
		break_ func(p *Projector)
		err    string
	}{
		{"duplicate column", func(p *Projector) { p.Idx[1] = p.Idx[0] }, "twice"},
		{"column out of range", func(p *Projector) { p.Idx[4] = 6 }, "outside"},
		{"short values", func(p *Projector) { p.Val = p.Val[:5] }, "entries"},
		{"stale column value", func(p *Projector) { p.Val[7] += 1 }, "SyncValues"},
		{"rows out of order", func(p *Projector) {
			k := p.ColPtr[0]
			p.RowIdx[k], p.RowIdx[k+1] = p.RowIdx[k+1], p.RowIdx[k]
			p.ColVal[k], p.ColVal[k+1] = p.ColVal[k+1], p.ColVal[k]
		}, "ascending"},
		{"stale positions", func(p *Projector) {
			// Move row 0's first entry to a column it does not hold.
			for a := range int32(p.D) {
				if !slices.Contains(p.Idx[:p.R], a) {
					p.Idx[0] = a
					break
				}
			}
		}, "row storage does not"},
		{"not finite", func(p *Projector) { p.Val[0] = float32(math.NaN()) }, "not finite"},
	} {
		p := base.Clone()
		tc.break_(p)
		err := p.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: Validate() = %v, want an error containing %q", tc.name, err, tc.err)
		}
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("the clones changed the original: %v", err)
	}
}

func TestSyncAndRebuild(t *testing.T) {
	p := mustProjector(t, 30, 8, 2, newRNG(4))
	for k := range p.Val {
		p.Val[k] *= -2
	}
	if err := p.SyncValues(); err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("after SyncValues: %v", err)
	}
	// New positions in row 3 (reversed order is accepted), then rebuild.
	row := p.Idx[3*p.R : 4*p.R]
	row[0], row[1] = row[1], row[0]
	if err := p.RebuildColumns(); err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("after RebuildColumns: %v", err)
	}
	bare := &Projector{M: p.M, D: p.D, R: p.R, Idx: p.Idx, Val: p.Val}
	if err := bare.SyncValues(); err == nil {
		t.Error("SyncValues without columns: no error")
	}
	if err := bare.RebuildColumns(); err != nil || !bare.Equal(p) || bare.Validate() != nil {
		t.Errorf("RebuildColumns on bare rows: %v", err)
	}
	q := p.Clone()
	if !q.Equal(p) {
		t.Error("a clone is not Equal")
	}
	q.Val[0] = math.Nextafter32(q.Val[0], 10)
	if q.Equal(p) {
		t.Error("Equal ignores a one-ulp value change")
	}
}

func TestCap(t *testing.T) {
	for _, tc := range []struct{ d, m, n, r, wantD, wantR int }{
		{512, 768, 2304, 16, 512, 16},
		{512, 64, 256, 16, 64, 16},
		{512, 768, 8, 16, 8, 8},
	} {
		if got := CapD(tc.d, tc.m, tc.n); got != tc.wantD {
			t.Errorf("CapD(%d,%d,%d) = %d, want %d", tc.d, tc.m, tc.n, got, tc.wantD)
		}
		if got := CapR(tc.r, tc.wantD); got != tc.wantR {
			t.Errorf("CapR(%d,%d) = %d, want %d", tc.r, tc.wantD, got, tc.wantR)
		}
	}
}
