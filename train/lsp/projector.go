// The Projector type, its construction and validation. A projector of an
// m x d matrix keeps exactly r non-zeros per row at distinct columns, stored
// by row (Idx, Val; used by apply) and by column (ColPtr, RowIdx, ColVal;
// used by compress, rebuilt after every change of positions). Nothing here
// densifies a projector (the tests' dense reference does, in
// helpers_test.go).

package lsp

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Projector is a (d,r)-sparse projector of an M x D matrix: each of the M
// rows has exactly R non-zeros at R distinct columns in [0,D).
//
// Row storage: row i's columns are Idx[i*R:(i+1)*R] (ascending when drawn by
// NewProjector, any order accepted) and its values Val[i*R:(i+1)*R].
// Column storage: column a's entries are [ColPtr[a], ColPtr[a+1]) of RowIdx
// (strictly ascending rows) and ColVal. RebuildColumns derives it from the
// row storage after positions change; SyncValues copies values after a
// value-only update.
type Projector struct {
	M, D, R int
	Idx     []int32
	Val     []float32
	ColPtr  []int32
	RowIdx  []int32
	ColVal  []float32

	// slot[k] is the row-storage index of column-storage entry k, so that
	// SyncValues is one gather. Rebuilt with the columns.
	slot []int32
}

// CapD is the projected size of an m x n matrix for a requested d:
// min(d, m, n), or AutoD(m, n) when d is 0 (--d not given). The caller
// logs when it caps.
func CapD(d, m, n int) int {
	if d <= 0 {
		return AutoD(m, n)
	}
	return min(d, m, n)
}

// MaxAutoD is the largest projected size AutoD gives: the paper's d for
// 7B models, whose sides are 4096 and more.
const MaxAutoD = 512

// AutoD is the projected size of an m x n matrix when --d is not given:
// a quarter of its shorter side, at most MaxAutoD, at least 1. A d at the
// shorter side compresses nothing (S, d x d, is as large as the gradient
// of a square matrix, and the subspace is all of that side); a quarter
// sends at most 1/16 of the gradient and is what compare uses.
func AutoD(m, n int) int { return max(1, min(MaxAutoD, m/4, n/4)) }

// CapR is the non-zeros per row for a requested r once d has been capped:
// min(r, d).
func CapR(r, d int) int { return min(r, d) }

// checkShape reports what is wrong with the sizes of a projector of an m x
// d matrix with r non-zeros per row.
func checkShape(m, d, r int) error {
	switch {
	case d < 1:
		return fmt.Errorf("lsp projector: d=%d, want at least 1", d)
	case r < 1:
		return fmt.Errorf("lsp projector: r=%d, want at least 1", r)
	case r > d:
		return fmt.Errorf("lsp projector: r=%d larger than d=%d", r, d)
	case d > m:
		return fmt.Errorf("lsp projector: d=%d larger than the matrix side m=%d (cap it with CapD)", d, m)
	}
	return nil
}

// NewProjector draws a (d,r)-sparse projector of an m x d matrix: per row, r
// distinct columns uniformly without replacement (Floyd's algorithm, then
// sorted), and values N(0, 1/r), so each diagonal entry of P P^T has mean 1
// and each off-diagonal one mean 0: E[P P^T] = I.
func NewProjector(m, d, r int, rng *rand.Rand) (*Projector, error) {
	if err := checkShape(m, d, r); err != nil {
		return nil, err
	}
	if rng == nil {
		return nil, fmt.Errorf("lsp projector: nil random source")
	}
	p := &Projector{M: m, D: d, R: r, Idx: make([]int32, m*r), Val: make([]float32, m*r)}
	if err := p.redraw(rng); err != nil {
		return nil, err
	}
	return p, nil
}

// redraw replaces positions and values with a fresh draw, keeping the
// shape, and rebuilds the columns.
func (p *Projector) redraw(rng *rand.Rand) error {
	std := 1 / math.Sqrt(float64(p.R))
	for i := range p.M {
		row := p.Idx[i*p.R : (i+1)*p.R]
		// Floyd: for j = d-r .. d-1 pick t in [0,j]; take t unless already
		// chosen, else j. Every r-subset is equally likely.
		n := 0
		for j := p.D - p.R; j < p.D; j++ {
			t := int32(rng.IntN(j + 1))
			if slices.Contains(row[:n], t) {
				t = int32(j)
			}
			row[n] = t
			n++
		}
		slices.Sort(row)
		for s := range p.R {
			p.Val[i*p.R+s] = float32(rng.NormFloat64() * std)
		}
	}
	return p.RebuildColumns()
}

// checkRows validates the shape and row storage: lengths, columns in
// [0,D), distinct within a row, finite values.
func (p *Projector) checkRows() error {
	if err := checkShape(p.M, p.D, p.R); err != nil {
		return err
	}
	nnz := p.M * p.R
	if len(p.Idx) != nnz || len(p.Val) != nnz {
		return fmt.Errorf("lsp projector %dx%d r=%d: Idx has %d and Val %d entries, want %d", p.M, p.D, p.R, len(p.Idx), len(p.Val), nnz)
	}
	for i := range p.M {
		row := p.Idx[i*p.R : (i+1)*p.R]
		for s, a := range row {
			if a < 0 || int(a) >= p.D {
				return fmt.Errorf("lsp projector: row %d entry %d: column %d outside [0,%d)", i, s, a, p.D)
			}
			if slices.Contains(row[:s], a) {
				return fmt.Errorf("lsp projector: row %d holds column %d twice", i, a)
			}
			if v := p.Val[i*p.R+s]; math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return fmt.Errorf("lsp projector: row %d column %d: value %v not finite", i, a, v)
			}
		}
	}
	return nil
}

// RebuildColumns derives the column storage from the row storage (rows
// ascending within each column). Call it after any change of positions. It
// validates the row storage first and leaves the columns untouched on error.
func (p *Projector) RebuildColumns() error {
	if err := p.checkRows(); err != nil {
		return err
	}
	nnz := p.M * p.R
	colptr := make([]int32, p.D+1)
	for _, a := range p.Idx {
		colptr[a+1]++
	}
	for a := range p.D {
		colptr[a+1] += colptr[a]
	}
	next := slices.Clone(colptr[:p.D])
	rowidx := make([]int32, nnz)
	slot := make([]int32, nnz)
	// Rows visited in ascending order, so each column's rows ascend.
	for i := range p.M {
		for s := range p.R {
			k := i*p.R + s
			a := p.Idx[k]
			rowidx[next[a]] = int32(i)
			slot[next[a]] = int32(k)
			next[a]++
		}
	}
	p.ColPtr, p.RowIdx, p.slot = colptr, rowidx, slot
	p.ColVal = make([]float32, nnz)
	return p.SyncValues()
}

// SyncValues copies the row values into the column storage after a
// value-only update (positions unchanged since RebuildColumns).
func (p *Projector) SyncValues() error {
	nnz := p.M * p.R
	if len(p.slot) != nnz || len(p.ColVal) != nnz || len(p.Val) != nnz {
		return fmt.Errorf("lsp projector %dx%d r=%d: column storage not built (call RebuildColumns after changing positions)", p.M, p.D, p.R)
	}
	for k, s := range p.slot {
		p.ColVal[k] = p.Val[s]
	}
	return nil
}

// Validate checks the shape, the row storage, and that the column storage
// holds exactly the row storage's entries (same values, bit for bit) with
// rows strictly ascending within each column.
func (p *Projector) Validate() error {
	if p == nil {
		return fmt.Errorf("lsp projector: nil")
	}
	if err := p.checkRows(); err != nil {
		return err
	}
	nnz := p.M * p.R
	if len(p.ColPtr) != p.D+1 || len(p.RowIdx) != nnz || len(p.ColVal) != nnz {
		return fmt.Errorf("lsp projector %dx%d r=%d: column storage has ColPtr %d, RowIdx %d, ColVal %d entries, want %d, %d, %d",
			p.M, p.D, p.R, len(p.ColPtr), len(p.RowIdx), len(p.ColVal), p.D+1, nnz, nnz)
	}
	if p.ColPtr[0] != 0 || int(p.ColPtr[p.D]) != nnz {
		return fmt.Errorf("lsp projector: ColPtr runs from %d to %d, want 0 to %d", p.ColPtr[0], p.ColPtr[p.D], nnz)
	}
	for a := range p.D {
		lo, hi := p.ColPtr[a], p.ColPtr[a+1]
		if hi < lo {
			return fmt.Errorf("lsp projector: ColPtr decreases at column %d", a)
		}
		for k := lo; k < hi; k++ {
			i := p.RowIdx[k]
			if i < 0 || int(i) >= p.M {
				return fmt.Errorf("lsp projector: column %d: row %d outside [0,%d)", a, i, p.M)
			}
			if k > lo && p.RowIdx[k-1] >= i {
				return fmt.Errorf("lsp projector: column %d: rows not strictly ascending at entry %d", a, k)
			}
			s := slices.Index(p.Idx[int(i)*p.R:(int(i)+1)*p.R], int32(a))
			if s < 0 {
				return fmt.Errorf("lsp projector: column storage has (row %d, column %d), row storage does not", i, a)
			}
			if rv := p.Val[int(i)*p.R+s]; math.Float32bits(rv) != math.Float32bits(p.ColVal[k]) {
				return fmt.Errorf("lsp projector: (row %d, column %d) is %v by row and %v by column (call SyncValues)", i, a, rv, p.ColVal[k])
			}
		}
	}
	// Every column entry matched a distinct row entry (rows ascend within a
	// column, so no pair repeats) and the counts are equal: the storages
	// hold the same set.
	return nil
}

// Clone returns a deep copy.
func (p *Projector) Clone() *Projector {
	return &Projector{
		M: p.M, D: p.D, R: p.R,
		Idx: slices.Clone(p.Idx), Val: slices.Clone(p.Val),
		ColPtr: slices.Clone(p.ColPtr), RowIdx: slices.Clone(p.RowIdx), ColVal: slices.Clone(p.ColVal),
		slot: slices.Clone(p.slot),
	}
}

// Equal reports whether p and o describe the same matrix entry for entry:
// same shape, same positions in the same order and bit-identical values.
func (p *Projector) Equal(o *Projector) bool {
	if p == o {
		return true
	}
	if p == nil || o == nil || p.M != o.M || p.D != o.D || p.R != o.R || !slices.Equal(p.Idx, o.Idx) || len(p.Val) != len(o.Val) {
		return false
	}
	for k, v := range p.Val {
		if math.Float32bits(v) != math.Float32bits(o.Val[k]) {
			return false
		}
	}
	return true
}

// values returns the row values in float64 (the working form of the bias
// math).
func (p *Projector) values() []float64 {
	out := make([]float64, len(p.Val))
	for k, v := range p.Val {
		out[k] = float64(v)
	}
	return out
}
