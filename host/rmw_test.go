// rmw_test.go: the read-modify-write ceiling kernel on every path and
// length (tails included) against exact small-integer arithmetic, and a
// small bandwidth run.

package host

import "testing"

func TestRMW4Paths(t *testing.T) {
	pool := adamTestWorkers(t, 2)
	eachSIMD(t, func(path SIMD) {
		for _, n := range []int{1, 7, 8, 9, 15, 16, 17, 31, 3*TriadChunkLen + 9} {
			for _, pf := range []bool{false, true} {
				w, g, m, v := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
				for i := range w {
					// Small integers of both signs: every result is exact.
					w[i], g[i], m[i], v[i] = float32(i%977), float32(i%7-3), float32(i%5), float32(i%11)
				}
				if err := pool.RMW4(w, g, m, v, -2, pf); err != nil {
					t.Fatal(err)
				}
				for i := range w {
					gi := float32(i%7 - 3)
					mi := float32(i%5) + gi
					want := [3]float32{float32(i%977) - 2*mi, mi, float32(i%11) + gi*gi}
					if got := [3]float32{w[i], m[i], v[i]}; got != want {
						t.Fatalf("%v n=%d prefetch=%v: element %d (w, m, v) = %v, want %v", path, n, pf, i, got, want)
					}
				}
			}
		}
	})
	if err := pool.RMW4(make([]float32, 3), make([]float32, 3), make([]float32, 2), make([]float32, 3), 1, false); err == nil {
		t.Error("mismatched lengths accepted")
	}
}

func TestRMWBandwidth(t *testing.T) {
	pool := adamTestWorkers(t, 2)
	r, err := pool.RMWBandwidth(1<<20+5, 2)
	if err != nil {
		t.Fatal(err)
	}
	if r.N != 1<<20+5 || r.Threads != 2 || r.Best <= 0 || !(r.GBps > 0) || !(r.GBpsPF > 0) || r.Max() < r.GBps || r.Max() < r.GBpsPF {
		t.Errorf("result %+v", r)
	}
	if _, err := pool.RMWBandwidth(0, 1); err == nil {
		t.Error("n = 0 accepted")
	}
	t.Logf("1M-element rmw4 %.1f GB/s, with prefetch %.1f GB/s", r.GBps, r.GBpsPF)
}
