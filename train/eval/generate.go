// Text generation from a model: greedy, temperature, top-k, nucleus
// (top-p) sampling and the repetition penalty. Generate runs a batch of
// prompts at a time without a cache: each new token reruns the forward
// pass over the rows. It is the reference GenerateCached (kvgen.go) is
// tested against, and the path for a model without a decoder.

package eval

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// Sampler picks the next token from logits, as transformers' generate
// does with these settings: the repetition penalty first, then greedy
// (temperature 0) or sampling from softmax(logits / Temperature) after
// top-k, then top-p.
type Sampler struct {
	Temperature float64 // 0: greedy
	TopK        int     // keep the k most likely tokens; 0 keeps every token
	TopP        float64 // in (0, 1]; 1 or 0 keeps every token
	// RepetitionPenalty, HF's: the logit of a token already in the
	// context is divided by it when positive and multiplied by it when
	// negative. 0 or 1: none.
	RepetitionPenalty float64
	RNG               *rand.Rand
}

// NewSampler returns a sampler with its own seeded RNG; temperature 0 is
// greedy.
func NewSampler(temperature, topP float64, seed uint64) Sampler {
	return Sampler{Temperature: temperature, TopP: topP, RNG: rand.New(rand.NewPCG(seed, 0x5a3d))}
}

// penalized is logits after the repetition penalty on the tokens of
// context (a copy; logits itself is not written).
func (s Sampler) penalized(logits []float32, context []int32) []float32 {
	if s.RepetitionPenalty == 0 || s.RepetitionPenalty == 1 || len(context) == 0 {
		return logits
	}
	out := slices.Clone(logits)
	p := float32(s.RepetitionPenalty)
	for _, id := range context {
		if id < 0 || int(id) >= len(out) {
			continue
		}
		// From the original logit, so a token seen twice is penalized
		// once (HF gathers, then scatters).
		if v := logits[id]; v < 0 {
			out[id] = v * p
		} else {
			out[id] = v / p
		}
	}
	return out
}

// Pick returns the next token id after context (the prompt and the
// tokens generated so far, which the repetition penalty reads).
func (s Sampler) Pick(logits []float32, context []int32) int32 {
	logits = s.penalized(logits, context)
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	if s.Temperature <= 0 || s.RNG == nil {
		return int32(best)
	}
	probs := make([]float64, len(logits))
	for i, v := range logits {
		probs[i] = math.Exp(float64(v-logits[best]) / s.Temperature)
	}
	idx := make([]int, len(probs))
	for i := range idx {
		idx[i] = i
	}
	// Most likely first; ties keep the lower id first, so top-k keeps
	// exactly k tokens (HF keeps every token tied with the k-th).
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case probs[a] > probs[b]:
			return -1
		case probs[a] < probs[b]:
			return 1
		}
		return 0
	})
	keep := len(idx)
	if s.TopK > 0 {
		keep = min(keep, s.TopK)
	}
	var total float64
	for _, i := range idx[:keep] {
		total += probs[i]
	}
	if s.TopP > 0 && s.TopP < 1 {
		// The smallest prefix whose probability, renormalized over the
		// top-k tokens, reaches TopP.
		var acc float64
		for k, i := range idx[:keep] {
			acc += probs[i] / total
			if acc >= s.TopP {
				keep = k + 1
				break
			}
		}
		total = 0
		for _, i := range idx[:keep] {
			total += probs[i]
		}
	}
	r := s.RNG.Float64() * total
	for _, i := range idx[:keep] {
		r -= probs[i]
		if r <= 0 {
			return int32(i)
		}
	}
	return int32(idx[keep-1])
}

// errNoStop refuses a generation without a stop id.
var errNoStop = errors.New("generate: no stop id (the EOS at least)")

// Generate continues each prompt until one of the stop ids (a
// tokenizer's tokenizer.StopIDs: its EOS first, then Llama 3's
// <|eot_id|> and the like), maxNew tokens, or the model's batch length T,
// and returns the new tokens (without the stop id). stop[0] also pads the
// batch and stands for an empty prompt. Prompts longer than T-1 keep
// their last T-1 tokens.
func Generate(be backend.Backend, s backend.Stream, m Model, prompts [][]int32, maxNew int, stop []int32, smp Sampler) ([][]int32, error) {
	if len(stop) == 0 {
		return nil, errNoStop
	}
	eos := stop[0]
	B, T, V := m.B, m.T, m.Spec.VocabSize()
	buf := m.Buffers()
	out := make([][]int32, len(prompts))
	host, err := be.AllocHost("generate logits", B*V*4)
	if err != nil {
		return nil, err
	}
	defer be.FreeHost(host)
	inputs := make([]int32, B*T)
	for lo := 0; lo < len(prompts); lo += B {
		hi := min(lo+B, len(prompts))
		rows := make([][]int32, hi-lo)
		done := make([]bool, hi-lo)
		for r := range rows {
			p := prompts[lo+r]
			if len(p) > T-1 {
				p = p[len(p)-(T-1):]
			}
			if len(p) == 0 {
				p = []int32{eos}
			}
			rows[r] = slices.Clone(p)
		}
		for step := 0; step < maxNew; step++ {
			active := 0
			for r, row := range rows {
				if !done[r] && len(row) < T+1 {
					active++
				}
			}
			if active == 0 {
				break
			}
			for i := range inputs {
				inputs[i] = eos
			}
			for r, row := range rows {
				copy(inputs[r*T:(r+1)*T], row[:min(len(row), T)])
			}
			if err := model.UploadBatch(be, s, buf, T, inputs, nil, nil); err != nil {
				return nil, fmt.Errorf("generate: %w", err)
			}
			if err := m.Forward(s); err != nil {
				return nil, fmt.Errorf("generate: %w", err)
			}
			for r, row := range rows {
				if done[r] {
					continue
				}
				pos := len(row) - 1
				row := buf.Logits.Slice((r*T+pos)*V, V)
				if err := be.CopyD2H(s, host, r*int(row.Bytes()), row); err != nil {
					return nil, fmt.Errorf("generate: %w", err)
				}
			}
			if err := be.Synchronize(s); err != nil {
				return nil, fmt.Errorf("generate: %w", err)
			}
			logits := host.Float32()
			if buf.Logits.DType == backend.BF16 {
				logits = make([]float32, B*V)
				bf16.ToFloat32Slice(logits, host.BF16())
			}
			for r := range rows {
				if done[r] {
					continue
				}
				tok := smp.Pick(logits[r*V:(r+1)*V], rows[r])
				if slices.Contains(stop, tok) {
					done[r] = true
					continue
				}
				rows[r] = append(rows[r], tok)
				out[lo+r] = append(out[lo+r], tok)
				if len(rows[r]) >= T {
					done[r] = true
				}
			}
		}
	}
	return out, nil
}
