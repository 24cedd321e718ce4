package eval

import (
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// scripted is a decoder whose logits after position pos pick next[pos]:
// a model that says what a test wants it to.
type scripted struct {
	be     backend.Backend
	tok    backend.Tensor
	logits backend.Tensor
	next   []int32
	V      int
}

func (d *scripted) Token() backend.Tensor  { return d.tok }
func (d *scripted) Logits() backend.Tensor { return d.logits }
func (d *scripted) MaxT() int              { return len(d.next) }
func (d *scripted) Free()                  {}
func (d *scripted) Step(s backend.Stream, pos int) error {
	l := make([]float32, d.V)
	l[d.next[pos]] = 1
	return backend.Upload(d.be, s, d.logits, l)
}

// TestGenerateStopsAtEveryStopID: with the Llama-3 style fixture
// tokenizer, whose generation_config.json lists two end-of-sequence ids,
// generation ends at either, not only at EOS().
func TestGenerateStopsAtEveryStopID(t *testing.T) {
	tok, err := tokenizer.Open("../tokenizer/testdata/llama3")
	if err != nil {
		t.Fatal(err)
	}
	stop := tokenizer.StopIDs(tok)
	if len(stop) != 2 || stop[0] != tok.EOS() {
		t.Fatalf("StopIDs = %v (EOS %d): the fixture should have two, EOS first", stop, tok.EOS())
	}
	be := cpu.New(cpu.Config{Threads: 1})
	defer be.Close()
	V := tok.VocabSize()
	tokT, err := be.Alloc("token", 1, backend.I32)
	if err != nil {
		t.Fatal(err)
	}
	logits, err := be.Alloc("logits", V, backend.F32)
	if err != nil {
		t.Fatal(err)
	}
	prompt := tok.Encode("hi")
	for _, id := range stop {
		// After the prompt: 7, 8, then the stop id, then 9.
		next := make([]int32, 16)
		at := len(prompt) - 1
		copy(next[at:], []int32{7, 8, id, 9})
		d := &scripted{be: be, tok: tokT, logits: logits, next: next, V: V}
		g, err := NewGenerator(be, be.DefaultStream(), d)
		if err != nil {
			t.Fatal(err)
		}
		out, err := g.Generate(prompt, 10, stop, Sampler{})
		g.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(out, []int32{7, 8}) {
			t.Errorf("stop id %d: generated %v, want [7 8]", id, out)
		}
	}
	g, err := NewGenerator(be, be.DefaultStream(), &scripted{be: be, tok: tokT, logits: logits, next: make([]int32, 4), V: V})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.Generate(prompt, 2, nil, Sampler{}); err == nil {
		t.Error("no stop ids: no error")
	}
}

// TestGenerateStopSet: both generation paths, on a real fixture model,
// end at a later stop id of the set, not only at the first: the greedy
// continuation, given its 4th token as a second stop id, is cut before
// that token's first occurrence.
func TestGenerateStopSet(t *testing.T) {
	spec, vals, err := catalog.Load("../testdata/llama-tiny-gqa")
	if err != nil {
		t.Fatal(err)
	}
	be, m := cpuModel(t, spec, vals, 1, spec.MaxSeqLen())
	s := be.DefaultStream()
	prompt := [][]int32{{5, 17, 42, 9}}
	eos := int32(spec.VocabSize() - 1)
	full, err := Generate(be, s, m, prompt, 12, []int32{eos}, Sampler{})
	if err != nil {
		t.Fatal(err)
	}
	if len(full[0]) < 4 {
		t.Fatalf("greedy gave only %v", full[0])
	}
	stopAt := full[0][3]
	want := full[0][:slices.Index(full[0], stopAt)]
	for name, gen := range map[string]func(backend.Backend, backend.Stream, Model, [][]int32, int, []int32, Sampler) ([][]int32, error){
		"uncached": Generate, "cached": GenerateCached} {
		out, err := gen(be, s, m, prompt, 12, []int32{eos, stopAt}, Sampler{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(out[0], want) {
			t.Errorf("%s: stop set {%d, %d}: %v, want %v (the full continuation %v)", name, eos, stopAt, out[0], want, full[0])
		}
	}
	if _, err := Generate(be, s, m, prompt, 2, nil, Sampler{}); err == nil {
		t.Error("Generate without stop ids: no error")
	}
}
