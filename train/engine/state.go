// The optimizer state of each mode as named fp32 arrays, for checkpoints:
// native's device moments, the host's master weights and moments (zero,
// lsp --dense-params host), the dense device optimizer, and lsp's
// per-matrix projectors and subspace moments (train/lsp's State.Save),
// and galore's projectors and moments (its step count is the engine's).
// Integers are stored as float32, exact below 2^24, which every index and
// count here is.
//
// A checkpoint streams them: StateArrays hands each array over a chunk at
// a time (a device array through the staging buffer, a host array as the
// engine's own memory, a sharded one group by group as it is gathered),
// and LoadStateFrom takes each back a chunk at a time, so that neither
// holds a whole array on the host that the engine does not hold already.

package engine

import (
	"fmt"
	"slices"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/hazard"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// StateArray is one named array of the optimizer state, as a checkpoint
// write streams it.
type StateArray struct {
	Name string
	Len  int
	// Read hands the array's values to fn in order, a chunk at a time;
	// a chunk is valid only during the call and must not be written.
	// It must be called between steps, with the pipeline drained.
	Read func(fn func(v []float32) error) error
	// collective: reading takes part in a collective of every rank (a
	// sharded optimizer's gather), so that every rank reads it.
	collective bool
	read       *bool // set once Read ran: finish skips it
}

// stateChunk is the elements a device array comes down in per chunk
// (the staging buffer's worth): the host buffer a checkpoint write
// holds for the optimizer's device state.
const stateChunk = backend.StagingBytes / 4

// StateArrays returns the optimizer state's arrays, sorted by name, to be
// read between steps. finish must be called once they are read, or not:
// on every rank of a sharded host optimizer it reads what was left
// unread of the arrays that take part in a collective (discarding the
// values), so that a rank whose checkpoint write failed half-way, or a
// rank that writes nothing, still joins every gather the others join.
func (e *Engine) StateArrays() (arrays []StateArray, finish func() error, err error) {
	s := e.st.Compute
	var buf []float32 // one chunk for every device array, read one after another
	add := func(a StateArray) {
		done := new(bool)
		read := a.Read
		a.read = done
		a.Read = func(fn func([]float32) error) error {
			*done = true
			return read(fn)
		}
		arrays = append(arrays, a)
	}
	dev := func(name string, t backend.Tensor) {
		if t.Buf == nil {
			return
		}
		add(StateArray{Name: name, Len: t.Len(), Read: func(fn func([]float32) error) error {
			if buf == nil {
				buf = make([]float32, min(stateChunk, e.largestDeviceState()))
			}
			for off := 0; off < t.Len(); off += len(buf) {
				n := min(len(buf), t.Len()-off)
				if err := e.be.Staging().DownloadInto(s, buf[:n], t.Slice(off, n)); err != nil {
					return fmt.Errorf("saving %s: %w", name, err)
				}
				if err := fn(buf[:n]); err != nil {
					return err
				}
			}
			return nil
		}})
	}
	host := func(name string, v []float32) {
		add(StateArray{Name: name, Len: len(v), Read: func(fn func([]float32) error) error { return fn(v) }})
	}
	if o := e.opt; o != nil {
		dev("adam.m", o.M)
		dev("adam.v", o.V)
		dev("adam.master", o.Master)
		dev("adam.norms", o.Norms)
	}
	if d := e.dense; d != nil {
		dev("dense.m", d.M)
		dev("dense.v", d.V)
		dev("dense.master", d.Master)
		dev("dense.norms", d.Norms)
	}
	if o := e.off; o != nil {
		if o.shard != nil {
			for _, a := range o.shardArrays() {
				add(a)
			}
		} else {
			host("host.master", o.weights())
			host("host.m", o.mom[:o.n])
			host("host.v", o.mom[o.n:])
		}
		count := 0
		for _, g := range o.groups {
			count += len(g.tensors)
		}
		add(StateArray{Name: "host.steps", Len: count, Read: func(fn func([]float32) error) error {
			steps := make([]float32, 0, count)
			for _, g := range o.groups {
				for _, t := range g.tensors {
					steps = append(steps, float32(t.state.Step))
				}
			}
			return fn(steps)
		}})
	}
	if e.lora != nil {
		// The adapters are parameters the checkpoint's model tensors
		// lack: they are saved with the state (the master, when they are
		// bf16, is adam.master's first elements).
		dev("lora.adapters", e.lora.Params)
	}
	if e.galore != nil {
		gp, gm, gv := e.galore.State()
		dev("galore.p", gp)
		dev("galore.m", gm)
		dev("galore.v", gv)
	}
	if e.lsp != nil {
		e.lsp.SaveArrays(func(name string, n int, read func() []float32) {
			add(StateArray{Name: name, Len: n, Read: func(fn func([]float32) error) error { return fn(read()) }})
		})
	}
	slices.SortFunc(arrays, func(a, b StateArray) int { return strings.Compare(a.Name, b.Name) })
	finish = func() error {
		for _, a := range arrays {
			if a.collective && !*a.read {
				if err := a.Read(func([]float32) error { return nil }); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return arrays, finish, nil
}

// largestDeviceState is the elements of the longest device array of the
// optimizer state (native's or the dense device optimizer's).
func (e *Engine) largestDeviceState() int {
	n := 0
	if e.lora != nil {
		n = e.lora.Params.Len()
	}
	if e.galore != nil {
		gp, gm, _ := e.galore.State()
		n = max(n, gp.Len(), gm.Len())
	}
	for _, o := range []*optim.AdamW{e.opt, e.dense} {
		if o == nil {
			continue
		}
		for _, t := range []backend.Tensor{o.M, o.V, o.Master, o.Norms} {
			n = max(n, t.Len())
		}
	}
	return n
}

// SaveState returns the optimizer state by name, every array the
// caller's own (a copy). The pipeline must be drained (it is between
// steps). With a sharded host optimizer every rank must call it at the
// same point (it gathers the shards).
func (e *Engine) SaveState() (map[string][]float32, error) {
	arrays, finish, err := e.StateArrays()
	if err != nil {
		return nil, err
	}
	out := make(map[string][]float32, len(arrays))
	for _, a := range arrays {
		v := make([]float32, 0, a.Len)
		if err := a.Read(func(c []float32) error { v = append(v, c...); return nil }); err != nil {
			return nil, err
		}
		out[a.Name] = v
	}
	return out, finish()
}

// StateSource is a saved optimizer state that LoadStateFrom reads array
// by array, chunk by chunk (a checkpoint file).
type StateSource interface {
	// Len is the named array's element count; ok is false when there is
	// no array of that name.
	Len(name string) (n int, ok bool)
	// Read hands the named array to fn in order, a chunk at a time, with
	// the chunk's first element's index; the chunk is valid only during
	// the call.
	Read(name string, fn func(off int, v []float32) error) error
}

// mapSource is a StateSource of whole arrays in memory.
type mapSource map[string][]float32

func (m mapSource) Len(name string) (int, bool) {
	v, ok := m[name]
	return len(v), ok
}

func (m mapSource) Read(name string, fn func(off int, v []float32) error) error {
	return fn(0, m[name])
}

// LoadState restores SaveState's arrays; every array the mode needs must be
// present with its exact length.
func (e *Engine) LoadState(ts map[string][]float32) error { return e.LoadStateFrom(mapSource(ts)) }

// LoadStateFrom is LoadState reading each array from src chunk by chunk
// as it restores it, into the engine's own memory (a device array
// through the staging buffer), so that a checkpoint restores with no
// whole array on the host that the engine does not hold already.
func (e *Engine) LoadStateFrom(src StateSource) error {
	s := e.st.Compute
	check := func(name string, n int) error {
		got, ok := src.Len(name)
		if !ok {
			return fmt.Errorf("optimizer state %s missing (was the checkpoint saved with another --mode, --dense-params or --dtype?)", name)
		}
		if got != n {
			return fmt.Errorf("optimizer state %s has %d elements, this run needs %d (was it saved with another --d or --r?)", name, got, n)
		}
		return nil
	}
	// into reads the named array of n elements, handing each chunk to
	// put at its offset.
	into := func(name string, n int, put func(off int, v []float32) error) error {
		if err := check(name, n); err != nil {
			return err
		}
		return src.Read(name, put)
	}
	// whole reads a small array (lsp's per matrix, the step counts) into
	// a new slice.
	whole := func(name string, n int) ([]float32, error) {
		v := make([]float32, n)
		err := into(name, n, func(off int, c []float32) error {
			copy(v[off:], c)
			return nil
		})
		return v, err
	}
	dev := func(name string, t backend.Tensor) error {
		if t.Buf == nil {
			return nil
		}
		return into(name, t.Len(), func(off int, v []float32) error {
			return backend.Upload(e.be, s, t.Slice(off, len(v)), v)
		})
	}
	for _, o := range []struct {
		prefix string
		st     *optim.AdamW
	}{{"adam.", e.opt}, {"dense.", e.dense}} {
		if o.st == nil {
			continue
		}
		for _, a := range []struct {
			name string
			t    backend.Tensor
		}{{"m", o.st.M}, {"master", o.st.Master}, {"norms", o.st.Norms}, {"v", o.st.V}} {
			if err := dev(o.prefix+a.name, a.t); err != nil {
				return err
			}
		}
	}
	if e.lora != nil {
		if err := dev("lora.adapters", e.lora.Params); err != nil {
			return err
		}
	}
	if e.galore != nil {
		gp, gm, gv := e.galore.State()
		for _, a := range []struct {
			name string
			t    backend.Tensor
		}{{"galore.p", gp}, {"galore.m", gm}, {"galore.v", gv}} {
			if err := dev(a.name, a.t); err != nil {
				return err
			}
		}
	}
	if o := e.off; o != nil {
		count := 0
		for _, g := range o.groups {
			count += len(g.tensors)
		}
		steps, err := whole("host.steps", count)
		if err != nil {
			return err
		}
		e.hostAccess("restore host state", nil, []backend.Range{hazard.HostRange(o.out, 0, len(o.out.Bytes()))})
		if o.shard != nil {
			err = o.loadShard(into)
		} else {
			err = o.load(into)
		}
		if err != nil {
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
		if err := e.lsp.Restore(whole); err != nil {
			return err
		}
	}
	return e.be.Synchronize(s)
}

// load restores the master and moments of an unsharded host optimizer,
// each chunk copied into place as it is read.
func (o *offload) load(into func(string, int, func(int, []float32) error) error) error {
	for _, a := range []struct {
		name string
		dst  []float32
	}{{"host.master", o.weights()}, {"host.m", o.mom[:o.n]}, {"host.v", o.mom[o.n:]}} {
		err := into(a.name, o.n, func(off int, v []float32) error {
			copy(a.dst[off:], v)
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}
