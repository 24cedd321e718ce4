// Package calibrate describes the CPU backend (train/cpu) as a machine for
// the step planner, from microbenchmarks only: nothing here is fitted to
// the training step times the planner's predictions are checked against.
//
// Measure times, at a given thread count:
//
//   - GEMM: the backend's Gemm at exact shapes (the planner passes those its
//     trace found; StepGemms lists a model's without a trace) and at square
//     shapes of growing size, the fallback for shapes not measured
//     (GemmRate interpolates by arithmetic intensity).
//   - Memory bandwidth: the STREAM triad on a host worker pool of the same
//     thread count (host.Workers.TriadBandwidth), and the backend's own
//     read-modify-write (Accumulate, dst += src) and copy (CopyD2D) on
//     arrays four times the last-level cache.
//   - Every other compute op of the Backend contract, at the sizes of the
//     model geometries asked for (OpSize), as an efficiency against the
//     triad bandwidth (memory-bound ops) or the peak GEMM rate (attention
//     and the LSP sparse ops, which do most of their work in multiply-adds).
//   - Per-op overhead: an op on a one-element tensor, enqueued in a batch
//     (the cost each op of a stream adds) and alone followed by
//     Synchronize (a round trip); an event record and wait across two
//     streams; Synchronize of an idle stream.
//   - The link: the backend's CopyH2D and CopyD2H (a memcpy on this
//     backend) as a fixed latency plus bytes over a bandwidth.
//   - Host Adam: the fused AdamW of host/adam.go on a worker pool of the
//     thread count, and its fixed cost (a step of a 64-element tensor).
//   - Sharing: a backend GEMM on the compute stream, the host Adam, and a
//     CopyH2D on a second stream, each looped alone and then two at a
//     time, since they all run on the same cores: the planner scales an
//     op's rate by the shared/alone ratio while the other runs.
//
// Conventions, which the planner's cost model must share:
//
//   - GEMMs and the other compute ops are timed cold: each repetition is
//     one op, timed by a pair of events around it on its stream, right
//     after a read of a buffer twice the last-level cache's size,
//     so that its operands come from memory as a step's ops find theirs
//     (between two uses of a tensor run the rest of the layer, or a whole
//     step; timed warm, back to back on the same operands, the small
//     models' ops ran 10 to 30% faster than in their steps). Overhead.Op,
//     the enqueue cost the events do not see, is added to each time.
//     Times are medians over the repetitions; the repetitions of every
//     GEMM shape and op are taken in turns (one round times each once),
//     so that each one's median spans the whole time they take, not one
//     stretch of it that a slow spell of a shared machine may cover; a
//     caller may run its own measurements between rounds
//     (Options.Between), as bench/plan steps the engines it predicts.
//     The fixed costs, memory bandwidth and the link are timed warm, in
//     batches enqueued back to back (a per-op time then includes the
//     cost of enqueueing it, Overhead.Op).
//   - An op's bytes are what the train/hazard declarations of that op say
//     it reads plus what they say it writes (a range read and written
//     counts twice; write-allocate is not counted, as in STREAM);
//     AccessBytes sums them. The declarations name whole tensors, so the
//     encoder counts the whole token table although it touches B*T rows
//     of it: its efficiency can exceed 1.
//   - FLOPs count a multiply-add as two: a GEMM 2*M*N*K; causal attention
//     2*B*NH*HS*T*(T+1) forward (Q K^T and P V over the causal half) and
//     2.5 times that backward (the scores recomputed, then dP, dV, dQ and
//     dK); SparseCompressA/B 2*BT*rows*r; SparseS 2*d*d*BT; SparseApply
//     2*d*n*r + 2*m*n*r + 2*m*n (the decay); DenseGemm 2*M*N*K;
//     DenseApply 2*M*N*K + 2*M*N (the decay), as train/trace counts them.
//     Every other op counts 0 and is memory-bound.
//   - Op efficiency: Eff = ideal / (seconds - Overhead.Op), where ideal =
//     max(flops/GemmPeak, bytes/Triad); so OpTime(method, flops, bytes) =
//     ideal/Eff + Overhead.Op gives back the measured time at a measured
//     size and interpolates Eff between sizes.
//
// Limits: wall-clock timing on a machine that may be shared; absolute
// numbers carry that noise. Tensors hold zeros or fixed patterns (speed
// does not depend on values: no denormals arise). The backend's thread
// count sets the process-wide GEMM pool (host.SetThreads).
package calibrate
