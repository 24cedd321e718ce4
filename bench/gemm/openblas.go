//go:build openblas

// openblas.go: the OpenBLAS side of the comparison, through cgo. Built only
// with -tags openblas so the normal build never needs libopenblas-dev
// (`make bench-gemm` installs it).

package main

/*
#cgo LDFLAGS: -lopenblas
#include <cblas.h>

// row_sgemm keeps the enum conversions on the C side.
static void row_sgemm(int ta, int tb, blasint m, blasint n, blasint k,
		      float alpha, const float *a, blasint lda, const float *b,
		      blasint ldb, float beta, float *c, blasint ldc)
{
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
		    tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b,
		    ldb, beta, c, ldc);
}
*/
import "C"

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"unsafe"

	"github.com/lsp-offload/lsp-offload/host"
)

// openBLAS calls cblas_sgemm with the same thread count as ours.
type openBLAS struct{}

// Cores of OpenBLAS 0.3.x whose sgemm kernels use AVX-512 or at least AVX2.
var (
	avx512Cores = []string{"skylakex", "cooperlake", "sapphirerapids", "zen4"}
	avx2Cores   = append([]string{"haswell", "zen"}, avx512Cores...)
)

// fixCore re-runs this program with OPENBLAS_CORETYPE set when it is unset
// and OpenBLAS's dynamic dispatch fell back to a core without the vector
// unit this CPU has (0.3.21 takes an unrecognised Xeon for Prescott, SSE3),
// so the comparison is with OpenBLAS's best kernels here. The variable is
// read when the library loads, hence the exec. On success it does not
// return.
func fixCore() error {
	if _, set := os.LookupEnv("OPENBLAS_CORETYPE"); set {
		return nil
	}
	core := strings.ToLower(C.GoString(C.openblas_get_corename()))
	want := ""
	switch host.DetectSIMD() {
	case host.AVX512:
		if !contains(avx512Cores, core) {
			want = "SkylakeX"
		}
	case host.AVX2:
		if !contains(avx2Cores, core) {
			want = "Haswell"
		}
	}
	if want == "" {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("openblas: re-running with OPENBLAS_CORETYPE=%s: %w", want, err)
	}
	fmt.Fprintf(os.Stderr, "bench/gemm: OpenBLAS chose core %q on this %v CPU; re-running with OPENBLAS_CORETYPE=%s (-fix-core=false keeps it)\n", core, host.DetectSIMD(), want)
	env := append(os.Environ(), "OPENBLAS_CORETYPE="+want, "LSP_BENCH_GEMM_FIXED_CORE="+core)
	return fmt.Errorf("openblas: exec %s: %w", exe, syscall.Exec(exe, os.Args, env))
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func newReference(threads int, fix bool) (reference, error) {
	if fix {
		if err := fixCore(); err != nil {
			return nil, err
		}
	}
	C.openblas_set_num_threads(C.int(threads))
	if got := int(C.openblas_get_num_threads()); got != threads {
		return nil, fmt.Errorf("openblas: asked for %d threads, it runs %d (built with a lower limit?)", threads, got)
	}
	return openBLAS{}, nil
}

func (openBLAS) Name() string { return "openblas" }

func (openBLAS) Describe() string {
	d := fmt.Sprintf("OpenBLAS core %s, config %q, threads %d, OPENBLAS_CORETYPE=%q",
		C.GoString(C.openblas_get_corename()), C.GoString(C.openblas_get_config()),
		int(C.openblas_get_num_threads()), os.Getenv("OPENBLAS_CORETYPE"))
	if was := os.Getenv("LSP_BENCH_GEMM_FIXED_CORE"); was != "" {
		d += fmt.Sprintf(" (set by this program: OpenBLAS had chosen %q)", was)
	}
	return d
}

func (openBLAS) Sgemm(transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []float32, ldb int, beta float32, Cm []float32, ldc int) {
	ta, tb := C.int(0), C.int(0)
	if transA {
		ta = 1
	}
	if transB {
		tb = 1
	}
	C.row_sgemm(ta, tb, C.blasint(M), C.blasint(N), C.blasint(K), C.float(alpha),
		(*C.float)(unsafe.Pointer(&A[0])), C.blasint(lda),
		(*C.float)(unsafe.Pointer(&B[0])), C.blasint(ldb), C.float(beta),
		(*C.float)(unsafe.Pointer(&Cm[0])), C.blasint(ldc))
}
