//go:build lsp_sim

// Go wrappers of the simulator's self-test kernels (selftest.cu), used by
// sim_test.go. Test code: sizes are checked only as far as the tests need.

package simtest

/*
#include "selftest.h"
*/
import "C"

import "unsafe"

func ptr(b *Buffer) unsafe.Pointer {
	if b == nil {
		return nil
	}
	return b.Ptr()
}

func b2i(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

func stReverse(in, out *Buffer, n int, barrier bool) error {
	return Check("lsp_st_reverse", int(C.lsp_st_reverse((*C.float)(ptr(in)), (*C.float)(ptr(out)), C.int(n), b2i(barrier), nil)))
}

func stOrder(tickets, counter *Buffer, n int) error {
	return Check("lsp_st_order", int(C.lsp_st_order((*C.int)(ptr(tickets)), (*C.int)(ptr(counter)), C.int(n), nil)))
}

func stWarp(in, out *Buffer, n int) error {
	return Check("lsp_st_warp", int(C.lsp_st_warp((*C.int)(ptr(in)), (*C.int)(ptr(out)), C.int(n), nil)))
}

// wmmaArgs describes one st_wmma launch: layouts (col-major when true) and
// leading dimensions of A, B, C and D.
type wmmaArgs struct {
	aCol, bCol, cCol, dCol bool
	lda, ldb, ldc, ldd     int
}

func stWmma(a wmmaArgs, A, B, Cm, D *Buffer, scale float32, bias *Buffer) error {
	return Check("lsp_st_wmma", int(C.lsp_st_wmma((*C.__nv_bfloat16)(ptr(A)), b2i(a.aCol), C.int(a.lda),
		(*C.__nv_bfloat16)(ptr(B)), b2i(a.bCol), C.int(a.ldb), (*C.float)(ptr(Cm)), b2i(a.cCol), C.int(a.ldc),
		(*C.float)(ptr(D)), b2i(a.dCol), C.int(a.ldd), C.float(scale), (*C.float)(ptr(bias)), nil)))
}

func stGemm(A, B, Cm *Buffer, M, N, K int) error {
	return Check("lsp_st_gemm", int(C.lsp_st_gemm((*C.__nv_bfloat16)(ptr(A)), (*C.__nv_bfloat16)(ptr(B)),
		(*C.float)(ptr(Cm)), C.int(M), C.int(N), C.int(K), nil)))
}

func stShift(in, out *Buffer, n, off int) error {
	return Check("lsp_st_shift", int(C.lsp_st_shift((*C.float)(ptr(in)), (*C.float)(ptr(out)), C.int(n), C.int(off), nil)))
}

func stSmem(out *Buffer, n, off int) error {
	return Check("lsp_st_smem", int(C.lsp_st_smem((*C.float)(ptr(out)), C.int(n), C.int(off), nil)))
}

func stConfig(grid, block [3]int, smem, setAttr int) error {
	return Check("lsp_st_config", int(C.lsp_st_config(C.int(grid[0]), C.int(grid[1]), C.int(grid[2]),
		C.int(block[0]), C.int(block[1]), C.int(block[2]), C.size_t(smem), C.int(setAttr), nil)))
}

func stMisuse(kind int, out *Buffer) error {
	return Check("lsp_st_misuse", int(C.lsp_st_misuse(C.int(kind), (*C.int)(ptr(out)), nil)))
}

func stWmmaMisaligned(A *Buffer, off, lda int, D *Buffer) error {
	return Check("lsp_st_wmma_misaligned", int(C.lsp_st_wmma_misaligned((*C.__nv_bfloat16)(ptr(A)), C.int(off),
		C.int(lda), (*C.float)(ptr(D)), nil)))
}

func stReduce(in, out *Buffer, n, blocks int) error {
	return Check("lsp_st_reduce", int(C.lsp_st_reduce((*C.float)(ptr(in)), (*C.float)(ptr(out)), C.int(n), C.int(blocks), nil)))
}

func stBlocks(out, counter, maxv *Buffer, grid, block [3]int) error {
	return Check("lsp_st_blocks", int(C.lsp_st_blocks((*C.int)(ptr(out)), (*C.int)(ptr(counter)),
		(*C.unsigned)(ptr(maxv)), C.int(grid[0]), C.int(grid[1]), C.int(grid[2]), C.int(block[0]),
		C.int(block[1]), C.int(block[2]), nil)))
}

func stRecurse(depth int, out *Buffer) error {
	return Check("lsp_st_recurse", int(C.lsp_st_recurse(C.int(depth), (*C.int)(ptr(out)), nil)))
}
