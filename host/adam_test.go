// adam_test.go: the fused Adam against PyTorch's AdamW trajectory, every
// SIMD path against the scalar one (bit for bit), bf16 rounding, the NaN/Inf
// skip, argument errors, clipping, the subspace form and thread invariance.

package host

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"
)

// adamTestWorkers returns a 2-worker pool closed at the end of the test.
func adamTestWorkers(t testing.TB, n int) *Workers {
	t.Helper()
	w, err := NewWorkers(WorkersOptions{N: n})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

// adamTestBytes views a slice's memory for bit-exact comparison.
func adamTestBytes[T float32 | uint16](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// adamTestFirstDiff reports the first differing element of two slices.
func adamTestFirstDiff[T float32 | uint16](a, b []T) string {
	for i := range a {
		if adamTestBits(a[i]) != adamTestBits(b[i]) {
			return fmt.Sprintf("[%d]: %v (%#x) vs %v (%#x)", i, a[i], adamTestBits(a[i]), b[i], adamTestBits(b[i]))
		}
	}
	return "lengths differ"
}

func adamTestBits[T float32 | uint16](x T) uint32 {
	switch v := any(x).(type) {
	case float32:
		return math.Float32bits(v)
	case uint16:
		return uint32(v)
	}
	return 0
}

// adamTestF16 is an independent binary16 decoder (float64 arithmetic).
func adamTestF16(h uint16) float32 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e := int(h>>10) & 0x1f
	m := float64(h & 0x3ff)
	switch e {
	case 0:
		return float32(sign * m * math.Ldexp(1, -24))
	case 31:
		if m != 0 {
			return float32(math.NaN())
		}
		return float32(sign * math.Inf(1))
	}
	return float32(sign * (1 + m/1024) * math.Ldexp(1, e-15))
}

// adamTestBF16RNE is an independent bf16 rounding: of the two neighbours
// (the second may be the overflow point 2^128), take the nearer, ties to the
// even one, distances measured exactly in float64.
func adamTestBF16RNE(f float32) uint16 {
	bits := math.Float32bits(f)
	if f != f {
		return uint16(bits>>16) | 0x40
	}
	sign := uint16(bits>>16) & 0x8000
	a := math.Abs(float64(f))
	lo := uint16(bits>>16) & 0x7fff // truncation toward zero
	loV := float64(math.Float32frombits(uint32(lo) << 16))
	if loV == a {
		return sign | lo
	}
	hi := lo + 1
	hiV := float64(math.Float32frombits(uint32(hi) << 16))
	if math.IsInf(hiV, 0) {
		hiV = math.Ldexp(1, 128)
	}
	switch dl, dh := a-loV, hiV-a; {
	case dl < dh:
		return sign | lo
	case dh < dl:
		return sign | hi
	case lo&1 == 0:
		return sign | lo
	}
	return sign | hi
}

// adamTestDType names the gradient types.
var adamTestDTypes = []string{"f32", "bf16", "f16"}

// adamTestRandGrad draws n gradient values as bits of the given type, with a
// random sign and a binary exponent in [e0, e1], clamped to the type's range
// (its bottom is the subnormals); zero gives +0 and -0 only.
func adamTestRandGrad(r *rand.Rand, n int, dtype string, e0, e1 int, zero bool) AdamGrad {
	// bits returns sign | biased exponent | mantissa for a format with the
	// given exponent bias, all-ones exponent and mantissa width.
	bits := func(bias, top, man int) uint32 {
		e := max(0, min(top-1, e0+r.IntN(e1-e0+1)+bias))
		sign := r.Uint32() & 1
		if zero {
			e = 0
		}
		m := r.Uint32() & (1<<man - 1)
		if zero {
			m = 0
		}
		return sign<<(man+adamTestBitsLen(top)) | uint32(e)<<man | m
	}
	switch dtype {
	case "f32":
		g := make([]float32, n)
		for i := range g {
			g[i] = math.Float32frombits(bits(127, 255, 23))
		}
		return AdamGrad{F32: g}
	case "bf16":
		g := make([]uint16, n)
		for i := range g {
			g[i] = uint16(bits(127, 255, 7))
		}
		return AdamGrad{BF16: g}
	}
	g := make([]uint16, n)
	for i := range g {
		g[i] = uint16(bits(15, 31, 10))
	}
	return AdamGrad{F16: g}
}

// adamTestBitsLen is the width of an all-ones exponent field.
func adamTestBitsLen(top int) int {
	w := 0
	for ; top > 0; top >>= 1 {
		w++
	}
	return w
}

// adamTestCase is one input: weights, state, gradient and parameters.
type adamTestCase struct {
	w, m, v  []float32
	g        AdamGrad
	step     int64
	p        AdamParams
	prefetch adamPrefetch // the zero value decides from the size
}

// adamTestTile fills dst by repeating a shorter random block: cheap, and the
// block length (prime) shifts every lane's position from one repeat to the
// next.
func adamTestTile[T any](dst, block []T) []T {
	for i := 0; i < len(dst); i += len(block) {
		copy(dst[i:], block)
	}
	return dst
}

// adamTestArena hands out slices of one off-heap buffer (a nil arena: Go
// heap). Big test arrays live there because the race detector annotates
// every copy into Go memory byte range by byte range, which made the
// 1000003-element cases take a minute under -race; off-heap copies are plain.
type adamTestArena struct {
	buf *HostBuffer
	off int
}

func newAdamTestArena(t testing.TB, size int) *adamTestArena {
	t.Helper()
	b, err := NewHostBuffer(size, HostBufferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return &adamTestArena{buf: b}
}

func (a *adamTestArena) take(bytes int) int {
	off := a.off
	a.off += (bytes + 63) &^ 63
	if a.off > a.buf.Len() {
		panic(fmt.Sprintf("test arena of %d bytes exhausted", a.buf.Len()))
	}
	return off
}

func (a *adamTestArena) f32(n int) []float32 { return arenaSlice[float32](a, n) }

func (a *adamTestArena) u16(n int) []uint16 { return arenaSlice[uint16](a, n) }

// arenaSlice takes n zeroed elements of T from a (from the Go heap when a
// is nil).
func arenaSlice[T float32 | uint16](a *adamTestArena, n int) []T {
	if a == nil {
		return make([]T, n)
	}
	var zero T
	s, err := hostView[T](a.buf, "test arena", a.take(int(unsafe.Sizeof(zero))*n), n)
	if err != nil {
		panic(err)
	}
	clear(s)
	return s
}

func (a *adamTestArena) reset() {
	if a != nil {
		a.off = 0
	}
}

// adamTestMake builds a case of n elements of the named kind.
func adamTestMake(r *rand.Rand, a *adamTestArena, n int, kind, dtype string, step int64) adamTestCase {
	const block = 4099
	bn := min(n, block)
	p := AdamDefaults()
	p.LR = 3e-3
	ge0, ge1, we, me := -20, 2, 0, -8 // gradient exponents, weight and moment scales
	zero := false
	switch kind {
	case "nowd":
		p.WeightDecay = 0
	case "zero":
		zero = true
	case "large":
		// Gradients up to 2^70: g*g overflows fp32 and v becomes Inf, which
		// every path must handle identically; weights near fp32's maximum
		// round to bf16 Inf.
		ge0, ge1, we, me = 30, 70, 120, 60
	}
	gb := adamTestRandGrad(r, bn, dtype, ge0, ge1, zero)
	wb := make([]float32, bn)
	mb := make([]float32, bn)
	vb := make([]float32, bn)
	for i := range wb {
		wb[i] = float32(math.Ldexp(r.NormFloat64(), we+r.IntN(8)))
		if step > 1 {
			mb[i] = float32(math.Ldexp(r.NormFloat64(), me))
			vb[i] = mb[i] * mb[i] * float32(0.5+r.Float64())
		}
	}
	var g AdamGrad
	switch {
	case gb.F32 != nil:
		g.F32 = adamTestTile(a.f32(n), gb.F32)
	case gb.BF16 != nil:
		g.BF16 = adamTestTile(a.u16(n), gb.BF16)
	default:
		g.F16 = adamTestTile(a.u16(n), gb.F16)
	}
	return adamTestCase{w: adamTestTile(a.f32(n), wb), m: adamTestTile(a.f32(n), mb),
		v: adamTestTile(a.f32(n), vb), g: g, step: step - 1, p: p}
}

// adamTestRun runs the case on a copy with the given path and mode ("w",
// "w+bf16", "w+bf16-unaligned" or "delta") and returns the outputs.
type adamTestOut struct {
	w, m, v, delta []float32
	out16          []uint16
	res            AdamResult
}

func (c adamTestCase) run(t *testing.T, pool *Workers, a *adamTestArena, path SIMD, mode string) adamTestOut {
	t.Helper()
	n := len(c.m)
	o := adamTestOut{m: a.f32(n), v: a.f32(n)}
	copy(o.m, c.m)
	copy(o.v, c.v)
	var g AdamGrad
	switch {
	case c.g.F32 != nil:
		g.F32 = a.f32(n)
		copy(g.F32, c.g.F32)
	case c.g.BF16 != nil:
		g.BF16 = a.u16(n)
		copy(g.BF16, c.g.BF16)
	default:
		g.F16 = a.u16(n)
		copy(g.F16, c.g.F16)
	}
	st := &AdamState{M: o.m, V: o.v, Step: c.step}
	tensor := AdamTensor{Name: "case", Params: c.p, Grad: g, State: st}
	switch mode {
	case "delta":
		if g.F32 != nil {
			o.delta = g.F32 // in place
		} else {
			o.delta = a.f32(n)
		}
		tensor.Delta = o.delta
	default:
		o.w = a.f32(n)
		copy(o.w, c.w)
		tensor.W = o.w
		switch mode {
		case "w+bf16": // aligned: SIMD paths use streaming stores
			o.out16 = a.u16(n)
		case "w+bf16-unaligned": // 2 bytes off: plain stores
			o.out16 = a.u16(n + 1)[1:]
		}
		tensor.BF16Out = o.out16
	}
	res, err := pool.adamStepPrefetch([]AdamTensor{tensor}, path, c.prefetch)
	if err != nil {
		t.Fatal(err)
	}
	o.res = res
	if st.Step != c.step+1 {
		t.Fatalf("Step = %d after a step from %d", st.Step, c.step)
	}
	return o
}

// adamTestSIMDRun is one SIMD path with one prefetch choice.
type adamTestSIMDRun struct {
	path     SIMD
	prefetch adamPrefetch
}

// TestAdamSIMDMatchesScalar: tolerance 0. Every path performs the same IEEE
// operations (explicit FMAs, correctly rounded sqrt and division, exact
// conversions), so every output must equal the scalar path's bit for bit,
// at every software prefetch level.
func TestAdamSIMDMatchesScalar(t *testing.T) {
	paths := SupportedSIMD()
	if len(paths) < 2 {
		t.Skipf("this CPU has only the scalar path (best %v)", DetectSIMD())
	}
	var runs []adamTestSIMDRun
	for _, path := range paths[1:] {
		for _, pf := range []adamPrefetch{adamPrefetchNone, adamPrefetchNear, adamPrefetchFar} {
			runs = append(runs, adamTestSIMDRun{path, pf})
		}
	}
	pool := adamTestWorkers(t, 2)
	r := rand.New(rand.NewPCG(1, 2))
	const maxN = 1000003
	in, ra, ga := newAdamTestArena(t, 24*maxN), newAdamTestArena(t, 24*maxN), newAdamTestArena(t, 24*maxN)
	for _, n := range []int{1, 7, 8, 15, 16, 17, maxN} {
		for _, dtype := range adamTestDTypes {
			for _, step := range []int64{1, 1000} {
				for _, kind := range []string{"wd", "nowd", "zero", "large"} {
					in.reset()
					c := adamTestMake(r, in, n, kind, dtype, step)
					for _, mode := range []string{"w", "w+bf16", "w+bf16-unaligned", "delta"} {
						ra.reset()
						ref := c.run(t, pool, ra, Scalar, mode)
						for _, sp := range runs {
							name := fmt.Sprintf("n=%d/%s/step=%d/%s/%s/%v/pf=%d", n, dtype, step, kind, mode, sp.path, sp.prefetch)
							ga.reset()
							c.prefetch = sp.prefetch
							got := c.run(t, pool, ga, sp.path, mode)
							adamTestSame(t, name+"/w", got.w, ref.w)
							adamTestSame(t, name+"/m", got.m, ref.m)
							adamTestSame(t, name+"/v", got.v, ref.v)
							adamTestSame(t, name+"/delta", got.delta, ref.delta)
							adamTestSame(t, name+"/bf16", got.out16, ref.out16)
							gn, rn := got.res.Tensors[0].Norm, ref.res.Tensors[0].Norm
							if math.Float64bits(gn) != math.Float64bits(rn) {
								t.Errorf("%s: norm %v, scalar %v", name, gn, rn)
							}
						}
					}
				}
			}
		}
	}
}

func adamTestSame[T float32 | uint16](t *testing.T, name string, got, want []T) {
	t.Helper()
	if !bytes.Equal(adamTestBytes(got), adamTestBytes(want)) || len(got) != len(want) {
		t.Errorf("%s differs from scalar at %s", name, adamTestFirstDiff(got, want))
	}
}

// TestAdamBF16RoundsToNearestEven: with lr = 0 the weights pass through
// unchanged, so the bf16 copy must be exactly the rounding of each crafted
// bit pattern (ties both ways, overflow to Inf, subnormals, NaN, zeros).
func TestAdamBF16RoundsToNearestEven(t *testing.T) {
	var ws []float32
	for _, hi := range []uint32{0x0000, 0x0001, 0x3f80, 0x3f81, 0x7f7e, 0x7f7f, 0x8000, 0xbf80, 0xbf81, 0xff7f, 0x0040} {
		for _, lo := range []uint32{0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff} {
			ws = append(ws, math.Float32frombits(hi<<16|lo))
		}
	}
	ws = append(ws, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()),
		math.Float32frombits(0x7f800001), math.Float32frombits(0xffc00000))
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		ws = append(ws, math.Float32frombits(r.Uint32()))
	}
	n := len(ws)
	for _, path := range SupportedSIMD() {
		w := append([]float32(nil), ws...)
		out := make([]uint16, n)
		p := AdamDefaults()
		p.LR = 0
		tensor := AdamTensor{W: w, Grad: AdamGrad{F32: make([]float32, n)}, State: NewAdamState(n), BF16Out: out, Params: p}
		if _, err := (*Workers)(nil).adamStep([]AdamTensor{tensor}, path); err != nil {
			t.Fatal(err)
		}
		for i, f := range ws {
			want := adamTestBF16RNE(f)
			if f != f {
				if out[i]&0x7f80 != 0x7f80 || out[i]&0x7f == 0 {
					t.Errorf("%v: bf16(%#x NaN) = %#x, want a NaN", path, math.Float32bits(f), out[i])
				}
				continue
			}
			if out[i] != want {
				t.Errorf("%v: bf16(%#x) = %#x, want %#x", path, math.Float32bits(f), out[i], want)
			}
			if math.Float32bits(w[i]) != math.Float32bits(f) {
				t.Errorf("%v: lr=0 changed w[%d] from %v to %v", path, i, f, w[i])
			}
		}
	}
}

// TestAdamHalfGradsExact: every finite bf16 and fp16 value, decoded by the C
// code of each path, gives exactly the step of the same value given as fp32
// (decoded here independently).
func TestAdamHalfGradsExact(t *testing.T) {
	for _, dtype := range []string{"bf16", "f16"} {
		var bits []uint16
		var f32 []float32
		for h := 0; h < 1<<16; h++ {
			var f float32
			if dtype == "bf16" {
				f = math.Float32frombits(uint32(h) << 16)
			} else {
				f = adamTestF16(uint16(h))
			}
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				continue
			}
			bits = append(bits, uint16(h))
			f32 = append(f32, f)
		}
		n := len(bits)
		for _, path := range SupportedSIMD() {
			run := func(g AdamGrad) adamTestOut {
				c := adamTestCase{w: make([]float32, n), m: make([]float32, n), v: make([]float32, n), g: g, p: AdamDefaults()}
				for i := range c.w {
					c.w[i] = float32(i) * 1e-3
				}
				return c.run(t, nil, nil, path, "w")
			}
			var half AdamGrad
			if dtype == "bf16" {
				half.BF16 = bits
			} else {
				half.F16 = bits
			}
			got, want := run(half), run(AdamGrad{F32: f32})
			name := dtype + "/" + path.String()
			adamTestSame(t, name+"/w", got.w, want.w)
			adamTestSame(t, name+"/m", got.m, want.m)
			adamTestSame(t, name+"/v", got.v, want.v)
		}
	}
}

// adamFixture is host/testdata/adam_trajectory.json.
type adamFixture struct {
	N           int     `json:"n"`
	Steps       int     `json:"steps"`
	LR          float64 `json:"lr"`
	Beta1       float64 `json:"beta1"`
	Beta2       float64 `json:"beta2"`
	Eps         float64 `json:"eps"`
	WeightDecay float64 `json:"weight_decay"`
	DataFile    string  `json:"data_file"`
	DataSHA256  string  `json:"data_sha256"`
	Versions    struct {
		Torch string `json:"torch"`
	} `json:"versions"`
}

// TestAdamMatchesTorchTrajectory replays torch.optim.AdamW's 1000 steps
// (scripts/fixtures/adam_trajectory.py) with the same gradients. Tolerance:
// every weight within 8 ulps of 1 (9.5e-7) plus 8 ulps of itself, at every
// step; the final moments within 1e-5 relative. The difference is torch's
// operation order (lerp for m, division by sqrt(bias correction), separate
// multiply-adds) drifting over 1000 steps; a wrong formula (eps inside the
// sqrt, coupled decay, no bias correction) is off by orders of magnitude more.
func TestAdamMatchesTorchTrajectory(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "adam_trajectory.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx adamFixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatalf("adam_trajectory.json: %v", err)
	}
	data, err := os.ReadFile(filepath.Join("testdata", fx.DataFile))
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != fx.DataSHA256 {
		t.Fatalf("%s: sha256 does not match adam_trajectory.json", fx.DataFile)
	}
	n := fx.N
	if len(data) != 4*n*(1+2*fx.Steps+2) {
		t.Fatalf("%s: %d bytes, want %d for n=%d steps=%d", fx.DataFile, len(data), 4*n*(1+2*fx.Steps+2), n, fx.Steps)
	}
	vals := make([]float32, len(data)/4)
	if err := binary.Read(bytes.NewReader(data), binary.LittleEndian, vals); err != nil {
		t.Fatal(err)
	}
	p := AdamParams{LR: fx.LR, Beta1: fx.Beta1, Beta2: fx.Beta2, Eps: fx.Eps, WeightDecay: fx.WeightDecay}
	for _, path := range SupportedSIMD() {
		w := append([]float32(nil), vals[:n]...)
		st := NewAdamState(n)
		var worst float64
		for s := 0; s < fx.Steps; s++ {
			off := n + 2*n*s
			g := append([]float32(nil), vals[off:off+n]...)
			want := vals[off+n : off+2*n]
			tensor := AdamTensor{Name: "traj", W: w, Grad: AdamGrad{F32: g}, State: st, Params: p}
			if _, err := (*Workers)(nil).adamStep([]AdamTensor{tensor}, path); err != nil {
				t.Fatal(err)
			}
			for i := range w {
				d := math.Abs(float64(w[i]) - float64(want[i]))
				tol := 8 * (adamTestULP(1) + adamTestULP(want[i]))
				worst = max(worst, d/tol)
				if d > tol {
					t.Fatalf("%v: step %d: w[%d] = %v, torch %s %v (|diff| %.3g > %.3g)", path, s+1, i, w[i], fx.Versions.Torch, want[i], d, tol)
				}
			}
		}
		mv := vals[n+2*n*fx.Steps:]
		for i := 0; i < n; i++ {
			for _, c := range []struct {
				name      string
				got, want float32
			}{{"m", st.M[i], mv[i]}, {"v", st.V[i], mv[n+i]}} {
				if d := math.Abs(float64(c.got - c.want)); d > 1e-5*math.Abs(float64(c.want))+1e-30 {
					t.Errorf("%v: final %s[%d] = %v, torch %v", path, c.name, i, c.got, c.want)
				}
			}
		}
		t.Logf("%v: worst weight difference is %.3f of the tolerance", path, worst)
	}
}

func adamTestULP(f float32) float64 {
	a := math.Abs(float64(f))
	return float64(math.Nextafter32(float32(a), float32(math.Inf(1)))) - a
}

// TestAdamSkipsNonFinite: a NaN or Inf anywhere in a tensor's gradient (the
// last element included, so the scan must come before any write) leaves that
// tensor's weights, moments, bf16 copy and step count untouched; the other
// tensors step.
func TestAdamSkipsNonFinite(t *testing.T) {
	pool := adamTestWorkers(t, 2)
	const n = 2*AdamChunkLen + 5
	ones, zeros, halves := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range ones {
		ones[i], halves[i] = 1, 0.5
	}
	bad := map[string]AdamGrad{
		"f32-nan-last":  {F32: make([]float32, n)},
		"f32-inf-first": {F32: make([]float32, n)},
		"bf16-inf":      {BF16: make([]uint16, n)},
		"f16-nan":       {F16: make([]uint16, n)},
	}
	bad["f32-nan-last"].F32[n-1] = float32(math.NaN())
	bad["f32-inf-first"].F32[0] = float32(math.Inf(-1))
	bad["bf16-inf"].BF16[AdamChunkLen+1] = 0x7f80
	bad["f16-nan"].F16[2*AdamChunkLen] = 0x7e00
	for name, g := range bad {
		t.Run(name, func(t *testing.T) {
			var ts []AdamTensor
			for k := 0; k < 3; k++ {
				grad := AdamGrad{F32: append([]float32(nil), halves...)}
				if k == 1 {
					grad = g
				}
				ts = append(ts, AdamTensor{Name: fmt.Sprint(k), W: append([]float32(nil), ones...), Grad: grad,
					State: NewAdamState(n), BF16Out: make([]uint16, n), Params: AdamDefaults()})
			}
			res, err := pool.AdamStep(ts)
			if err != nil {
				t.Fatal(err)
			}
			if res.Skipped != 1 || !res.Tensors[1].Skipped || res.Tensors[0].Skipped || res.Tensors[2].Skipped {
				t.Fatalf("result %+v, want only tensor 1 skipped", res)
			}
			for k, tensor := range ts {
				same := bytes.Equal(adamTestBytes(tensor.W), adamTestBytes(ones)) &&
					bytes.Equal(adamTestBytes(tensor.State.M), adamTestBytes(zeros)) &&
					bytes.Equal(adamTestBytes(tensor.State.V), adamTestBytes(zeros)) &&
					bytes.Equal(adamTestBytes(tensor.BF16Out), adamTestBytes(make([]uint16, n)))
				if k == 1 && (!same || tensor.State.Step != 0) {
					t.Errorf("skipped tensor was written (step %d)", tensor.State.Step)
				}
				if k != 1 && (same || tensor.State.Step != 1 || tensor.W[n-1] == 1 || tensor.BF16Out[n-1] == 0) {
					t.Errorf("tensor %d did not step", k)
				}
			}
		})
	}
	// A norm supplied by the caller replaces the scan: NaN skips a finite
	// gradient, a finite norm steps it, and the scan's bytes are not counted.
	for _, c := range []struct {
		norm float64
		skip bool
	}{{math.NaN(), true}, {math.Inf(1), true}, {2, false}} {
		tensor := AdamTensor{W: make([]float32, 100), Grad: AdamGrad{F32: make([]float32, 100)}, State: NewAdamState(100),
			Params: AdamDefaults(), NormKnown: true, Norm: c.norm}
		res, err := pool.AdamStep([]AdamTensor{tensor})
		if err != nil {
			t.Fatal(err)
		}
		if res.Tensors[0].Skipped != c.skip || res.Tensors[0].Norm != c.norm && !c.skip {
			t.Errorf("norm %v: result %+v", c.norm, res)
		}
		if wantBytes := int64(100 * AdamBytesPerElement(4, false, false, false)); !c.skip && res.Bytes != wantBytes {
			t.Errorf("norm %v: Bytes = %d, want %d", c.norm, res.Bytes, wantBytes)
		}
	}
}

// TestAdamErrors: bad arguments are errors naming the tensor, and nothing is
// written (validation runs before any work).
func TestAdamErrors(t *testing.T) {
	good := func() AdamTensor {
		return AdamTensor{Name: "layer0.w", W: make([]float32, 10), Grad: AdamGrad{F32: make([]float32, 10)},
			State: NewAdamState(10), Params: AdamDefaults()}
	}
	cases := []struct {
		name string
		edit func(*AdamTensor)
		want string
	}{
		{"short W", func(a *AdamTensor) { a.W = a.W[:9] }, "len(W) = 9"},
		{"short M", func(a *AdamTensor) { a.State.M = a.State.M[:3] }, "len(M) = 3"},
		{"short V", func(a *AdamTensor) { a.State.V = nil }, "len(V) = 0"},
		{"long BF16Out", func(a *AdamTensor) { a.BF16Out = make([]uint16, 11) }, "len(BF16Out) = 11"},
		{"no grad", func(a *AdamTensor) { a.Grad = AdamGrad{} }, "0 of F32"},
		{"two grads", func(a *AdamTensor) { a.Grad.BF16 = make([]uint16, 10) }, "2 of F32"},
		{"nil state", func(a *AdamTensor) { a.State = nil }, "State is nil"},
		{"W and Delta", func(a *AdamTensor) { a.Delta = make([]float32, 10) }, "both W and Delta"},
		{"neither", func(a *AdamTensor) { a.W = nil }, "neither W nor Delta"},
		{"short Delta", func(a *AdamTensor) { a.W, a.Delta = nil, make([]float32, 4) }, "len(Delta) = 4"},
		{"bf16 on delta", func(a *AdamTensor) { a.W, a.Delta, a.BF16Out = nil, make([]float32, 10), make([]uint16, 10) }, "BF16Out is set on a subspace"},
		{"beta1 = 1", func(a *AdamTensor) { a.Params.Beta1 = 1 }, "Beta1"},
		{"beta2 < 0", func(a *AdamTensor) { a.Params.Beta2 = -0.1 }, "Beta2"},
		{"negative lr", func(a *AdamTensor) { a.Params.LR = -1 }, "LR"},
		{"NaN eps", func(a *AdamTensor) { a.Params.Eps = math.NaN() }, "Eps"},
		{"negative wd", func(a *AdamTensor) { a.Params.WeightDecay = -1 }, "WeightDecay"},
		{"Inf clip", func(a *AdamTensor) { a.Params.ClipNorm = math.Inf(1) }, "ClipNorm"},
	}
	pool := adamTestWorkers(t, 2)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ok := good()
			for i := range ok.Grad.F32 {
				ok.Grad.F32[i] = 1
			}
			bad := good()
			c.edit(&bad)
			_, err := pool.AdamStep([]AdamTensor{ok, bad})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `tensor 1 "layer0.w"`) {
				t.Fatalf("error %v, want one naming tensor 1 and containing %q", err, c.want)
			}
			if ok.W[0] != 0 || ok.State.Step != 0 {
				t.Errorf("a valid tensor was updated in a batch that failed validation")
			}
		})
	}
}

// TestAdamSubspace: the subspace form writes -lr*mhat/(sqrt(vhat)+eps), the
// same value the weight form subtracts from w = 0 without decay; in place
// over S, and with its own step count.
func TestAdamSubspace(t *testing.T) {
	const d = 300
	r := rand.New(rand.NewPCG(5, 6))
	p := AdamDefaults()
	p.WeightDecay = 0.5 // must be ignored by the subspace form
	noWD := p
	noWD.WeightDecay = 0
	sub, ref := NewAdamState(d*d), NewAdamState(d*d)
	for step := 1; step <= 3; step++ {
		s := make([]float32, d*d)
		for i := range s {
			s[i] = float32(r.NormFloat64())
		}
		w := make([]float32, d*d)
		g := append([]float32(nil), s...)
		res, err := (*Workers)(nil).AdamStep([]AdamTensor{
			AdamSubspace("S", s, sub, p),
			{Name: "ref", W: w, Grad: AdamGrad{F32: g}, State: ref, Params: noWD},
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Skipped != 0 || sub.Step != int64(step) {
			t.Fatalf("step %d: result %+v, subspace step %d", step, res, sub.Step)
		}
		for i := range s {
			if s[i] != w[i] { // -0 == +0 here, as it should
				t.Fatalf("step %d: Delta[%d] = %v, weight form %v", step, i, s[i], w[i])
			}
		}
		if step == 1 && math.Abs(float64(s[0])+p.LR*math.Copysign(1, float64(g[0]))) > 1e-6 {
			t.Errorf("step 1: Delta[0] = %v, want -lr*sign(S[0]) = %v", s[0], -p.LR*math.Copysign(1, float64(g[0])))
		}
	}
}

// TestAdamNormAndClip: the reported norm is the L2 norm of the gradient,
// and ClipNorm scales the gradient by ClipNorm/(norm+1e-6) exactly as
// pre-scaling it would.
func TestAdamNormAndClip(t *testing.T) {
	const n = 200003
	r := rand.New(rand.NewPCG(7, 8))
	g := make([]float32, n)
	var ss float64
	for i := range g {
		g[i] = float32(r.NormFloat64())
		ss += float64(g[i]) * float64(g[i])
	}
	pool := adamTestWorkers(t, 2)
	p := AdamDefaults()
	p.ClipNorm = math.Sqrt(ss) / 4
	clipped := adamTestCase{w: make([]float32, n), m: make([]float32, n), v: make([]float32, n), g: AdamGrad{F32: g}, p: p}
	got := clipped.run(t, pool, nil, ActiveSIMD(), "w")
	norm := got.res.Tensors[0].Norm
	if math.Abs(norm-math.Sqrt(ss)) > 1e-12*norm {
		t.Fatalf("norm %v, want %v", norm, math.Sqrt(ss))
	}
	scale := float32(math.Min(1, p.ClipNorm/(norm+1e-6)))
	pre := make([]float32, n)
	for i := range g {
		pre[i] = g[i] * scale
	}
	p.ClipNorm = 0
	manual := adamTestCase{w: make([]float32, n), m: make([]float32, n), v: make([]float32, n), g: AdamGrad{F32: pre}, p: p}
	want := manual.run(t, pool, nil, ActiveSIMD(), "w")
	adamTestSame(t, "clipped m", got.m, want.m)
	adamTestSame(t, "clipped w", got.w, want.w)
}

// TestAdamThreadInvariance: the same bits (weights and norm) from the
// calling goroutine and from pools of 1, 2 and 3 workers.
func TestAdamThreadInvariance(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	c := adamTestMake(r, nil, 5*AdamChunkLen+77, "wd", "bf16", 10)
	ref := c.run(t, nil, nil, ActiveSIMD(), "w+bf16")
	for _, k := range []int{1, 2, 3} {
		got := c.run(t, adamTestWorkers(t, k), nil, ActiveSIMD(), "w+bf16")
		name := fmt.Sprintf("%d workers", k)
		adamTestSame(t, name+"/w", got.w, ref.w)
		adamTestSame(t, name+"/bf16", got.out16, ref.out16)
		if got.res.Tensors[0].Norm != ref.res.Tensors[0].Norm {
			t.Errorf("%s: norm %v, serial %v", name, got.res.Tensors[0].Norm, ref.res.Tensors[0].Norm)
		}
	}
}

// TestAdamPlan: the grabs of a step cover every element of every listed
// tensor once, in order, in runs of whole chunks that never cross a tensor's
// end; their count stays logarithmic in the chunk count, and the last grab
// is one chunk (the workers finish together).
func TestAdamPlan(t *testing.T) {
	for _, tc := range []struct {
		name string
		lens []int
	}{
		{"one chunk", []int{5}},
		{"exact chunks", []int{4 * AdamChunkLen}},
		{"128M", []int{128 << 20}},
		{"mixed", []int{1, AdamChunkLen - 1, AdamChunkLen, 3*AdamChunkLen + 5, 37*AdamChunkLen + 1}},
		{"many small", []int{100, 200, 300, 400, 500, 600, 700}},
	} {
		jobs := make([]adamJob, len(tc.lens)+1)
		jobs[len(tc.lens)].n = 99 * AdamChunkLen // not listed: must get no grab
		var sel []int
		chunks := 0
		for j, n := range tc.lens {
			jobs[j].n = n
			sel = append(sel, j)
			chunks += (n + AdamChunkLen - 1) / AdamChunkLen
		}
		for _, workers := range []int{1, 2, 3, 16} {
			name := fmt.Sprintf("%s/%d workers", tc.name, workers)
			grabs, total := adamPlan(jobs, sel, workers)
			if total != chunks {
				t.Errorf("%s: %d chunks, want %d", name, total, chunks)
			}
			k, lo, c0 := 0, 0, 0
			for _, gr := range grabs {
				for k < len(sel) && lo == jobs[sel[k]].n {
					k, lo = k+1, 0
				}
				if k == len(sel) || gr.job != sel[k] || gr.lo != lo || gr.chunk0 != c0 || gr.hi <= gr.lo || gr.hi > jobs[gr.job].n ||
					(gr.hi != jobs[gr.job].n && (gr.hi-gr.lo)%AdamChunkLen != 0) {
					t.Fatalf("%s: grab %+v, want job %d from %d, chunk %d, whole chunks inside the tensor", name, gr, sel[min(k, len(sel)-1)], lo, c0)
				}
				c0 += (gr.hi - gr.lo + AdamChunkLen - 1) / AdamChunkLen
				lo = gr.hi
			}
			if k != len(sel)-1 || lo != jobs[sel[k]].n || c0 != chunks {
				t.Errorf("%s: grabs end at job %d element %d chunk %d, want the end of job %d (%d chunks)", name, k, lo, c0, len(sel)-1, chunks)
			}
			if limit := len(sel) + adamGuided*workers*(int(math.Log(float64(chunks)))+2); len(grabs) > limit {
				t.Errorf("%s: %d grabs, want at most %d", name, len(grabs), limit)
			}
			if last := grabs[len(grabs)-1]; last.hi-last.lo > AdamChunkLen {
				t.Errorf("%s: last grab %+v is longer than a chunk", name, last)
			}
		}
	}
}

// TestAdamFar: the far prefetches are chosen exactly when the step's arrays
// (gradient, m, v, w or Delta, bf16 copy) outgrow the last-level cache.
func TestAdamFar(t *testing.T) {
	llc := TriadLLCBytes()
	if llc <= 0 {
		t.Skip("last-level cache size unknown: always far")
	}
	withCopy := &AdamTensor{BF16Out: []uint16{}}
	for _, tc := range []struct {
		name string
		jobs []adamJob
		want bool
	}{
		{"small", []adamJob{{t: &AdamTensor{}, n: 1000, gsize: 4}}, false},
		{"exactly the cache", []adamJob{{t: &AdamTensor{}, n: int(llc / 16), gsize: 4}}, false},
		{"one over", []adamJob{{t: &AdamTensor{}, n: int(llc/16) + 1, gsize: 4}}, true},
		{"bf16 copy counted", []adamJob{{t: withCopy, n: int(llc / 16), gsize: 4}}, true},
		{"summed over tensors", []adamJob{{t: &AdamTensor{}, n: int(llc/28) + 1, gsize: 2}, {t: &AdamTensor{}, n: int(llc/28) + 1, gsize: 2}}, true},
		{"half each", []adamJob{{t: &AdamTensor{}, n: int(llc / 28), gsize: 2}, {t: &AdamTensor{}, n: int(llc / 28), gsize: 2}}, false},
	} {
		if got := adamFar(tc.jobs); got != tc.want {
			t.Errorf("%s: far = %v, want %v (LLC %d bytes)", tc.name, got, tc.want, llc)
		}
	}
}

// TestAdamNormCanonical: the pre-scanned norm of tensors spanning many
// chunks equals, bit for bit, the documented order computed here in Go
// (per chunk: 16 lanes by index mod 16, a pairwise tree; chunks added in
// order), for every pool size, on the scalar and the active path, at every
// software prefetch level.
func TestAdamNormCanonical(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	lens := []int{3, AdamChunkLen + 1, 9*AdamChunkLen + 17}
	var grads [][]float32
	var want []float64
	for _, n := range lens {
		g := make([]float32, n)
		for i := range g {
			g[i] = float32(r.NormFloat64() * math.Ldexp(1, r.IntN(40)-20))
		}
		grads = append(grads, g)
		total := 0.0
		for lo := 0; lo < n; lo += AdamChunkLen {
			var acc [16]float64
			for i := lo; i < min(lo+AdamChunkLen, n); i++ {
				acc[(i-lo)&15] += float64(g[i]) * float64(g[i])
			}
			for s := 8; s >= 1; s >>= 1 {
				for j := 0; j < s; j++ {
					acc[j] += acc[j+s]
				}
			}
			total += acc[0]
		}
		want = append(want, math.Sqrt(total))
	}
	pools := map[string]*Workers{"serial": nil}
	for _, k := range []int{1, 2, 3} {
		pools[fmt.Sprintf("%d workers", k)] = adamTestWorkers(t, k)
	}
	for name, pool := range pools {
		for _, sp := range []adamTestSIMDRun{{Scalar, adamPrefetchNear}, {ActiveSIMD(), adamPrefetchNone}, {ActiveSIMD(), adamPrefetchNear}, {ActiveSIMD(), adamPrefetchFar}} {
			ts := make([]AdamTensor, len(lens))
			for j, n := range lens {
				ts[j] = AdamTensor{Name: fmt.Sprint(j), W: make([]float32, n), Grad: AdamGrad{F32: grads[j]},
					State: NewAdamState(n), Params: AdamDefaults()}
			}
			res, err := pool.adamStepPrefetch(ts, sp.path, sp.prefetch)
			if err != nil {
				t.Fatal(err)
			}
			for j := range lens {
				if got := res.Tensors[j].Norm; math.Float64bits(got) != math.Float64bits(want[j]) {
					t.Errorf("%s/%v/pf=%d: tensor %d norm %v, want %v", name, sp.path, sp.prefetch, j, got, want[j])
				}
			}
		}
	}
}

// TestAdamSubmit: steps submitted together on disjoint tensors complete
// with the results of the same steps run one by one; the completion's Done
// channel closes.
func TestAdamSubmit(t *testing.T) {
	pool := adamTestWorkers(t, 2)
	r := rand.New(rand.NewPCG(11, 12))
	var cases []adamTestCase
	for range 6 {
		cases = append(cases, adamTestMake(r, nil, 3*AdamChunkLen/2, "wd", "f32", 1))
	}
	var comps []*AdamCompletion
	var states []*AdamState
	var ws [][]float32
	for _, c := range cases {
		st := &AdamState{M: append([]float32(nil), c.m...), V: append([]float32(nil), c.v...), Step: c.step}
		w := append([]float32(nil), c.w...)
		g := append([]float32(nil), c.g.F32...)
		comps = append(comps, pool.AdamSubmit([]AdamTensor{{W: w, Grad: AdamGrad{F32: g}, State: st, Params: c.p}}))
		states, ws = append(states, st), append(ws, w)
	}
	for i, comp := range comps {
		<-comp.Done()
		res, err := comp.Wait()
		if err != nil || len(res.Tensors) != 1 || res.Skipped != 0 {
			t.Fatalf("submission %d: %+v, %v", i, res, err)
		}
		want := cases[i].run(t, nil, nil, ActiveSIMD(), "w")
		adamTestSame(t, fmt.Sprintf("submission %d w", i), ws[i], want.w)
		adamTestSame(t, fmt.Sprintf("submission %d v", i), states[i].V, want.v)
	}
	// An invalid step reports its error through the completion.
	comp := pool.AdamSubmit([]AdamTensor{{W: make([]float32, 3), Grad: AdamGrad{F32: make([]float32, 4)}, State: NewAdamState(4), Params: AdamDefaults()}})
	if _, err := comp.Wait(); err == nil {
		t.Error("mismatched lengths: submission succeeded")
	}
}

// BenchmarkAdamStep: one 16M-parameter tensor (fp32 gradient, bf16 copy,
// pre-scan) on off-heap buffers and all cores; reports GB/s as bench/adam
// counts it.
func BenchmarkAdamStep(b *testing.B) {
	const n = 16 << 20
	pool := adamTestWorkers(b, 0)
	a := newAdamTestArena(b, 22*n)
	t := AdamTensor{W: a.f32(n), Grad: AdamGrad{F32: a.f32(n)}, State: &AdamState{M: a.f32(n), V: a.f32(n)},
		BF16Out: a.u16(n), Params: AdamDefaults()}
	var bytes int64
	b.ResetTimer()
	for b.Loop() {
		res, err := pool.AdamStep([]AdamTensor{t})
		if err != nil {
			b.Fatal(err)
		}
		bytes = res.Bytes
	}
	b.ReportMetric(float64(bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}
