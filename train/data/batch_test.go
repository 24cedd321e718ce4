// Tests for batching: the target mask of a hand-made row, exact resume of a
// Loader across an epoch boundary, per-epoch permutations, and eval batches.

package data

import (
	"slices"
	"testing"
)

const eos = 256 // the byte tokenizer's EOS, used in hand-made examples

func TestFillRow(t *testing.T) {
	tests := []struct {
		name       string
		ex         Example
		T          int
		in, tg     []int32
		numTargets int
	}{
		{
			name: "prompt masked, padded with EOS",
			ex:   Example{Tokens: []int32{10, 11, 12, 13, eos}, PromptLen: 2},
			T:    6,
			in:   []int32{10, 11, 12, 13, eos, eos},
			tg:   []int32{-1, 12, 13, eos, -1, -1},
			// targets: the response 12, 13 and the EOS
			numTargets: 3,
		},
		{
			name:       "exact fit",
			ex:         Example{Tokens: []int32{1, 2, 3, eos}, PromptLen: 1},
			T:          3,
			in:         []int32{1, 2, 3},
			tg:         []int32{2, 3, eos},
			numTargets: 3,
		},
		{
			name:       "plain text: every position a target",
			ex:         Example{Tokens: []int32{5, 6, 7}},
			T:          4,
			in:         []int32{5, 6, 7, 7},
			tg:         []int32{6, 7, -1, -1},
			numTargets: 2,
		},
		{
			name:       "too long: cut to T+1",
			ex:         Example{Tokens: []int32{1, 2, 3, 4, 5, eos}, PromptLen: 3},
			T:          3,
			in:         []int32{1, 2, 3},
			tg:         []int32{-1, -1, 4},
			numTargets: 1,
		},
		{
			name:       "empty row",
			ex:         Example{},
			T:          2,
			in:         []int32{9, 9},
			tg:         []int32{-1, -1},
			numTargets: 0,
		},
	}
	for _, tc := range tests {
		in, tg := make([]int32, tc.T), make([]int32, tc.T)
		n := fillRow(in, tg, tc.ex, 9)
		if !slices.Equal(in, tc.in) || !slices.Equal(tg, tc.tg) || n != tc.numTargets {
			t.Errorf("%s: inputs %v targets %v n %d; want %v %v %d", tc.name, in, tg, n, tc.in, tc.tg, tc.numTargets)
		}
	}
}

// handExamples makes n distinct examples: example i starts with token 100+i.
func handExamples(n int) []Example {
	ex := make([]Example, n)
	for i := range ex {
		ex[i] = Example{Tokens: []int32{int32(100 + i), 1, 2, int32(i % 3), eos}, PromptLen: 2}
	}
	return ex
}

func cloneBatch(b Batch) Batch {
	b.Inputs, b.Targets = slices.Clone(b.Inputs), slices.Clone(b.Targets)
	return b
}

func TestLoaderResume(t *testing.T) {
	ex := handExamples(7)
	const B, T, seed, steps = 3, 6, 11, 12 // 7 examples, 3 rows: batches straddle epochs
	full, err := NewLoader(ex, B, T, seed)
	if err != nil {
		t.Fatal(err)
	}
	var want []Batch
	var b Batch
	for range steps {
		full.Next(&b)
		want = append(want, cloneBatch(b))
	}
	if got := full.Position(); got != (Position{Epoch: 5, Index: 1}) { // 36 rows = 5*7 + 1
		t.Fatalf("position after %d batches = %+v", steps, got)
	}
	for _, cut := range []int{1, 2, 3, 5, 7} {
		first, _ := NewLoader(ex, B, T, seed)
		for range cut {
			first.Next(&b)
		}
		saved := first.Position()
		resumed, _ := NewLoader(ex, B, T, seed)
		if err := resumed.Seek(saved); err != nil {
			t.Fatal(err)
		}
		for i := cut; i < steps; i++ {
			resumed.Next(&b)
			if !slices.Equal(b.Inputs, want[i].Inputs) || !slices.Equal(b.Targets, want[i].Targets) || b.NumTargets != want[i].NumTargets {
				t.Fatalf("resumed at batch %d (%+v): batch %d differs", cut, saved, i)
			}
		}
	}
}

func TestLoaderEpochs(t *testing.T) {
	ex := handExamples(7)
	l, err := NewLoader(ex, 1, 4, 5)
	if err != nil {
		t.Fatal(err)
	}
	var b Batch
	var orders [][]int32
	for e := range 3 {
		var order []int32
		for i := range len(ex) {
			if got, want := l.Epoch(), float64(e)+float64(i)/7; got != want {
				t.Fatalf("Epoch() = %v, want %v", got, want)
			}
			l.Next(&b)
			order = append(order, b.Inputs[0])
		}
		sorted := slices.Sorted(slices.Values(order))
		if !slices.Equal(sorted, []int32{100, 101, 102, 103, 104, 105, 106}) {
			t.Fatalf("epoch %d is not a permutation: %v", e, order)
		}
		orders = append(orders, order)
	}
	if slices.Equal(orders[0], orders[1]) && slices.Equal(orders[1], orders[2]) {
		t.Errorf("three epochs in the same order %v", orders[0])
	}
	if l.Epoch() != 3 || l.Position() != (Position{Epoch: 3}) {
		t.Errorf("after 3 epochs: Epoch %v Position %+v", l.Epoch(), l.Position())
	}
	other, _ := NewLoader(ex, 7, 4, 6)
	other.Next(&b)
	var first []int32
	for r := range 7 {
		first = append(first, b.Inputs[r*4])
	}
	if slices.Equal(first, orders[0]) {
		t.Errorf("seeds 5 and 6 give the same order %v", first)
	}
}

func TestLoaderReusesBatch(t *testing.T) {
	l, _ := NewLoader(handExamples(4), 2, 5, 1)
	var b Batch
	l.Next(&b)
	p, q := &b.Inputs[0], &b.Targets[0]
	for range 5 {
		l.Next(&b)
	}
	if &b.Inputs[0] != p || &b.Targets[0] != q || b.B != 2 || b.T != 5 || len(b.Inputs) != 10 {
		t.Error("Next reallocated the batch or set a wrong shape")
	}
}

func TestLoaderErrors(t *testing.T) {
	ok := handExamples(2)
	tests := []struct {
		name string
		ex   []Example
		B, T int
	}{
		{"no examples", nil, 1, 4},
		{"B zero", ok, 0, 4},
		{"T zero", ok, 1, 0},
		{"too long", ok, 1, 3},
		{"one token", []Example{{Tokens: []int32{1}}}, 1, 4},
		{"all prompt", []Example{{Tokens: []int32{1, 2}, PromptLen: 2}}, 1, 4},
	}
	for _, tc := range tests {
		if _, err := NewLoader(tc.ex, tc.B, tc.T, 1); err == nil {
			t.Errorf("%s: NewLoader succeeded", tc.name)
		}
	}
	l, _ := NewLoader(ok, 1, 4, 1)
	for _, p := range []Position{{-1, 0}, {0, -1}, {0, 3}} {
		if err := l.Seek(p); err == nil {
			t.Errorf("Seek(%+v) succeeded", p)
		}
	}
	if err := l.Seek(Position{Epoch: 4, Index: 2}); err != nil || l.Position() != (Position{Epoch: 5}) {
		t.Errorf("Seek to the end of epoch 4: %v, at %+v", err, l.Position())
	}
}

func TestEvalBatches(t *testing.T) {
	ex := handExamples(5)
	bs := EvalBatches(ex, 2, 6)
	if len(bs) != 3 {
		t.Fatalf("%d batches, want 3", len(bs))
	}
	for i, e := range ex {
		b := bs[i/2]
		row := i % 2
		if b.Inputs[row*6] != e.Tokens[0] {
			t.Errorf("example %d is not in batch %d row %d", i, i/2, row)
		}
	}
	last := bs[2]
	for _, tg := range last.Targets[6:] {
		if tg != -1 {
			t.Fatalf("padding row has target %d", tg)
		}
	}
	for _, b := range bs {
		n := 0
		for _, tg := range b.Targets {
			if tg != -1 {
				n++
			}
		}
		if n != b.NumTargets || b.B != 2 || b.T != 6 {
			t.Errorf("NumTargets %d, counted %d; shape %dx%d", b.NumTargets, n, b.B, b.T)
		}
	}
	if last.NumTargets != 3 { // example 4: targets at the response and EOS
		t.Errorf("last batch NumTargets %d, want 3", last.NumTargets)
	}
	if EvalBatches(nil, 2, 6) != nil {
		t.Error("EvalBatches(nil) is not nil")
	}
}

func BenchmarkLoaderNext(b *testing.B) {
	const B, T = 16, 256
	ex := make([]Example, 1000)
	for i := range ex {
		tok := make([]int32, 40+i%200)
		for j := range tok {
			tok[j] = int32(j % 250)
		}
		ex[i] = Example{Tokens: tok, PromptLen: 20}
	}
	l, err := NewLoader(ex, B, T, 1)
	if err != nil {
		b.Fatal(err)
	}
	var batch Batch
	for b.Loop() {
		l.Next(&batch)
	}
	b.ReportMetric(float64(B*T)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
