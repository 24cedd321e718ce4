// The parameter layout and train/model's Arch and Spec for a Config.

package llama

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// Matrix names one of a block's seven weight matrices.
type Matrix int

// The matrices of a block, in forward order.
const (
	MatQ    Matrix = iota // self_attn.q_proj: C x NH*HS
	MatK                  // self_attn.k_proj: C x KVH*HS
	MatV                  // self_attn.v_proj: C x KVH*HS
	MatO                  // self_attn.o_proj: NH*HS x C
	MatGate               // mlp.gate_proj: C x I
	MatUp                 // mlp.up_proj: C x I
	MatDown               // mlp.down_proj: I x C
)

// NumMatrices is the number of weight matrices of a block.
const NumMatrices = 7

var matrixNames = [NumMatrices]string{"q", "k", "v", "o", "gate", "up", "down"}

func (k Matrix) String() string {
	if k >= 0 && k < NumMatrices {
		return matrixNames[k]
	}
	return fmt.Sprintf("Matrix(%d)", int(k))
}

// A block's parameters, in Layout order: the input norm, q, k, v, o, the
// post-attention norm, gate, up, down, then (Qwen2, QKVBias only) the q, k
// and v biases. The biases come last so that a LLaMA's layout is the same
// with or without them in the code.
const (
	slotInNorm = iota
	slotQ
	slotK
	slotV
	slotO
	slotPostNorm
	slotGate
	slotUp
	slotDown
	slotQBias
	slotKBias
	slotVBias
	maxSlots // a block's parameters with the biases
)

// perLayer is the number of parameters of a block: 12 with the q, k and v
// biases, 9 without.
func (c Config) perLayer() int {
	if c.QKVBias {
		return maxSlots
	}
	return slotQBias
}

// biasSlot is the slot of the bias of matrix k (q, k or v), and whether it
// has one.
func (c Config) biasSlot(k Matrix) (int, bool) {
	if !c.QKVBias {
		return 0, false
	}
	switch k {
	case MatQ:
		return slotQBias, true
	case MatK:
		return slotKBias, true
	case MatV:
		return slotVBias, true
	}
	return 0, false
}

// matrixSlot is each matrix's index among its block's parameters.
var matrixSlot = [NumMatrices]int{slotQ, slotK, slotV, slotO, slotGate, slotUp, slotDown}

// matrixInput is the block input each matrix reads (model.Matrix.Input): q, k
// and v read the normed residual, o the attention output, gate and up the
// second normed residual, down the SwiGLU output. Matrices that share an input
// share LSP's projector P (docs/DESIGN.md, "LSP as implemented").
var matrixInput = [NumMatrices]int{0, 0, 0, 1, 2, 2, 3}

// NumInputs is the number of matrix inputs of a block.
const NumInputs = 4

// blockName is the HF name of each block parameter, after
// "model.layers.<l>.".
var blockName = [maxSlots]string{
	"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
	"self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
	"mlp.down_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
}

// Widths of the attention's tensors per position.
func (c Config) qWidth() int   { return c.Heads * c.HS() }
func (c Config) kvWidth() int  { return c.KVHeads * c.HS() }
func (c Config) qkvWidth() int { return c.qWidth() + 2*c.kvWidth() }

// MatrixShape is matrix k's shape, in x out (HF's Linear stores out x in:
// the layout's matrices are Transposed).
func (c Config) MatrixShape(k Matrix) (m, n int) {
	C, I := c.Hidden, c.Intermediate
	switch k {
	case MatQ:
		return C, c.qWidth()
	case MatK, MatV:
		return C, c.kvWidth()
	case MatO:
		return c.qWidth(), C
	case MatGate, MatUp:
		return C, I
	case MatDown:
		return I, C
	}
	return 0, 0
}

// MatrixParam is the index into Layout() of matrix k of layer l.
func (c Config) MatrixParam(l int, k Matrix) int { return 1 + l*c.perLayer() + matrixSlot[k] }

// Matrices lists a block's seven matrices for model.Arch.
func (c Config) Matrices() []model.Matrix {
	ms := make([]model.Matrix, NumMatrices)
	for k := range Matrix(NumMatrices) {
		m, n := c.MatrixShape(k)
		ms[k] = model.Matrix{Name: k.String(), Slot: matrixSlot[k], M: m, N: n, Input: matrixInput[k]}
	}
	return ms
}

// isMatrix reports whether Layout() entry i is a block's weight matrix.
func (c Config) isMatrix(i int) bool {
	if i < 1 || i >= 1+c.NumLayers*c.perLayer() {
		return false
	}
	j := (i - 1) % c.perLayer()
	return j >= slotQ && j <= slotDown && j != slotPostNorm
}

// isBias reports whether Layout() entry i is a q, k or v bias.
func (c Config) isBias(i int) bool {
	if !c.QKVBias || i < 1 || i >= 1+c.NumLayers*c.perLayer() {
		return false
	}
	return (i-1)%c.perLayer() >= slotQBias
}

// Layers is the number of blocks (model.Arch).
func (c Config) Layers() int { return c.NumLayers }

// Layout lists every parameter in allocation order with Hugging Face's
// names: the token embedding, each block's tensors together, the final
// norm, then the LM head unless it is tied to the embedding. The block
// matrices are stored in x out (Transposed: HF stores out x in). The head
// is stored as HF does, V x C (logits = h head^T, the same product as a
// tied head's with the embedding), so it is not Transposed.
func (c Config) Layout() []model.Param {
	var ps []model.Param
	off, layer := 0, -1
	add := func(name string, decay, transposed bool, shape ...int) {
		p := model.Param{Name: name, Shape: shape, Offset: off, Decay: decay, Layer: layer, Transposed: transposed}
		off += p.Len()
		ps = append(ps, p)
	}
	// pass says which backward passes outside the blocks write the
	// gradient of the tensor added last (model.Param.Backward).
	pass := func(b model.Pass) { ps[len(ps)-1].Backward = b }
	C := c.Hidden
	add("model.embed_tokens.weight", true, false, c.Vocab, C)
	if c.Tied {
		pass(model.ByHead | model.ByEmbed)
	} else {
		pass(model.ByEmbed)
	}
	for l := 0; l < c.NumLayers; l++ {
		layer = l
		pre := fmt.Sprintf("model.layers.%d.", l)
		for slot, name := range blockName[:c.perLayer()] {
			switch slot {
			case slotInNorm, slotPostNorm:
				add(pre+name, false, false, C)
				continue
			case slotQBias:
				add(pre+name, false, false, c.qWidth())
				continue
			case slotKBias, slotVBias:
				add(pre+name, false, false, c.kvWidth())
				continue
			}
			k := Matrix(0)
			for k = range Matrix(NumMatrices) {
				if matrixSlot[k] == slot {
					break
				}
			}
			m, n := c.MatrixShape(k)
			add(pre+name, true, true, m, n)
		}
	}
	layer = -1
	add("model.norm.weight", false, false, C)
	pass(model.ByHead)
	if !c.Tied {
		add("lm_head.weight", true, false, c.Vocab, C)
		pass(model.ByHead)
	}
	return ps
}

// NumParams is the number of parameter elements, computed without the
// layout.
func (c Config) NumParams() int {
	C, I := c.Hidden, c.Intermediate
	block := 2*C + C*c.qWidth() + 2*C*c.kvWidth() + c.qWidth()*C + 3*C*I
	if c.QKVBias {
		block += c.qkvWidth()
	}
	n := c.Vocab*C + c.NumLayers*block + C
	if !c.Tied {
		n += c.Vocab * C
	}
	return n
}

// Family names the family (model.Spec).
func (c Config) Family() string { return "llama" }

// MaxSeqLen is the longest sequence the model takes: its context, or a
// shorter sliding window.
func (c Config) MaxSeqLen() int {
	if c.SlidingWindow > 0 {
		return min(c.MaxPos, c.SlidingWindow)
	}
	return c.MaxPos
}

// VocabSize is the number of token ids (model.Spec).
func (c Config) VocabSize() int { return c.Vocab }

// Describe is the log line's view of the architecture.
func (c Config) Describe() []any {
	rope := "default"
	if r := c.RopeScaling; r != nil {
		rope = fmt.Sprintf("%s x%g", r.Type, r.Factor)
	}
	return []any{"layers", c.NumLayers, "hidden", c.Hidden, "intermediate", c.Intermediate,
		"heads", c.Heads, "kv_heads", c.KVHeads, "head_dim", c.HS(), "vocab", c.Vocab, "context", c.MaxPos,
		"rope_theta", c.RopeTheta, "rope_scaling", rope, "tied", c.Tied, "qkv_bias", c.QKVBias, "params", c.NumParams()}
}

// Init returns transformers' initialisation of LlamaForCausalLM, drawn
// from seed (InitEach's values in one slice).
func (c Config) Init(seed uint64) []float32 {
	vals := make([]float32, c.NumParams())
	_ = c.InitEach(seed, func(p model.Param, v []float32) error { // fn never fails
		copy(vals[p.Offset:], v)
		return nil
	})
	return vals
}

// InitEach is Init parameter by parameter (model.Spec): every matrix, the
// embedding and the head N(0, initializer_range), the RMSNorm weights 1,
// the q, k and v biases 0 (transformers' Linear bias init),
// drawn from one generator in Layout order, so the values do not depend
// on how they are consumed.
func (c Config) InitEach(seed uint64, fn func(p model.Param, v []float32) error) error {
	rng := rand.New(rand.NewPCG(seed, 0x6c6c_616d_61))
	buf := model.InitBuffer(c)
	std := c.initRange()
	for _, p := range c.Layout() {
		v := buf[:p.Len()]
		switch {
		case strings.HasSuffix(p.Name, ".bias"):
			clear(v)
		case len(p.Shape) == 1:
			for i := range v {
				v[i] = 1
			}
		default:
			for i := range v {
				v[i] = float32(rng.NormFloat64() * std)
			}
		}
		if err := fn(p, v); err != nil {
			return err
		}
	}
	return nil
}

// Config is the model contract's Arch and Spec.
var (
	_ model.Arch        = Config{}
	_ model.Spec        = Config{}
	_ model.DecoderSpec = Config{}
)

// NewModel is New for model.Arch.
func (c Config) NewModel(be backend.Backend, B, T int, dt backend.DType, opts model.Options) (model.Model, error) {
	m, err := New(be, c, B, T, dt, opts)
	if err != nil {
		return nil, err // not a nil *Model in a non-nil interface
	}
	return m, nil
}
