// Generation with a KV cache (model.Decoder): the prompt is run a token
// at a time into the cache, then each new token costs one position's
// forward pass instead of the whole sequence's. Its greedy output equals
// Generate's token for token (tested on both families); prompts and
// limits are treated as Generate treats them, with the decoder's MaxT as
// the context.

package eval

import (
	"fmt"
	"slices"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/bf16"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// Generator continues prompts with a decoder, reusing its host buffer
// across calls.
type Generator struct {
	be   backend.Backend
	s    backend.Stream
	dec  model.Decoder
	host backend.HostBuffer
	tok  []int32
}

// NewGenerator returns a generator over dec on be's stream s; Close it
// before freeing dec.
func NewGenerator(be backend.Backend, s backend.Stream, dec model.Decoder) (*Generator, error) {
	host, err := be.AllocHost("generate logits", int(dec.Logits().Bytes()))
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	return &Generator{be: be, s: s, dec: dec, host: host, tok: make([]int32, 1)}, nil
}

// Close frees the generator's host buffer.
func (g *Generator) Close() {
	if g.host != nil {
		g.be.FreeHost(g.host)
		g.host = nil
	}
}

// step runs token tok at position pos.
func (g *Generator) step(tok int32, pos int) error {
	g.tok[0] = tok
	if err := backend.UploadInt32(g.be, g.s, g.dec.Token(), g.tok); err != nil {
		return err
	}
	return g.dec.Step(g.s, pos)
}

// logits downloads the logits of the last step.
func (g *Generator) logits() ([]float32, error) {
	lg := g.dec.Logits()
	if err := g.be.CopyD2H(g.s, g.host, 0, lg); err != nil {
		return nil, err
	}
	if err := g.be.Synchronize(g.s); err != nil {
		return nil, err
	}
	if lg.DType == backend.BF16 {
		out := make([]float32, lg.Len())
		bf16.ToFloat32Slice(out, g.host.BF16()[:lg.Len()])
		return out, nil
	}
	return g.host.Float32()[:lg.Len()], nil
}

// Generate continues prompt until a stop id (see Generate), maxNew
// tokens, or the decoder's MaxT positions, and returns the new tokens
// (without the stop id). A prompt longer than MaxT-1 keeps its last MaxT-1
// tokens; an empty one is stop[0], the EOS.
func (g *Generator) Generate(prompt []int32, maxNew int, stop []int32, smp Sampler) ([]int32, error) {
	if len(stop) == 0 {
		return nil, errNoStop
	}
	eos := stop[0]
	T := g.dec.MaxT()
	if len(prompt) > T-1 {
		prompt = prompt[len(prompt)-(T-1):]
	}
	if len(prompt) == 0 {
		prompt = []int32{eos}
	}
	seq := slices.Clone(prompt)
	for pos, tok := range seq {
		if err := g.step(tok, pos); err != nil {
			return nil, fmt.Errorf("generate, prompt: %w", err)
		}
	}
	var out []int32
	for len(out) < maxNew {
		logits, err := g.logits()
		if err != nil {
			return nil, fmt.Errorf("generate: %w", err)
		}
		tok := smp.Pick(logits, seq)
		if slices.Contains(stop, tok) {
			break
		}
		seq = append(seq, tok)
		out = append(out, tok)
		if len(seq) >= T || len(out) == maxNew {
			break
		}
		if err := g.step(tok, len(seq)-1); err != nil {
			return nil, fmt.Errorf("generate: %w", err)
		}
	}
	return out, nil
}

// GenerateCached is Generate (the uncached one) through m's KV-cache
// decoder with a context of m.T, one prompt after another. It falls back
// to Generate when m has no decoder or the decoder cannot be allocated
// (a device budget planned for training alone): both give the same greedy
// tokens, the cache only sooner.
func GenerateCached(be backend.Backend, s backend.Stream, m Model, prompts [][]int32, maxNew int, stop []int32, smp Sampler) ([][]int32, error) {
	c, ok := m.Model.(model.Cached)
	if !ok {
		return Generate(be, s, m, prompts, maxNew, stop, smp)
	}
	dec, err := c.NewDecoder(m.T)
	if err != nil {
		return Generate(be, s, m, prompts, maxNew, stop, smp)
	}
	defer dec.Free()
	g, err := NewGenerator(be, s, dec)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	outs := make([][]int32, len(prompts))
	for i, p := range prompts {
		if outs[i], err = g.Generate(p, maxNew, stop, smp); err != nil {
			return nil, fmt.Errorf("prompt %d: %w", i, err)
		}
	}
	return outs, nil
}
