package optim

import (
	"math"
	"testing"
)

func TestSchedule(t *testing.T) {
	s := Schedule{LR: 1e-3, MinLR: 1e-4, Warmup: 10, Total: 110}
	for _, c := range []struct {
		step int
		want float64
	}{
		{1, 1e-4},               // warmup starts at LR/Warmup, never at 0
		{5, 5e-4},               //
		{10, 1e-3},              // peak at the end of warmup
		{60, (1e-3 + 1e-4) / 2}, // half way through the cosine
		{110, 1e-4},             // MinLR at the last step
		{200, 1e-4},             // and after it
	} {
		if got := s.At(c.step); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("At(%d) = %g, want %g", c.step, got, c.want)
		}
	}
	flat := Schedule{LR: 2e-3, Total: 5}
	if got := flat.At(3); got != 2e-3*(1+math.Cos(math.Pi*3/5))/2 {
		t.Errorf("no-warmup cosine At(3) = %g", got)
	}
}

func TestParseClipMode(t *testing.T) {
	for _, ok := range []string{"none", "matrix", "global-prev"} {
		if _, err := ParseClipMode(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	if _, err := ParseClipMode("global"); err == nil {
		t.Error("global (current-step norm) accepted; it breaks the layer-wise schedule")
	}
}
