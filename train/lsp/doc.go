// Package lsp is the host-side math of LSP-Offload's learned sparse
// projectors (DESIGN.md section 2): the (d,r)-sparse projector and its two
// storages, the bias ratio ||P P^T G Q Q^T - G|| / ||G|| and its gradient,
// fitting the projector values, carrying Adam moments into a new subspace,
// the learning-rate re-warm after a large change, and the validation of the
// LSP flags.
//
// The engine (train/engine) calls it between steps, at projector checks;
// it is float64 and single-threaded. The per-step work with the projectors
// (compress, apply) is backend ops: kernels/sparse.cu on the device, and
// train/cpu (whose ref_sparse.go is the kernels' reference) on the CPU.
package lsp
