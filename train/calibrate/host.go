// Fixed costs, memory bandwidth, the link, and the host Adam with its share
// of the cores.

package calibrate

import (
	"fmt"
	"time"

	"github.com/lsp-offload/lsp-offload/host"
	"github.com/lsp-offload/lsp-offload/train/backend"
)

// overhead times ops on one element, event pairs and idle synchronizes.
func (m *meter) overhead() (Overhead, error) {
	defer m.release()
	var o Overhead
	t, err := m.alloc("one", 1, backend.F32, 0)
	if err != nil {
		return o, err
	}
	fill := func() error { return m.be.Fill(m.s, t, 1) }
	if o.Op, err = m.perOp(fill); err != nil {
		return o, err
	}
	if o.RoundTrip, err = m.loop(func() error {
		if err := fill(); err != nil {
			return err
		}
		return m.be.Synchronize(m.s)
	}); err != nil {
		return o, err
	}
	if o.Synchronize, err = m.loop(func() error { return m.be.Synchronize(m.s) }); err != nil {
		return o, err
	}
	other, err := m.be.NewStream("calibrate")
	if err != nil {
		return o, err
	}
	defer m.be.DestroyStream(other)
	ev, err := m.be.NewEvent("calibrate")
	if err != nil {
		return o, err
	}
	defer m.be.DestroyEvent(ev)
	// Each pair: the default stream records, the other waits; the batch
	// ends when the other stream has passed every wait.
	const pairs = 200
	o.RecordWait, err = m.loop(func() error {
		for range pairs {
			if err := m.be.Record(ev, m.s); err != nil {
				return err
			}
			if err := m.be.Wait(other, ev); err != nil {
				return err
			}
		}
		return m.be.Synchronize(other)
	})
	o.RecordWait /= pairs
	return o, err
}

// loop returns the median seconds of f over repetitions filling the
// item's share (3 to 1000), after a warm-up call.
func (m *meter) loop(f func() error) (float64, error) {
	if err := f(); err != nil {
		return 0, err
	}
	var ts []float64
	start := time.Now()
	for len(ts) < 3 || (len(ts) < 1000 && time.Since(start) < m.share/4) {
		t0 := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		ts = append(ts, time.Since(t0).Seconds())
	}
	if err := m.ctx.Err(); err != nil {
		return 0, err
	}
	return median(ts), nil
}

// triadReps are the triad's timed runs (best kept), enough for one to run
// undisturbed on a shared machine.
const triadReps = 10

// memory measures the triad on a worker pool of the thread count, and the
// backend's Accumulate and CopyD2D on arrays of n elements.
func (m *meter) memory(threads, n int) (Memory, error) {
	pool, err := host.NewWorkers(host.WorkersOptions{N: threads})
	if err != nil {
		return Memory{}, err
	}
	tr, err := pool.TriadBandwidth(n, triadReps)
	pool.Close()
	if err != nil {
		return Memory{}, err
	}
	mem := Memory{Triad: tr.Max() * 1e9, TriadPlain: tr.GBps * 1e9, TriadElements: n}
	defer m.release()
	dst, err := m.alloc("dst", n, backend.F32, 1)
	if err != nil {
		return mem, err
	}
	src, err := m.alloc("src", n, backend.F32, 2)
	if err != nil {
		return mem, err
	}
	sec, err := m.perOp(func() error { return m.be.Accumulate(m.s, dst, src) })
	if err != nil {
		return mem, fmt.Errorf("accumulate: %w", err)
	}
	mem.RMW = 12 * float64(n) / sec
	if sec, err = m.perOp(func() error { return m.be.CopyD2D(m.s, dst, src) }); err != nil {
		return mem, fmt.Errorf("copy: %w", err)
	}
	mem.Copy = 8 * float64(n) / sec
	return mem, nil
}

// linkBytes is the size of the link's bandwidth copies: far beyond the
// caches, as a step's weight and gradient copies are.
const linkBytes = 64 << 20

// link times CopyH2D and CopyD2H of 4 bytes (the latency) and of linkBytes.
func (m *meter) link() (Link, error) {
	defer m.release()
	l := Link{Bytes: linkBytes}
	hb, err := m.be.AllocHost("calibrate link", linkBytes)
	if err != nil {
		return l, err
	}
	defer m.be.FreeHost(hb)
	clear(hb.Bytes()) // touch every page
	t, err := m.alloc("link", linkBytes/4, backend.F32, 0)
	if err != nil {
		return l, err
	}
	one := t.Slice(0, 1)
	if l.H2DLatency, err = m.perOp(func() error { return m.be.CopyH2D(m.s, one, hb, 0) }); err != nil {
		return l, err
	}
	if l.D2HLatency, err = m.perOp(func() error { return m.be.CopyD2H(m.s, hb, 0, one) }); err != nil {
		return l, err
	}
	h2d, err := m.perOp(func() error { return m.be.CopyH2D(m.s, t, hb, 0) })
	if err != nil {
		return l, err
	}
	d2h, err := m.perOp(func() error { return m.be.CopyD2H(m.s, hb, 0, t) })
	if err != nil {
		return l, err
	}
	l.H2D = linkBytes / max(h2d-l.H2DLatency, h2d/100)
	l.D2H = linkBytes / max(d2h-l.D2HLatency, d2h/100)
	return l, nil
}

// adamSet is one fp32 tensor's host Adam state.
type adamSet struct {
	w, g []float32
	st   *host.AdamState
}

func newAdamSet(n int) adamSet {
	a := adamSet{w: make([]float32, n), g: make([]float32, n), st: host.NewAdamState(n)}
	for i := range a.w {
		a.w[i], a.g[i] = 0.5, 1e-3
	}
	return a
}

func (a adamSet) step(pool *host.Workers) error {
	_, err := pool.AdamStep([]host.AdamTensor{{Name: "calibrate", Params: host.AdamDefaults(), W: a.w, Grad: host.AdamGrad{F32: a.g}, State: a.st}})
	return err
}

// hostAdam times the host Adam alone.
func (m *meter) hostAdam(o Options, c CPU) (HostAdam, error) {
	pool, err := host.NewWorkers(host.WorkersOptions{N: o.Threads})
	if err != nil {
		return HostAdam{}, err
	}
	defer pool.Close()
	a := newAdamSet(o.AdamParams)
	h := HostAdam{Params: o.AdamParams, BytesPerParam: host.AdamBytesPerElement(4, true, false, false)}
	sec, err := m.loop(func() error { return a.step(pool) })
	if err != nil {
		return h, err
	}
	h.Rate = float64(o.AdamParams) / sec
	small := newAdamSet(64)
	if h.Overhead, err = m.loop(func() error { return small.step(pool) }); err != nil {
		return h, err
	}
	h.Eff = h.Rate * float64(h.BytesPerParam) / c.Memory.Triad
	return h, nil
}
