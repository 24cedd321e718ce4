// Package lsp is LSP-Offload's learned sparse projectors, all of them
// (docs/DESIGN.md, "LSP as implemented"):
//
//   - the (d,r)-sparse projector and its two storages (projector.go,
//     sparse.go);
//   - lsp mode's state during training (state.go): every block matrix's
//     projectors, compressed activations and S on the device, the hooks
//     the model calls to compress X and dY, the subspace Adam on the
//     host, the apply of P Delta Q^T, and the state's part of a
//     checkpoint (save.go);
//   - the projector check (check.go): calibration gradients, bias ratios,
//     the refit, held-out acceptance, carrying the Adam moments into a
//     new subspace (carry.go) and re-warming (ramp.go);
//   - the fit of the projector values: the float64 host reference
//     (bias.go, fit.go, measure.go) and the same fit on a Backend's ops
//     (devicefit.go), which a check runs;
//   - the settings and their flags (config.go), and the memory of all of
//     the above (memory.go), which the engine's memory plan and the
//     planner count.
//
// The engine (train/engine) owns the schedule: it makes a State, hands it
// to the model as its matrix hooks, and puts each layer's copy down, host
// Adam, copy up and apply into the step's graph; it calls Check between
// steps. The per-step device work is Backend ops (the sparse compress,
// S and apply ops, and SparseValueGrad for the fit): kernels/sparse.cu
// and kernels/fit.cu on the device, their CPU references in train/cpu.
package lsp
