// Command adam benchmarks the fused CPU AdamW step (host.Workers.AdamStep)
// at 1M, 16M and 128M parameters (and 1B when memory allows) on all cores,
// next to two bandwidth yardsticks measured in the same run with the same
// pinned workers: a STREAM triad, and a read-modify-write ceiling with the
// Adam update's own access pattern (host.Workers.RMWBandwidth: w, m, v read
// and written, g read, almost no arithmetic). It prints params/s, effective
// GB/s and the ratio to each yardstick. Its last line is "adam-vs-triad: X.XX" for 128M parameters with
// the -headline combination (default: fp32 gradient with the bf16 weight
// copy, pre-scanned: the whole ZeRO-Offload host step).
//
// Byte accounting (per parameter, every byte read or written once, no
// write-allocate, as STREAM counts): w, m and v read and written (24), the
// gradient read (4 for fp32, 2 for bf16/fp16) and read again by the NaN/Inf
// pre-scan unless the norm is supplied ("norm" rows), and the bf16 copy
// written (2). The triad counts 12 bytes per element, its arrays at least
// 4 times the last-level cache; it runs with plain stores (STREAM's usual
// build) and with non-temporal stores, and the ratio uses the higher. Both
// report the best of -reps timed runs after a warm-up. The ceiling moves
// 28 bytes per element, as the "norm" fp32 rows do; it runs with and without
// software prefetch and the ratio uses the higher. -yardsticks=false skips
// both (bench/peers/adam_peers.sh runs this command once per round and
// measures them once, separately).
//
// Limits: wall-clock timing on a possibly shared machine; the 1M case fits
// in a large last-level cache and then beats memory bandwidth.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lsp-offload/lsp-offload/host"
)

// combo is one dtype combination of the table.
type combo struct {
	name string
	grad string // f32, bf16, f16
	copy bool   // bf16 weight copy written
	norm bool   // norm supplied: no pre-scan
}

var allCombos = []combo{
	{"f32", "f32", false, false},
	{"f32+bf16", "f32", true, false},
	{"bf16", "bf16", false, false},
	{"bf16+bf16", "bf16", true, false},
	{"f16", "f16", false, false},
	{"f16+bf16", "f16", true, false},
	{"f32/norm", "f32", false, true},
	{"f32+bf16/norm", "f32", true, true},
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "adam:", err)
		os.Exit(1)
	}
}

func run() error {
	threads := flag.Int("threads", 0, "workers (0: every core of the affinity mask)")
	sizes := flag.String("sizes", "1M,16M,128M,1B", "parameter counts (K, M, B suffixes); sizes that do not fit in memory are skipped")
	combos := flag.String("combos", "all", "comma-separated combinations ("+comboNames()+") or all")
	headline := flag.String("headline", "f32+bf16", "combination whose 128M ratio is the last line")
	reps := flag.Int("reps", 10, "timed steps per row (best kept), after one warm-up")
	triadN := flag.Int("triad-n", 0, "triad elements per array (0: 4x the last-level cache)")
	csvPath := flag.String("csv", "", "also write the rows to this CSV file")
	yardsticks := flag.Bool("yardsticks", true, "measure the triad and the read-modify-write ceiling (false: Adam rows only, ratio columns empty)")
	flag.Parse()

	var rows []combo
	for _, name := range strings.Split(*combos, ",") {
		found := false
		for _, c := range allCombos {
			if name == "all" || c.name == name {
				rows, found = append(rows, c), true
			}
		}
		if !found {
			return fmt.Errorf("-combos: unknown combination %q (want %s)", name, comboNames())
		}
	}
	var ns []int
	for _, s := range strings.Split(*sizes, ",") {
		n, err := parseCount(s)
		if err != nil {
			return fmt.Errorf("-sizes: %w", err)
		}
		ns = append(ns, n)
	}
	if *reps < 1 {
		return fmt.Errorf("-reps = %d, want >= 1", *reps)
	}

	pool, err := host.NewWorkers(host.WorkersOptions{N: *threads})
	if err != nil {
		return err
	}
	defer pool.Close()

	tn := *triadN
	if tn <= 0 {
		tn = host.TriadMinElements()
	}
	fmt.Printf("machine: %d workers pinned to CPUs %v, SIMD %v, LLC %d MiB\n",
		pool.N(), pool.CPUs(), host.ActiveSIMD(), host.TriadLLCBytes()>>20)
	triadGBps, ceilGBps := math.NaN(), math.NaN()
	if *yardsticks {
		tr, err := pool.TriadBandwidth(tn, *reps)
		if err != nil {
			return err
		}
		fmt.Printf("triad: %d elements per array (%.2f GB each), %d threads, 12 B/element: plain stores %.1f ms %.2f GB/s, non-temporal %.1f ms %.2f GB/s; ratios use %.2f GB/s\n",
			tr.N, float64(4*tr.N)/1e9, tr.Threads, ms(tr.Best), tr.GBps, ms(tr.BestNT), tr.GBpsNT, tr.Max())
		rw, err := pool.RMWBandwidth(tn, *reps)
		if err != nil {
			return err
		}
		fmt.Printf("ceiling: read-modify-write of 4 arrays (w, m, v read and written, g read), %d elements per array, %d threads, 28 B/element: no prefetch %.1f ms %.2f GB/s, prefetch %.1f ms %.2f GB/s; ratios use %.2f GB/s\n",
			rw.N, rw.Threads, ms(rw.Best), rw.GBps, ms(rw.BestPF), rw.GBpsPF, rw.Max())
		triadGBps, ceilGBps = tr.Max(), rw.Max()
	}
	fmt.Println()
	var csvRows []string

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "params\tgrad\tbf16 copy\tpre-scan\tB/param\tbest ms\tMparams/s\tGB/s\tvs triad\tvs ceiling\t")
	headRatio := math.NaN()
	var notes []string
	for _, n := range ns {
		need := int64(n) * 20 // w, m, v, fp32 grad, 16-bit grad, bf16 copy
		if avail := memAvailable(); avail > 0 && float64(need) > 0.8*float64(avail) {
			notes = append(notes, fmt.Sprintf("%s: skipped, needs %.1f GB, %.1f GB available", countName(n), float64(need)/1e9, float64(avail)/1e9))
			continue
		}
		set, err := newParamSet(pool, n)
		if err != nil {
			return fmt.Errorf("%s parameters: %w", countName(n), err)
		}
		for _, c := range rows {
			best, bytes, err := set.time(pool, c, *reps)
			if err != nil {
				set.free()
				return fmt.Errorf("%s parameters, %s: %w", countName(n), c.name, err)
			}
			gbps := float64(bytes) / best.Seconds() / 1e9
			ratio, ceil := gbps/triadGBps, gbps/ceilGBps
			mps := float64(n) / best.Seconds() / 1e6
			csvRows = append(csvRows, fmt.Sprintf("%s,%s,%d,%.3f,%.1f,%.3f,%.3f,%.3f", countName(n), c.name, bytes/int64(n), ms(best), mps, gbps, ratio, ceil))
			if n == 128<<20 && c.name == *headline {
				headRatio = ratio
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%.2f\t%.0f\t%.2f\t%s\t%s\t\n", countName(n), c.grad, yes(c.copy), yes(!c.norm),
				bytes/int64(n), ms(best), mps, gbps, ratioText(ratio), ratioText(ceil))
		}
		set.free()
	}
	tw.Flush()
	for _, note := range notes {
		fmt.Println(note)
	}
	if *csvPath != "" {
		data := "params,combo,bytes_per_param,best_ms,mparams_per_s,gbps,vs_triad,vs_ceiling\n" + strings.Join(csvRows, "\n") + "\n"
		if err := os.WriteFile(*csvPath, []byte(data), 0o644); err != nil {
			return fmt.Errorf("-csv: %w", err)
		}
	}
	if math.IsNaN(headRatio) {
		if !*yardsticks {
			return nil // no yardstick, no headline
		}
		for _, n := range ns {
			if n == 128<<20 {
				return fmt.Errorf("no 128M row for the headline combination %q (check -combos, and memory)", *headline)
			}
		}
		return nil // 128M not asked for: no headline
	}
	fmt.Printf("adam-vs-triad: %.2f\n", headRatio)
	return nil
}

// paramSet holds one size's arrays, off-heap, first touched by the workers.
type paramSet struct {
	n       int
	bufs    []*host.HostBuffer
	w, m, v []float32
	g32     []float32
	g16     []uint16 // read as bf16 or fp16
	out     []uint16
	state   *host.AdamState
}

// hostArray is an array of s.n elements of size bytes in an off-heap
// buffer of its own, which s frees; view is the buffer's typed view.
func hostArray[T any](s *paramSet, size int, view func(*host.HostBuffer, int, int) ([]T, error)) ([]T, error) {
	b, err := host.NewHostBuffer(size*s.n, host.HostBufferOptions{})
	if err != nil {
		return nil, err
	}
	s.bufs = append(s.bufs, b)
	return view(b, 0, s.n)
}

func newParamSet(pool *host.Workers, n int) (*paramSet, error) {
	s := &paramSet{n: n}
	var err error
	for _, p := range []*[]float32{&s.w, &s.m, &s.v, &s.g32} {
		if *p, err = hostArray(s, 4, (*host.HostBuffer).Float32s); err != nil {
			s.free()
			return nil, err
		}
	}
	for _, p := range []*[]uint16{&s.g16, &s.out} {
		if *p, err = hostArray(s, 2, (*host.HostBuffer).Uint16s); err != nil {
			s.free()
			return nil, err
		}
	}
	// Values from a hash of the index: weights in [-1, 1), gradients about
	// 1e-3, the 16-bit gradient 0x3a00-ish (finite as bf16 and fp16).
	chunks := (n + host.AdamChunkLen - 1) / host.AdamChunkLen
	err = pool.ParallelFor(chunks, func(k int) {
		for i := k * host.AdamChunkLen; i < min((k+1)*host.AdamChunkLen, n); i++ {
			h := splitmix(uint64(i))
			u := float32(h>>40) / (1 << 24)
			s.w[i] = 2*u - 1
			s.g32[i] = (u - 0.5) * 2e-3
			s.g16[i] = 0x3a00 | uint16(h&0x1ff) | uint16(h>>9&1)<<15
			s.m[i], s.v[i], s.out[i] = 0, 0, 0
		}
	})
	if err != nil {
		s.free()
		return nil, err
	}
	s.state = &host.AdamState{M: s.m, V: s.v}
	return s, nil
}

func (s *paramSet) free() {
	for _, b := range s.bufs {
		b.Free()
	}
	s.bufs = nil
}

// time runs one warm-up and reps timed steps of the combination and returns
// the best time and the bytes one step moves.
func (s *paramSet) time(pool *host.Workers, c combo, reps int) (time.Duration, int64, error) {
	t := host.AdamTensor{Name: c.name, Params: host.AdamDefaults(), W: s.w, State: s.state}
	switch c.grad {
	case "f32":
		t.Grad.F32 = s.g32
	case "bf16":
		t.Grad.BF16 = s.g16
	default:
		t.Grad.F16 = s.g16
	}
	if c.copy {
		t.BF16Out = s.out
	}
	best := time.Duration(math.MaxInt64)
	var bytes int64
	for r := 0; r <= reps; r++ {
		if c.norm {
			t.NormKnown, t.Norm = true, 1 // as if computed on the device
		}
		t0 := time.Now()
		res, err := pool.AdamStep([]host.AdamTensor{t})
		d := time.Since(t0)
		if err != nil {
			return 0, 0, err
		}
		if res.Skipped != 0 {
			return 0, 0, fmt.Errorf("step skipped (gradient norm %v)", res.Tensors[0].Norm)
		}
		if r > 0 && d < best {
			best = d
		}
		bytes = res.Bytes
	}
	return best, bytes, nil
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// memAvailable reads MemAvailable from /proc/meminfo, in bytes (0: unknown).
func memAvailable() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// parseCount reads 1M, 16M, 1B, 4096 ... (binary multiples: M = 2^20).
func parseCount(s string) (int, error) {
	s = strings.TrimSpace(s)
	mult := 1
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "B"):
		mult, s = 1<<30, strings.TrimSuffix(s, "B")
	}
	v, err := strconv.Atoi(s)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("bad count %q", s)
	}
	return v * mult, nil
}

func countName(n int) string {
	switch {
	case n%(1<<30) == 0:
		return fmt.Sprintf("%dB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.Itoa(n)
}

func comboNames() string {
	var names []string
	for _, c := range allCombos {
		names = append(names, c.name)
	}
	return strings.Join(names, ", ")
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// ratioText prints a ratio, or "-" when its yardstick was not measured.
func ratioText(r float64) string {
	if math.IsNaN(r) {
		return "-"
	}
	return fmt.Sprintf("%.2f", r)
}
