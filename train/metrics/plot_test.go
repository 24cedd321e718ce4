// Tests for PlotLoss and PlotEvalLoss: a valid PNG for train-only,
// eval-only and mixed data (with non-finite values skipped), every curve of
// a multi-run plot visible, errors on no data, and the smoother.

package metrics

import (
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
)

func nan() float64 { return math.NaN() }

// checkPlot checks the outcome of a plot into path (in dir): when !ok, an
// error naming path and no file left behind (it returns nil); when ok, a
// PNG of a plausible size, which it returns.
func checkPlot(t *testing.T, dir, path string, err error, ok bool) image.Image {
	t.Helper()
	if !ok {
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("err = %v, want one naming %s", err, path)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("failed plot left files: %v", ents)
		}
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 400 || b.Dy() < 200 {
		t.Fatalf("image is %v", b)
	}
	return img
}

func TestPlotLoss(t *testing.T) {
	var mixed []Record
	for i := 1; i <= 300; i++ {
		r := Record{Step: i, TrainLoss: F(3 * math.Exp(-float64(i)/100) * (1 + 0.1*math.Sin(float64(i))))}
		if i == 150 {
			r.TrainLoss = F(math.Inf(1))
		}
		if i%50 == 0 {
			r.EvalLoss = F(3 * math.Exp(-float64(i)/120))
		}
		mixed = append(mixed, r)
	}
	tests := []struct {
		name string
		recs []Record
		ok   bool
	}{
		{"mixed", mixed, true},
		{"train only, short", []Record{{Step: 1, TrainLoss: F(2)}, {Step: 2, TrainLoss: F(1.5)}}, true},
		{"eval only, one point", []Record{{Step: 10, EvalLoss: F(2)}}, true},
		{"no records", nil, false},
		{"events only", []Record{{Step: 1, Event: "resume"}}, false},
		{"only non-finite", []Record{{Step: 1, TrainLoss: F(nan())}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "loss.png")
			err := PlotLoss(tc.recs, path, "test run")
			checkPlot(t, dir, path, err, tc.ok)
		})
	}
}

func TestSmooth(t *testing.T) {
	if w := smoothWindow(10); w != 1 {
		t.Errorf("smoothWindow(10) = %d, want 1 (no smoothing)", w)
	}
	if w := smoothWindow(100000); w != 50 {
		t.Errorf("smoothWindow(1e5) = %d, want 50", w)
	}
	// Bias correction: a constant series stays constant from the first point.
	in := plotter.XYs{{X: 1, Y: 4}, {X: 2, Y: 4}, {X: 3, Y: 4}}
	for _, p := range smooth(in, 9) {
		if math.Abs(p.Y-4) > 1e-12 {
			t.Fatalf("smooth of a constant = %v", p.Y)
		}
	}
	// A step is followed with lag, staying between the levels.
	out := smooth(plotter.XYs{{X: 1, Y: 0}, {X: 2, Y: 0}, {X: 3, Y: 10}}, 3)
	if y := out[2].Y; y <= 0 || y >= 10 {
		t.Fatalf("smoothed step = %v, want in (0, 10)", y)
	}
}

// evalRun is the records of a run with an eval every 10 steps whose loss
// decays from start toward end.
func evalRun(start, end float64, steps int) []Record {
	var recs []Record
	for s := 0; s <= steps; s++ {
		r := Record{Step: s}
		if s > 0 {
			r.TrainLoss = F(end + (start-end)*math.Exp(-float64(s)/20) + 0.1)
		}
		if s%10 == 0 {
			r.EvalLoss = F(end + (start-end)*math.Exp(-float64(s)/20))
		}
		recs = append(recs, r)
	}
	return recs
}

// countColor is the number of pixels of img exactly of colour c.
func countColor(img image.Image, c color.Color) int {
	cr, cg, cb, ca := c.RGBA()
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bb, a := img.At(x, y).RGBA()
			if r == cr && g == cg && bb == cb && a == ca {
				n++
			}
		}
	}
	return n
}

func TestPlotEvalLoss(t *testing.T) {
	same := evalRun(7, 1.5, 100)
	four := []Curve{{"native", same}, {"zero", same}, {"lsp", evalRun(7, 2, 100)}, {"lsp (no fit)", evalRun(7, 1.6, 100)}}
	withBad := slices.Clone(evalRun(3, 1, 30))
	withBad[10].EvalLoss = F(math.Inf(1))
	tests := []struct {
		name   string
		curves []Curve
		refs   []RefLine
		ok     bool
		drawn  int // curves whose colour must show (the first n)
	}{
		{"four runs, two identical, with L0", four, []RefLine{{"L0 = 7.00", 7}}, true, 4},
		{"one point", []Curve{{"a", []Record{{Step: 0, EvalLoss: F(2)}}}}, []RefLine{{"ref", 3}}, true, 0},
		{"non-finite skipped", []Curve{{"a", withBad}, {"empty", nil}}, []RefLine{{"nan", nan()}}, true, 1},
		{"no curves", nil, nil, false, 0},
		{"train loss only", []Curve{{"a", []Record{{Step: 1, TrainLoss: F(2)}}}}, []RefLine{{"ref", 3}}, false, 0},
		{"only non-finite", []Curve{{"a", []Record{{Step: 1, EvalLoss: F(nan())}}}}, nil, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "compare.png")
			err := PlotEvalLoss(tc.curves, tc.refs, path, "compare")
			img := checkPlot(t, dir, path, err, tc.ok)
			if img == nil {
				return
			}
			// Every curve shows in its own colour, even one drawn under an
			// identical one, and so does a finite reference line.
			for i := range tc.drawn {
				if n := countColor(img, plotutil.Color(i)); n < 50 {
					t.Errorf("curve %d (%s): %d pixels of its colour, want a line's worth", i, tc.curves[i].Label, n)
				}
			}
			if tc.drawn > 0 && len(tc.refs) > 0 && finite(tc.refs[0].Y) {
				if n := countColor(img, refColor); n < 50 {
					t.Errorf("reference line: %d pixels of its colour", n)
				}
			}
		})
	}
}
