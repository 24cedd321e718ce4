// Tests of the LSP flag checks.

package lsp

import (
	"math"
	"strings"
	"testing"
)

func TestCheckFlags(t *testing.T) {
	for _, tc := range []struct {
		name       string
		d, r       int
		alpha      float64
		checkEvery int
		want       []string // substrings that must all appear; none: no error
	}{
		{"paper 1B defaults", 512, 16, 0.5, 100, nil},
		{"r equal to d", 8, 8, 0.2, 1, nil},
		{"r larger than d", 8, 16, 0.5, 100, []string{"--r 16 larger than --d 8"}},
		{"d zero", 0, 4, 0.5, 100, []string{"--d 0"}},
		{"r zero", 8, 0, 0.5, 100, []string{"--r 0"}},
		{"alpha zero", 8, 4, 0, 100, []string{"--alpha 0"}},
		{"alpha one", 8, 4, 1, 100, []string{"--alpha 1"}},
		{"alpha NaN", 8, 4, math.NaN(), 100, []string{"--alpha NaN"}},
		{"check-every zero", 8, 4, 0.5, 0, []string{"--check-every 0"}},
		{"all at once", -1, 0, 2, -5, []string{"--d -1", "--r 0", "--alpha 2", "--check-every -5"}},
	} {
		err := CheckFlags(tc.d, tc.r, tc.alpha, tc.checkEvery)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s: unexpected error %v", tc.name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not name %q", tc.name, err, w)
			}
		}
	}
}
