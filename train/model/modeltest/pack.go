package modeltest

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// CheckPacked is the property --pack rests on, for any family: a packed
// batch (model.Options.Packed: documents end to end in a row, positions
// restarting at each, backend.Positions) gives every document's tokens the
// per-token losses of the same document run alone in a row of its own, and
// parameter gradients equal to the sum of the documents' own. It runs on
// the CPU backend in fp32 with params (the arch's layout) and V the
// vocabulary, L blocks, opts the other model options; docs are the
// documents' lengths in places, row by row (a row's tail after them is
// padding, a document of its own without targets). Losses must agree to
// fp32 rounding (the CPU backend gives the same bits but for GEMM
// blockings that may differ with the row count), gradients to the
// rounding of sums taken in another order.
func CheckPacked(t *testing.T, arch model.Arch, params []float32, V, L int, opts model.Options, T int, docs [][]int) {
	t.Helper()
	be := cpu.New(cpu.Config{})
	defer be.Close()
	s := be.DefaultStream()
	B := len(docs)
	rng := rand.New(rand.NewPCG(42, uint64(T)))
	inp, tgt, pos := make([]int32, B*T), make([]int32, B*T), make([]int32, B*T)
	type doc struct{ start, n int } // flat start, places
	var all []doc
	for r, row := range docs {
		used := 0
		for _, n := range row {
			if used+n > T {
				t.Fatalf("row %d: documents %v exceed T=%d", r, row, T)
			}
			for i := range n {
				k := r*T + used + i
				inp[k], tgt[k], pos[k] = int32(rng.IntN(V)), int32(rng.IntN(V)), int32(i)
				if rng.IntN(4) == 0 {
					tgt[k] = -1 // prompt places
				}
			}
			all = append(all, doc{r*T + used, n})
			used += n
		}
		for i := used; i < T; i++ {
			k := r*T + i
			inp[k], tgt[k], pos[k] = inp[r*T+max(used-1, 0)], -1, int32(i-used)
		}
	}

	build := func(B int, packed bool) model.Model {
		o := opts
		o.Packed = packed
		m, err := arch.NewModel(be, B, T, backend.F32, o)
		if err != nil {
			t.Fatalf("packed=%v: %v", packed, err)
		}
		if err := backend.Upload(be, s, m.Buffers().Params, params); err != nil {
			t.Fatal(err)
		}
		if err := m.ZeroGrads(s); err != nil {
			t.Fatal(err)
		}
		return m
	}
	run := func(m model.Model, T int, inp, tgt, pos []int32) []float32 {
		if err := model.UploadBatch(be, s, m.Buffers(), T, inp, tgt, pos); err != nil {
			t.Fatal(err)
		}
		if err := model.ForwardBackward(m, s, L, 1); err != nil {
			t.Fatal(err)
		}
		l, err := backend.Download(be, s, m.Buffers().Losses)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	grads := func(m model.Model) []float32 {
		g, err := backend.Download(be, s, m.Buffers().Grads)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}

	pm := build(B, true)
	defer pm.Free()
	packedLoss := run(pm, T, inp, tgt, pos)
	packedGrad := grads(pm)

	um := build(1, false)
	defer um.Free()
	var worst float64
	for _, d := range all {
		in1, tg1 := make([]int32, T), make([]int32, T)
		for i := range T {
			in1[i], tg1[i] = inp[d.start+d.n-1], -1 // padding after the document
		}
		copy(in1, inp[d.start:d.start+d.n])
		copy(tg1, tgt[d.start:d.start+d.n])
		alone := run(um, T, in1, tg1, nil) // the gradients accumulate over the documents
		for i := range d.n {
			got, want := float64(packedLoss[d.start+i]), float64(alone[i])
			diff := math.Abs(got - want)
			worst = max(worst, diff)
			if diff > 1e-6+1e-6*math.Abs(want) {
				t.Fatalf("document at %d, place %d: packed loss %v, alone %v", d.start, i, got, want)
			}
		}
	}
	t.Logf("per-token losses: largest difference %.3g", worst)
	sumGrad := grads(um)
	var scale float64
	for _, g := range sumGrad {
		scale = max(scale, math.Abs(float64(g)))
	}
	for i := range sumGrad {
		got, want := float64(packedGrad[i]), float64(sumGrad[i])
		if math.Abs(got-want) > 1e-5*scale+1e-4*math.Abs(want) {
			t.Fatalf("gradient %d: packed %v, the documents' sum %v (scale %v)", i, got, want, scale)
		}
	}
}
