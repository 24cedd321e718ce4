//go:build lsp_sim

// The simulator's self-test kernels (selftest.cu) are called through the
// generated face in selftest_gen.go (stReverse, stOrder, ...; regenerate
// with `go generate ./kernels`); this file holds what the tests add to it.

package simtest

// wmmaArgs describes one st_wmma launch: layouts (col-major when true) and
// leading dimensions of A, B, C and D.
type wmmaArgs struct {
	aCol, bCol, cCol, dCol bool
	lda, ldb, ldc, ldd     int
}

// launch runs lsp_st_wmma: D = scale * A B + C (+ bias by element
// position, when bias is not nil) on one 16x16x16 tile.
func (a wmmaArgs) launch(A, B, Cm, D *Buffer, scale float32, bias *Buffer) error {
	return stWmma(A.Dev(), a.aCol, a.lda, B.Dev(), a.bCol, a.ldb, Cm.Dev(), a.cCol, a.ldc, D.Dev(), a.dCol, a.ldd, scale,
		bias.Dev(), 0)
}
