// Tests of the sampler (greedy, temperature, top-p), of Generate's
// bookkeeping, of Sample on an exported model, and of Loss without
// examples.

package eval

import (
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/gpt2"
)

func TestSamplerGreedy(t *testing.T) {
	for _, tc := range []struct {
		logits []float32
		want   int32
	}{
		{[]float32{0.1, 2, -1}, 1},
		{[]float32{-5, -3, -4}, 1},
		{[]float32{7}, 0},
		{[]float32{1, 3, 3, 2}, 1}, // ties: the first
		{[]float32{float32(math.Inf(-1)), -1e30, 0}, 2},
	} {
		// Temperature 0 is greedy, and so is a sampler without an RNG.
		for _, s := range []Sampler{{}, {Temperature: 0, RNG: rand.New(rand.NewPCG(1, 2))}, {Temperature: 1}} {
			if got := s.Pick(tc.logits, nil); got != tc.want {
				t.Errorf("%+v.Pick(%v) = %d, want %d", s, tc.logits, got, tc.want)
			}
		}
	}
}

// logitsOf turns probabilities into logits.
func logitsOf(p ...float64) []float32 {
	l := make([]float32, len(p))
	for i, v := range p {
		l[i] = float32(math.Log(v))
	}
	return l
}

func TestSamplerTopP(t *testing.T) {
	peaked := logitsOf(0.05, 0.7, 0.1, 0.15)
	s := NewSampler(1, 0.5, 42)
	for i := 0; i < 2000; i++ {
		if got := s.Pick(peaked, nil); got != 1 {
			t.Fatalf("draw %d: top-p 0.5 on a distribution whose top token has 0.7 picked %d", i, got)
		}
	}
	// top-p 0.8 keeps the 0.7 and 0.15 tokens, never the others, and picks
	// them in proportion 0.7 : 0.15.
	s = NewSampler(1, 0.8, 42)
	checkShares(t, "top-p 0.8", drawShares(s, peaked, 20000), []float64{0, 0.7 / 0.85, 0, 0.15 / 0.85}, 0.02)
}

// drawShares is the share of each token in n draws from logits by s.
func drawShares(s Sampler, logits []float32, n int) []float64 {
	shares := make([]float64, len(logits))
	for range n {
		shares[s.Pick(logits, nil)] += 1 / float64(n)
	}
	return shares
}

// checkShares fails the test unless each token's share of the draws is
// within tol of want's, and exactly 0 where want's is (the token is never
// drawn).
func checkShares(t *testing.T, what string, got, want []float64, tol float64) {
	t.Helper()
	for i := range want {
		if want[i] == 0 && got[i] != 0 || math.Abs(got[i]-want[i]) > tol {
			t.Errorf("%s: token %d drawn %.3f of the time, want %.3f", what, i, got[i], want[i])
		}
	}
}

// TestSamplerTemperature: draws follow softmax(logits / T), and a seed
// gives the same sequence every time.
func TestSamplerTemperature(t *testing.T) {
	probs := []float64{0.5, 0.3, 0.2}
	logits := logitsOf(probs...)
	for _, temp := range []float64{1, 2} {
		// softmax(log p / T) is p^(1/T), normalised.
		want := make([]float64, len(probs))
		var z float64
		for i, p := range probs {
			want[i] = math.Pow(p, 1/temp)
			z += want[i]
		}
		for i := range want {
			want[i] /= z
		}
		for _, topP := range []float64{0, 1} { // both keep every token
			s := NewSampler(temp, topP, 7)
			checkShares(t, fmt.Sprintf("T=%g top-p %g", temp, topP), drawShares(s, logits, 30000), want, 0.015)
		}
	}

	draw := func(seed uint64) []int32 {
		s := NewSampler(0.8, 0.95, seed)
		out := make([]int32, 300)
		for i := range out {
			out[i] = s.Pick(logits, nil)
		}
		return out
	}
	a, b, c := draw(5), draw(5), draw(6)
	if !slices.Equal(a, b) {
		t.Errorf("seed 5 gave two different sequences")
	}
	if slices.Equal(a, c) {
		t.Errorf("seeds 5 and 6 gave the same 300 draws")
	}
}

// TestGenerate checks Generate's bookkeeping on a random micro model:
// greedy generation is deterministic and independent of how prompts are
// grouped into batches, outputs respect maxNew and the context, and EOS
// is never returned.
func TestGenerate(t *testing.T) {
	mc := microConfig(16, 1)
	vals := gpt2.Init(mc, 9)
	const eos = 256
	prompts := [][]int32{{'a', 'b', '='}, {'x'}, {}, {'l', 'o', 'n', 'g', 'e', 'r', ' ', 'p', 'r', 'o', 'm', 'p', 't', '='}, {'q', '='}}
	be1, m1 := cpuModel(t, mc, vals, 1, 16)
	one, err := Generate(be1, be1.DefaultStream(), m1, prompts, 6, []int32{eos}, Sampler{})
	if err != nil {
		t.Fatal(err)
	}
	be3, m3 := cpuModel(t, mc, vals, 3, 16)
	three, err := Generate(be3, be3.DefaultStream(), m3, prompts, 6, []int32{eos}, Sampler{})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for i := range prompts {
		if !slices.Equal(one[i], three[i]) {
			t.Errorf("prompt %d: batch of 1 gave %v, batch of 3 gave %v", i, one[i], three[i])
		}
		if len(one[i]) > 6 {
			t.Errorf("prompt %d: %d new tokens, maxNew is 6", i, len(one[i]))
		}
		if slices.Contains(one[i], eos) {
			t.Errorf("prompt %d: output %v holds EOS", i, one[i])
		}
		if n := len(prompts[i]) + len(one[i]); n > 16 {
			t.Errorf("prompt %d: prompt and output are %d tokens, the model's T is 16", i, n)
		}
		total += len(one[i])
	}
	if total == 0 {
		t.Errorf("no prompt produced a token; the test sees nothing")
	}

	// A prompt at the context limit gets at most one token; each output is
	// the greedy pick at the last position, whatever maxNew.
	long := make([]int32, 40)
	for i := range long {
		long[i] = int32('a' + i%26)
	}
	out, err := Generate(be1, be1.DefaultStream(), m1, [][]int32{long}, 10, []int32{eos}, Sampler{})
	if err != nil {
		t.Fatal(err)
	}
	if len(out[0]) > 1 {
		t.Errorf("a prompt cut to T-1 tokens got %d new tokens, want at most 1", len(out[0]))
	}
}

// TestSample exports a model and samples from it, by its hf directory and
// by the training output directory holding it.
func TestSample(t *testing.T) {
	mc := microConfig(16, 1)
	out := t.TempDir()
	hf := filepath.Join(out, "hf")
	if err := gpt2.ExportHF(hf, mc, gpt2.Init(mc, 4)); err != nil {
		t.Fatal(err)
	}
	var texts []string
	for _, dir := range []string{hf, out} {
		res, err := Sample(SampleOptions{Model: dir, Prompt: "reverse abc=", MaxNew: 5, Threads: 1})
		if err != nil {
			t.Fatalf("Sample(%s): %v", dir, err)
		}
		texts = append(texts, res.Text)
	}
	if texts[0] != texts[1] {
		t.Errorf("greedy samples differ: %q vs %q", texts[0], texts[1])
	}
	a, err := Sample(SampleOptions{Model: hf, Prompt: "x", MaxNew: 8, Temperature: 1, Seed: 3, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Sample(SampleOptions{Model: hf, Prompt: "x", MaxNew: 8, Temperature: 1, Seed: 3, Threads: 1})
	if err != nil || !slices.Equal(a.IDs, b.IDs) || a.Text != b.Text {
		t.Errorf("same seed: %v then %v (%v)", a.IDs, b.IDs, err)
	}
	// The cached and the uncached paths draw the same tokens from the same
	// seed, sampling too (the logits agree to float rounding).
	c, err := Sample(SampleOptions{Model: hf, Prompt: "x", MaxNew: 8, Temperature: 1, Seed: 3, Threads: 1, NoCache: true})
	if err != nil || !slices.Equal(a.IDs, c.IDs) {
		t.Errorf("seed 3: cached %v, uncached %v (%v)", a.IDs, c.IDs, err)
	}
	if a.PromptTokens != 1 || len(a.IDs) == 0 || a.Elapsed <= 0 || a.TokensPerSecond() <= 0 {
		t.Errorf("result %+v: want 1 prompt token, some new ones and a positive time", a)
	}
	for _, tc := range []struct {
		o    SampleOptions
		want []string
	}{
		{SampleOptions{Model: t.TempDir(), Prompt: "x"}, []string{"--model", "config.json"}},
		{SampleOptions{Model: hf, Prompt: "x", TopP: 1.5}, []string{"--top-p"}},
		{SampleOptions{Model: hf, Prompt: "x", Temperature: -1}, []string{"--temperature"}},
		{SampleOptions{Model: hf, Prompt: "x", TopK: -1}, []string{"--top-k"}},
		{SampleOptions{Model: hf, Prompt: "x", RepetitionPenalty: -1}, []string{"--repetition-penalty"}},
		{SampleOptions{Model: hf, Prompt: "x", Device: "tpu"}, []string{"--device"}},
		{SampleOptions{Model: hf, Prompt: string(make([]byte, 40))}, []string{"--prompt", "32"}},
	} {
		_, err := Sample(tc.o)
		wantErr(t, err, tc.want...)
	}
}

// microConfig is a GPT-2 small enough for tests under -race; V = 257 so it
// uses the byte tokenizer.
func microConfig(C, L int) gpt2.Config {
	return gpt2.Config{V: 257, MaxT: 32, C: C, L: L, NH: 2, Eps: 1e-5}
}

// wantErr fails unless err is non-nil and its message holds every part.
func wantErr(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want one mentioning %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("error %q does not mention %q", err, p)
		}
	}
}

// TestLossNoExamples: no eval examples is NaN, not 0/0 panics or 0.
func TestLossNoExamples(t *testing.T) {
	mc := microConfig(16, 1)
	be, m := cpuModel(t, mc, gpt2.Init(mc, 1), 2, 8)
	if l, err := Loss(be, be.DefaultStream(), m, nil, Watch{}); err != nil || !math.IsNaN(l) {
		t.Fatalf("Loss of no examples = %v, %v; want NaN, nil", l, err)
	}
}

// TestSamplerTopK: top-k 1 is greedy whatever the temperature and seed;
// top-k 2 never draws outside the two most likely tokens and draws them
// in proportion; top-p then applies to the top-k tokens renormalized.
func TestSamplerTopK(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 200; trial++ {
		logits := make([]float32, 50)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64())
		}
		greedy := Sampler{}.Pick(logits, nil)
		s := NewSampler(2, 1, uint64(trial))
		s.TopK = 1
		if got := s.Pick(logits, nil); got != greedy {
			t.Fatalf("trial %d: top-k 1 picked %d, greedy %d", trial, got, greedy)
		}
	}
	p := logitsOf(0.1, 0.4, 0.2, 0.3)
	s := NewSampler(1, 1, 9)
	s.TopK = 2
	checkShares(t, "top-k 2", drawShares(s, p, 20000), []float64{0, 0.4 / 0.7, 0, 0.3 / 0.7}, 0.02)
	// Within the top 2 (0.4 and 0.3, renormalized 0.571 and 0.429), top-p
	// 0.5 keeps only the first; over all four tokens it would keep two.
	s.TopP = 0.5
	for i := 0; i < 2000; i++ {
		if got := s.Pick(p, nil); got != 1 {
			t.Fatalf("top-k 2, top-p 0.5 picked %d, want only 1", got)
		}
	}
	s.TopK, s.TopP = 0, 0.6 // 0.4 + 0.3 reach 0.6: tokens 1 and 3 only
	checkShares(t, "top-p 0.6 over 0.1, 0.4, 0.2, 0.3", drawShares(s, p, 20000), []float64{0, 0.4 / 0.7, 0, 0.3 / 0.7}, 0.02)
}

// TestSamplerRepetitionPenalty: HF's definition, a logit of a token in the
// context divided by the penalty when positive and multiplied when
// negative, once however often the token occurs; the caller's logits are
// not written.
func TestSamplerRepetitionPenalty(t *testing.T) {
	logits := []float32{3, 2.5, -1, -0.5, 0}
	s := Sampler{RepetitionPenalty: 2}
	got := s.penalized(logits, []int32{0, 0, 2, 4, 4})
	want := []float32{1.5, 2.5, -2, -0.5, 0}
	if !slices.Equal(got, want) {
		t.Errorf("penalized = %v, want %v", got, want)
	}
	if logits[0] != 3 {
		t.Errorf("the caller's logits were written: %v", logits)
	}
	// Greedy: 3/2 falls below 2.5, so token 1 wins; without the context
	// token 0 does.
	if g := s.Pick(logits, []int32{0}); g != 1 {
		t.Errorf("greedy with token 0 penalized picked %d, want 1", g)
	}
	if g := s.Pick(logits, nil); g != 0 {
		t.Errorf("greedy with no context picked %d, want 0", g)
	}
	// A negative logit moves further down: token 3's -0.5 becomes -1, a
	// tie with tokens 0 and 2 that the lowest id wins.
	if g := (Sampler{RepetitionPenalty: 2}).Pick([]float32{-1, -3, -1, -0.5}, []int32{3}); g != 0 {
		t.Errorf("picked %d, want 0", g)
	}
	for _, p := range []float64{0, 1} {
		if g := (Sampler{RepetitionPenalty: p}).penalized(logits, []int32{0}); &g[0] != &logits[0] {
			t.Errorf("penalty %g changed the logits", p)
		}
	}
}
