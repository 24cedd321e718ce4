// Text generation from a model: greedy, temperature and nucleus (top-p)
// sampling, a batch of prompts at a time. There is no KV cache: each new
// token reruns the forward pass over the rows, which is fine for evaluation
// and sampling from small models but not a serving path.

package eval

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
)

// Sampler picks the next token from logits.
type Sampler struct {
	Temperature float64 // 0: greedy
	TopP        float64 // in (0, 1]; 1 or 0 keeps every token
	RNG         *rand.Rand
}

// NewSampler returns a sampler with its own seeded RNG; temperature 0 is
// greedy.
func NewSampler(temperature, topP float64, seed uint64) Sampler {
	return Sampler{Temperature: temperature, TopP: topP, RNG: rand.New(rand.NewPCG(seed, 0x5a3d))}
}

// Pick returns the next token id.
func (s Sampler) Pick(logits []float32) int32 {
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
	var sum float64
	for i, v := range logits {
		probs[i] = math.Exp(float64(v-logits[best]) / s.Temperature)
		sum += probs[i]
	}
	idx := make([]int, len(probs))
	for i := range idx {
		idx[i] = i
	}
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
	if s.TopP > 0 && s.TopP < 1 {
		var acc float64
		for k, i := range idx {
			acc += probs[i] / sum
			if acc >= s.TopP {
				keep = k + 1
				break
			}
		}
	}
	var total float64
	for _, i := range idx[:keep] {
		total += probs[i]
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

// Generate continues each prompt until EOS, maxNew tokens, or the model's
// batch length T, and returns the new tokens (without the EOS). Prompts
// longer than T-1 keep their last T-1 tokens.
func Generate(be backend.Backend, s backend.Stream, m Model, prompts [][]int32, maxNew int, eos int32, smp Sampler) ([][]int32, error) {
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
			if err := backend.UploadInt32(be, s, buf.Inputs, inputs); err != nil {
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
				tok := smp.Pick(logits[r*V : (r+1)*V])
				if tok == eos {
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
