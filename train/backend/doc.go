// Package backend defines the Backend contract of lsp-offload
// (docs/DESIGN.md, "The Backend contract"): device buffers, pinned host
// buffers, asynchronous streams, events, and the compute ops every model
// is written against.
//
// Two backends implement it: the CPU backend (package train/cpu), the
// readable reference and the oracle for the CUDA kernels, and the CUDA
// backend (package cuda: build tag cuda on a GPU, cudasim on the
// simulated CUDA runtime). Model and engine code use only this interface,
// so they are the same on both.
//
// # Streams and events
//
// Semantics follow CUDA: every op is enqueued on a Stream and runs after the
// ops enqueued before it on that stream; Record marks a point in a stream;
// Wait makes a stream wait for the latest Record of an event at the moment
// Wait is enqueued (a wait on an event never recorded is an error); errors of
// asynchronous ops surface at Synchronize. ElapsedTime measures the device
// time between two completed records (the CPU backend stamps a record when
// its stream reaches it), for the benchmarks and the planner.
//
// # Lifecycle
//
// Whoever creates a resource destroys it: Free for Alloc, FreeHost for
// AllocHost, DestroyStream for NewStream, DestroyEvent for NewEvent. The
// default stream and the staging buffer (Staging) belong to the backend.
// Close synchronizes every stream and releases whatever is left; nothing of
// the backend may be used after it.
//
// # Goroutines
//
// A backend has one device goroutine: the goroutine that created it (on
// CUDA, the one whose OS thread holds the context). Only the device
// goroutine may enqueue work or change the backend's resources: Alloc,
// Free, AllocHost, FreeHost, NewStream, DestroyStream, NewEvent,
// DestroyEvent, Record, Wait, Synchronize, the copies, every op, the
// transfers of Staging (Upload, Download) and Close. Any goroutine may call
// Name, MemStats, Traffic, DefaultStream, Staging (the pointer),
// EventSynchronize and ElapsedTime, and read or write pinned host memory
// through a HostBuffer's views (Bytes, Float32, Int32, BF16) once ordered
// after the device work that uses it (EventSynchronize): the host nodes of
// the pipelined schedule do exactly that. The CPU backend's hazard mode
// checks the rule and reports a call from another goroutine as an error
// naming the method.
//
// # Storage types of the ops
//
// Storage is fp32 or bf16 (I32 for token ids and sparse indices, F64 for
// scratch); arithmetic is fp32. The table (KernelDTypes, checked at enqueue
// by CheckDTypes) is what every backend accepts: the CUDA kernels'
// signatures in kernels/kernels.h. Arguments in one group share one dtype,
// chosen by the launcher argument in brackets; a group with one dtype is
// fixed. The GEMM and attention kernels take bf16 only, so a model stored in
// fp32 does not run on the GPU (--device cuda defaults to --dtype bf16), and
// a model keeps its activation gradients in its storage dtype, as llm.c
// does (the flags g_bf16, dout's and dinp's), apart from its parameter
// gradients (--grad-dtype; dw_bf16 where one op writes both kinds).
// The CPU backend accepts any mix of fp32 and bf16 in every float argument,
// and in its KernelDTypes mode refuses what the table refuses, so whether
// a schedule's dtypes run on the GPU is checked with no GPU.
//
//	Fill                         t: fp32|bf16 [t_bf16]
//	Scale                        t: fp32|bf16 [t_bf16]
//	Add                          out: fp32|bf16 [out_bf16]; a: fp32|bf16 [a_bf16]; b: fp32|bf16 [b_bf16]
//	Accumulate                   dst: fp32|bf16 [dst_bf16]; src: fp32|bf16 [src_bf16]
//	EncoderForward               out, wte, wpe: fp32|bf16 [x_bf16]; inp, pos: i32
//	EncoderBackward              dwte, dwpe: fp32|bf16 [dw_bf16]; dout: fp32|bf16 [g_bf16]; inp, pos: i32
//	LayerNormForward             out, inp, weight, bias: fp32|bf16 [x_bf16]; mean, rstd: fp32
//	LayerNormBackward            dinp, dout: fp32|bf16 [g_bf16]; dweight, dbias: fp32|bf16 [dw_bf16]; inp, weight: fp32|bf16 [x_bf16]; mean, rstd, scratch: fp32
//	Gemm                         A, B: bf16; C: fp32|bf16 [c_is_bf16]
//	GemmQ                        A: bf16; C: fp32|bf16 [c_is_bf16]
//	Dequantize                   out: fp32|bf16 [out_bf16]
//	AddBias                      out: fp32|bf16 [out_bf16]; bias: fp32|bf16 [bias_bf16]
//	BiasBackward                 dbias: fp32|bf16 [dbias_bf16]; dout: fp32|bf16 [dout_bf16]
//	AttentionForward             out, qkv: bf16; lse: fp32; pos: i32
//	AttentionBackward            dqkv, dout, qkv, out: bf16; lse, scratch: fp32; pos: i32
//	GeluForward                  out, inp: fp32|bf16 [x_bf16]
//	GeluBackward                 dinp, dout: fp32|bf16 [g_bf16]; inp: fp32|bf16 [x_bf16]
//	SwiGLUForward                out, gate, up: fp32|bf16 [x_bf16]
//	SwiGLUBackward               dgate, dup, dout: fp32|bf16 [g_bf16]; gate, up: fp32|bf16 [x_bf16]
//	RMSNormForward               out, inp, weight: fp32|bf16 [x_bf16]; rstd: fp32
//	RMSNormBackward              dinp, dout: fp32|bf16 [g_bf16]; dweight: fp32|bf16 [dw_bf16]; inp, weight: fp32|bf16 [x_bf16]; rstd, scratch: fp32
//	RoPEForward                  out, inp: fp32|bf16 [x_bf16]; invFreq: fp32; pos: i32
//	RoPEBackward                 dinp, dout: fp32|bf16 [x_bf16]; invFreq: fp32; pos: i32
//	CrossEntropyForwardBackward  losses: fp32; logits: fp32|bf16 [x_bf16]; targets: i32
//	SumSquares                   out: fp32; x: fp32|bf16 [x_bf16]; work: fp64
//	NonFiniteFlag                flag, x: fp32
//	AdamW                        param: fp32|bf16 [param_bf16]; grad: fp32|bf16 [grad_bf16]; master, m, v, sumSq, skip: fp32
//	SparseCompressA              A, colval: fp32; X: fp32|bf16 [x_bf16]; colptr, rowidx: i32
//	SparseCompressB              B, colval: fp32; dY: fp32|bf16 [dy_bf16]; colptr, rowidx: i32
//	SparseS                      S, A, B: fp32
//	SparseApply                  W: fp32|bf16 [w_bf16]; T, Delta, pval, qval, skip: fp32; pidx, qidx: i32
//	SparseValueGrad              out, Y, M, K, val: fp32; idx: i32
//	DenseGemm                    A: fp32|bf16 [a_bf16]; B: fp32|bf16 [b_bf16]; C: fp32
//	DenseApply                   A, B, skip: fp32; W: fp32|bf16 [w_bf16]
//
// A quantized matrix (GemmQ's and Dequantize's W, a Quant) is not in the
// table: its tensors' dtypes are fixed (codes and absmax bytes in I32
// words, scale and book fp32) and Quant.Check checks them with its shape.
//
// Scratch memory (LayerNormBackward, RMSNormBackward, AttentionBackward,
// SumSquares) is passed in by the caller, sized by
// LayerNormBackwardScratch, RMSNormBackwardScratch,
// AttentionBackwardScratch and SumSquaresWork, so that memory plans count
// it and no backend allocates during a step.
package backend
