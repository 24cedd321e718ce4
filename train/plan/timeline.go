// The timeline of a simulated step as a PNG: one lane per device stream
// and per host worker, each node a box split into its ops and coloured by
// op family, under a time axis.

package plan

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// familyColor is each family's fill (the host Adam's included).
var familyColor = map[trace.Family]color.RGBA{
	trace.Gemm:        {31, 119, 180, 255},
	trace.Attention:   {255, 127, 14, 255},
	trace.Norm:        {44, 160, 44, 255},
	trace.Activation:  {214, 39, 40, 255},
	trace.Elementwise: {148, 103, 189, 255},
	trace.Sparse:      {140, 86, 75, 255},
	trace.Dense:       {196, 156, 148, 255},
	trace.Embedding:   {227, 119, 194, 255},
	trace.Loss:        {127, 127, 127, 255},
	trace.Adam:        {188, 189, 34, 255},
	trace.Reduce:      {23, 190, 207, 255},
	trace.Copy:        {90, 90, 160, 255},
	HostAdam:          {230, 180, 40, 255},
	Sync:              {60, 60, 60, 255},
	AllReduce:         {0, 120, 110, 255},
}

// Timeline draws p (its tasks and their times) as a PNG: lanes compute,
// d2h, h2d, then one per host worker of the machine (a host node runs on
// every worker at once, so it is drawn on each), and a network lane when
// the step has collectives between ranks.
func Timeline(p Prediction, workers int, title string) ([]byte, error) {
	if len(p.Tasks) == 0 || !(p.Step > 0) {
		return nil, fmt.Errorf("plan: timeline: nothing to draw (%d tasks, step %g s)", len(p.Tasks), p.Step)
	}
	workers = max(workers, 1)
	const (
		width, left, right, top = 1400, 90, 20, 40
		laneH, gap              = 22, 4
	)
	lanes := []string{"compute", "d2h", "h2d"}
	for w := 0; w < workers; w++ {
		lanes = append(lanes, fmt.Sprintf("host %d", w))
	}
	netLane := -1
	for _, t := range p.Tasks {
		if t.Net && netLane < 0 {
			netLane = len(lanes)
			lanes = append(lanes, "net")
		}
	}
	fams := append(trace.Families(), HostAdam, Sync, AllReduce)
	axisY := top + len(lanes)*(laneH+gap) + 4
	legendY := axisY + 36
	height := legendY + 20*((len(fams)+5)/6) + 10
	img := image.NewRGBA(image.Rect(0, 0, width, height))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	black := color.RGBA{0, 0, 0, 255}
	text(img, 8, 20, title, black)

	plotW := float64(width - left - right)
	x := func(t float64) int { return left + int(math.Round(t/p.Step*plotW)) }
	laneY := func(l int) int { return top + l*(laneH+gap) }
	for l, name := range lanes {
		y := laneY(l)
		fill(img, left, y, width-right, y+laneH, color.RGBA{242, 242, 242, 255})
		text(img, 6, y+15, name, black)
	}
	box := func(l int, t Task, start, end float64) {
		y := laneY(l)
		// The parts share the node's simulated span in proportion to
		// their times alone (contention stretches them alike).
		total := 0.0
		for _, pt := range t.Parts {
			total += pt.Seconds
		}
		at := start
		for _, pt := range t.Parts {
			d := 0.0
			if total > 0 {
				d = (end - start) * pt.Seconds / total
			}
			x0, x1 := x(at), x(at+d)
			if x1 == x0 {
				x1 = x0 + 1
			}
			fill(img, x0, y+1, x1, y+laneH-1, familyColor[pt.Family])
			at += d
		}
		// A thin dark edge at the node's start separates the nodes.
		fill(img, x(start), y+1, x(start)+1, y+laneH-1, color.RGBA{40, 40, 40, 255})
	}
	for i, t := range p.Tasks {
		if t.Net {
			box(netLane, t, p.Start[i], p.End[i])
			continue
		}
		if t.Queue == engine.Host {
			for w := 0; w < workers; w++ {
				box(3+w, t, p.Start[i], p.End[i])
			}
			continue
		}
		box(int(t.Queue), t, p.Start[i], p.End[i])
	}
	// The time axis, with about ten ticks at a round step.
	fill(img, left, axisY, width-right, axisY+1, black)
	step := niceStep(p.Step / 10)
	for t := 0.0; t <= p.Step*(1+1e-9); t += step {
		xx := x(t)
		fill(img, xx, axisY, xx+1, axisY+5, black)
		text(img, xx-10, axisY+18, fmtSeconds(t, step), black)
	}
	for i, f := range fams {
		lx, ly := left+(i%6)*210, legendY+(i/6)*20
		fill(img, lx, ly-10, lx+14, ly+2, familyColor[f])
		text(img, lx+20, ly, string(f), black)
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return nil, fmt.Errorf("plan: timeline: %w", err)
	}
	return buf.Bytes(), nil
}

// WriteTimeline writes Timeline's PNG to path atomically.
func WriteTimeline(path string, p Prediction, workers int, title string) error {
	b, err := Timeline(p, workers, title)
	if err != nil {
		return err
	}
	err = atomicfile.WriteFile(path, 0o644, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
	if err != nil {
		return fmt.Errorf("--timeline: %w", err)
	}
	return nil
}

func fill(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	draw.Draw(img, image.Rect(x0, y0, x1, y1), image.NewUniform(c), image.Point{}, draw.Src)
}

func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// niceStep rounds s up to 1, 2 or 5 times a power of ten.
func niceStep(s float64) float64 {
	if !(s > 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(s)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= s {
			return m * p
		}
	}
	return 10 * p
}

// fmtSeconds writes t in the unit that suits the resolution res.
func fmtSeconds(t, res float64) string {
	switch {
	case res >= 1:
		return fmt.Sprintf("%.0fs", t)
	case res >= 1e-3:
		return fmt.Sprintf("%.0fms", t*1e3)
	}
	return fmt.Sprintf("%.0fus", t*1e6)
}
