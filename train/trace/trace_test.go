package trace_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/cpu"
	"github.com/lsp-offload/lsp-offload/train/data"
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/galore"
	"github.com/lsp-offload/lsp-offload/train/gpt2"
	"github.com/lsp-offload/lsp-offload/train/hazard"
	"github.com/lsp-offload/lsp-offload/train/llama"
	"github.com/lsp-offload/lsp-offload/train/lora"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
	"github.com/lsp-offload/lsp-offload/train/plan"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

const testB, testT, testAccum = 2, 8, 2

var (
	tinyGPT   = gpt2.Config{V: 64, MaxT: 16, C: 32, L: 2, NH: 4, Eps: 1e-5}
	tinyLlama = llama.Config{Vocab: 64, Hidden: 32, Intermediate: 64, NumLayers: 2, Heads: 4, KVHeads: 2,
		MaxPos: 16, Eps: 1e-5, RopeTheta: 10000}
)

func config(mode engine.Mode, dense engine.DenseParams) engine.Config {
	h := optim.DefaultHyper()
	h.WeightDecay = 0.1
	return engine.Config{Mode: mode, DenseParams: dense, Hyper: h, Seed: 7, HostThreads: 2,
		LSP:    lsp.Config{D: 8, R: 2, Alpha: 0.5, CheckEvery: 5, CalibSamples: 4, ProjLR: 0.05, FitIters: 20},
		LoRA:   lora.Config{R: 4, Alpha: 8},
		Galore: galore.Config{Rank: 4, Every: 200, Scale: 0.25}}
}

type setup struct {
	name  string
	arch  model.Arch
	dt    backend.DType
	cfg   engine.Config
	vocab int
}

func setups() []setup {
	var ss []setup
	for _, a := range []struct {
		name  string
		arch  model.Arch
		vocab int
	}{{"gpt2", tinyGPT, tinyGPT.V}, {"llama", tinyLlama, tinyLlama.Vocab}} {
		for _, c := range []struct {
			mode  engine.Mode
			dense engine.DenseParams
		}{{engine.Native, ""}, {engine.Zero, ""}, {engine.LSP, engine.DenseDevice}, {engine.LSP, engine.DenseHost},
			{engine.LoRA, engine.DenseDevice}, {engine.LoRA, engine.DenseHost}} {
			for _, dt := range []backend.DType{backend.F32, backend.BF16} {
				ss = append(ss, setup{fmt.Sprintf("%s/%s%s/%v", a.name, c.mode, c.dense, dt), a.arch, dt, config(c.mode, c.dense), a.vocab})
			}
		}
	}
	return ss
}

func batches(n, vocab int) []data.Batch {
	out := make([]data.Batch, n)
	for i := range out {
		b := data.Batch{B: testB, T: testT, Inputs: make([]int32, testB*testT), Targets: make([]int32, testB*testT)}
		for j := range b.Inputs {
			b.Inputs[j] = int32((i + j) % vocab)
			b.Targets[j] = int32((i + j + 1) % vocab)
			b.NumTargets++
		}
		out[i] = b
	}
	return out
}

// key is what must match between a traced op and an executed one.
func key(o trace.Op) string {
	return fmt.Sprintf("%s %s %v %v flops=%g bytes=%d link=%d", o.Method, o.Family, o.DType, o.Shapes, o.FLOPs, o.Bytes, o.Link)
}

// TestTraceMatchesCPU: the ops the tracer records for a step's graph are,
// in order and with the same shapes, the ops the CPU backend runs in a
// real sequential step of the same engine, and the traced graph has the
// real engine's nodes, queues, edges and host work.
func TestTraceMatchesCPU(t *testing.T) {
	for _, s := range setups() {
		t.Run(s.name, func(t *testing.T) {
			g, ops, err := plan.Trace(s.arch, testB, testT, testAccum, s.dt, s.cfg)
			if err != nil {
				t.Fatal(err)
			}
			var traced []string
			for _, o := range ops {
				traced = append(traced, key(o))
			}

			w := trace.Wrap(cpu.New(cpu.Config{Threads: 1}))
			defer w.Close()
			e, err := engine.New(w, s.arch, testB, testT, testAccum, s.dt, s.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Free()
			if err := e.Init(); err != nil {
				t.Fatal(err)
			}
			real, err := e.Graph()
			if err != nil {
				t.Fatal(err)
			}
			if len(real.Nodes) != len(g.Nodes) {
				t.Fatalf("real graph has %d nodes, traced %d", len(real.Nodes), len(g.Nodes))
			}
			hostNodes := 0
			for i, rn := range real.Nodes {
				tn := g.Nodes[i]
				if rn.Name != tn.Name || rn.Queue != tn.Queue || !slices.Equal(rn.Deps, tn.Deps) || rn.Work != tn.Work {
					t.Errorf("node %d: real %q %v deps %v work %+v, traced %q %v deps %v work %+v", i,
						rn.Name, rn.Queue, rn.Deps, rn.Work, tn.Name, tn.Queue, tn.Deps, tn.Work)
				}
				if rn.Queue == engine.Host {
					hostNodes++
					if rn.Work.Elems <= 0 || rn.Work.Bytes <= 0 {
						t.Errorf("host node %q has no work: %+v", rn.Name, rn.Work)
					}
				}
			}
			// Host nodes are a host optimizer's: none in native, nor in
			// lora with its dense parameters on the device.
			noHost := s.cfg.Mode == engine.Native || s.cfg.Mode == engine.LoRA && s.cfg.DenseParams == engine.DenseDevice
			if noHost != (hostNodes == 0) {
				t.Errorf("%d host nodes in mode %s", hostNodes, s.cfg.Mode)
			}

			w.Reset()
			if _, err := e.Step(batches(testAccum, s.vocab), 1e-3); err != nil {
				t.Fatal(err)
			}
			var ran []string
			for _, o := range w.Recorded() {
				ran = append(ran, key(o))
			}
			// The losses' download after the graph goes through the CPU
			// backend's own staging, which the wrapper does not see.
			if len(ran) != len(traced) {
				t.Fatalf("ran %d ops, traced %d", len(ran), len(traced))
			}
			for i := range traced {
				if ran[i] != traced[i] {
					t.Fatalf("op %d: ran %s, traced %s", i, ran[i], traced[i])
				}
			}
		})
	}
}

// TestTraceNoMemory: a 7B-parameter model allocates nothing real, and the
// device memory the engine allocates on the tracer is engine.MemoryOf's.
func TestTraceNoMemory(t *testing.T) {
	c, err := llama.Preset("llama-7b")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range engine.Modes {
		cfg := config(mode, engine.DenseDevice)
		cfg.LSP.D, cfg.LSP.R = 512, 8
		tb := trace.New()
		g, err := engine.TraceStep(tb, c, 1, 512, 1, backend.BF16, cfg)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := engine.MemoryOf(c, 1, 512, 1, backend.BF16, cfg)
		if err != nil {
			t.Fatal(err)
		}
		got := tb.MemStats().HighWater
		if got != plan.DeviceTotal() {
			t.Errorf("%s: traced allocations %d bytes, plan %d", mode, got, plan.DeviceTotal())
		}
		if len(g.Nodes) == 0 {
			t.Errorf("%s: empty graph", mode)
		}
	}
}

// TestTraceRefuses: bad arguments are errors, as on the CPU backend.
func TestTraceRefuses(t *testing.T) {
	tb := trace.New()
	s := tb.DefaultStream()
	a, _ := tb.Alloc("a", 6, backend.F32)
	c, _ := tb.Alloc("c", 4, backend.F32)
	if err := tb.Gemm(s, false, false, 2, 2, 3, 1, a, a, 0, c); err != nil {
		t.Errorf("a valid Gemm refused: %v", err)
	}
	if ops := tb.Recorded(); len(ops) != 1 || ops[0].FLOPs != 2*2*2*3 || ops[0].Bytes != 4*(6+6+4) {
		t.Errorf("recorded %+v, want one Gemm of 24 FLOPs and 64 bytes", ops)
	}
	if err := tb.Gemm(s, false, false, 2, 3, 3, 1, a, a, 0, c); err == nil {
		t.Error("Gemm with C of 4 elements for 2 x 3 accepted")
	}
	if err := tb.Fill(s, a.Slice(4, 4), 0); err == nil {
		t.Error("Fill past the buffer accepted")
	}
	other := trace.New()
	if err := tb.Fill(other.DefaultStream(), a, 0); err == nil {
		t.Error("another backend's stream accepted")
	}
	h, _ := tb.AllocHost("h", 8)
	if err := tb.CopyH2D(s, a, h, 0); err == nil {
		t.Error("CopyH2D of 24 bytes from 8 accepted")
	}
}

// TestWrapTimed: a timed wrapper records each op's wall time and a Gemm's
// layout and sizes, with the bytes of its hazard declaration.
func TestWrapTimed(t *testing.T) {
	be := cpu.New(cpu.Config{Threads: 1})
	w := trace.WrapTimed(be)
	defer w.Close()
	s := w.DefaultStream()
	const M, N, K = 64, 48, 32
	A, _ := w.Alloc("A", M*K, backend.F32)
	B, _ := w.Alloc("B", K*N, backend.F32)
	C, _ := w.Alloc("C", M*N, backend.F32)
	if err := w.Gemm(s, true, false, M, N, K, 1, A, B, 1, C); err != nil {
		t.Fatal(err)
	}
	ops, err := w.Times()
	if err != nil {
		t.Fatal(err)
	}
	if len(ops) != 1 {
		t.Fatalf("recorded %d ops", len(ops))
	}
	o := ops[0]
	if o.Gemm != (trace.GemmArgs{TransA: true, M: M, N: N, K: K}) {
		t.Errorf("gemm args %+v", o.Gemm)
	}
	// beta 1: C is read and written.
	if want := int64(4 * (M*K + K*N + 2*M*N)); o.Bytes != want {
		t.Errorf("bytes %d, want %d", o.Bytes, want)
	}
	if !(o.Seconds > 0) {
		t.Errorf("seconds %g, want > 0", o.Seconds)
	}
}

// TestEveryOpRecorded walks the op table: every op, called with arguments
// the table's counts accept, is recorded once with the table's family and
// FLOPs and with the bytes of its hazard declaration, through the hazard
// wrapper too.
func TestEveryOpRecorded(t *testing.T) {
	tb := trace.New()
	w := hazard.Wrap(tb)
	s := w.DefaultStream()
	const n = 4096 // elements of every tensor: more than any count at these sizes
	for _, sig := range backend.OpSignatures() {
		d, err := backend.LookupOp(sig.Op)
		if err != nil {
			t.Fatal(err)
		}
		c := &backend.Call{Op: sig.Op}
		dtype := func(arg string) backend.DType {
			for _, g := range d.Groups {
				if slices.Contains(g.Args, arg) {
					return g.DTypes[0]
				}
			}
			return backend.F32
		}
		for _, p := range sig.Params {
			switch p.Kind {
			case backend.KindTensors:
				x, err := tb.Alloc(sig.Op+" "+p.Name, n, dtype(p.Name))
				if err != nil {
					t.Fatal(err)
				}
				c.Tensors = append(c.Tensors, x)
			case backend.KindInts:
				v := 2 // every size; HS even, r <= d
				if p.Name == "off" {
					v = 0 // Dequantize's first element
				}
				c.Ints = append(c.Ints, v)
			case backend.KindFloats:
				c.Floats = append(c.Floats, 0.5)
			case backend.KindBools:
				c.Bools = append(c.Bools, false)
			case backend.KindU64s:
				c.U64s = append(c.U64s, 1)
			case backend.KindU32s:
				c.U32s = append(c.U32s, 1)
			case backend.KindLayouts:
				c.Layouts = append(c.Layouts, backend.QKVFused)
			case backend.KindAdams:
				c.Adams = append(c.Adams, backend.AdamParams{LR: 1e-3, Step: 1, MaxNorm: 1})
			case backend.KindQuants:
				W := backend.Quant{Format: backend.Int8, Rows: 2, Cols: 2}
				mk := func(name string, dt backend.DType, k int) backend.Tensor {
					x, err := tb.Alloc(sig.Op+" W "+name, k, dt)
					if err != nil {
						t.Fatal(err)
					}
					return x
				}
				W.Codes = mk("codes", backend.I32, backend.Words(W.Format.CodeBytes(4)))
				W.Absmax = mk("absmax", backend.I32, backend.Words(backend.QBlocks(4)))
				W.Scale = mk("scale", backend.F32, backend.QGroups(4)+1)
				W.Book = mk("book", backend.F32, backend.QBookLen)
				c.Quants = append(c.Quants, W)
			}
		}
		tb.Reset()
		if err := c.Run(w, s); err != nil {
			t.Errorf("%s: %v", sig.Op, err)
			continue
		}
		ops := tb.Recorded()
		if len(ops) != 1 || ops[0].Method != sig.Op {
			t.Errorf("%s: recorded %+v", sig.Op, ops)
			continue
		}
		o := ops[0]
		flops := int64(0)
		if d.FLOPs != "" {
			if flops, err = c.Eval(d.FLOPs); err != nil {
				t.Fatal(err)
			}
		}
		acc, err := hazard.Of(c)
		if err != nil {
			t.Fatal(err)
		}
		if string(o.Family) != d.Family || o.FLOPs != float64(flops) || o.Bytes != acc.Bytes() || o.Bytes == 0 {
			t.Errorf("%s: recorded family %s, %g FLOPs, %d bytes; the table says %s, %d FLOPs, %d bytes",
				sig.Op, o.Family, o.FLOPs, o.Bytes, d.Family, flops, acc.Bytes())
		}
	}
	if err := w.Synchronize(s); err != nil {
		t.Error(err)
	}
}
