// The CPU backend as a Machine, from calibrate's microbenchmarks only.

package plan

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/calibrate"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// FromCalibration is the CPU backend configured as cfg (its link charge and
// memory budget; cfg.Threads is ignored: c.Threads is what was measured)
// as a Machine, built from the calibration c alone: nothing in it comes
// from a training step's time.
//
//   - Compute ops (GPU.Measured): a Gemm takes c.GemmTime at its exact
//     layout and sizes (interpolated by arithmetic intensity where that
//     shape was not measured); every other op c.OpTime of its method at its
//     bytes (the hazard declaration's, as calibrate counts them) and, for
//     attention and LSP's sparse ops, its FLOPs (the other families count
//     none in calibrate's convention: they are memory-bound). Both include
//     the cost of enqueueing the op (Overhead.Op), so Launch is only for
//     ops the hook does not answer.
//   - The link: calibrate's CopyH2D/CopyD2H bandwidth and latency (a
//     memcpy), plus cfg's charge (LinkBandwidth, LinkLatency: a sleep)
//     when set.
//   - Host Adam: HostAdam's rate as a fraction of the triad bandwidth, its
//     fixed overhead per node, on c.Threads workers.
//   - Sharing the cores: GPU.Contention from the Sharing pairs (the GEMM
//     for compute, the host Adam, a copy for the link): a queue runs at
//     shared/alone of its rate while the other runs. A charged copy only
//     contends for the cores during its memcpy, so its factors are
//     diluted by the share of its time the charge (a sleep) takes.
//   - Schedule overheads: Sync = a round trip less the op in it (the wait
//     Synchronize adds), Event = an event record and wait.
//
// Memory is cfg.MemBudget, else the host's (MemTotal of /proc/meminfo, 0
// where unknown).
func FromCalibration(c calibrate.CPU, cfg cpu.Config) (Machine, error) {
	if c.Threads < 1 || !(c.GemmPeak > 0) || !(c.Memory.Triad > 0) || !(c.Link.H2D > 0) || !(c.Link.D2H > 0) || !(c.HostAdam.Rate > 0) {
		return Machine{}, fmt.Errorf("plan: calibration of %d threads lacks a GEMM peak, triad, link or host Adam rate", c.Threads)
	}
	mem := hostMemory()
	dev := mem
	if cfg.MemBudget > 0 {
		dev = cfg.MemBudget
	}
	name := fmt.Sprintf("CPU backend, %d threads (%s), calibrated", c.Threads, c.SIMD)
	m := Machine{
		GPU: GPU{Name: name, Memory: dev, PeakF32: c.GemmPeak, PeakBF16: c.GemmPeak, MemBW: c.Memory.Triad,
			Launch: c.Overhead.Op, SharesHost: true, ComputeThreads: c.Threads,
			Sync: max(c.Overhead.RoundTrip-c.Overhead.Op, 0), Event: c.Overhead.RecordWait,
			Measured: cpuOpTime(c)},
		Host: Host{Name: fmt.Sprintf("this host, %d workers", c.Threads), Cores: c.Threads, MemBW: c.Memory.Triad, Memory: mem,
			Workers: c.Threads, AdamBWFraction: float64(c.HostAdam.BytesPerParam) * c.HostAdam.Rate / c.Memory.Triad,
			AdamOverhead: c.HostAdam.Overhead},
	}
	// The link: memcpy time plus the charged sleep, per direction.
	charge := cfg.LinkLatency.Seconds()
	inv := func(bw float64) float64 {
		t := 1 / bw
		if cfg.LinkBandwidth > 0 {
			t += 1 / cfg.LinkBandwidth
		}
		return 1 / t
	}
	m.Link = Link{Name: "CPU backend copies (memcpy", H2D: inv(c.Link.H2D), D2H: inv(c.Link.D2H),
		Latency: (c.Link.H2DLatency+c.Link.D2HLatency)/2 + charge}
	if cfg.LinkBandwidth > 0 || charge > 0 {
		m.Link.Name += fmt.Sprintf(", charged %.3g GB/s + %v)", cfg.LinkBandwidth/1e9, cfg.LinkLatency)
	} else {
		m.Link.Name += ", no charge)"
	}
	// The share of a bandwidth copy's time spent copying (the rest sleeps).
	busy := 1.0
	if n := float64(max(c.Link.Bytes, 1)); cfg.LinkBandwidth > 0 || charge > 0 {
		copying, sleeping := n/c.Link.H2D, charge
		if cfg.LinkBandwidth > 0 {
			sleeping += n / cfg.LinkBandwidth
		}
		busy = copying / (copying + sleeping)
	}
	m.GPU.Contention = contention(c.Sharing, busy)
	return m, m.Validate()
}

// contention maps the Sharing pairs to queue kinds; busy is the share of
// a copy's time that uses a core.
func contention(pairs []calibrate.Sharing, busy float64) map[[2]Bound]float64 {
	kind := func(name string) (Bound, bool) {
		switch {
		case strings.HasPrefix(name, "gemm"):
			return ComputeBound, true
		case strings.HasPrefix(name, "host adam"):
			return HostBound, true
		case strings.HasPrefix(name, "copy"):
			return LinkBound, true
		}
		return "", false
	}
	out := map[[2]Bound]float64{}
	for _, p := range pairs {
		a, okA := kind(p.A)
		b, okB := kind(p.B)
		if !okA || !okB || !(p.AAlone > 0) || !(p.BAlone > 0) {
			continue
		}
		fa, fb := p.AShared/p.AAlone, p.BShared/p.BAlone
		// A charged copy: its own memcpy part slows as measured (time
		// 1-busy + busy/f), and it slows the other only while it copies.
		if a == LinkBound {
			fa, fb = 1/(1-busy+busy/fa), 1-busy*(1-fb)
		}
		if b == LinkBound {
			fb, fa = 1/(1-busy+busy/fb), 1-busy*(1-fa)
		}
		out[[2]Bound{a, b}] = fa
		out[[2]Bound{b, a}] = fb
	}
	if len(out) == 0 {
		return nil // nothing measured: the thread-count rule
	}
	return out
}

// cpuOpTime answers GPU.Measured from the calibration.
func cpuOpTime(c calibrate.CPU) func(trace.Op) (float64, bool) {
	return func(o trace.Op) (float64, bool) {
		if o.Link != trace.NoLink {
			return 0, false
		}
		if o.Family == trace.Gemm {
			g := o.Gemm
			if g.M < 1 || g.N < 1 || g.K < 1 {
				return 0, false
			}
			t := c.GemmTime(calibrate.GemmShape{TransA: g.TransA, TransB: g.TransB, M: g.M, N: g.N, K: g.K})
			return t, t > 0 && t < 1e300
		}
		flops := 0.0
		if o.Family == trace.Attention || o.Family == trace.Sparse || o.Family == trace.Dense {
			flops = o.FLOPs
		}
		return c.OpTime(o.Method, flops, float64(o.Bytes)), true
	}
}

// hostMemory is MemTotal of /proc/meminfo in bytes (0 where unknown).
func hostMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil {
				return kb << 10
			}
		}
	}
	return 0
}

// MeasuredOps is a GPU.Measured hook from ops timed on a real run of the
// same graph (trace.WrapTimed around any backend that times events, then
// Times): an op takes the mean time of the timed ops with its method,
// dtype, shapes, GEMM layout, FLOPs and bytes; ops never timed (and copies
// across the link, which the Link prices) are not answered. It prices a
// step with the device's own per-op times, so that what remains between a
// prediction and a measurement is the schedule's model, not the ops' (the
// mean, not the median: a step of one op of each kind priced at the means
// sums to what its ops took).
func MeasuredOps(timed []trace.Op) func(trace.Op) (float64, bool) {
	by := map[string][]float64{}
	for _, o := range timed {
		if o.Seconds > 0 && o.Link == trace.NoLink {
			k := opKey(o)
			by[k] = append(by[k], o.Seconds)
		}
	}
	med := make(map[string]float64, len(by))
	for k, ts := range by {
		sum := 0.0
		for _, t := range ts {
			sum += t
		}
		med[k] = sum / float64(len(ts))
	}
	return func(o trace.Op) (float64, bool) {
		if o.Link != trace.NoLink {
			return 0, false
		}
		t, ok := med[opKey(o)]
		return t, ok
	}
}

// opKey is what two ops must share to cost the same.
func opKey(o trace.Op) string {
	return fmt.Sprintf("%s %v %v %+v %g %d", o.Method, o.DType, o.Shapes, o.Gemm, o.FLOPs, o.Bytes)
}
