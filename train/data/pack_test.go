// Tests of packed rows (--pack, Loader.SetPack): every example lands whole
// in one row with its unpacked row's inputs and targets at positions from
// 0, rows take examples in the unpacked order, padding is a document of
// its own with no targets, and a packed stream resumes exactly.

package data

import (
	"slices"
	"testing"
)

// raggedExamples are examples of 2 to 9 tokens (so several fit a row and
// some rows end with padding), prompts of varied length.
func raggedExamples(n int) []Example {
	ex := make([]Example, n)
	for i := range ex {
		L := 2 + (i*5)%8
		tok := make([]int32, L)
		for j := range tok {
			tok[j] = int32(10*i + j)
		}
		ex[i] = Example{Tokens: tok, PromptLen: min(i%3, L-1)}
	}
	return ex
}

func TestPackedRowsHoldUnpackedExamples(t *testing.T) {
	ex := raggedExamples(11)
	const B, T, seed = 2, 12, 5
	plain, err := NewLoader(ex, 1, T, seed)
	if err != nil {
		t.Fatal(err)
	}
	// next is the next example of the unpacked order as its own row cut to
	// its places (L-1 of L tokens: up to its last target), and its targets.
	var ub Batch
	var pending *Batch
	next := func() Batch {
		if pending == nil {
			plain.Next(&ub)
			k := lastTarget(ub.Targets) + 1
			pending = &Batch{Inputs: slices.Clone(ub.Inputs[:k]), Targets: slices.Clone(ub.Targets[:k]), NumTargets: ub.NumTargets}
		}
		return *pending
	}
	packed, _ := NewLoader(ex, B, T, seed)
	packed.SetPack(true)
	var pb Batch
	for step := range 6 { // several epochs
		packed.Next(&pb)
		if len(pb.Positions) != B*T {
			t.Fatalf("step %d: %d positions for %d x %d", step, len(pb.Positions), B, T)
		}
		n := 0
		for r := range B {
			in, tg, pos := pb.Inputs[r*T:(r+1)*T], pb.Targets[r*T:(r+1)*T], pb.Positions[r*T:(r+1)*T]
			used := 0
			for e := next(); used == 0 || used+len(e.Inputs) <= T; e = next() {
				k := len(e.Inputs)
				if !slices.Equal(in[used:used+k], e.Inputs) || !slices.Equal(tg[used:used+k], e.Targets) {
					t.Fatalf("step %d row %d at %d: packed %v / %v, alone %v / %v", step, r, used, in[used:used+k], tg[used:used+k], e.Inputs, e.Targets)
				}
				for i := range k {
					if pos[used+i] != int32(i) {
						t.Fatalf("step %d row %d: position %d at %d, want %d", step, r, pos[used+i], used+i, i)
					}
				}
				n += e.NumTargets
				used += k
				pending = nil
			}
			for i := used; i < T; i++ {
				if tg[i] != -1 || pos[i] != int32(i-used) {
					t.Fatalf("step %d row %d: padding at %d has target %d position %d", step, r, i, tg[i], pos[i])
				}
			}
		}
		if n != pb.NumTargets {
			t.Fatalf("step %d: NumTargets %d, the examples' %d", step, pb.NumTargets, n)
		}
	}
	// The example that did not fit the last row is the packed loader's next.
	if pending == nil || packed.Position() == plain.Position() {
		t.Fatalf("packed loader at %+v, the unpacked one at %+v with a look-ahead example", packed.Position(), plain.Position())
	}
}

// lastTarget is the index of the last target that is not -1 (-1 for none).
func lastTarget(tg []int32) int {
	for i := len(tg) - 1; i >= 0; i-- {
		if tg[i] != -1 {
			return i
		}
	}
	return -1
}

func TestPackedLoaderResume(t *testing.T) {
	ex := raggedExamples(9)
	const B, T, seed, steps = 2, 10, 3, 10
	full, _ := NewLoader(ex, B, T, seed)
	full.SetPack(true)
	var want []Batch
	var b Batch
	for range steps {
		full.Next(&b)
		c := cloneBatch(b)
		c.Positions = slices.Clone(b.Positions)
		want = append(want, c)
	}
	for _, cut := range []int{1, 4, 7} {
		first, _ := NewLoader(ex, B, T, seed)
		first.SetPack(true)
		for range cut {
			first.Next(&b)
		}
		resumed, _ := NewLoader(ex, B, T, seed)
		resumed.SetPack(true)
		if err := resumed.Seek(first.Position()); err != nil {
			t.Fatal(err)
		}
		for i := cut; i < steps; i++ {
			resumed.Next(&b)
			w := want[i]
			if !slices.Equal(b.Inputs, w.Inputs) || !slices.Equal(b.Targets, w.Targets) || !slices.Equal(b.Positions, w.Positions) || b.NumTargets != w.NumTargets {
				t.Fatalf("resumed after %d batches: batch %d differs", cut, i)
			}
		}
	}
}

// TestUnpackedBatchHasNoPositions: a Batch reused from packed to unpacked
// use drops its positions (nil means one example per row).
func TestUnpackedBatchHasNoPositions(t *testing.T) {
	ex := raggedExamples(4)
	l, _ := NewLoader(ex, 2, 10, 1)
	var b Batch
	l.SetPack(true)
	l.Next(&b)
	l.SetPack(false)
	l.Next(&b)
	if b.Positions != nil {
		t.Fatalf("unpacked batch has positions %v", b.Positions)
	}
}
