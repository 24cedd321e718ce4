// The optimizer state of each mode as named fp32 arrays, for checkpoints:
// native's device moments, the host's master weights and moments (zero,
// lsp --dense-params host), the dense device optimizer, and per LSP matrix
// its projectors (row storage; the columns are rebuilt), subspace moments,
// Adam step count and re-warm start. Integers are stored as float32, exact
// below 2^24, which every index and count here is. Matrices that share an
// input each store the shared P under their own name.

package engine

import (
	"fmt"
	"slices"
	"sort"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/lsp"
)

// SaveState returns the optimizer state by name, every array the
// caller's own. The pipeline must be drained (it is between steps).
func (e *Engine) SaveState() (map[string][]float32, error) { return e.saveState(true) }

// SaveStateView is SaveState without copying the arrays the host holds
// as fp32 already (the host optimizer's master and moments, lsp's
// projector values and subspace moments): those are the engine's own,
// to be read, not written, and only until the next step or LoadState. A
// checkpoint write reads them between steps, so that it holds on the
// host only what it must download or convert (the plan's "checkpoint
// write").
func (e *Engine) SaveStateView() (map[string][]float32, error) { return e.saveState(false) }

// saveState is SaveState, with fresh copies of the host's fp32 arrays
// when own is set and the arrays themselves otherwise.
func (e *Engine) saveState(own bool) (map[string][]float32, error) {
	host := func(v []float32) []float32 {
		if own {
			return append([]float32(nil), v...)
		}
		return v
	}
	out := map[string][]float32{}
	s := e.st.Compute
	dev := func(name string, t backend.Tensor) error {
		if t.Buf == nil {
			return nil
		}
		v, err := backend.Download(e.be, s, t)
		if err != nil {
			return fmt.Errorf("saving %s: %w", name, err)
		}
		out[name] = v
		return nil
	}
	if o := e.opt; o != nil {
		for name, t := range map[string]backend.Tensor{"adam.m": o.M, "adam.v": o.V, "adam.master": o.Master, "adam.norms": o.Norms} {
			if err := dev(name, t); err != nil {
				return nil, err
			}
		}
	}
	if d := e.dense; d != nil {
		for name, t := range map[string]backend.Tensor{"dense.m": d.M, "dense.v": d.V, "dense.master": d.Master, "dense.norms": d.Norms} {
			if err := dev(name, t); err != nil {
				return nil, err
			}
		}
	}
	if o := e.off; o != nil && o.shard != nil {
		if err := o.saveShard(out, host); err != nil {
			return nil, err
		}
	} else if o != nil {
		out["host.master"] = host(o.weights())
		out["host.m"] = host(o.mom[:o.n])
		out["host.v"] = host(o.mom[o.n:])
	}
	if o := e.off; o != nil {
		var steps []float32
		for _, g := range o.groups {
			for _, t := range g.tensors {
				steps = append(steps, float32(t.state.Step))
			}
		}
		out["host.steps"] = steps
	}
	if st := e.lsp; st != nil {
		for _, row := range st.mats {
			for _, x := range row {
				p := "lsp." + x.name + "."
				out[p+"p_idx"], out[p+"p_val"] = ints(x.in.P.Idx), host(x.in.P.Val)
				out[p+"q_idx"], out[p+"q_val"] = ints(x.Q.Idx), host(x.Q.Val)
				out[p+"m"], out[p+"v"] = host(x.state.M), host(x.state.V)
				out[p+"counters"] = []float32{float32(x.state.Step), float32(x.rewarmFrom)}
			}
		}
	}
	return out, nil
}

func ints(v []int32) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// LoadState restores SaveState's arrays; every array the mode needs must be
// present with its exact length.
func (e *Engine) LoadState(ts map[string][]float32) error {
	return e.LoadStateFrom(func(name string) ([]float32, bool, error) {
		v, ok := ts[name]
		return v, ok, nil
	})
}

// LoadStateFrom is LoadState reading each array only when it restores
// it, by read (ok false when there is none of that name); it keeps no
// array after restoring it, so that a checkpoint decoded array by array
// is never all on the host at once.
func (e *Engine) LoadStateFrom(read func(name string) (v []float32, ok bool, err error)) error {
	s := e.st.Compute
	get := func(name string, n int) ([]float32, error) {
		v, ok, err := read(name)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("optimizer state %s missing (was the checkpoint saved with another --mode, --dense-params or --dtype?)", name)
		}
		if len(v) != n {
			return nil, fmt.Errorf("optimizer state %s has %d elements, this run needs %d (was it saved with another --d or --r?)", name, len(v), n)
		}
		return v, nil
	}
	dev := func(name string, t backend.Tensor) error {
		if t.Buf == nil {
			return nil
		}
		v, err := get(name, t.Len())
		if err != nil {
			return err
		}
		return backend.Upload(e.be, s, t, v)
	}
	if o := e.opt; o != nil {
		for _, name := range sortedKeys(map[string]backend.Tensor{"adam.m": o.M, "adam.v": o.V, "adam.master": o.Master, "adam.norms": o.Norms}) {
			if err := dev(name.k, name.t); err != nil {
				return err
			}
		}
	}
	if d := e.dense; d != nil {
		for _, name := range sortedKeys(map[string]backend.Tensor{"dense.m": d.M, "dense.v": d.V, "dense.master": d.Master, "dense.norms": d.Norms}) {
			if err := dev(name.k, name.t); err != nil {
				return err
			}
		}
	}
	if o := e.off; o != nil {
		count := 0
		for _, g := range o.groups {
			count += len(g.tensors)
		}
		steps, err := get("host.steps", count)
		if err != nil {
			return err
		}
		e.hostAccess("restore host state", nil, []backend.Range{hostRange(o.out, 0, len(o.out.Bytes()))})
		if o.shard != nil {
			if err := o.loadShard(get); err != nil {
				return err
			}
		} else if err := o.load(get); err != nil {
			return err
		}
		i := 0
		for _, g := range o.groups {
			for _, t := range g.tensors {
				t.state.Step = int64(steps[i])
				i++
			}
		}
	}
	if st := e.lsp; st != nil {
		for _, row := range st.mats {
			for _, x := range row {
				if err := st.restoreMatrix(x, get); err != nil {
					return err
				}
			}
		}
	}
	return e.be.Synchronize(s)
}

// load restores the master and moments of an unsharded host optimizer,
// one array at a time: each is copied before the next is read.
func (o *offload) load(get func(string, int) ([]float32, error)) error {
	for _, a := range []struct {
		name string
		dst  []float32
	}{{"host.master", o.weights()}, {"host.m", o.mom[:o.n]}, {"host.v", o.mom[o.n:]}} {
		v, err := get(a.name, o.n)
		if err != nil {
			return err
		}
		copy(a.dst, v)
	}
	return nil
}

// restoreMatrix restores one matrix's state and, for the first reader of
// its input, the shared P; a later reader's copy of P must equal it.
func (st *lspState) restoreMatrix(x *lspMatrix, get func(string, int) ([]float32, error)) error {
	p := "lsp." + x.name + "."
	var vals [6][]float32
	for i, f := range []struct {
		name string
		n    int
	}{{"p_idx", x.m * x.r}, {"p_val", x.m * x.r}, {"q_idx", x.n * x.r}, {"q_val", x.n * x.r}, {"m", x.d * x.d}, {"v", x.d * x.d}} {
		v, err := get(p+f.name, f.n)
		if err != nil {
			return err
		}
		vals[i] = v
	}
	counters, err := get(p+"counters", 2)
	if err != nil {
		return err
	}
	P, err := restoreProjector(x.name, x.m, x.d, x.r, vals[0], vals[1])
	if err != nil {
		return err
	}
	if first := x.in.mats[0]; first == x {
		x.in.P = P
		if err := st.uploadP(x.in); err != nil {
			return err
		}
	} else if !slices.Equal(P.Idx, x.in.P.Idx) || !slices.Equal(P.Val, x.in.P.Val) {
		return fmt.Errorf("optimizer state %sp_idx, p_val: differ from %s's, which shares the input and so P", p, first.name)
	}
	if x.Q, err = restoreProjector(x.name, x.n, x.d, x.r, vals[2], vals[3]); err != nil {
		return err
	}
	copy(x.state.M, vals[4])
	copy(x.state.V, vals[5])
	x.state.Step, x.rewarmFrom = int64(counters[0]), int(counters[1])
	return st.uploadQ(x)
}

// restoreProjector rebuilds a projector of rows x d from its saved row
// storage.
func restoreProjector(name string, rows, d, r int, idx, val []float32) (*lsp.Projector, error) {
	pr := &lsp.Projector{M: rows, D: d, R: r, Idx: make([]int32, len(idx)), Val: append([]float32(nil), val...)}
	for i, v := range idx {
		pr.Idx[i] = int32(v)
	}
	if err := pr.RebuildColumns(); err != nil {
		return nil, fmt.Errorf("optimizer state %s: %w", name, err)
	}
	return pr, pr.Validate()
}

type keyed struct {
	k string
	t backend.Tensor
}

// sortedKeys fixes the order of uploads (map order is random).
func sortedKeys(m map[string]backend.Tensor) []keyed {
	var out []keyed
	for k, t := range m {
		out = append(out, keyed{k, t})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].k < out[j].k })
	return out
}
