// plot.go: renders the loss curves of a run, or the eval-loss curves of
// several runs side by side (the compare job), to a PNG with
// gonum.org/v1/plot.
//
// Limits: linear axes only; non-finite losses (a diverged step) are left out
// of the plot rather than drawn; the image size is fixed (8 x 5 inches);
// past seven curves the colours repeat (the dashes and markers still differ).

package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/lsp-offload/lsp-offload/train/atomicfile"
)

var (
	trainColor    = color.RGBA{R: 31, G: 119, B: 180, A: 255}
	trainRawColor = color.NRGBA{R: 31, G: 119, B: 180, A: 70} // faint: noise behind the trend (NRGBA: not premultiplied)
	evalColor     = color.RGBA{R: 214, G: 39, B: 40, A: 255}
)

// PlotLoss draws train loss (faint raw values and, when there are enough
// points, an exponentially smoothed line) and eval loss (line with points)
// against step, and writes the PNG to path atomically. It is an error when
// records hold no finite train or eval loss.
func PlotLoss(records []Record, path, title string) error {
	recs := slices.Clone(records)
	slices.SortStableFunc(recs, func(a, b Record) int { return a.Step - b.Step })
	var train, eval plotter.XYs
	for _, r := range recs {
		if r.TrainLoss != nil && finite(*r.TrainLoss) {
			train = append(train, plotter.XY{X: float64(r.Step), Y: *r.TrainLoss})
		}
		if r.EvalLoss != nil && finite(*r.EvalLoss) {
			eval = append(eval, plotter.XY{X: float64(r.Step), Y: *r.EvalLoss})
		}
	}
	if len(train) == 0 && len(eval) == 0 {
		return fmt.Errorf("metrics: plot %s: no finite train or eval loss in %d records", path, len(records))
	}

	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "step"
	p.Y.Label.Text = "loss"
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.XOffs = -vg.Points(6) // keep the legend off the image edge

	if len(train) > 0 {
		raw, err := plotter.NewLine(train)
		if err != nil {
			return fmt.Errorf("metrics: plot %s: %w", path, err)
		}
		raw.Color = trainRawColor
		raw.Width = vg.Points(1)
		p.Add(raw)
		if w := smoothWindow(len(train)); w > 1 {
			sm, err := plotter.NewLine(smooth(train, w))
			if err != nil {
				return fmt.Errorf("metrics: plot %s: %w", path, err)
			}
			sm.Color = trainColor
			sm.Width = vg.Points(1.5)
			p.Add(sm)
			p.Legend.Add(fmt.Sprintf("train (EMA %d)", w), sm)
		} else {
			raw.Color = trainColor
			p.Legend.Add("train", raw)
		}
	}
	if len(eval) > 0 {
		l, pts, err := plotter.NewLinePoints(eval)
		if err != nil {
			return fmt.Errorf("metrics: plot %s: %w", path, err)
		}
		l.Color = evalColor
		l.Width = vg.Points(1.5)
		pts.Color = evalColor
		pts.Radius = vg.Points(2.5)
		p.Add(l, pts)
		p.Legend.Add("eval", l, pts)
	}

	return savePNG(p, path)
}

// Curve is one labelled run of a multi-run plot; its eval losses are drawn.
type Curve struct {
	Label   string
	Records []Record
}

// RefLine is a labelled horizontal line across a plot, such as the loss
// before fine-tuning.
type RefLine struct {
	Label string
	Y     float64
}

// refColor is the grey of reference lines.
var refColor = color.RGBA{R: 90, G: 90, B: 90, A: 255}

// PlotEvalLoss draws the eval loss of each curve against step (a line with
// points, each curve in its own colour, dash pattern and marker, so that
// curves lying on top of each other stay visible), then each reference line
// dashed in grey across the steps drawn, and writes the PNG to path
// atomically. It is an error when no curve holds a finite eval loss;
// non-finite reference values are left out.
func PlotEvalLoss(curves []Curve, refs []RefLine, path, title string) error {
	type series struct {
		label string
		xys   plotter.XYs
	}
	var all []series
	lo, hi := math.Inf(1), math.Inf(-1)   // steps
	ylo, yhi := math.Inf(1), math.Inf(-1) // losses and references
	for _, c := range curves {
		recs := slices.Clone(c.Records)
		slices.SortStableFunc(recs, func(a, b Record) int { return a.Step - b.Step })
		var xys plotter.XYs
		for _, r := range recs {
			if r.EvalLoss != nil && finite(*r.EvalLoss) {
				xys = append(xys, plotter.XY{X: float64(r.Step), Y: *r.EvalLoss})
				lo, hi = min(lo, float64(r.Step)), max(hi, float64(r.Step))
				ylo, yhi = min(ylo, *r.EvalLoss), max(yhi, *r.EvalLoss)
			}
		}
		if len(xys) > 0 {
			all = append(all, series{c.Label, xys})
		}
	}
	if len(all) == 0 {
		return fmt.Errorf("metrics: plot %s: no finite eval loss in %d curves", path, len(curves))
	}
	if hi == lo {
		hi = lo + 1 // one step: give the reference lines some length
	}
	for _, r := range refs {
		if finite(r.Y) {
			ylo, yhi = min(ylo, r.Y), max(yhi, r.Y)
		}
	}
	pad := 0.08 * max(yhi-ylo, 1e-3*max(math.Abs(yhi), 1))

	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "step"
	p.Y.Label.Text = "eval loss"
	// Room above the top curve or reference, so a line there stays clear of
	// the frame, and the legend below it (losses fall, so the upper right
	// is usually empty after the first evals).
	p.Y.Min, p.Y.Max = ylo-pad, yhi+pad
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.XOffs = -vg.Points(6)
	p.Legend.YOffs = -vg.Points(36)

	for i, s := range all {
		l, pts, err := plotter.NewLinePoints(s.xys)
		if err != nil {
			return fmt.Errorf("metrics: plot %s: %w", path, err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		l.Width = vg.Points(1.5)
		pts.Color = plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		pts.Radius = vg.Points(3)
		p.Add(l, pts)
		p.Legend.Add(s.label, l, pts)
	}
	for _, r := range refs {
		if !finite(r.Y) {
			continue
		}
		l, err := plotter.NewLine(plotter.XYs{{X: lo, Y: r.Y}, {X: hi, Y: r.Y}})
		if err != nil {
			return fmt.Errorf("metrics: plot %s: %w", path, err)
		}
		l.Color = refColor
		l.Width = vg.Points(1.5)
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(r.Label, l)
	}
	return savePNG(p, path)
}

// savePNG renders p at 8 x 5 inches and writes it to path atomically.
func savePNG(p *plot.Plot, path string) error {
	wt, err := p.WriterTo(8*vg.Inch, 5*vg.Inch, "png")
	if err != nil {
		return fmt.Errorf("metrics: plot %s: %w", path, err)
	}
	// Render fully before touching the file, so a failure leaves the old plot.
	var buf bytes.Buffer
	if _, err := wt.WriteTo(&buf); err != nil {
		return fmt.Errorf("metrics: plot %s: render: %w", path, err)
	}
	if buf.Len() == 0 {
		return errors.New("metrics: plot " + path + ": renderer produced no bytes")
	}
	if err := atomicfile.WriteFile(path, 0o644, func(w io.Writer) error {
		_, err := w.Write(buf.Bytes())
		return err
	}); err != nil {
		return fmt.Errorf("metrics: plot: %w", err)
	}
	return nil
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// smoothWindow picks an EMA span that is light: about 1/25 of the points,
// between 1 (no smoothing for short runs) and 50.
func smoothWindow(n int) int { return min(max(n/25, 1), 50) }

// smooth returns the bias-corrected exponential moving average of the Y
// values with span w (alpha = 2/(w+1)); the correction keeps the first points
// from being pulled toward zero.
func smooth(xys plotter.XYs, w int) plotter.XYs {
	alpha := 2 / float64(w+1)
	out := make(plotter.XYs, len(xys))
	var m, weight float64
	for i, p := range xys {
		m = (1-alpha)*m + alpha*p.Y
		weight = (1-alpha)*weight + alpha
		out[i] = plotter.XY{X: p.X, Y: m / weight}
	}
	return out
}
