// Tests for PlotLoss: a valid PNG for train-only, eval-only and mixed data
// (with non-finite values skipped), errors on no data, and the smoother.
package metrics

import (
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"
)

func nan() float64 { return math.NaN() }

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
			if !tc.ok {
				if err == nil || !strings.Contains(err.Error(), path) {
					t.Fatalf("err = %v, want one naming %s", err, path)
				}
				if ents, _ := os.ReadDir(dir); len(ents) != 0 {
					t.Fatalf("failed plot left files: %v", ents)
				}
				return
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
