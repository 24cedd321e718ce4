package plan

import (
	"math"
	"testing"
)

// TestAllReduceTime: two ranks send half the buffer in each half of the
// all-reduce (the whole buffer in all) and pay two latencies; more ranks
// approach twice the buffer; one rank is free.
func TestAllReduceTime(t *testing.T) {
	n := Net{Bandwidth: 1e9, Latency: 1e-5}
	for _, tc := range []struct {
		bytes int64
		ranks int
		want  float64
		sent  int64
	}{
		{1e9, 1, 0, 0},
		{1e9, 2, 1 + 2e-5, 1e9},
		{1e9, 4, 1.5 + 6e-5, 1.5e9},
		{0, 4, 0, 0},
	} {
		if got := n.AllReduceTime(tc.bytes, tc.ranks); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%d bytes, %d ranks: %g s, want %g", tc.bytes, tc.ranks, got, tc.want)
		}
		if got := AllReduceBytes(tc.bytes, tc.ranks); got != tc.sent {
			t.Errorf("%d bytes, %d ranks: %d bytes sent, want %d", tc.bytes, tc.ranks, got, tc.sent)
		}
	}
	if _, err := NetPreset("token-ring"); err == nil {
		t.Error("an unknown --net was accepted")
	}
	for name, p := range Nets {
		if !(p.Bandwidth > 0 && p.Latency > 0) {
			t.Errorf("%s: bandwidth %g, latency %g", name, p.Bandwidth, p.Latency)
		}
	}
}
