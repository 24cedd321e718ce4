// triad_test.go: the triad kernel on every path and length (tails
// included) against exact integer arithmetic, and a small bandwidth run.

package host

import (
	"testing"
)

func TestTriadPaths(t *testing.T) {
	pool := adamTestWorkers(t, 2)
	eachSIMD(t, func(path SIMD) {
		for _, n := range []int{1, 15, 16, 17, 31, 3*TriadChunkLen + 9} {
			a, b, c := make([]float32, n), make([]float32, n), make([]float32, n)
			for i := range b {
				b[i], c[i] = float32(i%977), float32(i%13) // small integers: exact
			}
			for _, nt := range []bool{false, true} {
				clear(a)
				if err := pool.Triad(a, b, c, 3, nt); err != nil {
					t.Fatal(err)
				}
				for i := range a {
					if want := b[i] + 3*c[i]; a[i] != want {
						t.Fatalf("%v n=%d nt=%v: a[%d] = %v, want %v", path, n, nt, i, a[i], want)
					}
				}
			}
		}
	})
	if err := pool.Triad(make([]float32, 3), make([]float32, 2), make([]float32, 3), 1, false); err == nil {
		t.Error("mismatched lengths accepted")
	}
}

func TestTriadBandwidth(t *testing.T) {
	pool := adamTestWorkers(t, 2)
	r, err := pool.TriadBandwidth(1<<20, 2)
	if err != nil {
		t.Fatal(err)
	}
	if r.N != 1<<20 || r.Threads != 2 || r.Best <= 0 || !(r.GBps > 0) || !(r.GBpsNT > 0) || r.Max() < r.GBps {
		t.Errorf("result %+v", r)
	}
	if _, err := pool.TriadBandwidth(0, 1); err == nil {
		t.Error("n = 0 accepted")
	}
	if min := TriadMinElements(); min*4 < 4*int(TriadLLCBytes()) {
		t.Errorf("TriadMinElements() = %d: arrays smaller than 4x the LLC (%d bytes)", min, TriadLLCBytes())
	}
	t.Logf("LLC %d MiB, 1M-element triad %.1f GB/s, non-temporal %.1f GB/s", TriadLLCBytes()>>20, r.GBps, r.GBpsNT)
}
