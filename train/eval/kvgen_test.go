// Tests of generation with the KV cache: greedy output equal to the
// uncached path's token for token on random gpt2 and llama presets, the
// decoder's logits equal to the whole sequence's at every position, and
// transformers' greedy ids on the tiny fixture checkpoints.

package eval

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/catalog"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/tokenizer"
)

// presetModel allocates preset name for B x T on a one-thread CPU backend
// with its random init from seed.
func presetModel(t *testing.T, name string, B, T int, seed uint64) (*cpu.Backend, Model) {
	t.Helper()
	spec, err := catalog.Preset(name)
	if err != nil {
		t.Fatal(err)
	}
	return cpuModel(t, spec, spec.Init(seed), B, T)
}

// cpuModel allocates spec for B x T on a one-thread CPU backend with
// params uploaded, both freed when the test ends.
func cpuModel(t *testing.T, spec model.Spec, params []float32, B, T int) (*cpu.Backend, Model) {
	t.Helper()
	be := cpu.New(cpu.Config{Threads: 1})
	t.Cleanup(func() { be.Close() })
	mm, err := spec.NewModel(be, B, T, backend.F32, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mm.Free)
	if err := backend.Upload(be, be.DefaultStream(), mm.Buffers().Params, params); err != nil {
		t.Fatal(err)
	}
	return be, Model{Model: mm, Spec: spec, B: B, T: T}
}

// namedModel is presetModel, or for a name under ../testdata that
// directory's checkpoint loaded as sample loads it.
func namedModel(t *testing.T, name string, B, T int, seed uint64) (*cpu.Backend, Model) {
	t.Helper()
	dir := filepath.Join("..", "testdata", name)
	if _, err := os.Stat(dir); err != nil {
		return presetModel(t, name, B, T, seed)
	}
	spec, vals, err := catalog.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return cpuModel(t, spec, vals, B, T)
}

// TestCachedGreedyEqualsUncached: on random gpt2 and llama presets (llama
// with grouped-query attention), greedy generation through the KV cache
// gives the uncached path's tokens, for prompts short, long, empty and at
// the context limit.
func TestCachedGreedyEqualsUncached(t *testing.T) {
	for _, name := range []string{"tiny", "llama-tiny"} {
		t.Run(name, func(t *testing.T) {
			const T = 48
			be, m := presetModel(t, name, 2, T, 5)
			if _, ok := m.Model.(model.Cached); !ok {
				t.Fatalf("%s has no KV-cache decoder", name)
			}
			s := be.DefaultStream()
			eos := int32(m.Spec.VocabSize() - 1)
			long := make([]int32, 60)
			for i := range long {
				long[i] = int32(i*7) % eos
			}
			prompts := [][]int32{{'a', 'b', '='}, {'x'}, {}, []int32("sort the words: pear apple fig ="), long, {200, 3, 3, 3}}
			smps := []Sampler{{}, {RepetitionPenalty: 1.3}}
			if testing.Short() { // under -race the uncached path is slow
				smps = smps[1:]
			}
			for _, smp := range smps {
				want, err := Generate(be, s, m, prompts, 40, []int32{eos}, smp)
				if err != nil {
					t.Fatal(err)
				}
				got, err := GenerateCached(be, s, m, prompts, 40, []int32{eos}, smp)
				if err != nil {
					t.Fatal(err)
				}
				total := 0
				for i := range prompts {
					if !slices.Equal(got[i], want[i]) {
						t.Errorf("penalty %g, prompt %d: cached %v, uncached %v", smp.RepetitionPenalty, i, got[i], want[i])
					}
					total += len(want[i])
				}
				if total < 40 {
					t.Errorf("penalty %g: only %d tokens generated in all; the comparison sees little", smp.RepetitionPenalty, total)
				}
			}
		})
	}
}

// TestDecoderLogits: the decoder's logits at each position equal those of
// the whole sequence's forward pass to float rounding, and stepping a
// position again replaces it.
func TestDecoderLogits(t *testing.T) {
	// qwen2-tiny-gqa: the q, k and v biases, nonzero (a preset's init
	// leaves them 0).
	for _, name := range []string{"tiny", "llama-tiny", "qwen2-tiny-gqa"} {
		t.Run(name, func(t *testing.T) {
			const T = 24
			be, m := namedModel(t, name, 1, T, 8)
			s := be.DefaultStream()
			V := m.Spec.VocabSize()
			seq := make([]int32, T)
			for i := range seq {
				seq[i] = int32(i*37+11) % int32(V)
			}
			if err := backend.UploadInt32(be, s, m.Buffers().Inputs, seq); err != nil {
				t.Fatal(err)
			}
			if err := m.Forward(s); err != nil {
				t.Fatal(err)
			}
			full, err := backend.Download(be, s, m.Buffers().Logits)
			if err != nil {
				t.Fatal(err)
			}
			dec, err := m.Model.(model.Cached).NewDecoder(T)
			if err != nil {
				t.Fatal(err)
			}
			defer dec.Free()
			step := func(tok int32, pos int) []float32 {
				t.Helper()
				if err := backend.UploadInt32(be, s, dec.Token(), []int32{tok}); err != nil {
					t.Fatal(err)
				}
				if err := dec.Step(s, pos); err != nil {
					t.Fatal(err)
				}
				lg, err := backend.Download(be, s, dec.Logits())
				if err != nil {
					t.Fatal(err)
				}
				return lg
			}
			check := func(pos int, lg []float32) {
				t.Helper()
				var worst float64
				for i, v := range lg {
					worst = max(worst, math.Abs(float64(v-full[pos*V+i])))
				}
				if worst > 1e-5 {
					t.Errorf("position %d: cached logits differ from the full pass's by %.2g", pos, worst)
				}
			}
			for pos, tok := range seq[:T/2] {
				check(pos, step(tok, pos))
			}
			// A wrong token at T/2, then the right one again: the cache
			// keeps the second.
			step(seq[T/2]^1, T/2)
			for pos := T / 2; pos < T; pos++ {
				check(pos, step(seq[pos], pos))
			}
			if err := dec.Step(s, T); err == nil {
				t.Errorf("Step(%d) of a %d-position decoder: no error", T, T)
			}
		})
	}
}

// greedyFixture is train/testdata/generate-greedy.json
// (scripts/fixtures/generate_greedy.py).
type greedyFixture struct {
	Cases []struct {
		Model             string  `json:"model"`
		Prompt            []int32 `json:"prompt"`
		MaxNew            int     `json:"max_new_tokens"`
		EOS               int32   `json:"eos_token_id"`
		RepetitionPenalty float64 `json:"repetition_penalty"`
		IDs               []int32 `json:"ids"`
	} `json:"cases"`
}

// TestGreedyFixtures: the KV-cache decoder of each tiny fixture checkpoint
// (loaded as sample loads it) gives transformers' greedy ids, with and
// without the repetition penalty, and so does the uncached path.
func TestGreedyFixtures(t *testing.T) {
	raw, err := os.ReadFile("../testdata/generate-greedy.json")
	if err != nil {
		t.Fatal(err)
	}
	var fx greedyFixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatal(err)
	}
	if len(fx.Cases) == 0 {
		t.Fatal("no cases in generate-greedy.json")
	}
	for _, c := range fx.Cases {
		spec, vals, err := catalog.Load(filepath.Join("../testdata", c.Model))
		if err != nil {
			t.Fatal(err)
		}
		be, m := cpuModel(t, spec, vals, 1, spec.MaxSeqLen())
		s := be.DefaultStream()
		smp := Sampler{RepetitionPenalty: c.RepetitionPenalty}
		for _, cached := range []bool{true, false} {
			gen := Generate
			if cached {
				gen = GenerateCached
			}
			out, err := gen(be, s, m, [][]int32{c.Prompt}, c.MaxNew, []int32{c.EOS}, smp)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(out[0], c.IDs) {
				t.Errorf("%s %v penalty %g (cached %v): got %v, transformers %v", c.Model, c.Prompt, c.RepetitionPenalty, cached, out[0], c.IDs)
			}
		}
	}
}

// eosAt is a tokenizer whose EOS is another id, so that a random model's
// greedy continuation ends where a test wants it to.
type eosAt struct {
	tokenizer.Tokenizer
	eos int32
}

func (e eosAt) EOS() int32 { return e.eos }

// TestExactMatchCached: the eval job's score through the cached path is 1
// on a record whose response is the model's greedy continuation up to
// its EOS, and 0 once the response is changed, for both families (llama's
// responses are several tokens long).
func TestExactMatchCached(t *testing.T) {
	for _, name := range []string{"tiny", "llama-tiny"} {
		be, m := presetModel(t, name, 2, 32, 12)
		s := be.DefaultStream()
		byteTok := tokenizer.Byte()
		scored := 0
		for _, p := range []string{"ab=", "sort b a=", "x", "hello="} {
			outs, err := Generate(be, s, m, [][]int32{byteTok.Encode(p)}, 12, []int32{byteTok.EOS()}, Sampler{})
			if err != nil {
				t.Fatal(err)
			}
			g := outs[0]
			// The last token that occurs first where it stands becomes
			// EOS: greedy generation stops right before it. (A tied
			// random GPT-2 repeats one token: k is 0, the empty
			// response.)
			k := lastFirstOccurrence(g)
			if k < 0 {
				continue
			}
			tok := eosAt{byteTok, g[k]}
			rec := []data.Record{{Prompt: p, Response: tok.Decode(g[:k])}}
			if em, err := ExactMatch(be, s, m, tok, rec, Watch{}); err != nil || em != 1 {
				t.Errorf("%s %q: exact match %v (%v) on its greedy output %v before EOS %d, want 1", name, p, em, err, g[:k], g[k])
			}
			rec[0].Response += "!"
			if em, err := ExactMatch(be, s, m, tok, rec, Watch{}); err != nil || em != 0 {
				t.Errorf("%s %q: exact match %v (%v) on a changed response, want 0", name, p, em, err)
			}
			scored++
		}
		if scored == 0 {
			t.Errorf("%s: no prompt could be scored", name)
		}
	}
}

// TestDecoderBytes: a family's DecoderBytes (the memory plan's figure for
// generation with the cache) is what NewDecoder allocates on the
// backend, byte for byte, in fp32 and bf16 and at two lengths.
func TestDecoderBytes(t *testing.T) {
	for _, name := range []string{"tiny", "llama-tiny"} {
		for _, dt := range []backend.DType{backend.F32, backend.BF16} {
			spec, err := catalog.Preset(name)
			if err != nil {
				t.Fatal(err)
			}
			be := cpu.New(cpu.Config{Threads: 1})
			mm, err := spec.NewModel(be, 1, 16, dt, model.Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, maxT := range []int{16, 7} {
				before := be.MemStats().InUse
				dec, err := mm.(model.Cached).NewDecoder(maxT)
				if err != nil {
					t.Fatal(err)
				}
				got := be.MemStats().InUse - before
				dec.Free()
				if want := spec.(model.DecoderSpec).DecoderBytes(maxT, dt); got != want {
					t.Errorf("%s %v, %d positions: the decoder allocated %d bytes, DecoderBytes says %d", name, dt, maxT, got, want)
				}
			}
			mm.Free()
			be.Close()
		}
	}
}

// TestExactMatchPrompts: records scored from given prompt tokens (a
// conversation's, whose turns end with an EOS id no text encodes to) are
// generated from those tokens: 1 on the model's greedy continuation of
// them, which the record's Prompt text does not produce; a prompt count
// that is not the records' is refused.
func TestExactMatchPrompts(t *testing.T) {
	be, m := presetModel(t, "llama-tiny", 2, 32, 12)
	s := be.DefaultStream()
	byteTok := tokenizer.Byte()
	prompt := []int32{'h', 'i', byteTok.EOS(), 'y', 'o', '='}
	outs, err := Generate(be, s, m, [][]int32{prompt}, 12, []int32{byteTok.EOS()}, Sampler{})
	if err != nil {
		t.Fatal(err)
	}
	g := outs[0]
	k := lastFirstOccurrence(g)
	if k < 0 {
		t.Skip("the greedy output repeats one token")
	}
	tok := eosAt{byteTok, g[k]}
	recs := []data.Record{{Prompt: "not the prompt", Response: tok.Decode(g[:k])}}
	given := [][]int32{slices.Clone(prompt)}
	if em, err := ExactMatchPrompts(be, s, m, tok, recs, given, Watch{}); err != nil || em != 1 {
		t.Errorf("exact match %v (%v) from the prompt tokens, want 1", em, err)
	}
	if !slices.Equal(given[0], prompt) {
		t.Errorf("the prompt tokens were changed to %v", given[0])
	}
	if _, err := ExactMatchPrompts(be, s, m, tok, recs, [][]int32{prompt, prompt}, Watch{}); err == nil {
		t.Error("two prompts for one record: no error")
	}
}

// lastFirstOccurrence is the index of the last token of g that occurs
// there for the first time (-1 for an empty g): made the EOS, greedy
// generation stops right before it.
func lastFirstOccurrence(g []int32) int {
	k := -1
	for i := range g {
		if !slices.Contains(g[:i], g[i]) {
			k = i
		}
	}
	return k
}
