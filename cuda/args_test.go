//go:build cuda || cudasim

// The argument checks of the ops LLaMA added (grouped-query attention and
// its layouts, SwiGLU, RMSNorm, RoPE): refused at enqueue with the CPU
// backend's reasons (train/cpu/args_test.go), before anything reaches a
// launcher.

package cuda

import (
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

func TestArgumentErrors(t *testing.T) {
	be := newBE(t, Config{})
	s := be.DefaultStream()
	f := func(n int) backend.Tensor { return alloc(t, be, "f", n, backend.F32) }
	h := func(n int) backend.Tensor { return alloc(t, be, "h", n, backend.BF16) }
	for _, c := range []struct {
		name string
		err  error
		want []string
	}{
		{"attention KVH does not divide NH", be.AttentionForward(s, h(12), f(3), h(24), backend.Tensor{}, 1, 1, 3, 2, 4, backend.QKVPlanar),
			[]string{"AttentionForward", "NH=3 query heads not a positive multiple of KVH=2"}},
		{"attention NH = 0", be.AttentionBackward(s, h(10), h(10), h(10), h(10), f(10), backend.Tensor{}, f(10), 1, 1, 0, 1, 10, backend.QKVFused),
			[]string{"AttentionBackward", "NH=0"}},
		{"attention KVH = 0", be.AttentionForward(s, h(2), f(2), h(2), backend.Tensor{}, 1, 1, 2, 0, 1, backend.QKVFused), []string{"KVH=0"}},
		{"attention unknown layout", be.AttentionForward(s, h(1), f(1), h(3), backend.Tensor{}, 1, 1, 1, 1, 1, backend.QKVLayout(7)),
			[]string{"unknown qkv layout QKVLayout(7)"}},
		{"attention negative B", be.AttentionForward(s, h(1), f(1), h(3), backend.Tensor{}, -1, 1, 1, 1, 1, backend.QKVFused), []string{"B=-1"}},
		// MQA: q 4*2, k and v 1*2 each per position.
		{"attention qkv of MHA's size under MQA", be.AttentionForward(s, h(8), f(4), h(24), backend.Tensor{}, 1, 1, 4, 1, 2, backend.QKVPlanar),
			[]string{"qkv has 24 elements, want 12"}},
		{"attention dqkv short", be.AttentionBackward(s, h(11), h(8), h(12), h(8), f(4), backend.Tensor{}, f(4), 1, 1, 4, 1, 2, backend.QKVFused),
			[]string{"dqkv has 11 elements, want 12"}},
		{"attention backward scratch short", be.AttentionBackward(s, h(12), h(8), h(12), h(8), f(4), backend.Tensor{}, f(3), 1, 1, 4, 1, 2, backend.QKVFused),
			[]string{"scratch has 3 elements, the op needs 4"}},
		{"swiglu length", be.SwiGLUForward(s, f(10), f(10), f(9)), []string{"SwiGLUForward", "up has 9 elements, want 10"}},
		{"swiglu backward mixed values", be.SwiGLUBackward(s, f(4), f(4), f(4), h(4), f(4)),
			[]string{"SwiGLUBackward(", "gate, up must share one dtype"}},
		{"rmsnorm negative N", be.RMSNormForward(s, f(4), f(1), f(4), f(4), -1, 4, 1e-5), []string{"N=-1"}},
		{"rmsnorm weight length", be.RMSNormForward(s, f(8), f(2), f(8), f(3), 2, 4, 1e-5), []string{"weight has 3 elements, want 4"}},
		{"rmsnorm bf16 rstd", be.RMSNormForward(s, h(8), h(2), h(8), h(4), 2, 4, 1e-5), []string{"rstd must be fp32"}},
		{"rmsnorm backward scratch short", be.RMSNormBackward(s, f(8), f(4), f(8), f(8), f(4), f(2), f(1), 2, 4),
			[]string{"RMSNormBackward", "scratch has 1 elements, the op needs 4 (backend.RMSNormBackwardScratch)"}},
		{"rope odd head size", be.RoPEForward(s, f(6), f(6), backend.Tensor{}, f(1), 1, 2, 1, 3), []string{"RoPEForward", "head size HS=3 is odd"}},
		{"rope invFreq length", be.RoPEBackward(s, f(16), f(16), backend.Tensor{}, f(3), 1, 2, 1, 8), []string{"RoPEBackward", "invFreq has 3 elements, want 4"}},
		{"rope bf16 invFreq", be.RoPEForward(s, h(16), h(16), backend.Tensor{}, h(4), 1, 2, 1, 8), []string{"invFreq must be fp32"}},
		{"rope mixed dtypes", be.RoPEForward(s, f(16), h(16), backend.Tensor{}, f(4), 1, 2, 1, 8), []string{"out, inp must share one dtype"}},
	} {
		wantErr(t, c.name, c.err, c.want...)
	}
	ok(t, be.Synchronize(s)) // nothing was enqueued, so nothing failed
}
