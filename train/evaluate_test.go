package train

import (
	"slices"
	"testing"
)

// TestEvalsFrom counts the evaluations still to come, which the progress
// display's ETA adds: the periodic ones before the last step and the
// final one, none once the final one is done.
func TestEvalsFrom(t *testing.T) {
	for _, tc := range []struct {
		steps, every, lastEval, from, want int
	}{
		{600, 100, -1, 1, 6},   // 100, ..., 500 and the final
		{600, 100, -1, 100, 6}, // step 100's is still to come
		{600, 100, 100, 101, 5},
		{600, 100, 500, 600, 1}, // only the final
		{600, 0, -1, 1, 1},
		{600, 100, 600, 600, 0}, // the final one is done
		{600, 100, -1, 601, 0},
		{3, 2, -1, 1, 2},
	} {
		r := &run{cfg: Config{Steps: tc.steps, EvalEvery: tc.every}, lastEval: tc.lastEval}
		if got := r.evalsFrom(tc.from); got != tc.want {
			t.Errorf("%d steps, --eval-every %d, last eval %d: evalsFrom(%d) = %d, want %d",
				tc.steps, tc.every, tc.lastEval, tc.from, got, tc.want)
		}
	}
}

// TestSpread: a capped eval set is spread over the held-out set, in
// order, first row included.
func TestSpread(t *testing.T) {
	xs := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}
	if got := spread(xs, 4); !slices.Equal(got, []int{0, 2, 5, 7}) {
		t.Errorf("spread(10, 4) = %v", got)
	}
	if got := spread(xs, 10); !slices.Equal(got, xs) {
		t.Errorf("spread(10, 10) = %v", got)
	}
	if got := spread(xs[:3], 5); !slices.Equal(got, xs[:3]) {
		t.Errorf("spread(3, 5) = %v", got)
	}
}
