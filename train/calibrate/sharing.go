// Sharing the cores: the compute stream's GEMM, the host Adam and a link
// copy on a second stream, looped alone and two at a time.

package calibrate

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lsp-offload/lsp-offload/host"
)

// work is one loop: a call and the units one call does.
type work struct {
	name  string
	units float64
	call  func() error
}

// sharing runs each pair of the three loops together, after each alone.
func (m *meter) sharing(o Options, c CPU) ([]Sharing, error) {
	defer m.release()
	// The GEMM: the largest measured shape under a tenth of a second, or
	// a 512 cube.
	shape := GemmShape{M: 512, N: 512, K: 512}
	best := 0.0
	for _, g := range append(append([]GemmSample(nil), c.Gemm...), c.GemmSquares...) {
		if g.Seconds < 0.1 && g.Shape.FLOPs() > best {
			shape, best = g.Shape, g.Shape.FLOPs()
		}
	}
	a := &tensors{m: m}
	A, B, C := a.f32("A", shape.M*shape.K, 0.5), a.f32("B", shape.K*shape.N, 0.5), a.f32("C", shape.M*shape.N, 0)
	dev := a.f32("link", linkBytes/4, 0)
	if a.err != nil {
		return nil, a.err
	}
	hb, err := m.be.AllocHost("calibrate sharing", linkBytes)
	if err != nil {
		return nil, err
	}
	defer m.be.FreeHost(hb)
	clear(hb.Bytes())
	cs, err := m.be.NewStream("calibrate copies")
	if err != nil {
		return nil, err
	}
	defer m.be.DestroyStream(cs)
	pool, err := host.NewWorkers(host.WorkersOptions{N: o.Threads})
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	adam := newAdamSet(o.AdamParams)
	loops := []work{
		{"gemm " + shape.String(), shape.FLOPs(), func() error {
			if err := m.be.Gemm(m.s, shape.TransA, shape.TransB, shape.M, shape.N, shape.K, 1, A, B, 0, C); err != nil {
				return err
			}
			return m.be.Synchronize(m.s)
		}},
		{"host adam", float64(o.AdamParams), func() error { return adam.step(pool) }},
		{"copy h2d", linkBytes, func() error {
			if err := m.be.CopyH2D(cs, dev, hb, 0); err != nil {
				return err
			}
			return m.be.Synchronize(cs)
		}},
	}
	if err := m.be.Synchronize(m.s); err != nil {
		return nil, err
	}
	alone := make([]float64, len(loops))
	for i, l := range loops {
		if err := l.call(); err != nil { // warm-up
			return nil, fmt.Errorf("%s: %w", l.name, err)
		}
		r, err := rate(o.Window, l.call)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.name, err)
		}
		alone[i] = r * l.units
	}
	var out []Sharing
	for i := range loops {
		for j := i + 1; j < len(loops); j++ {
			x, y := loops[i], loops[j]
			var rx, ry float64
			var ex, ey error
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				ry, ey = rate(o.Window, y.call)
			}()
			rx, ex = rate(o.Window, x.call)
			wg.Wait()
			if ex != nil || ey != nil {
				return nil, fmt.Errorf("%s with %s: %w", x.name, y.name, errors.Join(ex, ey))
			}
			out = append(out, Sharing{A: x.name, B: y.name, AAlone: alone[i], AShared: rx * x.units,
				BAlone: alone[j], BShared: ry * y.units, Seconds: o.Window.Seconds()})
		}
	}
	return out, m.ctx.Err()
}

// rate runs f back to back for about window (at least once) and returns
// calls per second.
func rate(window time.Duration, f func() error) (float64, error) {
	start := time.Now()
	calls := 0
	for calls == 0 || time.Since(start) < window {
		if err := f(); err != nil {
			return 0, err
		}
		calls++
	}
	return float64(calls) / time.Since(start).Seconds(), nil
}
