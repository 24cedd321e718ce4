// lsp mode's part of a checkpoint: per matrix its projectors (row
// storage; the columns are rebuilt), subspace moments, Adam step count
// and re-warm start, as named fp32 arrays (train/engine's SaveState puts
// them beside the other optimizers' state). Integers are stored as
// float32, exact below 2^24, which every index and count here is.
// Matrices that share an input each store the shared P under their own
// name.

package lsp

import (
	"fmt"
	"slices"
)

// Save adds every matrix's state to out as "lsp.<matrix>.<field>". The
// projector values and the moments go through host, which returns its
// argument (a view, to be read before the next step) or a copy.
func (st *State) Save(out map[string][]float32, host func([]float32) []float32) {
	for _, row := range st.Mats {
		for _, x := range row {
			p := "lsp." + x.Name + "."
			out[p+"p_idx"], out[p+"p_val"] = ints(x.In.P.Idx), host(x.In.P.Val)
			out[p+"q_idx"], out[p+"q_val"] = ints(x.Q.Idx), host(x.Q.Val)
			out[p+"m"], out[p+"v"] = host(x.Adam.M), host(x.Adam.V)
			out[p+"counters"] = []float32{float32(x.Adam.Step), float32(x.RewarmFrom)}
		}
	}
}

func ints(v []int32) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// Restore reads Save's arrays back by get (which checks each array's
// length) and uploads the projectors.
func (st *State) Restore(get func(name string, n int) ([]float32, error)) error {
	for _, row := range st.Mats {
		for _, x := range row {
			if err := st.restoreMatrix(x, get); err != nil {
				return err
			}
		}
	}
	return nil
}

// restoreMatrix restores one matrix's state and, for the first reader of
// its input, the shared P; a later reader's copy of P must equal it.
func (st *State) restoreMatrix(x *Matrix, get func(string, int) ([]float32, error)) error {
	p := "lsp." + x.Name + "."
	var vals [6][]float32
	for i, f := range []struct {
		name string
		n    int
	}{{"p_idx", x.M * x.R}, {"p_val", x.M * x.R}, {"q_idx", x.N * x.R}, {"q_val", x.N * x.R}, {"m", x.D * x.D}, {"v", x.D * x.D}} {
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
	P, err := restoreProjector(x.Name, x.M, x.D, x.R, vals[0], vals[1])
	if err != nil {
		return err
	}
	if first := x.In.Mats[0]; first == x {
		x.In.P = P
		if err := st.uploadP(x.In); err != nil {
			return err
		}
	} else if !slices.Equal(P.Idx, x.In.P.Idx) || !slices.Equal(P.Val, x.In.P.Val) {
		return fmt.Errorf("optimizer state %sp_idx, p_val: differ from %s's, which shares the input and so P", p, first.Name)
	}
	if x.Q, err = restoreProjector(x.Name, x.N, x.D, x.R, vals[2], vals[3]); err != nil {
		return err
	}
	copy(x.Adam.M, vals[4])
	copy(x.Adam.V, vals[5])
	x.Adam.Step, x.RewarmFrom = int64(counters[0]), int(counters[1])
	return st.uploadQ(x)
}

// restoreProjector rebuilds a projector of rows x d from its saved row
// storage.
func restoreProjector(name string, rows, d, r int, idx, val []float32) (*Projector, error) {
	pr := &Projector{M: rows, D: d, R: r, Idx: make([]int32, len(idx)), Val: append([]float32(nil), val...)}
	for i, v := range idx {
		pr.Idx[i] = int32(v)
	}
	if err := pr.RebuildColumns(); err != nil {
		return nil, fmt.Errorf("optimizer state %s: %w", name, err)
	}
	return pr, pr.Validate()
}
