//go:build cuda && !cudasim

// cuBLAS, for this benchmark only (-tags cuda): the same GEMM as a row of
// the table, bf16 in and out with fp32 accumulation, timed the same way,
// for the ratio of the kernels' GEMM to NVIDIA's. It is loaded at run time
// (dlopen) rather than linked: the GPU bundle's binary must start on a
// machine with only the driver, where the column is then skipped with a
// line, and nothing else needs cuBLAS.

package kernelbench

/*
#cgo LDFLAGS: -ldl
#include <stddef.h>
#include <dlfcn.h>
#include <cuda_runtime_api.h>
#include <cublas_v2.h>

// The four entry points used, found by lsp_cublas_open.
static cublasStatus_t (*p_create)(cublasHandle_t *);
static cublasStatus_t (*p_destroy)(cublasHandle_t);
static cublasStatus_t (*p_set_stream)(cublasHandle_t, cudaStream_t);
static cublasStatus_t (*p_gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
	const void *, const void *, cudaDataType, int, const void *, cudaDataType, int,
	const void *, void *, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

// lsp_cublas_open loads cuBLAS (CUDA 12's, 11's, or the unversioned name)
// and its entry points; NULL on success, else what was missing.
static const char *lsp_cublas_open(void) {
	static const char *names[] = {"libcublas.so.12", "libcublas.so.11", "libcublas.so"};
	void *h = NULL;
	for (int i = 0; i < 3 && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
	if (!h) return "libcublas.so.12, .so.11 or .so not found";
	if (!(p_create = dlsym(h, "cublasCreate_v2")) || !(p_destroy = dlsym(h, "cublasDestroy_v2")) ||
	    !(p_set_stream = dlsym(h, "cublasSetStream_v2")) || !(p_gemm_ex = dlsym(h, "cublasGemmEx")))
		return "a cuBLAS entry point (cublasCreate_v2, cublasDestroy_v2, cublasSetStream_v2, cublasGemmEx) is missing";
	return NULL;
}

// lsp_bench_cublas times runs of C[M,N] = op(A) op(B), row-major bf16 (as
// the kernels lay them out), after one warm-up, each after a memset of a
// flush-byte buffer that evicts L2; the times (ms) go to ms. cuBLAS is
// column-major, so it computes C^T = op(B)^T op(A)^T: its first operand
// is our B. 0 on success; 1-99 a CUDA runtime failure's step, 100 + a
// cuBLAS status.
static int lsp_bench_cublas(int transA, int transB, int M, int N, int K, int runs, size_t flush, float *ms) {
	int rc = 0;
	void *A = NULL, *B = NULL, *C = NULL, *F = NULL;
	cublasHandle_t h = NULL;
	cudaStream_t s = NULL;
	cudaEvent_t e0 = NULL, e1 = NULL;
	float alpha = 1, beta = 0;
	cublasOperation_t opB = transB ? CUBLAS_OP_T : CUBLAS_OP_N, opA = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
	int ldb = transB ? K : N, lda = transA ? M : K;
	if (cudaSetDevice(0) != cudaSuccess) return 1;
	if (cudaMalloc(&A, (size_t)M * K * 2) != cudaSuccess || cudaMalloc(&B, (size_t)K * N * 2) != cudaSuccess ||
	    cudaMalloc(&C, (size_t)M * N * 2) != cudaSuccess || (flush && cudaMalloc(&F, flush) != cudaSuccess)) { rc = 2; goto out; }
	// 0x3c3c is bf16 0.0115: finite products, whatever the sizes.
	if (cudaMemset(A, 0x3c, (size_t)M * K * 2) != cudaSuccess || cudaMemset(B, 0x3c, (size_t)K * N * 2) != cudaSuccess) { rc = 3; goto out; }
	if (p_create(&h) != CUBLAS_STATUS_SUCCESS) { rc = 4; goto out; }
	if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess || p_set_stream(h, s) != CUBLAS_STATUS_SUCCESS) { rc = 5; goto out; }
	if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) { rc = 6; goto out; }
	for (int i = -1; i < runs; i++) {
		if (F && cudaMemsetAsync(F, i & 0xff, flush, s) != cudaSuccess) { rc = 7; goto out; }
		if (cudaEventRecord(e0, s) != cudaSuccess) { rc = 8; goto out; }
		cublasStatus_t st = p_gemm_ex(h, opB, opA, N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda,
			&beta, C, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
		if (st != CUBLAS_STATUS_SUCCESS) { rc = 100 + (int)st; goto out; }
		if (cudaEventRecord(e1, s) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess) { rc = 9; goto out; }
		if (i >= 0 && cudaEventElapsedTime(&ms[i], e0, e1) != cudaSuccess) { rc = 10; goto out; }
	}
out:
	if (e0) cudaEventDestroy(e0);
	if (e1) cudaEventDestroy(e1);
	if (h) p_destroy(h);
	if (s) cudaStreamDestroy(s);
	if (A) cudaFree(A);
	if (B) cudaFree(B);
	if (C) cudaFree(C);
	if (F) cudaFree(F);
	return rc;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/bench/internal/gpubench"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// cublasMissing is why there is no cuBLAS column ("" when cuBLAS loaded);
// it loads cuBLAS on the first call.
var cublasMissing = sync.OnceValue(func() string {
	if msg := C.lsp_cublas_open(); msg != nil {
		return C.GoString(msg)
	}
	return ""
})

// cublasGemm is the median seconds of cuBLAS's bf16 GEMM of g's layout
// and sizes over runs (at least 1), L2 flushed before each.
func cublasGemm(g trace.GemmArgs, runs int) (float64, error) {
	runs = max(runs, 1)
	ms := make([]C.float, runs)
	rc := C.lsp_bench_cublas(b2i(g.TransA), b2i(g.TransB), C.int(g.M), C.int(g.N), C.int(g.K), C.int(runs),
		C.size_t(flushBytes), (*C.float)(unsafe.Pointer(&ms[0])))
	if rc != 0 {
		return 0, fmt.Errorf("cublas gemm %+v: failed at step %d (100 + n: cuBLAS status n)", g, int(rc))
	}
	s := make([]float64, runs)
	for i, v := range ms {
		s[i] = float64(v) / 1e3
	}
	return gpubench.Summarize(s).Median, nil
}

func b2i(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
