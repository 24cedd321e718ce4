// The optimizer state of each mode as named fp32 arrays, for checkpoints:
// native's device moments, the host's master weights and moments (zero,
// lsp --dense-params host), the dense device optimizer, and lsp's
// per-matrix projectors and subspace moments (train/lsp's State.Save).
// Integers are stored as float32, exact below 2^24, which every index and
// count here is.

package engine

import (
	"fmt"
	"sort"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
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
	if e.lsp != nil {
		e.lsp.Save(out, host)
	}
	return out, nil
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
		e.hostAccess("restore host state", nil, []backend.Range{hazard.HostRange(o.out, 0, len(o.out.Bytes()))})
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
	if e.lsp != nil {
		if err := e.lsp.Restore(get); err != nil {
			return err
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
