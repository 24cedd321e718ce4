// lsp mode's part of a checkpoint: per matrix its projectors (row
// storage; the columns are rebuilt), subspace moments, Adam step count
// and re-warm start, as named fp32 arrays (train/engine's SaveState puts
// them beside the other optimizers' state). Integers are stored as
// float32, exact below 2^24, which every index and count here is.
// Matrices that share an input each store the shared P under their own
// name. Dense projectors (r = d) store no indices: every row holds every
// column, in order.

package lsp

import (
	"fmt"
	"slices"
)

// SaveArrays names every matrix's state to add as
// "lsp.<matrix>.<field>", with its length and a read that returns its
// values when the checkpoint writes it: the projector values and the
// moments are the state's own (to be read, not written, before the next
// step), the indices and counters converted to fp32 then.
func (st *State) SaveArrays(add func(name string, n int, read func() []float32)) {
	for _, row := range st.Mats {
		for _, x := range row {
			p := "lsp." + x.Name + "."
			dense := st.Config.Projector.Dense() // the indices are every column, in order
			if !dense {
				add(p+"p_idx", len(x.In.P.Idx), func() []float32 { return ints(x.In.P.Idx) })
			}
			add(p+"p_val", len(x.In.P.Val), func() []float32 { return x.In.P.Val })
			if !dense {
				add(p+"q_idx", len(x.Q.Idx), func() []float32 { return ints(x.Q.Idx) })
			}
			add(p+"q_val", len(x.Q.Val), func() []float32 { return x.Q.Val })
			add(p+"m", len(x.Adam.M), func() []float32 { return x.Adam.M })
			add(p+"v", len(x.Adam.V), func() []float32 { return x.Adam.V })
			add(p+"counters", 2, func() []float32 { return []float32{float32(x.Adam.Step), float32(x.RewarmFrom)} })
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
	dense := st.Config.Projector.Dense()
	var vals [6][]float32
	for i, f := range []struct {
		name string
		n    int
	}{{"p_idx", x.M * x.R}, {"p_val", x.M * x.R}, {"q_idx", x.N * x.R}, {"q_val", x.N * x.R}, {"m", x.D * x.D}, {"v", x.D * x.D}} {
		if dense && (i == 0 || i == 2) {
			continue // not saved: every column, in order
		}
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
	P, err := restoreProjector(x.Name, x.M, x.D, x.R, vals[0], vals[1], dense)
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
	if x.Q, err = restoreProjector(x.Name, x.N, x.D, x.R, vals[2], vals[3], dense); err != nil {
		return err
	}
	copy(x.Adam.M, vals[4])
	copy(x.Adam.V, vals[5])
	x.Adam.Step, x.RewarmFrom = int64(counters[0]), int(counters[1])
	return st.uploadQ(x)
}

// restoreProjector rebuilds a projector of rows x d from its saved row
// storage (a dense one from its values).
func restoreProjector(name string, rows, d, r int, idx, val []float32, dense bool) (*Projector, error) {
	if dense {
		pr, err := denseProjector(rows, d, append([]float32(nil), val...))
		if err != nil {
			return nil, fmt.Errorf("optimizer state %s: %w", name, err)
		}
		return pr, nil
	}
	pr := &Projector{M: rows, D: d, R: r, Idx: make([]int32, len(idx)), Val: append([]float32(nil), val...)}
	for i, v := range idx {
		pr.Idx[i] = int32(v)
	}
	if err := pr.RebuildColumns(); err != nil {
		return nil, fmt.Errorf("optimizer state %s: %w", name, err)
	}
	return pr, pr.Validate()
}
