// Command gemm benchmarks host.Sgemm on the GPT-2 124M matmul shapes at
// B*T = 1024 rows (forward NN, backward dX as NT and dW as TN) and, when
// built with -tags openblas, OpenBLAS cblas_sgemm on the same inputs with
// the same thread count, printing GFLOP/s side by side, the ratio, and as
// its last line "gemm-vs-openblas: X.XX" (the geometric mean of the
// ratios). Timing alternates batches of ours and of the reference over
// several rounds and keeps the best call of each (see measure).
//
// Limits: wall-clock timing on a shared machine; the LM-head shapes need
// about 1 GB of memory.
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lsp-offload/lsp-offload/host"
)

// reference is another sgemm to compare with (OpenBLAS under -tags openblas).
type reference interface {
	Name() string
	Describe() string
	Sgemm(transA, transB bool, M, N, K int, alpha float32, A []float32, lda int, B []float32, ldb int, beta float32, C []float32, ldc int)
}

// shape is one GPT-2 matmul; C = op(A) op(B) with op(A) M x K, op(B) K x N.
type shape struct {
	name           string
	transA, transB bool
	M, N, K        int
}

// GPT-2 124M at B*T = 1024: C = 768, 3C = 2304, 4C = 3072, V = 50257.
// Forward y = x W (NN); backward dX = dY W^T (NT), dW = X^T dY (TN). The LM
// head ties W to wte (V x C), so its forward is NT, its dX NN and its dW TN.
var shapes = []shape{
	{"qkv fwd", false, false, 1024, 2304, 768},
	{"attproj fwd", false, false, 1024, 768, 768},
	{"fc fwd", false, false, 1024, 3072, 768},
	{"fcproj fwd", false, false, 1024, 768, 3072},
	{"lmhead fwd", false, true, 1024, 50257, 768},
	{"qkv dX", false, true, 1024, 768, 2304},
	{"attproj dX", false, true, 1024, 768, 768},
	{"fc dX", false, true, 1024, 768, 3072},
	{"fcproj dX", false, true, 1024, 3072, 768},
	{"lmhead dX", false, false, 1024, 768, 50257},
	{"qkv dW", true, false, 768, 2304, 1024},
	{"attproj dW", true, false, 768, 768, 1024},
	{"fc dW", true, false, 768, 3072, 1024},
	{"fcproj dW", true, false, 3072, 768, 1024},
	{"lmhead dW", true, false, 50257, 768, 1024},
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench/gemm:", err)
		os.Exit(1)
	}
}

func run() error {
	threads := flag.Int("threads", runtime.NumCPU(), "threads for both libraries")
	rounds := flag.Int("rounds", 5, "rounds per shape, each a batch of calls of ours then of the reference (best call kept)")
	only := flag.String("shapes", "", "comma-separated substrings; run only shapes whose name contains one")
	skipLM := flag.Bool("no-lmhead", false, "skip the (large) LM-head shapes")
	fixCore := flag.Bool("fix-core", true, "when OPENBLAS_CORETYPE is unset and OpenBLAS picked a core without this CPU's vector unit, re-run with it set")
	flag.Parse()
	if *threads < 1 || *rounds < 1 {
		return fmt.Errorf("-threads and -rounds must be at least 1 (got %d, %d)", *threads, *rounds)
	}
	host.SetThreads(*threads)
	ref, err := newReference(*threads, *fixCore)
	if err != nil {
		return err
	}

	fmt.Printf("sgemm GFLOP/s, GPT-2 124M shapes, B*T=1024, %d threads, best call of %d rounds\n", *threads, *rounds)
	fmt.Printf("ours: host.Sgemm path %v (CPU best %v, %s=%q)\n", host.ActiveSIMD(), host.DetectSIMD(), host.SIMDEnv, os.Getenv(host.SIMDEnv))
	if ref != nil {
		fmt.Printf("reference: %s\n", ref.Describe())
	} else {
		fmt.Println("reference: none (build with -tags openblas to compare)")
	}

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shape\tlayout\tM\tN\tK\tours\tref\tratio\tmax rel diff\t")
	rng := rand.New(rand.NewPCG(1, 2))
	var logSum float64
	var n int
	for _, s := range shapes {
		if !selected(s.name, *only, *skipLM) {
			continue
		}
		ours, theirs, diff, err := measure(rng, s, ref, *rounds)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		layout := map[[2]bool]string{{false, false}: "NN", {false, true}: "NT", {true, false}: "TN", {true, true}: "TT"}[[2]bool{s.transA, s.transB}]
		if ref == nil {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.1f\t-\t-\t-\t\n", s.name, layout, s.M, s.N, s.K, ours)
			continue
		}
		ratio := ours / theirs
		logSum += math.Log(ratio)
		n++
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%.1f\t%.1f\t%.2f\t%.1e\t\n", s.name, layout, s.M, s.N, s.K, ours, theirs, ratio, diff)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if ref == nil {
		return nil
	}
	if n == 0 {
		return fmt.Errorf("no shape matches -shapes %q", *only)
	}
	fmt.Printf("gemm-vs-openblas: %.2f\n", math.Exp(logSum/float64(n)))
	return nil
}

func selected(name, only string, skipLM bool) bool {
	if skipLM && strings.HasPrefix(name, "lmhead") {
		return false
	}
	if only == "" {
		return true
	}
	for _, f := range strings.Split(only, ",") {
		if f != "" && strings.Contains(name, f) {
			return true
		}
	}
	return false
}

// measure returns GFLOP/s of ours and of ref (0 without one) on s, and the
// largest difference between the two results relative to max |C|. After a
// warm-up, rounds alternate: a batch of calls of ours (about batchSeconds),
// the same number of the reference, then a pause so OpenBLAS's spinning
// worker threads go to sleep before ours runs again. The best call counts.
func measure(rng *rand.Rand, s shape, ref reference, rounds int) (ours, theirs, diff float64, err error) {
	ar, ac := s.M, s.K
	if s.transA {
		ar, ac = s.K, s.M
	}
	br, bc := s.K, s.N
	if s.transB {
		br, bc = s.N, s.K
	}
	A := randMat(rng, ar*ac)
	B := randMat(rng, br*bc)
	C1 := make([]float32, s.M*s.N)
	flops := 2 * float64(s.M) * float64(s.N) * float64(s.K)

	var callErr error
	ourCall := func() {
		if e := host.Sgemm(s.transA, s.transB, s.M, s.N, s.K, 1, A, ac, B, bc, 0, C1, s.N); e != nil {
			callErr = e
		}
	}
	var C2 []float32
	refCall := func() {}
	if ref != nil {
		C2 = make([]float32, s.M*s.N)
		refCall = func() { ref.Sgemm(s.transA, s.transB, s.M, s.N, s.K, 1, A, ac, B, bc, 0, C2, s.N) }
	}

	bestOurs, bestRef := timed(ourCall), timed(refCall)
	if callErr != nil {
		return 0, 0, 0, callErr
	}
	pause(ref)
	n := min(maxBatch, max(1, int(math.Ceil(batchSeconds/max(bestOurs, bestRef)))))
	for range rounds {
		for range n {
			bestOurs = min(bestOurs, timed(ourCall))
		}
		if ref != nil {
			for range n {
				bestRef = min(bestRef, timed(refCall))
			}
			pause(ref)
		}
	}
	if ref == nil {
		return flops / bestOurs / 1e9, 0, 0, nil
	}
	var maxAbs, maxDiff float64
	for i := range C1 {
		maxAbs = max(maxAbs, math.Abs(float64(C2[i])))
		maxDiff = max(maxDiff, math.Abs(float64(C1[i])-float64(C2[i])))
	}
	if maxAbs > 0 {
		diff = maxDiff / maxAbs
	}
	return flops / bestOurs / 1e9, flops / bestRef / 1e9, diff, nil
}

const (
	batchSeconds = 0.1 // length of one batch of calls
	maxBatch     = 50
	// OpenBLAS worker threads spin for about 2^28 cycles after a call.
	spinPause = 200 * time.Millisecond
)

func pause(ref reference) {
	if ref != nil {
		time.Sleep(spinPause)
	}
}

// timed returns how long f takes, in seconds.
func timed(f func()) float64 {
	t := time.Now()
	f()
	return time.Since(t).Seconds()
}

func randMat(rng *rand.Rand, n int) []float32 {
	m := make([]float32, n)
	for i := range m {
		m[i] = float32(rng.Float64()*2 - 1)
	}
	return m
}
