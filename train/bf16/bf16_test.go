// Tests for bfloat16 conversion: exact values, round-to-nearest-even ties,
// NaN, Inf, overflow, denormals, and an exhaustive round trip of all 65536
// bfloat16 values.

package bf16

import (
	"math"
	"testing"
)

func TestFromFloat32(t *testing.T) {
	f := math.Float32frombits
	tests := []struct {
		name string
		in   float32
		want uint16
	}{
		{"zero", 0, 0x0000},
		{"neg zero", float32(math.Copysign(0, -1)), 0x8000},
		{"one", 1, 0x3f80},
		{"minus two", -2, 0xc000},
		{"exact bf16", f(0x3f810000), 0x3f81},
		{"below half rounds down", f(0x3f807fff), 0x3f80},
		{"above half rounds up", f(0x3f808001), 0x3f81},
		{"tie to even stays (even)", f(0x3f808000), 0x3f80},
		{"tie to even goes up (odd)", f(0x3f818000), 0x3f82},
		{"tie carries into exponent", f(0x3fff8000), 0x4000},
		{"+inf", float32(math.Inf(1)), 0x7f80},
		{"-inf", float32(math.Inf(-1)), 0xff80},
		{"max float32 overflows to inf", math.MaxFloat32, 0x7f80},
		{"largest finite bf16", f(0x7f7f0000), 0x7f7f},
		{"just below overflow tie rounds to inf", f(0x7f7f8000), 0x7f80},
		{"denormal exact", f(0x00010000), 0x0001},
		{"denormal tie to even down", f(0x00008000), 0x0000},
		{"denormal tie to even up", f(0x00018000), 0x0002},
		{"denormal rounds up to normal", f(0x007fffff), 0x0080},
		{"smallest float32 denormal", f(0x00000001), 0x0000},
		{"negative denormal", f(0x80010000), 0x8001},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := FromFloat32(tc.in); got != tc.want {
				t.Fatalf("FromFloat32(%#08x) = %#04x, want %#04x", math.Float32bits(tc.in), got, tc.want)
			}
		})
	}
}

func TestNaN(t *testing.T) {
	for _, bits := range []uint32{
		0x7fc00000, // canonical quiet NaN
		0xffc00000, // negative quiet NaN
		0x7f800001, // signalling NaN, payload only in the low bits
		0xff800001,
		0x7f80ffff,
		0x7fffffff,
	} {
		h := FromFloat32(math.Float32frombits(bits))
		back := ToFloat32(h)
		if !math.IsNaN(float64(back)) {
			t.Errorf("NaN %#08x -> %#04x is not NaN", bits, h)
		}
		if (h >> 15) != uint16(bits>>31) {
			t.Errorf("NaN %#08x -> %#04x lost its sign", bits, h)
		}
	}
}

func TestToFloat32(t *testing.T) {
	tests := []struct {
		in   uint16
		want float32
	}{
		{0x3f80, 1}, {0xbf80, -1}, {0x4049, 3.140625}, {0x0001, math.Float32frombits(0x00010000)},
		{0x7f80, float32(math.Inf(1))}, {0xff80, float32(math.Inf(-1))},
	}
	for _, tc := range tests {
		if got := ToFloat32(tc.in); got != tc.want {
			t.Errorf("ToFloat32(%#04x) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// Every bfloat16 widens exactly and rounds back to itself (NaNs to a NaN).
func TestRoundTripAll(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		f := ToFloat32(h)
		back := FromFloat32(f)
		if math.IsNaN(float64(f)) {
			if !math.IsNaN(float64(ToFloat32(back))) {
				t.Fatalf("%#04x: NaN did not stay NaN (%#04x)", h, back)
			}
			continue
		}
		if back != h {
			t.Fatalf("%#04x -> %v -> %#04x", h, f, back)
		}
	}
}

// Compare with a reference rounding done in float64 arithmetic: the result
// must be the nearest bfloat16, ties to even.
func TestNearestAgainstFloat64(t *testing.T) {
	var x uint32 = 12345
	for range 20000 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		f := math.Float32frombits(x)
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			continue
		}
		h := FromFloat32(f)
		lo := uint16(x >> 16) // truncation: toward zero in magnitude
		hi := lo + 1
		dlo := math.Abs(float64(f) - float64(ToFloat32(lo)))
		dhi := math.Abs(float64(ToFloat32(hi)) - float64(f))
		if math.IsInf(float64(ToFloat32(hi)), 0) {
			// Overflow boundary: compare against 2^128, the value Inf stands for.
			dhi = math.Abs(math.Copysign(math.Ldexp(1, 128), float64(f)) - float64(f))
		}
		want := lo
		if dhi < dlo || (dhi == dlo && lo&1 == 1) {
			want = hi
		}
		if h != want {
			t.Fatalf("FromFloat32(%#08x) = %#04x, want %#04x", x, h, want)
		}
	}
}

func TestSlices(t *testing.T) {
	src := []float32{1, 2.5, -3}
	h := make([]uint16, 2)
	if n := FromFloat32Slice(h, src); n != 2 || h[0] != 0x3f80 || h[1] != 0x4020 {
		t.Fatalf("FromFloat32Slice = %d %x", n, h)
	}
	out := make([]float32, 5)
	if n := ToFloat32Slice(out, h); n != 2 || out[0] != 1 || out[1] != 2.5 {
		t.Fatalf("ToFloat32Slice = %d %v", n, out)
	}
}
