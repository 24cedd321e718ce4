package lora

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/safetensors"
)

// batch is reference.safetensors' input_ids and targets (-100 becomes
// this project's -1) and the number of targets taken.
type batch struct {
	B, T     int
	ids      []int64
	targets  []int32
	numValid int
}

func readBatch(t *testing.T, ref *safetensors.File) batch {
	t.Helper()
	ids, shape, err := ref.Int64("input_ids")
	if err != nil {
		t.Fatal(err)
	}
	tg, _, err := ref.Int64("targets")
	if err != nil {
		t.Fatal(err)
	}
	b := batch{B: shape[0], T: shape[1], ids: ids, targets: make([]int32, len(tg))}
	for i, x := range tg {
		b.targets[i] = int32(x)
		if x < 0 {
			b.targets[i] = -1
		} else {
			b.numValid++
		}
	}
	return b
}

// peftFixture is testdata/<family>'s base architecture and index, its
// reference.safetensors and PEFT's adapter read by ReadAdapter.
func peftFixture(t *testing.T, family string) (model.Arch, *model.Index, *safetensors.File, *Adapter) {
	t.Helper()
	arch, idx := fixtureArch(t, family)
	ref := openST(t, filepath.Join("testdata", family, "reference.safetensors"))
	ad, err := ReadAdapter(filepath.Join("testdata", family, "adapter"), idx)
	if err != nil {
		t.Fatal(err)
	}
	return arch, idx, ref, ad
}

// lossAndGrads runs arch's fp32 forward, the mean loss and the backward
// on the CPU backend, and returns the loss and the dense gradient (in x
// out) of each site's matrix.
func lossAndGrads(t *testing.T, arch model.Arch, idx *model.Index, params []float32, bt batch, sites []Site) (float64, [][]float32) {
	t.Helper()
	be := cpu.New(cpu.Config{})
	defer be.Close()
	m, err := arch.NewModel(be, bt.B, bt.T, backend.F32, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	s := be.DefaultStream()
	in := make([]int32, len(bt.ids))
	for i, x := range bt.ids {
		in[i] = int32(x)
	}
	bufs := m.Buffers()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(backend.Upload(be, s, bufs.Params, params))
	must(backend.UploadInt32(be, s, bufs.Inputs, in))
	must(backend.UploadInt32(be, s, bufs.Targets, bt.targets))
	must(m.ZeroGrads(s))
	must(m.Forward(s))
	must(m.CrossEntropy(s, 1/float32(bt.numValid)))
	must(model.Backward(m, s, arch.Layers()))
	losses, err := backend.Download(be, s, bufs.Losses)
	must(err)
	var loss float64
	for _, l := range losses {
		loss += float64(l)
	}
	loss /= float64(bt.numValid)
	grads := make([][]float32, len(sites))
	for i, st := range sites {
		gv, ok := m.GradView(idx.MatParam[st.Layer][st.K])
		if !ok {
			t.Fatalf("%s has no dense gradient", st.Module)
		}
		grads[i], err = backend.Download(be, s, gv)
		must(err)
	}
	return loss, grads
}

// closeTo requires |got - want| <= rtol * (the largest |want| + |want|).
func closeTo(t *testing.T, what string, got, want []float32, rtol float64) float64 {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	var scale float64
	for _, w := range want {
		scale = max(scale, math.Abs(float64(w)))
	}
	var worst float64
	for i, w := range want {
		d := math.Abs(float64(got[i]) - float64(w))
		if !(d <= rtol*(scale+math.Abs(float64(w)))) {
			t.Fatalf("%s[%d]: %.8g, PEFT %.8g (scale %.3g)", what, i, got[i], w, scale)
		}
		worst = max(worst, d/scale)
	}
	return worst
}

// TestGradsMatchPEFT: Grads of the merged model's dense gradients are
// PEFT's adapter gradients (reference.safetensors grad.<key>), and the
// loss is PEFT's.
func TestGradsMatchPEFT(t *testing.T) {
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			arch, idx, ref, ad := peftFixture(t, fam)
			bt := readBatch(t, ref)
			loss, dense := lossAndGrads(t, arch, idx, mergedParams(t, fam, idx, ad), bt, ad.Sites)
			want, _ := tensor(t, ref, "loss")
			if math.Abs(loss-float64(want[0])) > 1e-6*float64(want[0]) {
				t.Errorf("loss %.8g, PEFT %.8g", loss, want[0])
			}
			var worst float64
			for i, s := range ad.Sites {
				da, db := make([]float32, len(ad.A[i])), make([]float32, len(ad.B[i]))
				if err := Grads(dense[i], s, ad.A[i], ad.B[i], ad.Cfg.Scale(), da, db); err != nil {
					t.Fatal(err)
				}
				wa, _ := tensor(t, ref, "grad."+KeyA(s))
				wb, _ := tensor(t, ref, "grad."+KeyB(s))
				worst = max(worst, closeTo(t, "dA "+s.Module, da, wa, 1e-5), closeTo(t, "dB "+s.Module, db, wb, 1e-5))
			}
			t.Logf("largest gradient difference from PEFT, relative to the tensor's scale: %.2g", worst)
		})
	}
}

// TestAdamWMatchesPEFT replays reference.json's 5 AdamW steps on the
// adapter (torch.optim.AdamW's single-tensor arithmetic in float32, weight
// decay on every A and B, no clipping), each step's gradient from the
// merged model: the losses and the final adapter are PEFT's, so the
// fixture's trajectory means what reference.json says it does.
func TestAdamWMatchesPEFT(t *testing.T) {
	const (
		lr, beta1, beta2, eps, wd = 1e-3, 0.9, 0.95, 1e-8, 0.1
		steps                     = 5
	)
	for _, fam := range families {
		t.Run(fam, func(t *testing.T) {
			arch, idx, ref, ad := peftFixture(t, fam)
			bt := readBatch(t, ref)
			wantLosses, _ := tensor(t, ref, "adamw_losses")
			// Every tensor of the adapter, A then B per site, with its
			// moments. params alias ad.A and ad.B, so each step's merge
			// sees the update before it.
			var params, ms, vs [][]float32
			var keys []string
			for i, s := range ad.Sites {
				params = append(params, ad.A[i], ad.B[i])
				keys = append(keys, KeyA(s), KeyB(s))
				ms = append(ms, make([]float32, len(ad.A[i])), make([]float32, len(ad.B[i])))
				vs = append(vs, make([]float32, len(ad.A[i])), make([]float32, len(ad.B[i])))
			}
			for step := 1; step <= steps; step++ {
				loss, dense := lossAndGrads(t, arch, idx, mergedParams(t, fam, idx, ad), bt, ad.Sites)
				if w := float64(wantLosses[step-1]); math.Abs(loss-w) > 1e-6*w {
					t.Errorf("step %d: loss %.8g, PEFT %.8g", step, loss, w)
				}
				grads := make([][]float32, 0, len(params))
				for i, s := range ad.Sites {
					da, db := make([]float32, len(ad.A[i])), make([]float32, len(ad.B[i]))
					if err := Grads(dense[i], s, ad.A[i], ad.B[i], ad.Cfg.Scale(), da, db); err != nil {
						t.Fatal(err)
					}
					grads = append(grads, da, db)
				}
				// torch's _single_tensor_adamw, float32 tensors, Python
				// float scalars.
				bc1 := 1 - math.Pow(beta1, float64(step))
				bc2sqrt := float32(math.Sqrt(1 - math.Pow(beta2, float64(step))))
				stepSize := float32(lr / bc1)
				for ti, p := range params {
					g, m, v := grads[ti], ms[ti], vs[ti]
					for e := range p {
						p[e] *= float32(1 - lr*wd)
						m[e] += (g[e] - m[e]) * float32(1-beta1)
						v[e] = v[e]*float32(beta2) + float32(1-beta2)*g[e]*g[e]
						denom := float32(math.Sqrt(float64(v[e])))/bc2sqrt + float32(eps)
						p[e] -= stepSize * (m[e] / denom)
					}
				}
			}
			var worst float64
			for ti, p := range params {
				want, _ := tensor(t, ref, "final."+keys[ti])
				worst = max(worst, closeTo(t, "final "+strings.TrimPrefix(keys[ti], "base_model.model."), p, want, 1e-5))
			}
			t.Logf("largest final difference from PEFT, relative to the tensor's scale: %.2g", worst)
		})
	}
}

func TestGradsSmall(t *testing.T) {
	s := Site{Module: "m", M: 2, N: 3}
	a := []float32{1, 2, 3, 4}       // r = 2: A = [[1 2] [3 4]]
	b := []float32{1, 0, 0, 1, 1, 1} // B = [[1 0] [0 1] [1 1]]
	g := []float32{1, 0, 0, 0, 1, 2} // g = [[1 0 0] [0 1 2]]
	da, db := make([]float32, 4), make([]float32, 6)
	if err := Grads(g, s, a, b, 2, da, db); err != nil {
		t.Fatal(err)
	}
	// dA[k][i] = 2 sum_j g[i][j] B[j][k]; dB[j][k] = 2 sum_i g[i][j] A[k][i].
	if want := []float32{2, 4, 0, 6}; !sameBits(da, want) {
		t.Errorf("dA %v, want %v", da, want)
	}
	if want := []float32{2, 6, 4, 8, 8, 16}; !sameBits(db, want) {
		t.Errorf("dB %v, want %v", db, want)
	}
	if err := Grads(g, s, a, b, 2, da[:3], db); err == nil || !strings.Contains(err.Error(), "dA") {
		t.Errorf("short dA: %v", err)
	}
	if err := Grads(g[:5], s, a, b, 2, da, db); err == nil || !strings.Contains(err.Error(), "gradient") {
		t.Errorf("short gradient: %v", err)
	}
}
