// Memory and traffic accounting (issue: "will this fit on my GPU"): the
// device and host bytes each mode allocates, predicted from the
// configuration alone with the same size formulas the allocations use, so
// that --device-mem is checked before anything is allocated; and the bytes
// one step moves across the link.

package engine

import (
	"fmt"
	"strings"

	"github.com/lsp-offload/lsp-offload/train/backend"
	"github.com/lsp-offload/lsp-offload/train/model"
	"github.com/lsp-offload/lsp-offload/train/optim"
)

// Part is one named share of a memory plan, in bytes.
type Part struct {
	Name  string
	Bytes int64
}

// Plan is the predicted memory of an engine.
type Plan struct {
	Mode   Mode
	Device []Part
	Host   []Part
	// Link is the bytes one step moves each way, excluding the batch (and
	// including the non-finite flag's copy for the host Adam).
	LinkD2H, LinkH2D int64
	// Batch is the bytes of the micro-batches' inputs and targets (up) and
	// losses with the non-finite flag (down) per step.
	BatchH2D, BatchD2H int64
}

func sum(ps []Part) int64 {
	var t int64
	for _, p := range ps {
		t += p.Bytes
	}
	return t
}

// DeviceTotal is the device peak (everything is allocated up front): what
// --device-mem is checked against.
func (p Plan) DeviceTotal() int64 { return sum(p.Device) }

// HostTotal is the host memory of the optimizer side.
func (p Plan) HostTotal() int64 { return sum(p.Host) }

// String is a one-line summary per side, in MiB.
func (p Plan) String() string {
	f := func(ps []Part) string {
		var b strings.Builder
		for i, x := range ps {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s %.2f", x.Name, float64(x.Bytes)/(1<<20))
		}
		return b.String()
	}
	return fmt.Sprintf("device %.2f MiB (%s); host %.2f MiB (%s)", float64(p.DeviceTotal())/(1<<20), f(p.Device),
		float64(p.HostTotal())/(1<<20), f(p.Host))
}

// PlanMemory predicts the memory and link traffic of an engine for arch
// with micro-batches of B x T, accum per step.
func PlanMemory(arch model.Arch, B, T, accum int, dt backend.DType, cfg Config) (Plan, error) {
	if err := cfg.Validate(); err != nil {
		return Plan{}, err
	}
	x, err := model.NewIndex(arch)
	if err != nil {
		return Plan{}, fmt.Errorf("engine: %w", err)
	}
	BT := B * T
	var opts model.Options
	if cfg.Mode == LSP {
		opts.MatrixGrads = (*lspState)(nil) // plans for hooks
	}
	opts.GradDType = cfg.GradDType
	mp := arch.PlanWith(B, T, dt, opts)
	p := Plan{Mode: cfg.Mode,
		Device: []Part{{"weights", mp.Params}, {"grads", mp.Grads}, {"activations", mp.Activations},
			{"activation grads", mp.ActGrads}, {"batch", mp.Batch + int64(accum*BT*4) + 4}},
		Host:     []Part{{"batch staging", int64(accum * 2 * BT * 4)}},
		BatchH2D: int64(accum * 2 * BT * 4), BatchD2H: int64(accum*BT*4) + 4,
	}
	if cfg.Mode != Native {
		// The non-finite flag's pinned copy, read by the host Adam.
		p.Host = append(p.Host, Part{"non-finite flag", 4})
		p.LinkD2H += 4
	}
	N := int64(arch.NumParams())
	dsize, gsize := int64(dt.Size()), int64(cfg.GradDType.Size())
	switch cfg.Mode {
	case Native:
		p.Device = append(p.Device, Part{"optimizer", optim.StateBytes(arch.NumParams(), len(x.Layout), dt, true)})
	case Zero:
		p.Host = append(p.Host, Part{"master, moments, pinned grads and weights", offloadBytes(N, dt, cfg.GradDType)})
		p.LinkD2H, p.LinkH2D = p.LinkD2H+gsize*N, dsize*N
	case LSP:
		n := lspCount(x, cfg.LSP, BT)
		p.Device = append(p.Device,
			Part{"projectors, compressed activations, S", 4 * int64(n.ints+n.floats)},
			Part{"lsp workspaces", 4 * (int64(BT)*int64(n.dmax) + int64(n.dmax)*int64(n.nmax))})
		if !cfg.LSP.NoFit {
			p.Device = append(p.Device, Part{"calibration", calibrationBytes(x, BT, dt)})
		}
		s2 := int64(n.s2)
		p.Host = append(p.Host, Part{"S/Delta and subspace moments", 12 * s2})
		p.LinkD2H, p.LinkH2D = p.LinkD2H+4*s2, 4*s2
		dense := N - int64(x.MatrixElems())
		switch cfg.DenseParams {
		case DenseDevice:
			denseTensors := len(x.Layout) - len(x.Blocks)*len(x.Mats)
			p.Device = append(p.Device, Part{"dense optimizer", optim.StateBytes(int(dense), denseTensors, dt, false)})
		case DenseHost:
			p.Host = append(p.Host, Part{"dense master, moments, pinned grads and weights", offloadBytes(dense, dt, cfg.GradDType)})
			p.LinkD2H += gsize * dense
			p.LinkH2D += dsize * dense
		}
	}
	return p, nil
}
