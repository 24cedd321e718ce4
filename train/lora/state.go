// The adapters on the device: every site's A and B in one allocation of
// the model dtype (the parameters the device AdamW updates, with its fp32
// master when they are bf16), their gradients in one allocation, and two
// scratch buffers of [rows, r]. State is the model's model.Adapters: the
// term and its gradients are Backend GEMMs, no kernel of their own.
//
// Per site, with X [N, m], Y [N, n] (row-major, as the model's GEMMs):
//
//	forward:  U = X A^T [N, r];  Y += s U B^T
//	backward: U = X A^T (again: r columns cost less than keeping them);
//	          dU = s dY B;  dB += s dY^T U;  dA += dU^T X;  dX += dU A

package lora

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// State is the adapters of one model on a backend.
type State struct {
	Cfg   Config
	Sites []Site

	be    backend.Backend
	idx   *model.Index
	at    [][]int // at[l][k]: the site of matrix k of block l, -1: none
	scale float32
	rows  int // the largest N a call may have (B*T)

	// Params holds every site's A then B, back to back in site order, in
	// the model dtype; Grads the same layout in the gradient dtype.
	Params, Grads backend.Tensor
	a, b, da, db  []backend.Tensor
	u, du         backend.Tensor // scratch [rows, R], the model dtype
}

var _ model.Adapters = (*State)(nil)

// Elems is the elements of the adapters of sites (A and B of each).
func Elems(sites []Site, r int) int {
	n := 0
	for _, s := range sites {
		n += r * (s.M + s.N)
	}
	return n
}

// Bytes predicts the device bytes New allocates: the adapters in dt,
// their gradients in gdt and the scratch.
func Bytes(sites []Site, r, rows int, dt, gdt backend.DType) int64 {
	n := int64(Elems(sites, r))
	return n*int64(dt.Size()) + n*int64(gdt.Size()) + 2*int64(rows*r)*int64(dt.Size())
}

// New allocates the adapters of cfg's sites in idx for calls of up to
// rows rows, parameters in dt and gradients in gdt. They start at zero:
// Draw or Upload them.
func New(be backend.Backend, idx *model.Index, cfg Config, rows int, dt, gdt backend.DType) (*State, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Dropout != 0 {
		return nil, fmt.Errorf("--lora-dropout: %g: only 0 is supported (the term takes the matrix's input as it is)", cfg.Dropout)
	}
	sites, err := Sites(idx, cfg)
	if err != nil {
		return nil, err
	}
	st := &State{Cfg: cfg, Sites: sites, be: be, idx: idx, scale: cfg.Scale(), rows: rows}
	st.at = make([][]int, len(idx.MatParam))
	for l := range st.at {
		st.at[l] = make([]int, len(idx.Mats))
		for k := range st.at[l] {
			st.at[l][k] = -1
		}
	}
	for i, s := range sites {
		st.at[s.Layer][s.K] = i
	}
	n, r := Elems(sites, cfg.R), cfg.R
	ok := false
	defer func() {
		if !ok {
			st.Free()
		}
	}()
	if st.Params, err = be.Alloc("lora adapters", n, dt); err != nil {
		return nil, fmt.Errorf("lora: adapters: %w", err)
	}
	if st.Grads, err = be.Alloc("lora adapter grads", n, gdt); err != nil {
		return nil, fmt.Errorf("lora: adapter gradients: %w", err)
	}
	if st.u, err = be.Alloc("lora scratch", 2*rows*r, dt); err != nil {
		return nil, fmt.Errorf("lora: scratch: %w", err)
	}
	st.u, st.du = st.u.Slice(0, rows*r), st.u.Slice(rows*r, rows*r)
	off := 0
	for _, s := range sites {
		st.a = append(st.a, st.Params.Slice(off, r*s.M, r, s.M))
		st.da = append(st.da, st.Grads.Slice(off, r*s.M, r, s.M))
		off += r * s.M
		st.b = append(st.b, st.Params.Slice(off, s.N*r, s.N, r))
		st.db = append(st.db, st.Grads.Slice(off, s.N*r, s.N, r))
		off += s.N * r
	}
	ok = true
	return st, nil
}

// Free releases the adapters.
func (st *State) Free() {
	for _, t := range []*backend.Tensor{&st.Params, &st.Grads, &st.u} {
		if t.Buf != nil {
			st.be.Free(*t)
			*t = backend.Tensor{}
		}
	}
}

// Tensors are the adapters for the device AdamW, with PEFT's names; every
// one decays, as PEFT's under Hugging Face's Trainer.
func (st *State) Tensors() []optim.Tensor {
	var ts []optim.Tensor
	for i, s := range st.Sites {
		ts = append(ts,
			optim.Tensor{Name: KeyA(s), Param: st.a[i], Grad: st.da[i], Decay: true},
			optim.Tensor{Name: KeyB(s), Param: st.b[i], Grad: st.db[i], Decay: true})
	}
	return ts
}

// ZeroGrads enqueues clearing the adapters' gradients.
func (st *State) ZeroGrads(s backend.Stream) error { return st.be.Fill(s, st.Grads, 0) }

// Draw fills the adapters as PEFT initialises them (NewAdapter: A
// Kaiming-uniform, B zero), so the model starts as the base model. seed
// draws the same adapters on every backend.
func (st *State) Draw(s backend.Stream, seed uint64) error {
	ad, err := NewAdapter(st.idx, st.Cfg, seed)
	if err != nil {
		return err
	}
	return st.Upload(s, ad)
}

// Upload sets the adapters from ad, e.g. a PEFT adapter read by
// ReadAdapter: its rank and sites must be the State's.
func (st *State) Upload(s backend.Stream, ad *Adapter) error {
	v, err := st.Flatten(ad)
	if err != nil {
		return err
	}
	return backend.Upload(st.be, s, st.Params, v)
}

// Flatten lays ad out as Params is: each site's A then B, in site order.
func (st *State) Flatten(ad *Adapter) ([]float32, error) {
	if ad.Cfg.R != st.Cfg.R || len(ad.Sites) != len(st.Sites) {
		return nil, fmt.Errorf("lora: an adapter of rank %d on %d modules for rank %d on %d", ad.Cfg.R, len(ad.Sites), st.Cfg.R, len(st.Sites))
	}
	v := make([]float32, 0, st.Params.Len())
	for i, s := range st.Sites {
		if ad.Sites[i] != s || len(ad.A[i]) != st.Cfg.R*s.M || len(ad.B[i]) != s.N*st.Cfg.R {
			return nil, fmt.Errorf("lora: the adapter's module %d is %s, the model's %s", i, ad.Sites[i].Module, s.Module)
		}
		v = append(append(v, ad.A[i]...), ad.B[i]...)
	}
	return v, nil
}

// Download reads the adapters back (after the work before it on s).
func (st *State) Download(s backend.Stream) (*Adapter, error) {
	v, err := backend.Download(st.be, s, st.Params)
	if err != nil {
		return nil, err
	}
	ad := &Adapter{Cfg: st.Cfg, Sites: st.Sites}
	off := 0
	for _, site := range st.Sites {
		na, nb := st.Cfg.R*site.M, site.N*st.Cfg.R
		ad.A = append(ad.A, v[off:off+na])
		ad.B = append(ad.B, v[off+na:off+na+nb])
		off += na + nb
	}
	return ad, nil
}

// site is the site of matrix k of block l and the rows of x, or ok false
// when the matrix has no adapter.
func (st *State) site(l, k int, x backend.Tensor) (i, rows int, ok bool, err error) {
	if l < 0 || l >= len(st.at) || k < 0 || k >= len(st.at[l]) {
		return 0, 0, false, fmt.Errorf("lora: no matrix %d of block %d", k, l)
	}
	i = st.at[l][k]
	if i < 0 {
		return 0, 0, false, nil
	}
	m := st.Sites[i].M
	if x.Len()%m != 0 || x.Len()/m > st.rows {
		return 0, 0, false, fmt.Errorf("lora: %s: an input of %d elements for %d columns and at most %d rows", st.Sites[i].Module, x.Len(), m, st.rows)
	}
	return i, x.Len() / m, true, nil
}

// Forward implements model.Adapters: Y += s (X A^T) B^T.
func (st *State) Forward(s backend.Stream, l, k int, X, Y backend.Tensor) error {
	i, n, ok, err := st.site(l, k, X)
	if !ok {
		return err
	}
	site, r, be := st.Sites[i], st.Cfg.R, st.be
	u := st.u.Slice(0, n*r)
	if err := be.Gemm(s, false, true, n, r, site.M, 1, X, st.a[i], 0, u); err != nil {
		return fmt.Errorf("lora %s: %w", site.Module, err)
	}
	if err := be.Gemm(s, false, true, n, site.N, r, st.scale, u, st.b[i], 1, Y); err != nil {
		return fmt.Errorf("lora %s: %w", site.Module, err)
	}
	return nil
}

// Backward implements model.Adapters: dB += s dY^T U, dA += dU^T X and
// dX += dU A, with U = X A^T and dU = s dY B.
func (st *State) Backward(s backend.Stream, l, k int, X, dY, dX backend.Tensor) error {
	i, n, ok, err := st.site(l, k, X)
	if !ok {
		return err
	}
	site, r, be := st.Sites[i], st.Cfg.R, st.be
	u, du := st.u.Slice(0, n*r), st.du.Slice(0, n*r)
	err = model.Chain(
		func() error { return be.Gemm(s, false, true, n, r, site.M, 1, X, st.a[i], 0, u) },
		func() error { return be.Gemm(s, false, false, n, r, site.N, st.scale, dY, st.b[i], 0, du) },
		func() error { return be.Gemm(s, true, false, site.N, r, n, st.scale, dY, u, 1, st.db[i]) },
		func() error { return be.Gemm(s, true, false, r, site.M, n, 1, du, X, 1, st.da[i]) },
		func() error { return be.Gemm(s, false, false, n, site.M, r, 1, du, st.a[i], 1, dX) },
	)
	if err != nil {
		return fmt.Errorf("lora %s backward: %w", site.Module, err)
	}
	return nil
}

// LayerGrads are the gradients of block l's adapters, A then B of each
// site in order (contiguous: sites are by block), for the data-parallel
// sum of a block's gradients.
func (st *State) LayerGrads(l int) []backend.Tensor {
	var gs []backend.Tensor
	for i, s := range st.Sites {
		if s.Layer == l {
			gs = append(gs, st.da[i], st.db[i])
		}
	}
	return gs
}
