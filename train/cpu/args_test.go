// Tests that bad arguments are returned as errors when an op is enqueued,
// naming what is wrong, and never panic or reach the stream: wrong lengths
// and dtypes, views outside or not of this backend's live buffers, sizes
// that are negative or do not divide, and use after Close.

package cpu

import (
	"strings"
	"testing"
	"time"

	"github.com/lsp-offload/lsp-offload/train/backend"
)

// argEnv holds valid tensors for the cases to misuse.
type argEnv struct {
	f10, f9, g10 backend.Tensor // F32 [10], F32 [9], F32 [10]
	h10          backend.Tensor // BF16 [10]
	i10          backend.Tensor // I32 [10]
	one          backend.Tensor // F32 [1]
	lns          backend.Tensor // F32 [20]: layernorm scratch for N=1, C=10
	work, w10    backend.Tensor // F64 [SumSquaresWork], F64 [10]
	freed        backend.Tensor // F32 [10], freed
	foreign      backend.Tensor // F32 [10] of another backend
	host         backend.HostBuffer
	other        *Backend
}

func TestArgumentErrors(t *testing.T) {
	s := func(be *Backend) backend.Stream { return be.DefaultStream() }
	adam := backend.AdamParams{LR: 1e-3, Beta1: 0.9, Beta2: 0.99, Step: 1}
	cases := []struct {
		name string
		call func(be *Backend, x argEnv) error
		want string // a substring of the error
	}{
		{"add length", func(be *Backend, x argEnv) error { return be.Add(s(be), x.f10, x.g10, x.f9) }, "b has 9 elements, want 10"},
		{"accumulate length", func(be *Backend, x argEnv) error { return be.Accumulate(s(be), x.f9, x.f10) }, "src has 10 elements"},
		{"fill int tensor", func(be *Backend, x argEnv) error { return be.Fill(s(be), x.i10, 1) }, "dtype i32"},
		{"unknown dtype", func(be *Backend, x argEnv) error {
			return be.Scale(s(be), backend.Tensor{Buf: x.f10.Buf, Shape: []int{4}, DType: 9}, 2)
		}, "dtype"},
		{"negative shape", func(be *Backend, x argEnv) error {
			return be.Fill(s(be), backend.Tensor{Buf: x.f10.Buf, Shape: []int{-2}, DType: backend.F32}, 1)
		}, "shape"},
		{"view past the end", func(be *Backend, x argEnv) error { return be.Fill(s(be), x.f10.Slice(8, 4), 1) }, "outside"},
		{"negative offset", func(be *Backend, x argEnv) error { return be.Fill(s(be), x.f10.Slice(-1, 2), 1) }, "outside"},
		{"nil buffer", func(be *Backend, x argEnv) error {
			return be.Fill(s(be), backend.Tensor{Shape: []int{1}, DType: backend.F32}, 1)
		}, "not a CPU buffer"},
		{"freed buffer", func(be *Backend, x argEnv) error { return be.Fill(s(be), x.freed, 1) }, "freed"},
		{"foreign buffer", func(be *Backend, x argEnv) error { return be.Add(s(be), x.f10, x.g10, x.foreign) }, "another backend"},
		{"encoder ids not i32", func(be *Backend, x argEnv) error {
			return be.EncoderForward(s(be), x.f10, x.g10, backend.Tensor{}, x.f10, x.f10, 1, 10, 1)
		}, "inp has dtype fp32"},
		{"encoder C = 0", func(be *Backend, x argEnv) error {
			return be.EncoderForward(s(be), x.f10, x.i10, backend.Tensor{}, x.f10, x.f10, 1, 10, 0)
		}, "C=0"},
		{"encoder negative B, T", func(be *Backend, x argEnv) error {
			return be.EncoderForward(s(be), x.one, x.one.Reshape(1), backend.Tensor{}, x.one, x.f10.Slice(0, 0), -1, -1, 1)
		}, "B=-1"},
		{"encoder backward C = 0", func(be *Backend, x argEnv) error {
			return be.EncoderBackward(s(be), x.f10, x.f10, x.f10, x.i10, backend.Tensor{}, 1, 10, 0)
		}, "C=0"},
		{"encoder wte not V x C", func(be *Backend, x argEnv) error {
			return be.EncoderForward(s(be), x.f10, x.i10.Slice(0, 5), backend.Tensor{}, x.f9, x.f10, 1, 5, 2)
		}, "do not fit"},
		{"layernorm weight", func(be *Backend, x argEnv) error {
			return be.LayerNormForward(s(be), x.f10, x.one, x.one, x.f10, x.f9, x.f10, 1, 10, 1e-5)
		}, "weight has 9 elements"},
		{"layernorm backward rstd", func(be *Backend, x argEnv) error {
			return be.LayerNormBackward(s(be), x.f10, x.f10, x.f10, x.f10, x.f10, x.f10, x.one, x.f9, x.lns, 1, 10)
		}, "rstd has 9 elements"},
		{"layernorm backward scratch short", func(be *Backend, x argEnv) error {
			return be.LayerNormBackward(s(be), x.f10, x.f10, x.f10, x.f10, x.f10, x.f10, x.one, x.one, x.f10, 1, 10)
		}, "scratch has 10 elements, the op needs 20 (backend.LayerNormBackwardScratch)"},
		{"layernorm backward scratch bf16", func(be *Backend, x argEnv) error {
			return be.LayerNormBackward(s(be), x.f10, x.f10, x.f10, x.f10, x.f10, x.f10, x.one, x.one, x.h10, 1, 10)
		}, "layernorm backward: scratch has dtype bf16, want fp32"},
		{"layernorm backward scratch absent", func(be *Backend, x argEnv) error {
			return be.LayerNormBackward(s(be), x.f10, x.f10, x.f10, x.f10, x.f10, x.f10, x.one, x.one, backend.Tensor{}, 1, 10)
		}, "layernorm backward scratch"},
		{"gemm A length", func(be *Backend, x argEnv) error {
			return be.Gemm(s(be), false, false, 2, 5, 5, 1, x.f9, x.h10, 0, x.g10)
		}, "A has 9 elements"},
		{"gemm negative sizes", func(be *Backend, x argEnv) error {
			return be.Gemm(s(be), false, false, -1, -1, -1, 1, x.one, x.one, 0, x.one)
		}, "M=-1"},
		{"add bias length", func(be *Backend, x argEnv) error { return be.AddBias(s(be), x.f10, x.f9, 2, 5) }, "bias has 9"},
		{"bias backward length", func(be *Backend, x argEnv) error { return be.BiasBackward(s(be), x.f10.Slice(0, 5), x.f9, 2, 5) }, "dout has 9"},
		{"attention KVH does not divide NH", func(be *Backend, x argEnv) error {
			return be.AttentionForward(s(be), x.f10, x.f10, x.f10, backend.Tensor{}, 1, 1, 3, 2, 1, backend.QKVPlanar)
		}, "NH=3 query heads not a positive multiple of KVH=2"},
		{"attention NH = 0", func(be *Backend, x argEnv) error {
			return be.AttentionBackward(s(be), x.f10, x.f10, x.f10, x.f10, x.f10, backend.Tensor{}, x.f10, 1, 1, 0, 1, 10, backend.QKVFused)
		}, "NH=0"},
		{"attention KVH = 0", func(be *Backend, x argEnv) error {
			return be.AttentionForward(s(be), x.f10, x.f10, x.f10, backend.Tensor{}, 1, 1, 2, 0, 1, backend.QKVFused)
		}, "KVH=0"},
		{"attention unknown layout", func(be *Backend, x argEnv) error {
			return be.AttentionForward(s(be), x.f10, x.f10, x.f10, backend.Tensor{}, 1, 1, 1, 1, 1, backend.QKVLayout(7))
		}, "unknown qkv layout QKVLayout(7)"},
		{"attention negative B, T", func(be *Backend, x argEnv) error {
			return be.AttentionForward(s(be), x.one, x.one, x.f10.Slice(0, 3), backend.Tensor{}, -1, -1, 1, 1, 1, backend.QKVFused)
		}, "B=-1"},
		{"attention lse length", func(be *Backend, x argEnv) error {
			return be.AttentionBackward(s(be), x.f10.Slice(0, 6), x.f10.Slice(0, 2), x.g10.Slice(0, 6), x.f10.Slice(0, 2), x.f9, backend.Tensor{}, x.f10, 1, 1, 2, 2, 1, backend.QKVFused)
		}, "lse has 9 elements, want 2"},
		{"attention backward scratch short", func(be *Backend, x argEnv) error {
			return be.AttentionBackward(s(be), x.f10.Slice(0, 6), x.f10.Slice(0, 2), x.g10.Slice(0, 6), x.f10.Slice(0, 2), x.g10.Slice(0, 2), backend.Tensor{},
				x.f10.Slice(0, 1), 1, 1, 2, 2, 1, backend.QKVFused)

		}, "attention backward: scratch has 1 elements, the op needs 2"},
		{"gelu length", func(be *Backend, x argEnv) error { return be.GeluBackward(s(be), x.f10, x.g10, x.f9) }, "dout has 9"},
		{"cross entropy targets fp32", func(be *Backend, x argEnv) error {
			return be.CrossEntropyForwardBackward(s(be), x.f10.Slice(0, 2), x.g10, x.f10.Slice(0, 2), 2, 5, 1)
		}, "targets has dtype fp32"},
		{"cross entropy logits", func(be *Backend, x argEnv) error {
			return be.CrossEntropyForwardBackward(s(be), x.f10.Slice(0, 2), x.f9, x.i10.Slice(0, 2), 2, 5, 1)
		}, "logits has 9"},
		{"sum squares out", func(be *Backend, x argEnv) error { return be.SumSquares(s(be), x.f10.Slice(0, 2), x.g10, x.work) }, "out has 2"},
		{"sum squares work fp32", func(be *Backend, x argEnv) error { return be.SumSquares(s(be), x.one, x.g10, x.f10) }, "work has dtype fp32, want fp64"},
		{"sum squares work short", func(be *Backend, x argEnv) error { return be.SumSquares(s(be), x.one, x.g10, x.w10) }, "work has 10 elements, the op needs 1024"},
		{"fp64 is no storage type", func(be *Backend, x argEnv) error { return be.Fill(s(be), x.w10, 1) }, "t has dtype fp64"},
		{"adamw bf16 moments", func(be *Backend, x argEnv) error {
			return be.AdamW(s(be), x.f10, backend.Tensor{}, x.g10, x.h10, x.f10, backend.Tensor{}, backend.Tensor{}, adam)
		}, "fp32"},
		{"adamw step 0", func(be *Backend, x argEnv) error {
			p := adam
			p.Step = 0
			return be.AdamW(s(be), x.f10, backend.Tensor{}, x.g10, x.f10, x.f10, backend.Tensor{}, backend.Tensor{}, p)
		}, "step 0"},
		{"adamw clipping without sumSq", func(be *Backend, x argEnv) error {
			p := adam
			p.MaxNorm = 1
			return be.AdamW(s(be), x.f10, backend.Tensor{}, x.g10, x.f10, x.f10, backend.Tensor{}, backend.Tensor{}, p)
		}, "sumSq"},
		{"adamw master length", func(be *Backend, x argEnv) error {
			return be.AdamW(s(be), x.h10, x.f9, x.g10, x.f10, x.f10, backend.Tensor{}, backend.Tensor{}, adam)
		}, "master has 9"},
		{"copy to int", func(be *Backend, x argEnv) error { return be.CopyD2D(s(be), x.i10, x.f10) }, "dst has dtype i32"},
		{"copy length", func(be *Backend, x argEnv) error { return be.CopyD2D(s(be), x.f9, x.h10) }, "dst has 9"},
		{"copy h2d past host buffer", func(be *Backend, x argEnv) error { return be.CopyH2D(s(be), x.f10, x.host, 8) }, "outside buffer"},
		{"copy h2d negative offset", func(be *Backend, x argEnv) error { return be.CopyH2D(s(be), x.f10, x.host, -4) }, "outside buffer"},
		{"copy h2d nil host buffer", func(be *Backend, x argEnv) error { return be.CopyH2D(s(be), x.f10, nil, 0) }, "host buffer"},
		{"copy d2h past host buffer", func(be *Backend, x argEnv) error { return be.CopyD2H(s(be), x.host, 4, x.f10) }, "outside buffer"},
		{"copy d2h freed", func(be *Backend, x argEnv) error { return be.CopyD2H(s(be), x.host, 0, x.freed) }, "freed"},
		{"stream of another backend", func(be *Backend, x argEnv) error { return be.Fill(x.other.DefaultStream(), x.f10, 1) }, "does not belong"},
		{"nil stream", func(be *Backend, x argEnv) error { return be.Fill(nil, x.f10, 1) }, "does not belong"},
		{"nil event", func(be *Backend, x argEnv) error { return be.Wait(s(be), nil) }, "not a CPU event"},
		{"alloc negative", func(be *Backend, x argEnv) error { _, err := be.Alloc("neg", -1, backend.F32); return err }, "neg"},
		{"alloc bad dtype", func(be *Backend, x argEnv) error { _, err := be.Alloc("odd", 1, 7); return err }, "odd"},
		{"alloc host negative", func(be *Backend, x argEnv) error { _, err := be.AllocHost("hneg", -1); return err }, "hneg"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			be := newBE(t, Config{HazardCheck: true})
			other := newBE(t, Config{})
			h, err := be.AllocHost("host", 40)
			ok(t, err)
			x := argEnv{
				f10: alloc(t, be, "f10", 10, backend.F32), f9: alloc(t, be, "f9", 9, backend.F32),
				g10: alloc(t, be, "g10", 10, backend.F32), h10: alloc(t, be, "h10", 10, backend.BF16),
				i10: alloc(t, be, "i10", 10, backend.I32), one: alloc(t, be, "one", 1, backend.F32),
				lns: alloc(t, be, "lns", 20, backend.F32), work: sumWork(t, be), w10: alloc(t, be, "w10", 10, backend.F64),
				freed: alloc(t, be, "freed", 10, backend.F32), foreign: alloc(t, other, "foreign", 10, backend.F32),
				host: h, other: other,
			}
			be.Free(x.freed)
			err = func() (err error) {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("panic: %v", p)
					}
				}()
				return tc.call(be, x)
			}()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
			// The refused op reached no stream and declared no access.
			if err := be.Synchronize(be.DefaultStream()); err != nil {
				t.Fatalf("synchronize after a refused op: %v", err)
			}
			if hz := be.Hazards(); len(hz) > 0 {
				t.Fatalf("refused op left hazards %v", hz)
			}
		})
	}
}

// TestUseAfterClose: ops and syncs after Close return errors at once; none
// hangs on a stream whose goroutine has stopped.
func TestUseAfterClose(t *testing.T) {
	be := New(Config{})
	x := alloc(t, be, "x", 4, backend.F32)
	s := newStream(t, be, "s")
	e := newEvent(t, be, "e")
	ok(t, be.Record(e, s))
	ok(t, be.Close())
	done := make(chan []error, 1)
	go func() {
		done <- []error{be.Fill(s, x, 1), be.Wait(s, e), be.Synchronize(s), be.Synchronize(be.DefaultStream())}
	}()
	select {
	case errs := <-done:
		for i, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "closed") {
				t.Errorf("call %d after Close: %v, want an error saying the backend is closed", i, err)
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a call after Close hangs")
	}
	if err := be.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if ms := be.MemStats(); ms.InUse != 0 {
		t.Errorf("memory in use after Close: %d", ms.InUse)
	}
}
