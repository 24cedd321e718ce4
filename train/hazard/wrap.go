// Wrap: the hazard check around any backend, so that a backend with no
// check of its own (the CUDA one, on a GPU or on the simulated runtime)
// reports a missing stream or event edge deterministically, when the work
// is enqueued, rather than only when a race happens to corrupt a result.

package hazard

import (
	"fmt"
	"sync"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// Backend is a backend.Backend that forwards every call to the backend it
// wraps and declares, after each enqueue the wrapped backend accepted, what
// the op reads and writes (access.go), its stream, and the records, waits
// and host synchronizations that order them. A hazard found is listed by
// Hazards and returned (wrapped) by every later Synchronize and
// EventSynchronize, as the CPU backend's hazard mode does.
//
// Limits: only work enqueued through the wrapper is seen, so take transfers
// through its Staging (backend.Upload(w, ...) does) and declare host code
// touching pinned memory with HostAccess.
type Backend struct {
	backend.Backend
	chk *Checker

	mu      sync.Mutex
	actors  map[backend.Stream]int
	staging *backend.Staging
}

var _ backend.Backend = (*Backend)(nil)

// Wrap puts the hazard check around be; closing the wrapper closes be.
func Wrap(be backend.Backend) *Backend {
	w := &Backend{Backend: be, chk: NewChecker(), actors: map[backend.Stream]int{}}
	w.staging = backend.NewStaging(w, backend.StagingBytes)
	return w
}

// Hazards lists the hazards found so far.
func (w *Backend) Hazards() []Hazard { return w.chk.Hazards() }

// actor is the checker's actor of stream s: one per stream, in order of
// first use (streams are never reused, so ids need no recycling).
func (w *Backend) actor(s backend.Stream) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	a, ok := w.actors[s]
	if !ok {
		a = len(w.actors) + 1 // 0 is the host
		w.actors[s] = a
	}
	return a
}

// declare records acc on s once the wrapped backend accepted the op.
func (w *Backend) declare(s backend.Stream, err error, acc Access) error {
	if err != nil {
		return err
	}
	w.chk.Access(w.actor(s), acc.Name, acc.Reads, acc.Writes)
	return nil
}

// checked joins a hazard found so far into err.
func (w *Backend) checked(err error) error {
	if herr := w.chk.Err(); herr != nil {
		return fmt.Errorf("%s: hazard check: %w", w.Name(), herr)
	}
	return err
}

// HostAccess declares that host code is about to read and write the given
// ranges of pinned host memory (the engine and the staging transfers call
// it), so that device work touching them must be ordered before.
func (w *Backend) HostAccess(name string, reads, writes []backend.Range) {
	w.chk.Access(Host, name, reads, writes)
}

// HostSnapshot and HostJoin tell the check where goroutines hand work to
// each other (see Checker.Snapshot).
func (w *Backend) HostSnapshot() Clock { return w.chk.Snapshot() }

// HostJoin: see HostSnapshot.
func (w *Backend) HostJoin(c Clock) { w.chk.Join(c) }

// Staging is the wrapper's own, so that Upload and Download go through the
// wrapper and are checked.
func (w *Backend) Staging() *backend.Staging { return w.staging }

// Close frees the wrapper's staging buffer and closes the wrapped backend.
func (w *Backend) Close() error {
	w.staging.Free()
	return w.Backend.Close()
}

// DestroyEvent implements backend.Backend.
func (w *Backend) DestroyEvent(e backend.Event) error {
	err := w.Backend.DestroyEvent(e)
	if err == nil {
		w.chk.Forget(e)
	}
	return err
}

// Record implements backend.Backend.
func (w *Backend) Record(e backend.Event, s backend.Stream) error {
	err := w.Backend.Record(e, s)
	if err == nil {
		w.chk.Record(e, w.actor(s))
	}
	return err
}

// Wait implements backend.Backend.
func (w *Backend) Wait(s backend.Stream, e backend.Event) error {
	err := w.Backend.Wait(s, e)
	if err == nil {
		w.chk.Wait(w.actor(s), e)
	}
	return err
}

// Synchronize implements backend.Backend.
func (w *Backend) Synchronize(s backend.Stream) error {
	err := w.Backend.Synchronize(s)
	if err == nil {
		w.chk.HostJoinsStream(w.actor(s))
	}
	return w.checked(err)
}

// EventSynchronize implements backend.Backend.
func (w *Backend) EventSynchronize(e backend.Event) error {
	err := w.Backend.EventSynchronize(e)
	if err == nil {
		w.chk.HostJoinsEvent(e)
	}
	return w.checked(err)
}

// CopyH2D implements backend.Backend.
func (w *Backend) CopyH2D(s backend.Stream, dst backend.Tensor, src backend.HostBuffer, srcOff int) error {
	return w.declare(s, w.Backend.CopyH2D(s, dst, src, srcOff), CopyH2D(dst, src, srcOff))
}

// CopyD2H implements backend.Backend.
func (w *Backend) CopyD2H(s backend.Stream, dst backend.HostBuffer, dstOff int, src backend.Tensor) error {
	return w.declare(s, w.Backend.CopyD2H(s, dst, dstOff, src), CopyD2H(dst, dstOff, src))
}

// CopyD2D implements backend.Backend.
func (w *Backend) CopyD2D(s backend.Stream, dst, src backend.Tensor) error {
	return w.declare(s, w.Backend.CopyD2D(s, dst, src), CopyD2D(dst, src))
}

// The ops, each forwarded, then declared.

func (w *Backend) Fill(s backend.Stream, t backend.Tensor, v float32) error {
	return w.declare(s, w.Backend.Fill(s, t, v), Fill(t))
}

func (w *Backend) Scale(s backend.Stream, t backend.Tensor, a float32) error {
	return w.declare(s, w.Backend.Scale(s, t, a), Scale(t))
}

func (w *Backend) Add(s backend.Stream, out, x, y backend.Tensor) error {
	return w.declare(s, w.Backend.Add(s, out, x, y), Add(out, x, y))
}

func (w *Backend) Accumulate(s backend.Stream, dst, src backend.Tensor) error {
	return w.declare(s, w.Backend.Accumulate(s, dst, src), Accumulate(dst, src))
}

func (w *Backend) EncoderForward(s backend.Stream, out, inp, pos, wte, wpe backend.Tensor, B, T, C int) error {
	return w.declare(s, w.Backend.EncoderForward(s, out, inp, pos, wte, wpe, B, T, C), EncoderForward(out, inp, pos, wte, wpe))
}

func (w *Backend) EncoderBackward(s backend.Stream, dwte, dwpe, dout, inp, pos backend.Tensor, B, T, C int) error {
	return w.declare(s, w.Backend.EncoderBackward(s, dwte, dwpe, dout, inp, pos, B, T, C), EncoderBackward(dwte, dwpe, dout, inp, pos))
}

func (w *Backend) LayerNormForward(s backend.Stream, out, mean, rstd, inp, weight, bias backend.Tensor, N, C int, eps float32) error {
	return w.declare(s, w.Backend.LayerNormForward(s, out, mean, rstd, inp, weight, bias, N, C, eps),
		LayerNormForward(out, mean, rstd, inp, weight, bias))
}

func (w *Backend) LayerNormBackward(s backend.Stream, dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch backend.Tensor, N, C int) error {
	return w.declare(s, w.Backend.LayerNormBackward(s, dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N, C),
		LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, N, C))
}

func (w *Backend) Gemm(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, beta float32, C backend.Tensor) error {
	return w.declare(s, w.Backend.Gemm(s, transA, transB, M, N, K, alpha, A, B, beta, C), Gemm(A, B, beta, C))
}

func (w *Backend) GemmQ(s backend.Stream, transW bool, M, N, K int, alpha float32, A backend.Tensor, W backend.Quant, beta float32, C backend.Tensor) error {
	return w.declare(s, w.Backend.GemmQ(s, transW, M, N, K, alpha, A, W, beta, C), GemmQ(A, W, beta, C))
}

func (w *Backend) Dequantize(s backend.Stream, W backend.Quant, off int, out backend.Tensor) error {
	return w.declare(s, w.Backend.Dequantize(s, W, off, out), Dequantize(W, out))
}

func (w *Backend) AddBias(s backend.Stream, out, bias backend.Tensor, N, OC int) error {
	return w.declare(s, w.Backend.AddBias(s, out, bias, N, OC), AddBias(out, bias))
}

func (w *Backend) BiasBackward(s backend.Stream, dbias, dout backend.Tensor, N, OC int) error {
	return w.declare(s, w.Backend.BiasBackward(s, dbias, dout, N, OC), BiasBackward(dbias, dout))
}

func (w *Backend) AttentionForward(s backend.Stream, out, lse, qkv, pos backend.Tensor, B, T, NH, KVH, HS int, layout backend.QKVLayout) error {
	return w.declare(s, w.Backend.AttentionForward(s, out, lse, qkv, pos, B, T, NH, KVH, HS, layout), AttentionForward(out, lse, qkv, pos))
}

func (w *Backend) AttentionBackward(s backend.Stream, dqkv, dout, qkv, out, lse, pos, scratch backend.Tensor, B, T, NH, KVH, HS int, layout backend.QKVLayout) error {
	return w.declare(s, w.Backend.AttentionBackward(s, dqkv, dout, qkv, out, lse, pos, scratch, B, T, NH, KVH, HS, layout),
		AttentionBackward(dqkv, dout, qkv, out, lse, pos, scratch, B, T, NH))
}

func (w *Backend) GeluForward(s backend.Stream, out, inp backend.Tensor) error {
	return w.declare(s, w.Backend.GeluForward(s, out, inp), GeluForward(out, inp))
}

func (w *Backend) GeluBackward(s backend.Stream, dinp, inp, dout backend.Tensor) error {
	return w.declare(s, w.Backend.GeluBackward(s, dinp, inp, dout), GeluBackward(dinp, inp, dout))
}

func (w *Backend) SwiGLUForward(s backend.Stream, out, gate, up backend.Tensor) error {
	return w.declare(s, w.Backend.SwiGLUForward(s, out, gate, up), SwiGLUForward(out, gate, up))
}

func (w *Backend) SwiGLUBackward(s backend.Stream, dgate, dup, dout, gate, up backend.Tensor) error {
	return w.declare(s, w.Backend.SwiGLUBackward(s, dgate, dup, dout, gate, up), SwiGLUBackward(dgate, dup, dout, gate, up))
}

func (w *Backend) RMSNormForward(s backend.Stream, out, rstd, inp, weight backend.Tensor, N, C int, eps float32) error {
	return w.declare(s, w.Backend.RMSNormForward(s, out, rstd, inp, weight, N, C, eps), RMSNormForward(out, rstd, inp, weight))
}

func (w *Backend) RMSNormBackward(s backend.Stream, dinp, dweight, dout, inp, weight, rstd, scratch backend.Tensor, N, C int) error {
	return w.declare(s, w.Backend.RMSNormBackward(s, dinp, dweight, dout, inp, weight, rstd, scratch, N, C),
		RMSNormBackward(dinp, dweight, dout, inp, weight, rstd, scratch, N, C))
}

func (w *Backend) RoPEForward(s backend.Stream, out, inp, pos, invFreq backend.Tensor, B, T, NH, HS int) error {
	return w.declare(s, w.Backend.RoPEForward(s, out, inp, pos, invFreq, B, T, NH, HS), RoPE("rope forward", out, inp, pos, invFreq))
}

func (w *Backend) RoPEBackward(s backend.Stream, dinp, dout, pos, invFreq backend.Tensor, B, T, NH, HS int) error {
	return w.declare(s, w.Backend.RoPEBackward(s, dinp, dout, pos, invFreq, B, T, NH, HS), RoPE("rope backward", dinp, dout, pos, invFreq))
}

func (w *Backend) CrossEntropyForwardBackward(s backend.Stream, losses, logits, targets backend.Tensor, N, V int, scale float32) error {
	return w.declare(s, w.Backend.CrossEntropyForwardBackward(s, losses, logits, targets, N, V, scale),
		CrossEntropyForwardBackward(losses, logits, targets, scale))
}

func (w *Backend) SumSquares(s backend.Stream, out, x, work backend.Tensor) error {
	return w.declare(s, w.Backend.SumSquares(s, out, x, work), SumSquares(out, x, work))
}

func (w *Backend) NonFiniteFlag(s backend.Stream, flag, x backend.Tensor) error {
	return w.declare(s, w.Backend.NonFiniteFlag(s, flag, x), NonFiniteFlag(flag, x))
}

func (w *Backend) AdamW(s backend.Stream, param, master, grad, m, v, sumSq, skip backend.Tensor, p backend.AdamParams) error {
	return w.declare(s, w.Backend.AdamW(s, param, master, grad, m, v, sumSq, skip, p),
		AdamW(param, master, grad, m, v, sumSq, skip, p.MaxNorm))
}

func (w *Backend) SparseCompressA(s backend.Stream, A, X, colptr, rowidx, colval backend.Tensor, BT, m, d int) error {
	return w.declare(s, w.Backend.SparseCompressA(s, A, X, colptr, rowidx, colval, BT, m, d), SparseCompressA(A, X, colptr, rowidx, colval))
}

func (w *Backend) SparseCompressB(s backend.Stream, B, dY, colptr, rowidx, colval backend.Tensor, BT, n, d int) error {
	return w.declare(s, w.Backend.SparseCompressB(s, B, dY, colptr, rowidx, colval, BT, n, d), SparseCompressB(B, dY, colptr, rowidx, colval))
}

func (w *Backend) SparseS(s backend.Stream, S, A, B backend.Tensor, BT, d int, accumulate bool) error {
	return w.declare(s, w.Backend.SparseS(s, S, A, B, BT, d, accumulate), SparseS(S, A, B, accumulate))
}

func (w *Backend) SparseValueGrad(s backend.Stream, out, Y, M, K, idx, val backend.Tensor, rows, d, r int, wt float32, trans, accumulate bool) error {
	return w.declare(s, w.Backend.SparseValueGrad(s, out, Y, M, K, idx, val, rows, d, r, wt, trans, accumulate),
		SparseValueGrad(out, Y, M, K, idx, val, accumulate))
}

func (w *Backend) DenseGemm(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, beta float32, C backend.Tensor) error {
	return w.declare(s, w.Backend.DenseGemm(s, transA, transB, M, N, K, alpha, A, B, beta, C), DenseGemm(A, B, beta, C))
}

func (w *Backend) DenseApply(s backend.Stream, transA, transB bool, M, N, K int, alpha float32, A, B backend.Tensor, decay float32, W, skip backend.Tensor,
	seed, step uint64, matrix uint32) error {
	return w.declare(s, w.Backend.DenseApply(s, transA, transB, M, N, K, alpha, A, B, decay, W, skip, seed, step, matrix), DenseApply(A, B, W, skip))
}

func (w *Backend) SparseApply(s backend.Stream, W, T, Delta, pidx, pval, qidx, qval, skip backend.Tensor, m, n, d, r int,
	lr, wd float32, seed, step uint64, matrix uint32) error {
	return w.declare(s, w.Backend.SparseApply(s, W, T, Delta, pidx, pval, qidx, qval, skip, m, n, d, r, lr, wd, seed, step, matrix),
		SparseApply(W, T, Delta, pidx, pval, qidx, qval, skip))
}
