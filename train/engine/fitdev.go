// The projector fit's device memory: the fit of a check runs through the
// backend's ops (train/devfit), so its buffers count in the plan, and the
// engine holds that many bytes reserved from New on (one buffer, freed
// just before each fit and taken back after it), so that a budget that
// fits New fits every check, and New fails as the plan says.

package engine

import (
	"fmt"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/devfit"
	"github.com/lsp-offload/lsp-offload/train/model"
)

// fitSamples is the number of gradient samples per reader that one fit
// takes (Check: the fitting micro-batches in at most fitGroups groups for
// --refit split, their mean otherwise; every layer's with --share-layers
// and split), for micro-batches of B rows and L layers.
func fitSamples(c LSPConfig, B, L int) int {
	c = c.withDefaults()
	if c.Refit != RefitSplit {
		return 1
	}
	n := (c.CalibSamples + B - 1) / B
	if c.Accept == AcceptHeldOut {
		n = max(n, 2) / 2
	}
	s := min(n, fitGroups)
	if c.ShareLayers {
		s *= L
	}
	return s
}

// fitBytes is the device memory of the largest fit of a check (one input's
// P with its readers' Qs; devfit.Bytes), 0 when checks do not fit.
func fitBytes(x *model.Index, c LSPConfig, B int) int64 {
	if c.NoFit || c.withDefaults().Refit == RefitRandom {
		return 0
	}
	d, r := lspDims(x, c)
	samples := fitSamples(c, B, len(x.Blocks))
	var most int64
	for _, readers := range x.Readers {
		k := readers[0]
		var ns []int
		for _, j := range readers {
			ns = append(ns, x.Mats[j].N)
		}
		most = max(most, devfit.Bytes(x.Mats[k].M, ns, d[k], r[k], samples))
	}
	return most
}

// fitStagingBytes is the size of the host staging buffers the largest fit
// of a check copies through (devfit.StagingBytes), 0 and 0 when checks do
// not fit.
func fitStagingBytes(x *model.Index, c LSPConfig, B int) (grad, small int) {
	if c.NoFit || c.withDefaults().Refit == RefitRandom {
		return 0, 0
	}
	d, r := lspDims(x, c)
	samples := fitSamples(c, B, len(x.Blocks))
	for _, readers := range x.Readers {
		k := readers[0]
		var ns []int
		for _, j := range readers {
			ns = append(ns, x.Mats[j].N)
		}
		g, s := devfit.StagingBytes(x.Mats[k].M, ns, d[k], r[k], samples)
		grad, small = max(grad, g), max(small, s)
	}
	return grad, small
}

// newFitStaging allocates the fits' host staging once, so that a check
// allocates no host memory; nil when checks do not fit.
func (st *lspState) newFitStaging() error {
	g, s := fitStagingBytes(st.e.idx, st.cfg, st.e.b)
	if g == 0 {
		return nil
	}
	var err error
	if st.fitStaging, err = devfit.NewStaging(st.e.be, g, s); err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	return nil
}

// reserveFit takes the fit's bytes (fitBytes) back as one buffer; a no-op
// when checks do not fit or the reservation is held.
func (st *lspState) reserveFit() error {
	n := fitBytes(st.e.idx, st.cfg, st.e.b)
	if n == 0 || st.fitReserve.Buf != nil {
		return nil
	}
	t, err := st.e.be.Alloc("projector fit (reserved)", int((n+3)/4), backend.F32)
	if err != nil {
		return fmt.Errorf("engine: reserving the projector fit's memory: %w", err)
	}
	st.fitReserve = t
	return nil
}

// releaseFit frees the reservation for the fit to allocate in.
func (st *lspState) releaseFit() {
	if st.fitReserve.Buf != nil {
		st.e.be.Free(st.fitReserve)
		st.fitReserve = backend.Tensor{}
	}
}

// FitGroup is one kind of fit a check runs: an input's P (M rows) with its
// readers' Qs (Ns rows), d, r and the gradient samples per reader; Count
// such fits per check (one per layer, or one with --share-layers).
type FitGroup struct {
	M       int
	Ns      []int
	D, R    int
	Samples int
	Count   int
}

// FitGroups lists the fits of one projector check of arch with
// micro-batches of B rows (none when checks do not fit): what the planner
// costs a check's fits by (train/plan).
func FitGroups(arch model.Arch, B int, c LSPConfig) ([]FitGroup, error) {
	if c.NoFit || c.withDefaults().Refit == RefitRandom {
		return nil, nil
	}
	x, err := model.NewIndex(arch)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	d, r := lspDims(x, c)
	L := len(x.Blocks)
	count := L
	if c.ShareLayers {
		count = 1
	}
	var out []FitGroup
	for _, readers := range x.Readers {
		k := readers[0]
		g := FitGroup{M: x.Mats[k].M, D: d[k], R: r[k], Samples: fitSamples(c, B, L), Count: count}
		for _, j := range readers {
			g.Ns = append(g.Ns, x.Mats[j].N)
		}
		out = append(out, g)
	}
	return out, nil
}
