// triad.go: the STREAM triad on the worker pool, the memory-bandwidth
// yardstick for the Adam step: same threads, same chunking, same SIMD path.
//
// Accounting follows STREAM: 12 bytes per element (b and c read, a written),
// write-allocate traffic not counted; the best of the timed runs is reported.
// It is measured twice: with plain stores (what STREAM built with a stock
// compiler does; the uncounted write-allocate read costs time) and with
// non-temporal stores (no write-allocate); the higher is the fairer
// yardstick.
// Limits: the arrays should be at least 4 times the last-level cache
// (TriadMinElements) or the figure measures the cache, not memory.

package host

/*
#include "triad.h"
*/
import "C"

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/klauspost/cpuid/v2"
)

// TriadChunkLen is the number of elements per work chunk (as for Adam).
const TriadChunkLen = AdamChunkLen

// TriadBytesPerElement is STREAM's count for the triad.
const TriadBytesPerElement = 12

// TriadLLCBytes returns the size of the last-level cache as cpuid reports
// it (L3, else L2), or 0 when unknown.
func TriadLLCBytes() int64 {
	if l3 := cpuid.CPU.Cache.L3; l3 > 0 {
		return int64(l3)
	}
	if l2 := cpuid.CPU.Cache.L2; l2 > 0 {
		return int64(l2)
	}
	return 0
}

// TriadMinElements returns the array length at which each of the three
// arrays is 4 times the last-level cache (32 MiB assumed when unknown).
func TriadMinElements() int {
	llc := TriadLLCBytes()
	if llc <= 0 {
		llc = 32 << 20
	}
	return int(4 * llc / 4)
}

// Triad computes a[i] = b[i] + s*c[i] on the workers (nil: the calling
// goroutine) with the active SIMD path; nonTemporal asks for streaming
// stores (used on SIMD paths when a is 64-byte aligned).
func (w *Workers) Triad(a, b, c []float32, s float32, nonTemporal bool) error {
	n := len(a)
	if len(b) != n || len(c) != n {
		return fmt.Errorf("host: triad: lengths a=%d b=%d c=%d differ", len(a), len(b), len(c))
	}
	path := ActiveSIMD()
	nt := C.int(0)
	if nonTemporal {
		nt = 1
	}
	chunks := (n + TriadChunkLen - 1) / TriadChunkLen
	return w.parallel(chunks, func(k int) {
		lo := k * TriadChunkLen
		hi := min(lo+TriadChunkLen, n)
		C.lsp_triad(C.int(path), nt, (*C.float)(unsafe.Pointer(&a[lo])),
			(*C.float)(unsafe.Pointer(&b[lo])), (*C.float)(unsafe.Pointer(&c[lo])),
			C.float(s), C.size_t(hi-lo))
	})
}

// TriadResult is a bandwidth measurement.
type TriadResult struct {
	N       int           // elements per array
	Threads int           // workers used
	Best    time.Duration // fastest run, plain stores
	GBps    float64       // 12*N bytes / Best, in 1e9 bytes per second
	BestNT  time.Duration // fastest run, non-temporal stores
	GBpsNT  float64       // 12*N bytes / BestNT
}

// Max returns the higher of the two bandwidths.
func (r TriadResult) Max() float64 { return max(r.GBps, r.GBpsNT) }

// TriadBandwidth measures the triad on three off-heap arrays of n elements,
// first touched by the workers that later use them, over reps timed runs
// after one warm-up, with plain and with non-temporal stores. It checks the
// result, so a broken kernel cannot report a bandwidth.
func (w *Workers) TriadBandwidth(n, reps int) (TriadResult, error) {
	if n <= 0 || reps <= 0 {
		return TriadResult{}, fmt.Errorf("host: triad: n = %d, reps = %d, want both > 0", n, reps)
	}
	arrs, free, err := bandwidthArrays("triad", 3, n)
	if err != nil {
		return TriadResult{}, err
	}
	defer free()
	a, b, c := arrs[0], arrs[1], arrs[2]
	chunks := (n + TriadChunkLen - 1) / TriadChunkLen
	err = w.parallel(chunks, func(k int) {
		for i := k * TriadChunkLen; i < min((k+1)*TriadChunkLen, n); i++ {
			a[i], b[i], c[i] = 0, float32(i%1024), 1
		}
	})
	if err != nil {
		return TriadResult{}, fmt.Errorf("host: triad: initialising: %w", err)
	}
	const s = 3
	var best [2]time.Duration
	for k, nt := range []bool{false, true} {
		clear(a)
		if best[k], err = fastestRun(reps, func() error { return w.Triad(a, b, c, s, nt) }); err != nil {
			return TriadResult{}, err
		}
		for _, i := range []int{0, n / 3, n - 1} {
			if want := float32(i%1024) + s; a[i] != want {
				return TriadResult{}, fmt.Errorf("host: triad (non-temporal %v): a[%d] = %v, want %v", nt, i, a[i], want)
			}
		}
	}
	bytes := float64(TriadBytesPerElement) * float64(n)
	return TriadResult{
		N: n, Threads: w.threads(),
		Best: best[0], GBps: bytes / best[0].Seconds() / 1e9,
		BestNT: best[1], GBpsNT: bytes / best[1].Seconds() / 1e9,
	}, nil
}

// The parts the bandwidth measurements (TriadBandwidth, RMWBandwidth)
// share.

// bandwidthArrays allocates k off-heap arrays of n float32s for a
// measurement of kernel (named in its errors); free releases them.
func bandwidthArrays(kernel string, k, n int) (arrs [][]float32, free func(), err error) {
	var bufs []*HostBuffer
	free = func() {
		for _, b := range bufs {
			b.Free()
		}
	}
	arrs = make([][]float32, k)
	for i := range arrs {
		buf, err := NewHostBuffer(4*n, HostBufferOptions{})
		if err == nil {
			bufs = append(bufs, buf)
			arrs[i], err = buf.Float32s(0, n)
		}
		if err != nil {
			free()
			return nil, nil, fmt.Errorf("host: %s: array %d: %w", kernel, i, err)
		}
	}
	return arrs, free, nil
}

// fastestRun times run reps+1 times and returns the fastest time but for
// the first run's (the warm-up).
func fastestRun(reps int, run func() error) (time.Duration, error) {
	best := time.Duration(1<<63 - 1)
	for r := 0; r <= reps; r++ {
		t0 := time.Now()
		if err := run(); err != nil {
			return 0, err
		}
		if d := time.Since(t0); r > 0 && d < best {
			best = d
		}
	}
	return best, nil
}

// threads is the number of workers a measurement ran on (1 for nil).
func (w *Workers) threads() int {
	if w == nil {
		return 1
	}
	return w.N()
}
