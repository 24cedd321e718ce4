// gemm.go: Sgemm, the CPU backend's single-precision matrix multiply, and
// its thread split. The arithmetic is C (gemm_*.c): op(B) is packed into
// panels shared by all threads, then tiles of C are handed to goroutines
// that each pack their rows of op(A) and run the SIMD microkernel chosen by
// ActiveSIMD. Limits: row-major float32 only; the K summation order is
// fixed per SIMD path (K-blocks of the path's kc in ascending order), so
// results are bit-identical for any thread count but differ between paths.

package host

/*
#cgo CFLAGS: -O3
#include "gemm.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// gemmThreads is how many threads Sgemm uses.
var gemmThreads atomic.Int64

func init() { gemmThreads.Store(int64(runtime.NumCPU())) }

// SetThreads sets how many threads Sgemm uses (default runtime.NumCPU())
// and returns the previous value. n < 1 restores the default.
func SetThreads(n int) int {
	if n < 1 {
		n = runtime.NumCPU()
	}
	return int(gemmThreads.Swap(int64(n)))
}

// gemmParams is the blocking of one SIMD path, read once from C.
type gemmParams struct{ mr, nr, kc, mc, nc int }

var gemmPaths, gemmPathsErr = func() ([AVX512 + 1]gemmParams, error) {
	var out [AVX512 + 1]gemmParams
	for s := Scalar; s <= AVX512; s++ {
		var p C.lsp_gemm_params
		if C.lsp_sgemm_params(C.int(s), &p) != 0 {
			return out, fmt.Errorf("sgemm: this build has no %v path", s)
		}
		g := gemmParams{int(p.mr), int(p.nr), int(p.kc), int(p.mc), int(p.nc)}
		// The C driver's edge buffer holds 64*64 floats.
		if g.mr < 1 || g.nr < 1 || g.mr*g.nr > 64*64 || g.kc < 1 || g.mc < g.mr || g.nc < g.nr {
			return out, fmt.Errorf("sgemm: bad %v blocking %+v (built with bad -DLSP_* values?)", s, g)
		}
		out[s] = g
	}
	return out, nil
}()

// gemmPackFloats bounds the shared packed-B buffer (16 MiB, meant for L3);
// K is walked in super-blocks of whole K-blocks that fit, which keeps the
// summation order. A variable only so tests can shrink it; it never changes
// results.
var gemmPackFloats = 1 << 22

// packChunks is how many task-wide (nc) column chunks one packed block of
// op(B) holds.
const packChunks = 4

// minFlopsPerThread keeps tiny products on one thread, where goroutine
// start-up would cost more than it saves. It never changes results.
const minFlopsPerThread = 1 << 21

// ErrGemmArgs is wrapped by every argument error of Sgemm.
var ErrGemmArgs = errors.New("sgemm: bad arguments")

// Sgemm computes C = alpha*op(A)*op(B) + beta*C on row-major float32 matrices.
// op(A) is M x K (A is M x K, or K x M when transA), op(B) is K x N (B is K x N,
// or N x K when transB), C is M x N; lda, ldb, ldc are row strides in elements.
// beta == 0 means C is not read (NaNs in C are ignored); alpha == 0 or K == 0
// means A and B are not read (C = beta*C). Work is split across
// threads over tiles of C; each element's sum over K runs in one fixed order,
// so results are bit-identical for any thread count. Shapes, strides and slice
// lengths are checked; a mismatch is an error wrapping ErrGemmArgs. C must
// not overlap A or B. Sgemm is safe for concurrent use.
func Sgemm(transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []float32, ldb int, beta float32, C []float32, ldc int) error {
	if M < 0 || N < 0 || K < 0 {
		return fmt.Errorf("%w: negative shape M=%d N=%d K=%d", ErrGemmArgs, M, N, K)
	}
	ar, ac := M, K
	if transA {
		ar, ac = K, M
	}
	br, bc := K, N
	if transB {
		br, bc = N, K
	}
	if err := checkMatrix("A", A, ar, ac, lda); err != nil {
		return err
	}
	if err := checkMatrix("B", B, br, bc, ldb); err != nil {
		return err
	}
	if err := checkMatrix("C", C, M, N, ldc); err != nil {
		return err
	}
	if M == 0 || N == 0 {
		return nil
	}
	if K == 0 || alpha == 0 {
		scaleC(M, N, beta, C, ldc)
		return nil
	}
	if gemmPathsErr != nil {
		return gemmPathsErr
	}
	path := ActiveSIMD()
	sgemm(path, gemmPaths[path], int(gemmThreads.Load()), transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
	return nil
}

// checkMatrix checks that m holds a rows x cols matrix with row stride ld.
func checkMatrix(name string, m []float32, rows, cols, ld int) error {
	if ld < max(1, cols) {
		return fmt.Errorf("%w: ld%s=%d < %d columns", ErrGemmArgs, name, ld, cols)
	}
	if rows == 0 || cols == 0 {
		return nil
	}
	// (rows-1)*ld + cols, computed so that huge values cannot wrap.
	if len(m) < cols || rows-1 > (len(m)-cols)/ld {
		return fmt.Errorf("%w: len(%s)=%d too short for %dx%d with stride %d", ErrGemmArgs, name, len(m), rows, cols, ld)
	}
	return nil
}

// scaleC sets C = beta*C, or 0 when beta == 0 (so NaNs in C vanish).
func scaleC(M, N int, beta float32, C []float32, ldc int) {
	for i := range M {
		row := C[i*ldc : i*ldc+N]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// gemmTask is one unit of work in a column block of npanels panels: when
// pack, packing panels [p0, p0+np) of op(B) for the current K super-block;
// otherwise the C tile rows [i0, i0+rows) by panels [p0, p0+np). chunk is
// the column chunk both belong to; a tile waits until its chunk is packed.
type gemmTask struct {
	pack     bool
	chunk    int
	i0, rows int
	p0, np   int
}

func sgemm(path SIMD, p gemmParams, threads int, transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []float32, ldb int, beta float32, C []float32, ldc int) {
	flops := 2 * float64(M) * float64(N) * float64(K)
	threads = max(1, min(threads, int(flops/minFlopsPerThread)))

	// Packed column blocks of about packChunks*nc columns, equal in size
	// (rounded to nr); tiles then take at most nc of them, sized for L2.
	// Wide blocks mean fewer barriers.
	nblocks := ceilDiv(N, packChunks*p.nc)
	ncb := roundUp(ceilDiv(N, nblocks), p.nr)
	maxPanels := ncb / p.nr

	// K super-blocks: whole kc-blocks, as many as fit in packFloats.
	ks := max(1, gemmPackFloats/(maxPanels*p.nr*p.kc)) * p.kc

	bp := gemmBufs.get(min(ks, K) * maxPanels * p.nr)
	defer gemmBufs.put(bp)
	aps := make([]*scratchBuf, threads)
	for t := range aps {
		aps[t] = gemmBufs.get(p.mc * p.kc)
	}
	defer func() {
		for _, b := range aps {
			gemmBufs.put(b)
		}
	}()

	cA, cB, cC := sliceArg(A), sliceArg(B), sliceArg(C)
	cBp := sliceArg(bp.f)
	var tasks []gemmTask
	for j0 := 0; j0 < N; j0 += ncb {
		nc := min(ncb, N-j0)
		npanels := ceilDiv(nc, p.nr)
		var nchunks int
		tasks, nchunks = schedule(tasks[:0], M, npanels, threads, p)
		pending := make([]atomic.Int32, nchunks)
		ready := make([]chan struct{}, nchunks)
		for kb := 0; kb < K; kb += ks {
			kn := min(ks, K-kb)
			for c := range ready {
				ready[c] = make(chan struct{})
			}
			for _, tk := range tasks {
				if tk.pack {
					pending[tk.chunk].Add(1)
				}
			}
			// One phase per column block and K super-block; inside it,
			// packing and tiles of different chunks overlap.
			parallelFor(threads, len(tasks), func(w, t int) {
				tk := tasks[t]
				if tk.pack {
					C.lsp_sgemm_pack_b(C.int(path), cBool(transB), cB, C.ptrdiff_t(ldb),
						C.ptrdiff_t(kb), C.ptrdiff_t(kn), C.ptrdiff_t(j0), C.ptrdiff_t(nc),
						C.ptrdiff_t(npanels), C.ptrdiff_t(tk.p0), C.ptrdiff_t(tk.p0+tk.np), cBp)
					if pending[tk.chunk].Add(-1) == 0 {
						close(ready[tk.chunk])
					}
					return
				}
				<-ready[tk.chunk]
				C.lsp_sgemm_task(C.int(path), cBool(transA), cA, C.ptrdiff_t(lda),
					C.ptrdiff_t(kb), C.ptrdiff_t(kn), C.ptrdiff_t(tk.i0), C.ptrdiff_t(tk.rows),
					cBp, C.ptrdiff_t(npanels), C.ptrdiff_t(tk.p0),
					C.ptrdiff_t(j0+tk.p0*p.nr), C.ptrdiff_t(min(tk.np*p.nr, nc-tk.p0*p.nr)),
					C.float(alpha), C.float(beta), cC, C.ptrdiff_t(ldc), sliceArg(aps[w].f))
			})
		}
	}
	runtime.KeepAlive(A)
	runtime.KeepAlive(B)
	runtime.KeepAlive(C)
}

// schedule appends the work of one column block of npanels panels: for
// each column chunk, pieces packing it and then its tiles (splitTiles).
// Tasks are taken in order, so a thread done with one chunk's tiles packs
// the next chunk while others still compute: memory-bound packing overlaps
// compute-bound tiles. A tile only waits for pieces listed before it, which
// are already taken, so the wait always ends.
func schedule(tasks []gemmTask, M, npanels, threads int, p gemmParams) ([]gemmTask, int) {
	tiles := splitTiles(nil, M, npanels, threads, p)
	nchunks := 0
	for i, tl := range tiles {
		if i == 0 || tl.chunk != tiles[i-1].chunk {
			pieces := min(threads, tl.np)
			for q := range pieces {
				q0, q1 := tl.p0+q*tl.np/pieces, tl.p0+(q+1)*tl.np/pieces
				tasks = append(tasks, gemmTask{pack: true, chunk: tl.chunk, p0: q0, np: q1 - q0})
			}
			nchunks++
		}
		tasks = append(tasks, tl)
	}
	return tasks, nchunks
}

// splitTiles appends the tiles of one column block of npanels panels,
// column chunks (at most nc wide, for L2) outer. Rows go in whole
// micropanels, spread evenly over a multiple of threads tasks of at most mc
// rows; when that gives some thread no work, columns are split finer.
func splitTiles(tasks []gemmTask, M, npanels, threads int, p gemmParams) []gemmTask {
	mp := ceilDiv(M, p.mr)
	mt := min(mp, roundUp(ceilDiv(mp, p.mc/p.mr), threads))
	nt := ceilDiv(npanels, p.nc/p.nr)
	if mt*nt < threads {
		nt = min(npanels, ceilDiv(threads, mt))
	}
	for c := range nt {
		c0, c1 := c*npanels/nt, (c+1)*npanels/nt
		for r := range mt {
			i0, i1 := r*mp/mt*p.mr, min((r+1)*mp/mt*p.mr, M)
			tasks = append(tasks, gemmTask{chunk: c, i0: i0, rows: i1 - i0, p0: c0, np: c1 - c0})
		}
	}
	return tasks
}

// parallelFor runs fn(worker, task) for task in [0, n) on up to workers
// goroutines (the caller's included); worker indexes per-worker scratch.
func parallelFor(workers, n int, fn func(worker, task int)) {
	workers = min(workers, n)
	if workers <= 1 {
		for t := range n {
			fn(0, t)
		}
		return
	}
	var next atomic.Int64
	run := func(w int) {
		for {
			t := int(next.Add(1)) - 1
			if t >= n {
				return
			}
			fn(w, t)
		}
	}
	var wg sync.WaitGroup
	for w := 1; w < workers; w++ {
		wg.Go(func() { run(w) })
	}
	run(0)
	wg.Wait()
}

func sliceArg(s []float32) *C.float {
	if len(s) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&s[0]))
}

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// gemmBufs holds the packing buffers; they are large and reused across calls.
var gemmBufs scratchPool

func ceilDiv(a, b int) int { return (a + b - 1) / b }

func roundUp(a, b int) int { return ceilDiv(a, b) * b }
