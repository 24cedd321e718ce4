// The part of a family's decoder (model.Decoder) that does not depend on
// the family: its cache, the allocations it frees, the token and logits
// tensors the generator reads and writes, and its position budget.

package kvcache

import "github.com/lsp-offload/lsp-offload/train/backend"

// Buffers are a decoder's cache and allocations; a family's decoder
// embeds them and answers Token, Logits, MaxT and Free through them.
type Buffers struct {
	Be        backend.Backend
	Cache     *Cache
	Positions int // the positions the decoder was allocated for

	Acts, Stats, Tok backend.Tensor // the allocations besides the cache
	Lgts             backend.Tensor // [1, V], a view of Acts
}

// Token is the I32 [1] tensor the next token id is uploaded into.
func (b *Buffers) Token() backend.Tensor { return b.Tok }

// Logits is the [1, V] tensor a step writes.
func (b *Buffers) Logits() backend.Tensor { return b.Lgts }

// MaxT is the number of positions the decoder holds.
func (b *Buffers) MaxT() int { return b.Positions }

// Free releases the cache and the allocations; it may be called again,
// and on a decoder whose allocation failed part way.
func (b *Buffers) Free() {
	if b.Cache != nil {
		b.Cache.Free()
		b.Cache = nil
	}
	for _, t := range []backend.Tensor{b.Acts, b.Stats, b.Tok} {
		if t.Buf != nil {
			b.Be.Free(t)
		}
	}
	b.Acts, b.Stats, b.Tok = backend.Tensor{}, backend.Tensor{}, backend.Tensor{}
}
