// Several calibrations of one machine merged into one.

package calibrate

import (
	"fmt"
)

// Merge combines calibrations of the same machine at the same thread
// count, made at different times, into one whose every figure is the
// median of the calibrations' (the fastest repetition: the minimum of
// their Best), derived figures (rates, GemmPeak, efficiencies) recomputed.
// On a machine whose speed drifts (one shared with other virtual machines)
// calibrations spread over the time a measurement takes describe the
// machine over that time, not at one moment of it. Items measured by only
// some calibrations are kept with the values they have.
func Merge(cs ...CPU) (CPU, error) {
	if len(cs) == 0 {
		return CPU{}, fmt.Errorf("calibrate: merge: no calibrations")
	}
	out := CPU{Threads: cs[0].Threads, SIMD: cs[0].SIMD}
	for _, c := range cs {
		if c.Threads != out.Threads {
			return CPU{}, fmt.Errorf("calibrate: merge: %d and %d threads", out.Threads, c.Threads)
		}
		out.Seconds += c.Seconds
	}
	med := func(f func(CPU) float64) float64 {
		var xs []float64
		for _, c := range cs {
			xs = append(xs, f(c))
		}
		return median(xs)
	}
	out.Gemm = mergeGemms(cs, func(c CPU) []GemmSample { return c.Gemm })
	out.GemmSquares = mergeGemms(cs, func(c CPU) []GemmSample { return c.GemmSquares })
	for _, g := range append(append([]GemmSample(nil), out.Gemm...), out.GemmSquares...) {
		out.GemmPeak = max(out.GemmPeak, g.Rate)
	}
	out.Memory = Memory{
		Triad:         med(func(c CPU) float64 { return c.Memory.Triad }),
		TriadPlain:    med(func(c CPU) float64 { return c.Memory.TriadPlain }),
		TriadElements: cs[0].Memory.TriadElements,
		RMW:           med(func(c CPU) float64 { return c.Memory.RMW }),
		Copy:          med(func(c CPU) float64 { return c.Memory.Copy }),
	}
	out.Overhead = Overhead{
		Op:          med(func(c CPU) float64 { return c.Overhead.Op }),
		RoundTrip:   med(func(c CPU) float64 { return c.Overhead.RoundTrip }),
		RecordWait:  med(func(c CPU) float64 { return c.Overhead.RecordWait }),
		Synchronize: med(func(c CPU) float64 { return c.Overhead.Synchronize }),
	}
	out.Link = Link{
		H2D:        med(func(c CPU) float64 { return c.Link.H2D }),
		D2H:        med(func(c CPU) float64 { return c.Link.D2H }),
		H2DLatency: med(func(c CPU) float64 { return c.Link.H2DLatency }),
		D2HLatency: med(func(c CPU) float64 { return c.Link.D2HLatency }),
		Bytes:      cs[0].Link.Bytes,
	}
	out.HostAdam = HostAdam{Params: cs[0].HostAdam.Params, BytesPerParam: cs[0].HostAdam.BytesPerParam,
		Rate:     med(func(c CPU) float64 { return c.HostAdam.Rate }),
		Overhead: med(func(c CPU) float64 { return c.HostAdam.Overhead })}
	if out.Memory.Triad > 0 {
		out.HostAdam.Eff = out.HostAdam.Rate * float64(out.HostAdam.BytesPerParam) / out.Memory.Triad
	}

	// Ops by method and size, in first-seen order.
	type opKey struct {
		method, dims string
		flops, bytes float64
	}
	var keys []opKey
	ops := map[opKey][]OpSample{}
	for _, c := range cs {
		for _, o := range c.Ops {
			k := opKey{o.Method, o.Dims, o.FLOPs, o.Bytes}
			if _, ok := ops[k]; !ok {
				keys = append(keys, k)
			}
			ops[k] = append(ops[k], o)
		}
	}
	for _, k := range keys {
		s := ops[k]
		o := s[0]
		var secs []float64
		for _, x := range s {
			secs = append(secs, x.Seconds)
			o.Best = min(o.Best, x.Best)
		}
		o.Seconds = median(secs)
		out.Ops = append(out.Ops, o)
	}
	out.finishOps()

	// Sharing by pair.
	type pair struct{ a, b string }
	var pairs []pair
	sh := map[pair][]Sharing{}
	for _, c := range cs {
		for _, p := range c.Sharing {
			k := pair{p.A, p.B}
			if _, ok := sh[k]; !ok {
				pairs = append(pairs, k)
			}
			sh[k] = append(sh[k], p)
		}
	}
	for _, k := range pairs {
		s := sh[k]
		f := func(g func(Sharing) float64) float64 {
			var xs []float64
			for _, p := range s {
				xs = append(xs, g(p))
			}
			return median(xs)
		}
		out.Sharing = append(out.Sharing, Sharing{A: k.a, B: k.b, Seconds: s[0].Seconds,
			AAlone: f(func(p Sharing) float64 { return p.AAlone }), AShared: f(func(p Sharing) float64 { return p.AShared }),
			BAlone: f(func(p Sharing) float64 { return p.BAlone }), BShared: f(func(p Sharing) float64 { return p.BShared })})
	}
	return out, nil
}

// mergeGemms merges the samples of each shape, in first-seen order.
func mergeGemms(cs []CPU, of func(CPU) []GemmSample) []GemmSample {
	var shapes []GemmShape
	by := map[GemmShape][]GemmSample{}
	for _, c := range cs {
		for _, g := range of(c) {
			if _, ok := by[g.Shape]; !ok {
				shapes = append(shapes, g.Shape)
			}
			by[g.Shape] = append(by[g.Shape], g)
		}
	}
	var out []GemmSample
	for _, s := range shapes {
		gs := by[s]
		var secs []float64
		best := gs[0].Best
		for _, g := range gs {
			secs = append(secs, g.Seconds)
			best = min(best, g.Best)
		}
		m := median(secs)
		out = append(out, GemmSample{Shape: s, Seconds: m, Best: best, Rate: s.FLOPs() / m})
	}
	return out
}
