// GaLore's projector refresh on a GPU: every block matrix's randomized
// SVD (train/rsvd), which runs once every --galore-every steps, so the
// step graph (a step without a refresh) leaves it out.

package plan

import (
	"github.com/lsp-offload/lsp-offload/train/engine"
	"github.com/lsp-offload/lsp-offload/train/lsp"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/rsvd"
	"github.com/lsp-offload/lsp-offload/train/trace"
)

// HostJacobiRate is the host's flops a second on rsvd's l x l
// factorisations, one matrix at a time on one core: measured here (a
// Jacobi of l = 522 in about 2 s, rsvd's file header). An assumption on
// other hosts.
const HostJacobiRate = 5e9

// RefreshTime is the predicted time on m of one GaLore refresh of every
// block matrix of c (galore mode; 0 otherwise): each matrix's rsvd
// products at the bf16 GEMM rate and efficiency, and its host share at
// HostJacobiRate, one matrix after another as the backward runs them.
func RefreshTime(c Config, m Machine) (float64, error) {
	if c.Engine.Mode != engine.Galore {
		return 0, nil
	}
	x, err := model.NewIndex(c.Arch)
	if err != nil {
		return 0, err
	}
	var total float64
	for range x.MatParam {
		for _, mt := range x.Mats {
			k := c.Engine.Galore.RankOf(mt.M, mt.N)
			all := rsvd.FLOPs(mt.M, mt.N, k, rsvd.DefaultOversample, rsvd.DefaultPowerIters)
			host := rsvd.HostFLOPs(mt.M, mt.N, k, rsvd.DefaultOversample, rsvd.DefaultPowerIters)
			total += rsvdTime(m, all, host)
		}
	}
	return total, nil
}

// rsvdTime prices a randomized SVD of all flops, host of them the
// host's factorisations: the rest at the bf16 GEMM rate and efficiency.
func rsvdTime(m Machine, all, host float64) float64 {
	eff := 1.0
	if e, ok := m.GPU.Eff[trace.Gemm]; ok {
		eff = e
	}
	return (all-host)/(m.GPU.PeakBF16*eff) + host/HostJacobiRate
}

// SVDRefreshTime is the predicted time on m of one projector check's svd
// refresh in lsp mode with --projector svd (0 otherwise): every group's
// randomized SVDs (lsp.SVDGroups), priced as RefreshTime prices
// GaLore's. The calibration passes that form the gradients are not
// counted.
func SVDRefreshTime(c Config, m Machine) (float64, error) {
	if c.Engine.Mode != engine.LSP || c.Engine.LSP.Projector != lsp.KindSVD {
		return 0, nil
	}
	groups, err := lsp.SVDGroups(c.Arch, c.Engine.LSP)
	if err != nil {
		return 0, err
	}
	var total float64
	for _, g := range groups {
		total += float64(g.Count) * rsvdTime(m, g.FLOPs(), g.HostFLOPs())
	}
	return total, nil
}
