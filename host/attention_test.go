package host

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// attnRef is the CPU backend's former Go attention, element for element
// the order the C kernels keep: they may differ from it only through exp
// and log (C's against Go's).
type attnRef struct{ AttentionShape }

func (a attnRef) q(b, t, h int) int { return a.QBase + (b*a.T+t)*a.QRow + h*a.HS }
func (a attnRef) k(b, t, g int) int { return a.KBase + (b*a.T+t)*a.KVRow + g*a.HS }
func (a attnRef) v(b, t, g int) int { return a.VBase + (b*a.T+t)*a.KVRow + g*a.HS }
func (a attnRef) o(b, t, h int) int { return (b*a.T+t)*a.NH*a.HS + h*a.HS }

func (a attnRef) forward(out, lse, qkv []float32) {
	HS, scale := a.HS, float32(1/math.Sqrt(float64(a.HS)))
	p := make([]float32, a.T)
	for bh := 0; bh < a.B*a.NH; bh++ {
		b, h := bh/a.NH, bh%a.NH
		g := h / (a.NH / a.KVH)
		for t := 0; t < a.T; t++ {
			q := qkv[a.q(b, t, h):][:HS]
			mx := float32(math.Inf(-1))
			for t2 := 0; t2 <= t; t2++ {
				k := qkv[a.k(b, t2, g):][:HS]
				var dot float32
				for i := range q {
					dot += q[i] * k[i]
				}
				p[t2] = dot * scale
				mx = max(mx, p[t2])
			}
			var sum float32
			for t2 := 0; t2 <= t; t2++ {
				p[t2] = float32(math.Exp(float64(p[t2] - mx)))
				sum += p[t2]
			}
			o := out[a.o(b, t, h):][:HS]
			clear(o)
			for t2 := 0; t2 <= t; t2++ {
				v := qkv[a.v(b, t2, g):][:HS]
				w := p[t2] / sum
				for i := range o {
					o[i] += w * v[i]
				}
			}
			lse[(b*a.NH+h)*a.T+t] = mx + float32(math.Log(float64(sum)))
		}
	}
}

func (a attnRef) backward(dqkv, dout, qkv, out, lse []float32) {
	HS, scale := a.HS, float32(1/math.Sqrt(float64(a.HS)))
	per := a.NH / a.KVH
	for bg := 0; bg < a.B*a.KVH; bg++ {
		b, g := bg/a.KVH, bg%a.KVH
		for h := g * per; h < (g+1)*per; h++ {
			for t := 0; t < a.T; t++ {
				q, dq := qkv[a.q(b, t, h):][:HS], dqkv[a.q(b, t, h):][:HS]
				do, o := dout[a.o(b, t, h):][:HS], out[a.o(b, t, h):][:HS]
				var D float32
				for i := range do {
					D += do[i] * o[i]
				}
				l := lse[(b*a.NH+h)*a.T+t]
				for t2 := 0; t2 <= t; t2++ {
					k, v := qkv[a.k(b, t2, g):][:HS], qkv[a.v(b, t2, g):][:HS]
					dk, dv := dqkv[a.k(b, t2, g):][:HS], dqkv[a.v(b, t2, g):][:HS]
					var s, dp float32
					for i := range q {
						s += q[i] * k[i]
						dp += do[i] * v[i]
					}
					p := float32(math.Exp(float64(s*scale - l)))
					ds := p * (dp - D) * scale
					for i := range q {
						dv[i] += p * do[i]
						dq[i] += ds * k[i]
						dk[i] += ds * q[i]
					}
				}
			}
		}
	}
}

func TestAttentionMatchesGoLoopsOnEveryPath(t *testing.T) {
	if goFusesFloat() {
		t.Skip("this GOARCH fuses multiply-add in Go: the reference is not the unfused order")
	}
	prev := ActiveSIMD()
	defer SetSIMD(prev)
	for _, c := range []struct{ B, T, NH, KVH, HS int }{{2, 37, 4, 4, 64}, {1, 19, 6, 2, 24}, {2, 5, 2, 1, 7}} {
		// Fused rows (q, k, v of a token side by side), one extra
		// leading element so that the bases are not zero.
		kv := c.KVH * c.HS
		a := AttentionShape{B: c.B, T: c.T, NH: c.NH, KVH: c.KVH, HS: c.HS,
			QBase: 1, KBase: 1 + c.NH*c.HS, VBase: 1 + c.NH*c.HS + kv, QRow: c.NH*c.HS + 2*kv, KVRow: c.NH*c.HS + 2*kv}
		n := 1 + c.B*c.T*a.QRow
		r := rand.New(rand.NewPCG(uint64(c.T), 7))
		rnd := func(n int) []float32 {
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(r.NormFloat64())
			}
			return x
		}
		qkv, dout := rnd(n), rnd(c.B*c.T*c.NH*c.HS)
		ref := attnRef{a}
		wo, wl := make([]float32, len(dout)), make([]float32, c.B*c.NH*c.T)
		ref.forward(wo, wl, qkv)
		wd := make([]float32, n)
		ref.backward(wd, dout, qkv, wo, wl)
		var first [3][]float32
		for pi, path := range SupportedSIMD() {
			if _, err := SetSIMD(path); err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%+v %v", c, path)
			o, l := make([]float32, len(wo)), make([]float32, len(wl))
			d := rnd(n) // overwritten where it is a gradient
			d0 := slices.Clone(d)
			// Split the heads unevenly, as a thread count would.
			for _, span := range [][2]int{{0, 1}, {1, c.B * c.NH}} {
				if err := AttentionForward(o, l, qkv, a, span[0], span[1]); err != nil {
					t.Fatal(err)
				}
			}
			for _, span := range [][2]int{{0, c.B*c.KVH - 1}, {c.B*c.KVH - 1, c.B * c.KVH}} {
				if err := AttentionBackward(d, dout, qkv, o, l, a, span[0], span[1]); err != nil {
					t.Fatal(err)
				}
			}
			if d[0] != d0[0] {
				t.Fatalf("%s: backward wrote the leading element, which is no head's", name)
			}
			d[0] = 0
			near := func(what string, got, want []float32, tol float64) {
				for i := range got {
					if math.Abs(float64(got[i]-want[i])) > tol*(1+math.Abs(float64(want[i]))) {
						t.Fatalf("%s: %s[%d] = %v, want %v (Go loops)", name, what, i, got[i], want[i])
					}
				}
			}
			wd[0] = 0
			near("out", o, wo, 1e-6)
			near("lse", l, wl, 1e-6)
			near("dqkv", d, wd, 1e-5)
			if pi == 0 {
				first = [3][]float32{o, l, d}
				continue
			}
			for k, got := range [3][]float32{o, l, d} {
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(first[k][i]) {
						t.Fatalf("%s: output %d element %d = %v, scalar path %v: paths differ", name, k, i, got[i], first[k][i])
					}
				}
			}
		}
	}
	if err := AttentionForward(make([]float32, 3), make([]float32, 3), make([]float32, 3), AttentionShape{B: 1, T: 2, NH: 1, KVH: 1, HS: 4, QRow: 12, KVRow: 12}, 0, 1); err == nil {
		t.Error("short tensors: no error")
	}
}
