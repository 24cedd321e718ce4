//go:build lsp_sim

// Tests of the CPU simulator itself (through the self-test kernels in
// selftest.cu) and the barrier-removal check over every kernel family.
// Tests that crash the process on purpose run their crashing part in a child
// (RunInChild). TestBarrierRemoval is heavy and skips under -short; `make
// simtest` runs it.

package simtest

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// markerLine returns the line of selftest.cu that contains marker.
func markerLine(t *testing.T, marker string) int {
	t.Helper()
	data, err := os.ReadFile("selftest.cu")
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(data), "\n") {
		if strings.Contains(l, marker) {
			return i + 1
		}
	}
	t.Fatalf("selftest.cu: marker %s not found", marker)
	return 0
}

func iota32(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i) + 0.5
	}
	return x
}

func reversed(x []float32) []float32 {
	y := make([]float32, len(x))
	for i := range x {
		y[i] = x[len(x)-1-i]
	}
	return y
}

func equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// A kernel with its barrier is right for every seed; without it, wrong for
// every seed tried (threads read slots others have not written yet).
func TestSimBarrier(t *testing.T) {
	const n = 256
	in := FromFloat32(t, iota32(n))
	want := reversed(iota32(n))
	for _, seed := range []uint64{1, 2, 3, 4, 5} {
		for _, barrier := range []bool{true, false} {
			SetSeed(seed)
			out := Alloc(t, 4*n)
			if err := stReverse(in.Dev(), out.Dev(), n, barrier, 0); err != nil {
				t.Fatal(err)
			}
			ok := equal(out.Float32(), want)
			if ok != barrier {
				t.Errorf("seed %d, barrier %v: result right = %v, want %v", seed, barrier, ok, barrier)
			}
		}
	}
}

// LSP_SIM_SKIP_BARRIER's mechanism: switching the site off breaks the
// kernel and counts the skipped arrivals; other sites are unaffected.
func TestSimSkipBarrier(t *testing.T) {
	const n = 128
	line := markerLine(t, "SELFTEST_BARRIER_REVERSE")
	in := FromFloat32(t, iota32(n))
	want := reversed(iota32(n))
	defer func() {
		if err := setSkipBarriers(os.Getenv(skipEnv)); err != nil {
			t.Error(err)
		}
	}()
	for _, tc := range []struct {
		sites string
		right bool
	}{
		{"", true},
		{fmt.Sprintf("selftest.cu:%d", line), false},
		{fmt.Sprintf("other.cu:%d, selftest.cu:%d", line, line+1), true},
	} {
		if err := setSkipBarriers(tc.sites); err != nil {
			t.Fatal(err)
		}
		SetSeed(7)
		before := skippedBarrierHits()
		out := Alloc(t, 4*n)
		if err := stReverse(in.Dev(), out.Dev(), n, true, 0); err != nil {
			t.Fatal(err)
		}
		hits := skippedBarrierHits() - before
		if ok := equal(out.Float32(), want); ok != tc.right {
			t.Errorf("skip %q: result right = %v, want %v", tc.sites, ok, tc.right)
		}
		if wantHits := map[bool]int64{true: 0, false: n}[tc.right]; hits != wantHits {
			t.Errorf("skip %q: %d skipped arrivals, want %d", tc.sites, hits, wantHits)
		}
	}
	if err := setSkipBarriers("gemm.cu"); err == nil {
		t.Error("a site without a line was accepted")
	}
}

// Thread order varies with the seed, is reproducible for a seed, and no
// thread passes a barrier before all have reached it.
func TestSimOrder(t *testing.T) {
	const n = 64
	run := func(seed uint64) []int32 {
		SetSeed(seed)
		tickets := Alloc(t, 4*2*n)
		counter := FromInt32(t, []int32{0})
		if err := stOrder(tickets.Dev(), counter.Dev(), n, 0); err != nil {
			t.Fatal(err)
		}
		return append([]int32(nil), tickets.Int32()...)
	}
	orders := map[string]bool{}
	for _, seed := range []uint64{1, 2, 3} {
		got := run(seed)
		seen := make([]bool, 2*n)
		for i, v := range got {
			if v < 0 || int(v) >= 2*n || seen[v] {
				t.Fatalf("seed %d: bad ticket %d at %d", seed, v, i)
			}
			seen[v] = true
			if (i < n) != (int(v) < n) {
				t.Errorf("seed %d: thread %d took ticket %d on the wrong side of the barrier", seed, i%n, v)
			}
		}
		if again := run(seed); fmt.Sprint(again) != fmt.Sprint(got) {
			t.Errorf("seed %d: the order is not reproducible", seed)
		}
		orders[fmt.Sprint(got)] = true
	}
	if len(orders) < 3 {
		t.Errorf("3 seeds gave only %d distinct thread orders", len(orders))
	}
}

// shflRef is the source lane PTX's shfl.sync picks (mode: idx, up, down,
// xor), written from the PTX ISA's pseudo-code independently of sim.h.
func shflRef(mode string, lane, b, width int) int {
	segStart := lane / width * width
	segEnd := segStart + width - 1
	switch mode {
	case "idx":
		return segStart + b%width
	case "up":
		if lane-b >= segStart {
			return lane - b
		}
	case "down":
		if lane+b <= segEnd {
			return lane + b
		}
	case "xor":
		if lane^b <= segEnd {
			return lane ^ b
		}
	}
	return lane
}

func TestSimWarp(t *testing.T) {
	const n = 64
	in := make([]int32, n)
	for i := range in {
		in[i] = int32((i*37 + 11) % 97) // 0..96, some > 90, all >= 0
	}
	in[40] = 0 // warp 1 has a zero, warp 0 none: __all_sync differs
	for _, seed := range Seeds {
		SetSeed(seed)
		inb := FromInt32(t, in)
		out := Alloc(t, 4*14*n)
		if err := stWarp(inb.Dev(), out.Dev(), n, 0); err != nil {
			t.Fatal(err)
		}
		got := out.Int32()
		for tid := 0; tid < n; tid++ {
			w, lane := tid/32*32, tid%32
			v := func(l int) int32 { return in[w+l] }
			var ballot uint32
			all, anyv, sum := int32(1), int32(0), int32(0)
			for l := 0; l < 32; l++ {
				if v(l)&1 != 0 {
					ballot |= 1 << l
				}
				if v(l) <= 0 {
					all = 0
				}
				if v(l) > 90 {
					anyv = 1
				}
				sum += v(l)
			}
			partial := int32(-2)
			if lane < 16 {
				partial = v(lane + 1)
				if lane == 15 {
					partial = -1 // lane 16 is outside the mask: NaN bytes
				}
			}
			want := []int32{
				v(shflRef("idx", lane, (lane*7+3)%32, 32)),
				v(shflRef("idx", lane, lane+5, 8)),
				v(shflRef("up", lane, 3, 32)),
				v(shflRef("up", lane, 5, 16)),
				v(shflRef("down", lane, 4, 32)),
				v(shflRef("down", lane, 3, 8)),
				v(shflRef("xor", lane, 5, 32)),
				v(shflRef("xor", lane, 3, 4)),
				int32(ballot), all, anyv, sum,
				v(lane ^ 16),
				partial,
			}
			for k, wv := range want {
				if g := got[k*n+tid]; g != wv {
					t.Errorf("seed %d: op %d thread %d: got %d, want %d", seed, k, tid, g, wv)
				}
			}
		}
	}
}

// wmmaRef computes scale*(A B + C) in float64 from column/row-major
// storage with leading dimensions, and writes D in its layout.
func wmmaRef(a wmmaArgs, A, B []float32, Cm []float32, scale float32) []float32 {
	at := func(x []float32, col bool, ld, r, c int) float32 {
		if col {
			return x[c*ld+r]
		}
		return x[r*ld+c]
	}
	D := make([]float32, 16*a.ldd)
	for i := range D {
		D[i] = float32(math.NaN())
	}
	for r := 0; r < 16; r++ {
		for c := 0; c < 16; c++ {
			s := float64(at(Cm, a.cCol, a.ldc, r, c))
			for k := 0; k < 16; k++ {
				s += float64(at(A, a.aCol, a.lda, r, k)) * float64(at(B, a.bCol, a.ldb, k, c))
			}
			v := float32(s * float64(scale))
			if a.dCol {
				D[c*a.ldd+r] = v
			} else {
				D[r*a.ldd+c] = v
			}
		}
	}
	return D
}

func TestSimWmma(t *testing.T) {
	cases := []wmmaArgs{
		{lda: 16, ldb: 16, ldc: 16, ldd: 16},
		{aCol: true, lda: 24, ldb: 16, ldc: 20, ldd: 16},
		{bCol: true, lda: 16, ldb: 32, ldc: 16, cCol: true, ldd: 24},
		{aCol: true, bCol: true, lda: 16, ldb: 16, ldc: 16, ldd: 16, dCol: true},
	}
	for ci, a := range cases {
		A := RoundBF16(Rand(uint64(10+ci), 16*a.lda, 1))
		B := RoundBF16(Rand(uint64(20+ci), 16*a.ldb, 1))
		Cm := Rand(uint64(30+ci), 16*a.ldc, 1)
		bias := Rand(99, 16, 1)
		want := wmmaRef(a, A, B, Cm, 1.5)
		wrongBias := 0
		for _, seed := range []uint64{1, 2, 3, 4} {
			SetSeed(seed)
			D := Alloc(t, 4*16*a.ldd)
			bufs := []*Buffer{FromBF16(t, A), FromBF16(t, B), FromFloat32(t, Cm)}
			if err := a.launch(bufs[0], bufs[1], bufs[2], D, 1.5, nil); err != nil {
				t.Fatal(err)
			}
			got := D.Float32()
			gotValid, wantValid := []float32{}, []float32{}
			for i := range want {
				if !math.IsNaN(float64(want[i])) {
					gotValid, wantValid = append(gotValid, got[i]), append(wantValid, want[i])
				}
			}
			Compare(t, fmt.Sprintf("case %d seed %d", ci, seed), gotValid, wantValid, 1e-5, 1e-5)

			// Adding a bias by element position is layout-dependent.
			Db := Alloc(t, 4*16*a.ldd)
			if err := a.launch(bufs[0], bufs[1], bufs[2], Db, 1.5, FromFloat32(t, bias)); err != nil {
				t.Fatal(err)
			}
			for r := 0; r < 16; r++ {
				for c := 0; c < 16; c++ {
					i := r*a.ldd + c
					if a.dCol {
						i = c*a.ldd + r
					}
					if math.Abs(float64(Db.Float32()[i]-want[i]-bias[c])) > 1e-4 {
						wrongBias++
						r, c = 16, 16
					}
				}
			}
		}
		if wrongBias == 0 {
			t.Errorf("case %d: a kernel that indexes fragment elements by position was right for every seed", ci)
		}
	}
}

func TestSimWmmaMisaligned(t *testing.T) {
	A := FromBF16(t, Rand(1, 16*32+64, 1))
	for _, tc := range []struct {
		off, lda int
		ok       bool
	}{
		{0, 16, true},
		{16, 16, true}, // 32 bytes in: still aligned
		{1, 16, false}, // 2 bytes in
		{8, 16, false}, // 16 bytes in
		{0, 20, false}, // 40-byte rows
		{0, 24, true},  // 48-byte rows
	} {
		D := AllocAligned(t, 4*256, 256)
		err := stWmmaMisaligned(A.Dev(), tc.off, tc.lda, D.Dev(), 0)
		if (err == nil) != tc.ok {
			t.Errorf("off %d lda %d: error %v, want ok=%v", tc.off, tc.lda, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "cudaErrorMisalignedAddress") {
			t.Errorf("off %d lda %d: %v, want cudaErrorMisalignedAddress", tc.off, tc.lda, err)
		}
	}
}

// A tiled wmma GEMM (shared memory, two barriers per K slice) agrees with a
// float64 reference for every seed, and runs fast enough.
func TestSimGemm(t *testing.T) {
	const M, N, K = 256, 256, 256
	A := RoundBF16(Rand(1, M*K, 1))
	B := RoundBF16(Rand(2, K*N, 1))
	want := make([]float32, M*N)
	for i := 0; i < M; i++ {
		for j := 0; j < N; j++ {
			s := 0.0
			for k := 0; k < K; k++ {
				s += float64(A[i*K+k]) * float64(B[k*N+j])
			}
			want[i*N+j] = float32(s)
		}
	}
	Ab, Bb := FromBF16(t, A), FromBF16(t, B)
	for _, seed := range Seeds {
		SetSeed(seed)
		Cb := Alloc(t, 4*M*N)
		start := time.Now()
		if err := stGemm(Ab.Dev(), Bb.Dev(), Cb.Dev(), M, N, K, 0); err != nil {
			t.Fatal(err)
		}
		el := time.Since(start)
		t.Logf("seed %d: %dx%dx%d wmma GEMM in %v", seed, M, N, K, el)
		if el > 10*time.Second {
			t.Errorf("the simulator took %v for a %dx%dx%d GEMM", el, M, N, K)
		}
		Compare(t, fmt.Sprintf("gemm seed %d", seed), Cb.Float32(), want, 1e-4, 1e-4)
	}
}

func BenchmarkSimGemm(b *testing.B) {
	const M, N, K = 256, 256, 256
	Ab, Bb := FromBF16(b, Rand(1, M*K, 1)), FromBF16(b, Rand(2, K*N, 1))
	Cb := Alloc(b, 4*M*N)
	for b.Loop() {
		if err := stGemm(Ab.Dev(), Bb.Dev(), Cb.Dev(), M, N, K, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(2*M*N*K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// An off-by-one global read past the end (or before the start) crashes
// the child; the parent sees the failure and the simulator's report.
func TestSimOutOfBounds(t *testing.T) {
	const n = 200
	if mode := os.Getenv("LSP_SIMTEST_OOB"); InChild() && mode != "" {
		in := Alloc(t, 4*n)
		off := 1
		if mode == "before" {
			in, off = AllocBefore(t, 4*n), -1
		}
		_ = stShift(in.Dev(), Alloc(t, 4*n).Dev(), n, off, 0)
		t.Logf("the %s off-by-one read did not crash", mode)
		return
	}
	// In bounds it works.
	in := FromFloat32(t, iota32(n+1))
	out := Alloc(t, 4*n)
	if err := stShift(in.Dev(), out.Dev(), n, 1, 0); err != nil {
		t.Fatal(err)
	}
	Compare(t, "shift", out.Float32(), iota32(n + 1)[1:], 0, 0)
	for _, tc := range []struct{ mode, want string }{
		{"after", "at byte offset 800 of a 800-byte device buffer"},
		{"before", "4 byte(s) before the start of a 800-byte device buffer"},
	} {
		output, failed := RunInChild(t, "TestSimOutOfBounds", "LSP_SIMTEST_OOB="+tc.mode)
		if !failed {
			t.Errorf("%s: the off-by-one read was not caught:\n%s", tc.mode, output)
			continue
		}
		for _, w := range []string{tc.want, "kernel st_shift_kernel"} {
			if !strings.Contains(output, w) {
				t.Errorf("%s: the child's output lacks %q:\n%s", tc.mode, w, output)
			}
		}
	}
}

func TestSimSharedMemory(t *testing.T) {
	if InChild() && os.Getenv("LSP_SIMTEST_SMEM") != "" {
		_ = stSmem(Alloc(t, 4*2*64).Dev(), 64, 1, 0)
		t.Log("the shared memory overrun did not crash")
		return
	}
	// Fresh dynamic shared memory holds NaN bytes; writes land.
	out := Alloc(t, 4*2*50)
	if err := stSmem(out.Dev(), 50, 0, 0); err != nil {
		t.Fatal(err)
	}
	for i, v := range out.Int32()[:50] {
		if v != -1 {
			t.Fatalf("dynamic shared memory word %d was 0x%08x at block start, want 0xffffffff", i, uint32(v))
		}
	}
	Compare(t, "smem", out.Float32()[50:], func() []float32 {
		x := iota32(50)
		for i := range x {
			x[i] -= 0.5
		}
		return x
	}(), 0, 0)
	// Writes into the rounding gap after the end or just before the start
	// are reported by the launch.
	for _, tc := range []struct {
		n, off int
		want   string
	}{
		{63, 1, "past the end of the block's 252 bytes"},
		{64, -1, "before the start of the block's 256 bytes"},
	} {
		err := stSmem(Alloc(t, 4*2*tc.n).Dev(), tc.n, tc.off, 0)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("n %d off %d: error %v, want one containing %q", tc.n, tc.off, err, tc.want)
		}
	}
	// A write past a 16-byte-multiple window hits the guard page.
	output, failed := RunInChild(t, "TestSimSharedMemory", "LSP_SIMTEST_SMEM=1")
	if !failed || !strings.Contains(output, "at byte offset 256 of the block's 256 bytes of dynamic shared memory") {
		t.Errorf("the shared memory overrun was not reported (failed %v):\n%s", failed, output)
	}
}

func TestSimStackOverflow(t *testing.T) {
	if InChild() && os.Getenv("LSP_SIMTEST_STACK") != "" {
		_ = stRecurse(1000, Alloc(t, 4).Dev(), 0)
		t.Log("the recursion did not overflow")
		return
	}
	out := Alloc(t, 4)
	if err := stRecurse(3, out.Dev(), 0); err != nil {
		t.Fatal(err)
	}
	output, failed := RunInChild(t, "TestSimStackOverflow", "LSP_SIMTEST_STACK=1")
	if !failed || !strings.Contains(output, "stack overflow") {
		t.Errorf("the stack overflow was not reported (failed %v):\n%s", failed, output)
	}
}

func TestSimLaunchErrors(t *testing.T) {
	one := [3]int{1, 1, 1}
	for _, tc := range []struct {
		name          string
		grid, block   [3]int
		smem, setAttr int
		want          string
	}{
		{"ok", [3]int{4, 2, 1}, [3]int{32, 4, 2}, 1024, 0, ""},
		{"1024 threads", one, [3]int{1024, 1, 1}, 0, 0, ""},
		{"1025 threads", one, [3]int{1025, 1, 1}, 0, 0, "cudaErrorInvalidConfiguration"},
		{"32x32x2 threads", one, [3]int{32, 32, 2}, 0, 0, "cudaErrorInvalidConfiguration"},
		{"z 65", one, [3]int{1, 1, 65}, 0, 0, "cudaErrorInvalidConfiguration"},
		{"grid 0", [3]int{0, 1, 1}, one, 0, 0, "cudaErrorInvalidConfiguration"},
		{"grid y 65536", [3]int{1, 65536, 1}, one, 0, 0, "cudaErrorInvalidConfiguration"},
		{"48 KiB", one, one, 48 << 10, 0, ""},
		{"48 KiB + 1", one, one, 48<<10 + 1, 0, "cudaErrorInvalidValue"},
		{"100 KiB opted in", one, one, 100 << 10, 100 << 10, ""},
		{"227 KiB opted in", one, one, 227 << 10, 227 << 10, ""},
		{"opt-in above 227 KiB", one, one, 0, 227<<10 + 1, "cudaErrorInvalidValue"},
	} {
		err := stConfig(tc.grid[0], tc.grid[1], tc.grid[2], tc.block[0], tc.block[1], tc.block[2], tc.smem, tc.setAttr, 0)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want %s", tc.name, err, tc.want)
		}
	}
}

func TestSimMisuse(t *testing.T) {
	for kind, want := range []string{
		"divergent barriers",
		"every thread of a block must reach every barrier",
		"with mask 0x",
		"is not in mask 0x0000ffff",
		"returned",
		"__syncthreads()",
	} {
		out := Alloc(t, 4*64)
		for _, seed := range Seeds {
			SetSeed(seed)
			err := stMisuse(kind, out.Dev(), 0)
			if err == nil || !strings.Contains(err.Error(), "cudaErrorLaunchFailure") || !strings.Contains(err.Error(), want) {
				t.Errorf("misuse %d seed %d: error %v, want cudaErrorLaunchFailure mentioning %q", kind, seed, err, want)
			}
		}
		// The simulator recovers: the next launch works.
		in := FromFloat32(t, iota32(32))
		o := Alloc(t, 4*32)
		if err := stReverse(in.Dev(), o.Dev(), 32, true, 0); err != nil || !equal(o.Float32(), reversed(iota32(32))) {
			t.Fatalf("after misuse %d: %v", kind, err)
		}
	}
}

// A fixed-order reduction gives the same bits for every seed and run.
func TestSimDeterminism(t *testing.T) {
	const n, blocks = 1000, 9
	x := Rand(5, n*blocks, 3)
	in := FromFloat32(t, x)
	var first []float32
	for _, seed := range []uint64{1, 2, 3, 1} {
		SetSeed(seed)
		out := Alloc(t, 4*blocks)
		if err := stReduce(in.Dev(), out.Dev(), n, blocks, 0); err != nil {
			t.Fatal(err)
		}
		got := append([]float32(nil), out.Float32()...)
		if first == nil {
			first = got
			want := make([]float32, blocks)
			for b := range want {
				s := 0.0
				for i := 0; i < n; i++ {
					s += float64(x[b*n+i])*1.0009765625 + 0.1
				}
				want[b] = float32(s)
			}
			Compare(t, "reduce", got, want, 1e-3, 1e-5)
		} else if !equal(got, first) {
			t.Errorf("seed %d: %v differs from %v", seed, got, first)
		}
	}
}

// Static __shared__ is per block even with blocks on several workers;
// 3-D coordinates, __syncthreads_count/and/or and integer atomics.
func TestSimBlocks(t *testing.T) {
	for _, tc := range []struct{ grid, block [3]int }{
		{[3]int{3, 2, 2}, [3]int{4, 3, 2}},
		{[3]int{40, 1, 1}, [3]int{64, 1, 1}},
	} {
		g, b := tc.grid, tc.block
		nb, nt := g[0]*g[1]*g[2], b[0]*b[1]*b[2]
		out := Alloc(t, 4*nb*nt)
		counter := FromInt32(t, []int32{0})
		maxv := FromInt32(t, []int32{0})
		if err := stBlocks(out.Dev(), counter.Dev(), maxv.Dev(), g[0], g[1], g[2], b[0], b[1], b[2], 0); err != nil {
			t.Fatal(err)
		}
		cnt := 0
		if b[1] > 1 {
			cnt = b[0] * b[2]
		}
		for blk := 0; blk < nb; blk++ {
			anyv := 0
			if blk == 0 {
				anyv = 1
			}
			want := int32(blk*1000000 + cnt*1000 + 10 + anyv)
			for th := 0; th < nt; th++ {
				if got := out.Int32()[blk*nt+th]; got != want {
					t.Fatalf("grid %v block %v: block %d thread %d: got %d, want %d", g, b, blk, th, got, want)
				}
			}
		}
		if c := counter.Int32()[0]; int(c) != nb*nt {
			t.Errorf("atomicAdd counted %d, want %d", c, nb*nt)
		}
		if m := maxv.Int32()[0]; int(m) != nb*nt-1 {
			t.Errorf("atomicMax gave %d, want %d", m, nb*nt-1)
		}
	}
}

// The simulator's SIGSEGV reporter passes Go's own faults on to Go.
func TestSimGoFaultsStillPanic(t *testing.T) {
	if err := stReverse(FromFloat32(t, iota32(32)).Dev(), Alloc(t, 4*32).Dev(), 32, true, 0); err != nil {
		t.Fatal(err)
	}
	var p *int
	defer func() {
		if r := recover(); r == nil {
			t.Error("a nil dereference did not panic")
		}
	}()
	t.Log(*p)
}

func TestSimBuffers(t *testing.T) {
	page := uintptr(os.Getpagesize())
	b := Alloc(t, 12)
	if (uintptr(b.Ptr())+12)%page != 0 {
		t.Errorf("Alloc(12) ends at %#x, not at a page boundary", uintptr(b.Ptr())+12)
	}
	for i, v := range b.Bytes() {
		if v != 0xFF {
			t.Fatalf("new buffer byte %d is %#x, want 0xff", i, v)
		}
	}
	a := AllocAligned(t, 12, 256)
	if uintptr(a.Ptr())%256 != 0 {
		t.Errorf("AllocAligned(12, 256) at %#x", uintptr(a.Ptr()))
	}
	c := AllocBefore(t, 12)
	if uintptr(c.Ptr())%page != 0 {
		t.Errorf("AllocBefore(12) at %#x, not page-aligned", uintptr(c.Ptr()))
	}
	if z := Alloc(t, 0); z.Ptr() == nil {
		t.Error("Alloc(0) gave a nil pointer")
	}
	x := []float32{1, 1.00390625, -3.5, 1e-3}
	h := FromBF16(t, x)
	Compare(t, "bf16 round trip", h.BF16(), RoundBF16(x), 0, 0)
	if RoundBF16(x)[1] != 1 { // halfway between 1 and the next bf16: ties to even
		t.Errorf("RoundBF16(1.00390625) = %v, want 1", RoundBF16(x)[1])
	}
	CompareBits(t, "bits", h.Uint16(), BF16Bits(x))
	// A write into AllocAligned's gap is reported on Free.
	ft := &fakeTB{TB: t}
	g := AllocAligned(ft, 12, 256)
	gap := (*[16]byte)(g.Ptr())
	gap[12] = 0
	g.Free()
	if len(ft.errors) != 1 || !strings.Contains(ft.errors[0], "written past its end") {
		t.Errorf("a write into the alignment gap gave %q", ft.errors)
	}
}

// fakeTB records Errorf calls instead of failing.
type fakeTB struct {
	testing.TB
	errors []string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}

func TestSimCompare(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	for _, tc := range []struct {
		got, want  []float32
		atol, rtol float64
		ok         bool
		msg        string
	}{
		{[]float32{1, 2}, []float32{1, 2}, 0, 0, true, ""},
		{[]float32{1, 2.1}, []float32{1, 2}, 0.2, 0, true, ""},
		{[]float32{1, 2.1}, []float32{1, 2}, 0, 0.1, true, ""},
		{[]float32{1.5, 2.1}, []float32{1, 2}, 0.01, 0, false, "2 of 2 values out of tolerance; worst at index 0: got 1.5, want 1"},
		{[]float32{nan}, []float32{nan}, 0, 0, true, ""},
		{[]float32{nan}, []float32{1}, 1, 1, false, "worst at index 0: got NaN"},
		{[]float32{inf}, []float32{inf}, 0, 0, true, ""},
		{[]float32{inf}, []float32{1e30}, 1, 1, false, "got +Inf"},
		{[]float32{1}, []float32{1, 2}, 0, 0, false, "got 1 values, want 2"},
	} {
		ft := &fakeTB{TB: t}
		ok := Compare(ft, "x", tc.got, tc.want, tc.atol, tc.rtol)
		if ok != tc.ok || (tc.msg != "" && (len(ft.errors) != 1 || !strings.Contains(ft.errors[0], tc.msg))) {
			t.Errorf("Compare(%v, %v, %g, %g) = %v %q, want %v %q", tc.got, tc.want, tc.atol, tc.rtol, ok, ft.errors, tc.ok, tc.msg)
		}
	}
}

// Kernels cannot use float atomics (their order, hence their sum, varies)
// nor `extern __shared__`: both fail to compile under the simulator.
func TestSimRejects(t *testing.T) {
	cxx := os.Getenv("CXX")
	if cxx == "" {
		cxx = "g++"
	}
	if _, err := exec.LookPath(cxx); err != nil {
		t.Skipf("no C++ compiler: %v", err)
	}
	for _, tc := range []struct {
		name, body string
		ok         bool
	}{
		{"int atomicAdd", "__global__ void k(int* p) { atomicAdd(p, 1); }", true},
		{"float atomicAdd", "__global__ void k(float* p) { atomicAdd(p, 1.0f); }", false},
		{"double atomicAdd", "__global__ void k(double* p) { atomicAdd(p, 1.0); }", false},
		{"extern __shared__", "__global__ void k(float* p) { extern __shared__ float s[]; p[0] = s[0]; }", false},
		{"LSP_DYN_SMEM", "__global__ void k(float* p) { LSP_DYN_SMEM(float, s); p[0] = s[0]; }", true},
	} {
		src := filepath.Join(t.TempDir(), "k.cc")
		if err := os.WriteFile(src, []byte("#include \"common.cuh\"\n"+tc.body+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(cxx, "-std=c++17", "-DLSP_SIM", "-fsyntax-only", "-I..", "-I../sim", src).CombinedOutput()
		if (err == nil) != tc.ok {
			t.Errorf("%s: compiled = %v, want %v\n%s", tc.name, err == nil, tc.ok, out)
		}
	}
}

// barrierSite is one __syncthreads() in kernels/<file>.
type barrierSite struct {
	file   string // base name, e.g. gemm.cu
	line   int
	family string // e.g. Gemm for gemm.cu, SoftmaxCe for softmax_ce.cu
}

func (s barrierSite) String() string { return fmt.Sprintf("%s:%d", s.file, s.line) }

var syncRE = regexp.MustCompile(`\b__syncthreads\s*\(\s*\)`)

// family turns a kernel file name into its tests' name: softmax_ce.cu ->
// SoftmaxCe.
func family(file string) string {
	var b strings.Builder
	for _, part := range strings.Split(strings.TrimSuffix(file, ".cu"), "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

// scanBarriers finds the __syncthreads() call sites of dir/*.cu, skipping
// comments and string literals.
func scanBarriers(dir string) ([]barrierSite, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.cu"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var sites []barrierSite
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		base := filepath.Base(f)
		inComment := false
		for i, line := range strings.Split(string(data), "\n") {
			code := stripComments(line, &inComment)
			if syncRE.MatchString(code) {
				sites = append(sites, barrierSite{base, i + 1, family(base)})
			}
		}
	}
	return sites, nil
}

// stripComments removes /* */ and // comments and string literals from one
// line, carrying the block-comment state across lines.
func stripComments(line string, inComment *bool) string {
	var b strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case *inComment:
			if strings.HasPrefix(line[i:], "*/") {
				*inComment = false
				i++
			}
		case strings.HasPrefix(line[i:], "/*"):
			*inComment = true
			i++
		case strings.HasPrefix(line[i:], "//"):
			return b.String()
		case line[i] == '"':
			for i++; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' {
					i++
				}
			}
		default:
			b.WriteByte(line[i])
		}
	}
	return b.String()
}

var redundantRE = regexp.MustCompile("^\\s*(?:[-*]|\\|)\\s*`?([A-Za-z0-9_]+\\.cu):([0-9]+)`?\\s*(?:\\||:|—|-)?\\s*(.*?)\\s*\\|?\\s*$")

// readRedundant parses kernels/REDUNDANT_BARRIERS.md: entries "- `file.cu:LINE`: reason"
// (or table rows | `file.cu:LINE` | reason |), each with a reason.
func readRedundant(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		m := redundantRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if strings.TrimSpace(m[3]) == "" {
			return nil, fmt.Errorf("%s:%d: entry %s:%s has no reason", path, n, m[1], m[2])
		}
		line, _ := strconv.Atoi(m[2])
		out[fmt.Sprintf("%s:%d", m[1], line)] = m[3]
	}
	return out, sc.Err()
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// The barrier scanner and the REDUNDANT_BARRIERS.md parser.
func TestSimBarrierScan(t *testing.T) {
	dir := t.TempDir()
	src := "__syncthreads(); // 1\n" +
		"// __syncthreads();\n" +
		"/* __syncthreads();\n" +
		"   __syncthreads(); */ x = 1;\n" +
		"printf(\"__syncthreads()\"); __syncthreads ( );\n" +
		"__syncthreads_count(p);\n"
	for name, body := range map[string]string{"softmax_ce.cu": src, "gemm.cu": "a;\n\t__syncthreads();\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sites, err := scanBarriers(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(sites), "[gemm.cu:2 softmax_ce.cu:1 softmax_ce.cu:5]"; got != want {
		t.Errorf("sites %s, want %s", got, want)
	}
	if sites[1].family != "SoftmaxCe" || sites[0].family != "Gemm" {
		t.Errorf("families %q %q", sites[0].family, sites[1].family)
	}
	md := filepath.Join(dir, "r.md")
	os.WriteFile(md, []byte("# x\n\n    - `file.cu:LINE`: reason\n- `gemm.cu:2`: the tile is reloaded anyway\n| softmax_ce.cu:5 | why not |\n"), 0o644)
	red, err := readRedundant(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(red) != 2 || red["gemm.cu:2"] != "the tile is reloaded anyway" || red["softmax_ce.cu:5"] != "why not" {
		t.Errorf("parsed %q", red)
	}
	os.WriteFile(md, []byte("- `gemm.cu:2`:\n"), 0o644)
	if _, err := readRedundant(md); err == nil {
		t.Error("an entry without a reason was accepted")
	}
}

var hitsRE = regexp.MustCompile(`lsp_sim: skipped barrier hits: (\d+)`)
var failRE = regexp.MustCompile(`--- FAIL: (\S+)`)

// Switching off any one barrier of kernels/*.cu must make some test of its
// family fail, unless kernels/REDUNDANT_BARRIERS.md lists it with a reason.
func TestBarrierRemoval(t *testing.T) {
	if testing.Short() {
		t.Skip("heavy (one child run of a family's tests per barrier); make simtest runs it")
	}
	if InChild() {
		t.Skip("not in a child")
	}
	sites, err := scanBarriers("..")
	if err != nil {
		t.Fatal(err)
	}
	redundant, err := readRedundant("../REDUNDANT_BARRIERS.md")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, s := range sites {
		known[s.String()] = true
	}
	for site := range redundant {
		if !known[site] {
			t.Errorf("REDUNDANT_BARRIERS.md lists %s, which has no __syncthreads() (stale line number?)", site)
		}
	}
	workers := max(1, runtime.NumCPU()/2)
	type result struct {
		caught  bool
		detail  string
		elapsed time.Duration
	}
	results := make([]result, len(sites))
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	// Each family's tests must pass with every barrier in place, or a
	// failure with one switched off proves nothing.
	baseline := map[string]string{}
	var mu sync.Mutex
	for _, s := range sites {
		if _, done := baseline[s.family]; done {
			continue
		}
		baseline[s.family] = ""
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out, failed := runChild(t, "^Test"+s.family, 5*time.Minute, fmt.Sprintf("LSP_SIM_WORKERS=%d", workers))
			if failed {
				mu.Lock()
				baseline[s.family] = out
				mu.Unlock()
			}
		}()
	}
	for i, s := range sites {
		if _, ok := redundant[s.String()]; ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			start := time.Now()
			out, failed := runChild(t, "^Test"+s.family, 5*time.Minute,
				skipEnv+"="+s.String(), fmt.Sprintf("LSP_SIM_WORKERS=%d", workers))
			r := result{caught: failed, elapsed: time.Since(start)}
			switch {
			case failed:
				if m := failRE.FindStringSubmatch(out); m != nil {
					r.detail = "caught by " + m[1]
				} else {
					r.detail = "caught (child crashed or timed out)"
				}
			case strings.Contains(out, "no tests to run"):
				r.detail = fmt.Sprintf("no tests match ^Test%s", s.family)
			default:
				hits := "?"
				if m := hitsRE.FindStringSubmatch(out); m != nil {
					hits = m[1]
				}
				if hits == "0" {
					r.detail = fmt.Sprintf("never reached by the Test%s tests", s.family)
				} else {
					r.detail = fmt.Sprintf("reached %s times, yet every Test%s test passed", hits, s.family)
				}
			}
			results[i] = r
		}()
	}
	wg.Wait()
	var uncaught []string
	for fam, out := range baseline {
		if out != "" {
			t.Errorf("the Test%s tests fail with all barriers in place, so their barrier sites are unchecked:\n%s", fam, lastLines(out, 30))
		}
	}
	for i, s := range sites {
		if reason, ok := redundant[s.String()]; ok {
			t.Logf("%s: listed as redundant: %s", s, reason)
			continue
		}
		if baseline[s.family] != "" {
			continue
		}
		r := results[i]
		t.Logf("%s: %s (%v)", s, r.detail, r.elapsed.Round(time.Millisecond))
		if !r.caught {
			uncaught = append(uncaught, fmt.Sprintf("%s: %s", s, r.detail))
		}
	}
	if len(uncaught) > 0 {
		t.Errorf("%d of %d barrier sites can be removed without any test failing; strengthen the tests or list them with a reason in kernels/REDUNDANT_BARRIERS.md:\n  %s",
			len(uncaught), len(sites), strings.Join(uncaught, "\n  "))
	}
}
