// rmw.go: the four-array read-modify-write ceiling on the worker pool, a
// second yardstick for the Adam step beside the triad. The triad moves 12
// bytes per element over three arrays (two read, one written); the Adam
// update reads four streams and writes three back in place, a pattern the
// memory system may serve faster or slower than the triad's. This kernel
// has Adam's bytes and access pattern with almost none of its arithmetic,
// so it is what a memory-bound Adam could reach on this machine.
//
// Accounting as for Adam's "norm given" row: 28 bytes per element (w, m, v
// read and written, g read), no write-allocate (every written line was read
// first). Measured with and without software prefetch; the higher is the
// ceiling. Limits: the arrays should be at least 4 times the last-level
// cache (TriadMinElements) or the figure measures the cache.

package host

/*
#include "rmw.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"
)

// RMWBytesPerElement is the bytes one element of the ceiling kernel moves,
// the same as one parameter of an fp32 Adam update with the norm given.
const RMWBytesPerElement = 28

// RMW4 computes, for every i, m[i] += g[i]; v[i] += g[i]*g[i];
// w[i] += s*m[i] (the new m) on the workers (nil: the calling goroutine)
// with the active SIMD path; prefetch adds the Adam update's software
// prefetch.
func (w *Workers) RMW4(wt, g, m, v []float32, s float32, prefetch bool) error {
	n := len(wt)
	if len(g) != n || len(m) != n || len(v) != n {
		return fmt.Errorf("host: rmw4: lengths w=%d g=%d m=%d v=%d differ", len(wt), len(g), len(m), len(v))
	}
	path := ActiveSIMD()
	pf := C.int(0)
	if prefetch {
		pf = 1
	}
	chunks := (n + TriadChunkLen - 1) / TriadChunkLen
	return w.parallel(chunks, func(k int) {
		lo := k * TriadChunkLen
		hi := min(lo+TriadChunkLen, n)
		C.lsp_rmw4(C.int(path), pf, (*C.float)(unsafe.Pointer(&wt[lo])),
			(*C.float)(unsafe.Pointer(&g[lo])), (*C.float)(unsafe.Pointer(&m[lo])),
			(*C.float)(unsafe.Pointer(&v[lo])), C.float(s), C.size_t(hi-lo))
	})
}

// RMWResult is a ceiling measurement.
type RMWResult struct {
	N       int           // elements per array
	Threads int           // workers used
	Best    time.Duration // fastest run, no software prefetch
	GBps    float64       // 28*N bytes / Best, in 1e9 bytes per second
	BestPF  time.Duration // fastest run, with software prefetch
	GBpsPF  float64       // 28*N bytes / BestPF
}

// Max returns the higher of the two bandwidths.
func (r RMWResult) Max() float64 { return max(r.GBps, r.GBpsPF) }

// RMWBandwidth measures RMW4 on four off-heap arrays of n elements, first
// touched by the workers that later use them, over reps timed runs after
// one warm-up, without and with software prefetch. It checks the result
// (small integers, exact in float32), so a broken kernel cannot report a
// bandwidth.
func (w *Workers) RMWBandwidth(n, reps int) (RMWResult, error) {
	if n <= 0 || reps <= 0 {
		return RMWResult{}, fmt.Errorf("host: rmw4: n = %d, reps = %d, want both > 0", n, reps)
	}
	arrs, free, err := bandwidthArrays("rmw4", 4, n)
	if err != nil {
		return RMWResult{}, err
	}
	defer free()
	wt, g, m, v := arrs[0], arrs[1], arrs[2], arrs[3]
	chunks := (n + TriadChunkLen - 1) / TriadChunkLen
	reset := func() error {
		return w.parallel(chunks, func(k int) {
			for i := k * TriadChunkLen; i < min((k+1)*TriadChunkLen, n); i++ {
				wt[i], g[i], m[i], v[i] = float32(i%64), float32(i%3), 0, 0
			}
		})
	}
	// With g in {0, 1, 2} and s = 1, after r runs: m = r*g, v = r*g*g,
	// w = w0 + g*r*(r+1)/2, all small integers for the run counts used.
	const s = 1
	var best [2]time.Duration
	for k, pf := range []bool{false, true} {
		if err := reset(); err != nil {
			return RMWResult{}, fmt.Errorf("host: rmw4: initialising: %w", err)
		}
		if best[k], err = fastestRun(reps, func() error { return w.RMW4(wt, g, m, v, s, pf) }); err != nil {
			return RMWResult{}, err
		}
		runs := float32(reps + 1)
		for _, i := range []int{0, 1, 2, n / 3, n - 1} {
			if i >= n {
				continue
			}
			gi := float32(i % 3)
			wantW := float32(i%64) + gi*runs*(runs+1)/2
			if m[i] != runs*gi || v[i] != runs*gi*gi || wt[i] != wantW {
				return RMWResult{}, fmt.Errorf("host: rmw4 (prefetch %v): element %d = (w %v, m %v, v %v), want (%v, %v, %v)",
					pf, i, wt[i], m[i], v[i], wantW, runs*gi, runs*gi*gi)
			}
		}
	}
	bytes := float64(RMWBytesPerElement) * float64(n)
	return RMWResult{
		N: n, Threads: w.threads(),
		Best: best[0], GBps: bytes / best[0].Seconds() / 1e9,
		BestPF: best[1], GBpsPF: bytes / best[1].Seconds() / 1e9,
	}, nil
}
