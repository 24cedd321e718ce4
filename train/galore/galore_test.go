package galore

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// The fixture's hyperparameters (scripts/fixtures/galore_torch.py);
// TestFixtureMeta checks them against reference.json.
var (
	fixCfg  = Config{Rank: 4, Every: 3, Scale: 0.25}
	fixAdam = AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-6, WeightDecay: 0.5}
)

const fixSteps = 5

// The bound: max abs difference over max abs value.
const relTol = 1e-5

// The bound on a step's change of the weights, which is about 20 times
// smaller than the weights: torch's float32 arithmetic (its float32 SVD
// included) leaves up to about 2e-5 of it. Dropping the bias correction,
// moving the weight decay or resetting the moments changes it by 5e-3 or
// more.
const changeTol = 1e-4

type fixMeta struct {
	Versions map[string]string `json:"versions"`
	Matrices map[string]struct {
		Shape []int  `json:"torch_shape_out_in"`
		Side  string `json:"side"`
	} `json:"matrices"`
	Galore struct {
		Rank     int     `json:"rank"`
		Gap      int     `json:"update_proj_gap"`
		Scale    float64 `json:"scale"`
		ProjType string  `json:"proj_type"`
	} `json:"galore"`
	Adam struct {
		LR          float64   `json:"lr"`
		Betas       []float64 `json:"betas"`
		Eps         float64   `json:"eps"`
		WeightDecay float64   `json:"weight_decay"`
		CorrectBias bool      `json:"correct_bias"`
	} `json:"adamw"`
	Steps    int   `json:"steps"`
	Refresh  []int `json:"refresh_steps"`
	fix      *safetensors.File
	matNames []string
}

func loadFixture(t *testing.T) *fixMeta {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m fixMeta
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m.fix, err = safetensors.Open(filepath.Join("testdata", "reference.safetensors")); err != nil {
		t.Fatal(err)
	}
	m.matNames = []string{"wide", "tall", "square"}
	return &m
}

// tensor reads a float32 tensor as float64, checking its torch shape.
func (m *fixMeta) tensor(t *testing.T, name string, rows, cols int) []float64 {
	t.Helper()
	v, shape, err := m.fix.Float32(name)
	if err != nil {
		t.Fatal(err)
	}
	if len(shape) != 2 || shape[0] != rows || shape[1] != cols {
		t.Fatalf("%s: shape %v, want [%d %d]", name, shape, rows, cols)
	}
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func (m *fixMeta) has(name string) bool {
	_, ok := m.fix.Info(name)
	return ok
}

// ours reads a torch [out, in] matrix tensor into our in x out layout.
func (m *fixMeta) ours(t *testing.T, name string, in, out int) []float64 {
	return transpose(m.tensor(t, name, out, in), out, in)
}

// torchProjector reads galore-torch's ortho_matrix at a refresh in our
// layout: "right" keeps Vh[:r] ([r, in]), our P (in x r) transposed;
// "left" keeps U[:, :r] ([out, r]), already our Q (out x r).
func (m *fixMeta) torchProjector(t *testing.T, name string, s *State) []float64 {
	if s.Side == ProjectIn {
		return transpose(m.tensor(t, name, s.R, s.In), s.R, s.In)
	}
	return m.tensor(t, name, s.Out, s.R)
}

// torchMoment reads a projected moment in our layout: galore-torch's R is
// the transpose of ours on both sides.
func (m *fixMeta) torchMoment(t *testing.T, name string, s *State) []float64 {
	pr, pc := s.projShape()
	return transpose(m.tensor(t, name, pc, pr), pc, pr)
}

func maxRel(got, want []float64) float64 {
	var d, w float64
	for i := range want {
		d = max(d, math.Abs(got[i]-want[i]))
		w = max(w, math.Abs(want[i]))
	}
	return d / w
}

func sub(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] - b[i]
	}
	return out
}

func TestFixtureMeta(t *testing.T) {
	m := loadFixture(t)
	g, a := m.Galore, m.Adam
	if g.Rank != fixCfg.Rank || g.Gap != fixCfg.Every || g.Scale != fixCfg.Scale || g.ProjType != "std" {
		t.Errorf("fixture galore %+v, tests assume %+v and proj_type std", g, fixCfg)
	}
	if a.LR != fixAdam.LR || len(a.Betas) != 2 || a.Betas[0] != fixAdam.Beta1 || a.Betas[1] != fixAdam.Beta2 ||
		a.Eps != fixAdam.Eps || a.WeightDecay != fixAdam.WeightDecay || !a.CorrectBias {
		t.Errorf("fixture adamw %+v, tests assume %+v with bias correction", a, fixAdam)
	}
	if m.Steps != fixSteps || fmt.Sprint(m.Refresh) != "[1 4]" {
		t.Errorf("fixture: %d steps refreshing at %v, want 5 refreshing at [1 4]", m.Steps, m.Refresh)
	}
	if m.Versions["galore_torch"] != "1.0" {
		t.Errorf("fixture made with galore-torch %q, this reference follows 1.0", m.Versions["galore_torch"])
	}
	if len(m.Matrices) != len(m.matNames) {
		t.Errorf("fixture has %d matrices, tests read %v", len(m.Matrices), m.matNames)
	}
}

// The side chosen for our in x out matrix is the one galore-torch chose
// for the nn.Linear weight [out, in] in the fixture.
func TestFixtureSides(t *testing.T) {
	m := loadFixture(t)
	for _, name := range m.matNames {
		mat := m.Matrices[name]
		out, in := mat.Shape[0], mat.Shape[1]
		want := map[string]Side{"right": ProjectIn, "left": ProjectOut}[mat.Side]
		if got := SideOf(in, out); got != want {
			t.Errorf("%s (torch [%d %d], galore-torch %q): SideOf(in %d, out %d) = %v, want %v",
				name, out, in, mat.Side, in, out, got, want)
		}
	}
}

// torchSide is galore-torch 1.0's "std" rule, written on its own layout:
// the gradient [rows, cols] of an nn.Linear weight [out, in].
func torchSide(rows, cols int) string {
	if rows >= cols {
		return "right"
	}
	return "left"
}

func TestSideRule(t *testing.T) {
	for _, c := range []struct {
		in, out int
		want    Side
	}{
		{20, 12, ProjectOut}, // wide torch weight [12, 20]: out < in
		{10, 24, ProjectIn},  // tall torch weight [24, 10]
		{16, 16, ProjectIn},  // square goes right in torch, the in side here
		{1, 1, ProjectIn},
	} {
		if got := SideOf(c.in, c.out); got != c.want {
			t.Errorf("SideOf(%d, %d) = %v, want %v", c.in, c.out, got, c.want)
		}
	}
	// Every small shape: ours is torch's rule on the transpose, and the
	// projected dimension is the smaller one.
	for in := 1; in <= 9; in++ {
		for out := 1; out <= 9; out++ {
			s := SideOf(in, out)
			want := map[string]Side{"right": ProjectIn, "left": ProjectOut}[torchSide(out, in)]
			if s != want {
				t.Errorf("SideOf(%d, %d) = %v, galore-torch's rule on [%d %d] gives %v", in, out, s, out, in, want)
			}
			projected := map[Side]int{ProjectIn: in, ProjectOut: out}[s]
			if projected != min(in, out) {
				t.Errorf("SideOf(%d, %d) = %v projects %d, not the smaller side", in, out, s, projected)
			}
		}
	}
}

func TestRankOf(t *testing.T) {
	c := Config{Rank: 8, Every: 1, Scale: 1}
	for _, x := range [][3]int{{4, 6, 4}, {6, 4, 4}, {20, 30, 8}, {8, 8, 8}} {
		if got := c.RankOf(x[0], x[1]); got != x[2] {
			t.Errorf("rank 8 on %d x %d: %d, want %d", x[0], x[1], got, x[2])
		}
	}
}

func TestRefused(t *testing.T) {
	good := Config{Rank: 2, Every: 3, Scale: 0.25}
	for _, c := range []Config{
		{Rank: 0, Every: 3, Scale: 0.25},
		{Rank: 2, Every: 0, Scale: 0.25},
		{Rank: 2, Every: 3, Scale: 0},
		{Rank: 2, Every: 3, Scale: math.NaN()},
		{Rank: 2, Every: 3, Scale: math.Inf(1)},
	} {
		if _, err := NewState(c, 4, 5); err == nil {
			t.Errorf("NewState(%+v) took it", c)
		}
	}
	for _, sh := range [][2]int{{0, 5}, {5, 0}, {-1, 3}} {
		if _, err := NewState(good, sh[0], sh[1]); err == nil {
			t.Errorf("NewState on %d x %d took it", sh[0], sh[1])
		}
	}
	for _, a := range []AdamW{
		{LR: -1, Beta1: 0.9, Beta2: 0.999},
		{LR: 1e-3, Beta1: 1, Beta2: 0.999},
		{LR: 1e-3, Beta1: 0.9, Beta2: -0.1},
		{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: -1},
		{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, WeightDecay: -0.1},
		{LR: math.NaN(), Beta1: 0.9, Beta2: 0.999},
	} {
		if a.Validate() == nil {
			t.Errorf("AdamW %+v validated", a)
		}
	}
	s, err := NewState(good, 4, 5)
	if err != nil {
		t.Fatal(err)
	}
	w, g := make([]float64, 20), make([]float64, 20)
	adam := AdamW{LR: 1e-3, Beta1: 0.9, Beta2: 0.999, Eps: 1e-6}
	if err := Update(good, adam, s, w, g); err == nil {
		t.Error("Update without a projector ran")
	}
	if err := s.SetProjector(make([]float64, 5*2)); err == nil { // in x r is 4 x 2
		t.Error("SetProjector took a 5 x 2 projector for a 4 x 2 one")
	}
	if err := s.Refresh(g[:19]); err == nil {
		t.Error("Refresh took a short gradient")
	}
	if err := Step(good, adam, s, w[:19], g); err == nil {
		t.Error("Step took a short weight")
	}
	if err := Step(good, adam, s, w, g[:19]); err == nil {
		t.Error("Step took a short gradient")
	}
	if err := Step(good, adam, s, w, g); err != nil {
		t.Errorf("Step on good shapes: %v", err)
	}
}

// The Go reference, driven by galore-torch's own projectors at the refresh
// steps (so that singular vector signs are torch's), retraces the
// fixture's weights and moments over the 5 steps, refresh included.
func TestFixtureTorchProjectors(t *testing.T) {
	m := loadFixture(t)
	var worst float64
	for _, name := range m.matNames {
		out, in := m.Matrices[name].Shape[0], m.Matrices[name].Shape[1]
		fixtureRun(t, m, name, in, out, func(step int, s *State, _ []float64) {
			pname := fmt.Sprintf("%s.proj.%d", name, step)
			if due := s.RefreshDue(fixCfg); due != m.has(pname) {
				t.Fatalf("%s step %d: RefreshDue %v, galore-torch refreshed: %v", name, step, due, m.has(pname))
			}
			if s.RefreshDue(fixCfg) {
				if err := s.SetProjector(m.torchProjector(t, pname, s)); err != nil {
					t.Fatal(err)
				}
			}
		}, func(step int, s *State, w, prev []float64) {
			worst = max(worst, checkStep(t, m, name, step, s, prev, w))
		})
	}
	t.Logf("max relative difference of the weights over 5 steps: %.3g", worst)
}

// checkStep compares the weights, the change of the weights and the
// moments after a step with the fixture's, returning the weights' max
// relative difference.
func checkStep(t *testing.T, m *fixMeta, name string, step int, s *State, prev, w []float64) float64 {
	t.Helper()
	want := m.ours(t, fmt.Sprintf("%s.w.%d", name, step), s.In, s.Out)
	var wantPrev []float64
	if step > 1 {
		wantPrev = m.ours(t, fmt.Sprintf("%s.w.%d", name, step-1), s.In, s.Out)
	} else {
		wantPrev = m.ours(t, name+".w0", s.In, s.Out)
	}
	rw := maxRel(w, want)
	// The weights are about 20 times the step's change, so the change is
	// checked on its own too, against the change torch made from its own
	// previous weights.
	rd := maxRel(sub(w, prev), sub(want, wantPrev))
	rm := maxRel(s.M, m.torchMoment(t, fmt.Sprintf("%s.exp_avg.%d", name, step), s))
	rv := maxRel(s.V, m.torchMoment(t, fmt.Sprintf("%s.exp_avg_sq.%d", name, step), s))
	t.Logf("%s step %d: weights %.2g, change %.2g, exp_avg %.2g, exp_avg_sq %.2g", name, step, rw, rd, rm, rv)
	for _, c := range []struct {
		what   string
		r, tol float64
	}{{"weights", rw, relTol}, {"change of the weights", rd, changeTol}, {"exp_avg", rm, relTol}, {"exp_avg_sq", rv, relTol}} {
		if !(c.r <= c.tol) {
			t.Errorf("%s step %d: %s differ from galore-torch's by %.3g relative (max abs diff / max abs), want <= %g",
				name, step, c.what, c.r, c.tol)
		}
	}
	return rw
}

// The Go SVD's projector spans torch's subspace at every refresh; with its
// columns' signs aligned to torch's, the full Step with our own SVD
// retraces the fixture too.
func TestFixtureOwnSVD(t *testing.T) {
	m := loadFixture(t)
	for _, name := range m.matNames {
		out, in := m.Matrices[name].Shape[0], m.Matrices[name].Shape[1]
		ownSVDRun(t, m, name, in, out, func(step int, s *State, w, prev []float64) {
			checkStep(t, m, name, step, s, prev, w)
		}, true)
	}
}

// With our own signs, the weights still retrace the fixture up to the
// second refresh (steps 1 to 3), and not after it unless every sign
// happens to agree (Refresh's comment).
func TestFixtureOwnSigns(t *testing.T) {
	m := loadFixture(t)
	for _, name := range m.matNames {
		out, in := m.Matrices[name].Shape[0], m.Matrices[name].Shape[1]
		ownSVDRun(t, m, name, in, out, func(step int, s *State, w, prev []float64) {
			r := maxRel(w, m.ours(t, fmt.Sprintf("%s.w.%d", name, step), in, out))
			t.Logf("%s step %d (our signs): weights %.2g", name, step, r)
			if step < 4 && !(r <= relTol) {
				t.Errorf("%s step %d, before the second refresh, with our own signs: weights differ by %.3g", name, step, r)
			}
		}, false)
	}
}

// ownSVDRun runs the fixture's 5 steps with Step's own refresh (checking
// its span against torch's projector), aligning each refresh's signs to
// torch's when align is set, and calls check after every step.
func ownSVDRun(t *testing.T, m *fixMeta, name string, in, out int, check func(step int, s *State, w, prev []float64), align bool) {
	t.Helper()
	fixtureRun(t, m, name, in, out, func(step int, s *State, g []float64) {
		if !s.RefreshDue(fixCfg) {
			return
		}
		if err := s.Refresh(g); err != nil {
			t.Fatal(err)
		}
		tp := m.torchProjector(t, fmt.Sprintf("%s.proj.%d", name, step), s)
		rows := len(tp) / s.R
		if d := subspaceDiff(s.P, tp, rows, s.R); d > 1e-5 {
			t.Errorf("%s step %d: our projector's span differs from torch's by %.3g (max |P P^T - Pt Pt^T|)", name, step, d)
		}
		checkOrthonormal(t, fmt.Sprintf("%s step %d", name, step), s.P, rows, s.R)
		if align {
			alignSigns(s.P, tp, rows, s.R)
		}
	}, check)
}

// fixtureRun runs the fixture's 5 steps of matrix name (in x out) from its
// w0 and gradients: before each step's Update, refresh sets the projector
// where one is due (g is the step's gradient), and after it check sees the
// state and the weights before and after.
func fixtureRun(t *testing.T, m *fixMeta, name string, in, out int, refresh func(step int, s *State, g []float64), check func(step int, s *State, w, prev []float64)) {
	t.Helper()
	s, err := NewState(fixCfg, in, out)
	if err != nil {
		t.Fatal(err)
	}
	w := m.ours(t, name+".w0", in, out)
	for step := 1; step <= fixSteps; step++ {
		g := m.ours(t, fmt.Sprintf("%s.grad.%d", name, step), in, out)
		refresh(step, s, g)
		prev := append([]float64(nil), w...)
		if err := Update(fixCfg, fixAdam, s, w, g); err != nil {
			t.Fatal(err)
		}
		check(step, s, w, prev)
	}
}

// subspaceDiff is max |P P^T - Q Q^T| for two rows x k matrices with
// orthonormal columns: zero exactly when they span the same subspace,
// whatever their signs or order within it.
func subspaceDiff(p, q []float64, rows, k int) float64 {
	var d float64
	for i := range rows {
		for j := range rows {
			var a, b float64
			for c := range k {
				a += p[i*k+c] * p[j*k+c]
				b += q[i*k+c] * q[j*k+c]
			}
			d = max(d, math.Abs(a-b))
		}
	}
	return d
}

func checkOrthonormal(t *testing.T, what string, p []float64, rows, k int) {
	t.Helper()
	for a := range k {
		for b := range k {
			var s float64
			for i := range rows {
				s += p[i*k+a] * p[i*k+b]
			}
			want := 0.0
			if a == b {
				want = 1
			}
			if math.Abs(s-want) > 1e-12 {
				t.Errorf("%s: projector columns %d, %d have dot %.3g, want %g", what, a, b, s, want)
			}
		}
	}
}

// alignSigns flips each column of p whose dot with the same column of q is
// negative.
func alignSigns(p, q []float64, rows, k int) {
	for c := range k {
		var d float64
		for i := range rows {
			d += p[i*k+c] * q[i*k+c]
		}
		if d < 0 {
			for i := range rows {
				p[i*k+c] = -p[i*k+c]
			}
		}
	}
}

// The sign argument of Refresh's comment: flipping a projector column at
// the first refresh changes no step before the second refresh and every
// step from it; at a later refresh, with moments kept from the previous
// basis, it changes that step and those after it.
func TestSignFlip(t *testing.T) {
	cfg := Config{Rank: 2, Every: 2, Scale: 0.25} // refreshes at steps 1, 3, 5
	adam := AdamW{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-6, WeightDecay: 0.1}
	for _, sh := range [][2]int{{6, 9}, {9, 6}} {
		in, out := sh[0], sh[1]
		rng := rand.New(rand.NewPCG(1, uint64(in)))
		w0 := randn(rng, in*out)
		var grads [][]float64
		for range 5 {
			grads = append(grads, randn(rng, in*out))
		}
		// run returns the weights after every step, flipping the first
		// projector column at step flipAt's refresh.
		run := func(flipAt int) [][]float64 {
			s, _ := NewState(cfg, in, out)
			w := append([]float64(nil), w0...)
			var ws [][]float64
			for i, g := range grads {
				if s.RefreshDue(cfg) {
					if err := s.Refresh(g); err != nil {
						t.Fatal(err)
					}
					if i+1 == flipAt {
						for r := range len(s.P) / s.R {
							s.P[r*s.R] = -s.P[r*s.R]
						}
					}
				}
				if err := Update(cfg, adam, s, w, g); err != nil {
					t.Fatal(err)
				}
				ws = append(ws, append([]float64(nil), w...))
			}
			return ws
		}
		base := run(0)
		for _, flipAt := range []int{1, 3, 5} {
			ws := run(flipAt)
			for step := 1; step <= 5; step++ {
				d := maxRel(ws[step-1], base[step-1])
				from := flipAt // the first step the flip changes
				if flipAt == 1 {
					from = 1 + cfg.Every
				}
				if step < from && d > 1e-14 {
					t.Errorf("%d x %d, flip at step %d: step %d changed by %.3g, want unchanged", in, out, flipAt, step, d)
				}
				if step >= from && d < 1e-6 {
					t.Errorf("%d x %d, flip at step %d: step %d changed by only %.3g", in, out, flipAt, step, d)
				}
			}
		}
	}
}

func randn(rng *rand.Rand, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = rng.NormFloat64()
	}
	return out
}

// svdTop's vectors are orthonormal, ordered by singular value, and satisfy
// A^T A v = s^2 v; a rank-deficient matrix still gets orthonormal ones.
func TestSVDTop(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, sh := range [][2]int{{7, 5}, {5, 7}, {6, 6}, {1, 4}, {4, 1}} {
		rows, cols := sh[0], sh[1]
		a := randn(rng, rows*cols)
		v := svdTop(a, rows, cols, cols)
		checkOrthonormal(t, fmt.Sprintf("%d x %d", rows, cols), v, cols, cols)
		prevS := math.Inf(1)
		for c := range cols {
			av := make([]float64, rows) // a v_c
			for i := range rows {
				for j := range cols {
					av[i] += a[i*cols+j] * v[j*cols+c]
				}
			}
			s2 := dot(av, av)
			if s2 > prevS*(1+1e-12) {
				t.Errorf("%d x %d: singular value %d (%g) above the one before (%g)", rows, cols, c, math.Sqrt(s2), math.Sqrt(prevS))
			}
			prevS = s2
			var res float64 // |A^T A v - s^2 v|
			for j := range cols {
				var x float64
				for i := range rows {
					x += a[i*cols+j] * av[i]
				}
				res = max(res, math.Abs(x-s2*v[j*cols+c]))
			}
			if res > 1e-12*(1+s2) {
				t.Errorf("%d x %d: vector %d is off by %.3g", rows, cols, c, res)
			}
		}
	}
	// Rank 1: the second and third vectors are still orthonormal.
	a := []float64{1, 2, 3, 2, 4, 6}
	checkOrthonormal(t, "rank 1", svdTop(a, 2, 3, 3), 3, 3)
}
