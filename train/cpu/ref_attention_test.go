// The float64 reference of causal attention, naive loops over the whole
// probability matrix whose backward central finite differences check, and
// the check that the reference functions of ref_attention.go, which do
// every head on one goroutine, give the op's bits, which splits the heads
// over threads.

package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// attention64 is naive causal softmax attention: qkv [B,T,3C] with q, k, v
// side by side, out [B,T,C], lse [B,NH,T].
func attention64(qkv []float64, B, T, C, NH int) (out, lse []float64) {
	HS := C / NH
	sc := 1 / math.Sqrt(float64(HS))
	at := func(b, t, part, h int) []float64 { return qkv[(b*T+t)*3*C+part*C+h*HS:][:HS] }
	out, lse = make([]float64, B*T*C), make([]float64, B*NH*T)
	for b := range B {
		for h := range NH {
			for t := range T {
				s := make([]float64, t+1)
				mx := math.Inf(-1)
				for t2 := range s {
					s[t2] = dot64(at(b, t, 0, h), at(b, t2, 1, h)) * sc
					mx = max(mx, s[t2])
				}
				var sum float64
				for _, v := range s {
					sum += math.Exp(v - mx)
				}
				l := mx + math.Log(sum)
				lse[(b*NH+h)*T+t] = l
				o := out[(b*T+t)*C+h*HS:][:HS]
				for t2, v := range s {
					p := math.Exp(v - l)
					for i, x := range at(b, t2, 2, h) {
						o[i] += p * x
					}
				}
			}
		}
	}
	return out, lse
}

// attentionBackward64 backpropagates dout through attention64 with the
// whole probability matrix P of each head: dV = P^T dO, dP = dO V^T,
// dS = P o (dP - rowsum(P o dP)), dQ = dS K / sqrt(HS), dK = dS^T Q / sqrt(HS).
func attentionBackward64(qkv, dout []float64, B, T, C, NH int) []float64 {
	HS := C / NH
	sc := 1 / math.Sqrt(float64(HS))
	idx := func(b, t, part, h int) int { return (b*T+t)*3*C + part*C + h*HS }
	dqkv := make([]float64, len(qkv))
	for b := range B {
		for h := range NH {
			P := make([][]float64, T)
			for t := range T {
				P[t] = make([]float64, T)
				mx, s := math.Inf(-1), make([]float64, t+1)
				for t2 := range s {
					s[t2] = dot64(qkv[idx(b, t, 0, h):][:HS], qkv[idx(b, t2, 1, h):][:HS]) * sc
					mx = max(mx, s[t2])
				}
				var sum float64
				for t2 := range s {
					P[t][t2] = math.Exp(s[t2] - mx)
					sum += P[t][t2]
				}
				for t2 := range s {
					P[t][t2] /= sum
				}
			}
			for t := range T {
				do := dout[(b*T+t)*C+h*HS:][:HS]
				dP := make([]float64, t+1)
				var rowdot float64
				for t2 := range dP {
					dP[t2] = dot64(do, qkv[idx(b, t2, 2, h):][:HS])
					rowdot += P[t][t2] * dP[t2]
				}
				for t2 := range dP {
					dS := P[t][t2] * (dP[t2] - rowdot)
					for i := range HS {
						dqkv[idx(b, t2, 2, h)+i] += P[t][t2] * do[i]
						dqkv[idx(b, t, 0, h)+i] += dS * qkv[idx(b, t2, 1, h)+i] * sc
						dqkv[idx(b, t2, 1, h)+i] += dS * qkv[idx(b, t, 0, h)+i] * sc
					}
				}
			}
		}
	}
	return dqkv
}

// TestAttentionReference64 checks the float64 attention backward against
// central differences of its forward.
func TestAttentionReference64(t *testing.T) {
	const B, T, C, NH = 2, 5, 12, 3
	r := newRand(99)
	qkv, do := f64s(randVals(r, B*T*3*C, 1.5)), f64s(randVals(r, B*T*C, 1))
	fdCheck(t, "attention", func(v []float64) float64 {
		out, _ := attention64(v, B, T, C, NH)
		return dot64(out, do)
	}, qkv, attentionBackward64(qkv, do, B, T, C, NH), 1e-6)
}

// TestAttentionReferenceIsTheOp: AttentionForward and AttentionBackward
// give the bits of the backend's ops on 3 threads (heads split 3 ways),
// in both layouts with grouped-query heads.
func TestAttentionReferenceIsTheOp(t *testing.T) {
	const B, T, NH, KVH, HS = 3, 9, 4, 2, 8
	for _, layout := range []backend.QKVLayout{backend.QKVFused, backend.QKVPlanar} {
		t.Run(fmt.Sprint(layout), func(t *testing.T) {
			be := newBE(t, Config{Threads: 3})
			s := be.DefaultStream()
			r := newRand(31)
			C, n := NH*HS, B*T*(NH+2*KVH)*HS
			q, dy := randVals(r, n, 1.5), randVals(r, B*T*C, 1)
			qkv, out, lse := tensorOf(t, be, "qkv", backend.F32, q), alloc(t, be, "out", B*T*C, backend.F32), alloc(t, be, "lse", B*NH*T, backend.F32)
			dqkv := alloc(t, be, "dqkv", n, backend.F32)
			ok(t, be.AttentionForward(s, out, lse, qkv, backend.Tensor{}, B, T, NH, KVH, HS, layout))
			ok(t, be.AttentionBackward(s, dqkv, tensorOf(t, be, "dout", backend.F32, dy), qkv, out, lse, backend.Tensor{},
				attnScratch(t, be, B, T, NH), B, T, NH, KVH, HS, layout))

			o, l, dq := make([]float32, B*T*C), make([]float32, B*NH*T), make([]float32, n)
			ok(t, AttentionForward(o, l, q, nil, B, T, NH, KVH, HS, layout))
			ok(t, AttentionBackward(dq, dy, q, o, l, nil, B, T, NH, KVH, HS, layout))
			same(t, "out", o, get(t, be, out))
			same(t, "lse", l, get(t, be, lse))
			same(t, "dqkv", dq, get(t, be, dqkv))
		})
	}
}
