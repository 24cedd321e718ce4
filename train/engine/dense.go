// AdamW on the device for the parameters that are not block matrices
// (embeddings, norms, biases) in --mode lsp --dense-params device: the
// same update as native mode's optimizer, over the dense gradients only,
// with compact state (no moments for the matrices).

package engine

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

type denseTensor struct {
	name        string
	param, grad backend.Tensor
	off, n      int // into the compact state
	decay       bool
}

type denseAdam struct {
	e                   *Engine
	tensors             []denseTensor
	n                   int
	m, v, master, norms backend.Tensor
}

// denseAdamBytes is the device state of denseAdam.
func denseAdamBytes(tensors, elems int64, dt backend.DType) int64 {
	b := 8*elems + 4*tensors
	if dt != backend.F32 {
		b += 4 * elems
	}
	return b
}

func newDenseAdam(e *Engine) (*denseAdam, error) {
	m, be := e.Model, e.be
	params := m.Buffers().Params
	d := &denseAdam{e: e}
	for i, p := range e.idx.Layout {
		gv, ok := m.GradView(i)
		if !ok {
			continue
		}
		d.tensors = append(d.tensors, denseTensor{name: p.Name, param: m.ParamView(params, i), grad: gv,
			off: d.n, n: p.Len(), decay: p.Decay})
		d.n += p.Len()
	}
	var err error
	alloc := func(name string, n int) backend.Tensor {
		if err != nil {
			return backend.Tensor{}
		}
		var t backend.Tensor
		t, err = be.Alloc(name, n, backend.F32)
		return t
	}
	d.m, d.v = alloc("dense adam m", d.n), alloc("dense adam v", d.n)
	if e.dt != backend.F32 {
		d.master = alloc("dense master weights", d.n)
	}
	d.norms = alloc("dense grad norms", len(d.tensors))
	if err != nil {
		d.free()
		return nil, fmt.Errorf("engine: dense optimizer: %w", err)
	}
	return d, nil
}

func (d *denseAdam) free() {
	for _, t := range []backend.Tensor{d.m, d.v, d.master, d.norms} {
		if t.Buf != nil {
			d.e.be.Free(t)
		}
	}
}

func (d *denseAdam) initMaster(s backend.Stream) error {
	if d.master.Buf == nil {
		return nil
	}
	for _, t := range d.tensors {
		if err := d.e.be.CopyD2D(s, d.master.Slice(t.off, t.n), t.param); err != nil {
			return err
		}
	}
	return nil
}

// step enqueues the update of every dense tensor (step is 1-based).
func (d *denseAdam) step(s backend.Stream, lr float32, step int) error {
	be, h := d.e.be, d.e.cfg.Hyper
	for i, t := range d.tensors {
		norm := d.norms.Slice(i, 1)
		if err := be.SumSquares(s, norm, t.grad); err != nil {
			return fmt.Errorf("dense adamw: norm of %s: %w", t.name, err)
		}
		p := backend.AdamParams{LR: lr, Beta1: h.Beta1, Beta2: h.Beta2, Eps: h.Eps, Step: step}
		if t.decay {
			p.WeightDecay = h.WeightDecay
		}
		if h.Clip == optim.ClipMatrix {
			p.MaxNorm = h.MaxNorm
		}
		var master backend.Tensor
		if d.master.Buf != nil {
			master = d.master.Slice(t.off, t.n)
		}
		if err := be.AdamW(s, t.param, master, t.grad, d.m.Slice(t.off, t.n), d.v.Slice(t.off, t.n), norm, p); err != nil {
			return fmt.Errorf("dense adamw: %s: %w", t.name, err)
		}
	}
	return nil
}

// normSq is the squared norm of the dense gradients of the latest step.
func (d *denseAdam) normSq(s backend.Stream) (float64, error) {
	v, err := backend.Download(d.e.be, s, d.norms)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, x := range v {
		sum += float64(x)
	}
	return sum, nil
}
