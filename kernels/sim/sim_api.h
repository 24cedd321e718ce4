/*
 * sim_api.h: the C interface of the CPU simulator (kernels/sim), for test
 * harnesses (cgo preambles) and for the simulator's own C++ side. Plain C;
 * kernels never call these.
 *
 * Device buffers: lsp_sim_alloc maps `bytes` with an inaccessible guard page
 * directly after the last byte (guard_before == 0) or directly before the
 * first byte (guard_before != 0), so any access just past the buffer
 * faults. With guard_before == 0 and align > 1 the start is rounded down to
 * `align` and the gap (< align bytes) between the end and the guard page is
 * filled with a canary that lsp_sim_free checks. New buffers hold 0xFF bytes
 * (NaN as float32 and as bf16).
 *
 * Launches from several threads at once are serialised (one grid runs at a
 * time); each thread keeps its own last error and message.
 *
 * Limits: at most 16384 live buffers; lsp_sim_set_seed during launches
 * from other threads makes their schedules depend on timing.
 */
#ifndef LSP_SIM_API_H
#define LSP_SIM_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Picks the thread orders of every later launch and the wmma fragment
 * layouts; resets the launch counter so a run is reproducible. */
void lsp_sim_set_seed(uint64_t seed);

/* Allocates a guarded device buffer (see above); NULL on failure. A buffer
 * of 0 bytes is a pointer at the guard page. */
void* lsp_sim_alloc(size_t bytes, size_t align, int guard_before);

/* Frees a buffer from lsp_sim_alloc: 0 ok, 1 the canary after the end was
 * overwritten (freed anyway), -1 not a live buffer. */
int lsp_sim_free(void* p);

/* The message of the last error a launch on the calling thread reported
 * (config or run time), "" if none since the thread started or called
 * lsp_sim_clear_message. Per thread, as CUDA's last error is: a launch on
 * another thread neither sees nor replaces it. Valid until the next launch
 * on this thread. */
const char* lsp_sim_last_message(void);

/* Forgets the calling thread's message (lsp_sim_last_message returns ""
 * until a launch on this thread reports an error). */
void lsp_sim_clear_message(void);

/* Names of CUDA error codes, as cudaGetErrorName / cudaGetErrorString. */
const char* lsp_sim_error_name(int code);
const char* lsp_sim_error_string(int code);

/* Barrier sites switched off, as LSP_SIM_SKIP_BARRIER would
 * ("file.cu:123[,file.cu:456...]"; "" for none); returns 0, or -1 when the
 * list does not parse. */
int lsp_sim_set_skip_barriers(const char* sites);

/* When this runtime was compiled and the source hash the build passed in
 * (-DLSP_SIM_SOURCES=<hex>, see the Makefile): "Mmm dd yyyy hh:mm:ss|hex"
 * (hex empty when none). The Go harness uses it to detect stale builds. */
const char* lsp_sim_build_info(void);

/* How many times a switched-off barrier site was reached (and skipped). */
long long lsp_sim_skipped_barrier_hits(void);

/* Number of worker threads that run blocks (set before the first launch;
 * default min(NumCPU, 8), env LSP_SIM_WORKERS). Returns the number in use. */
int lsp_sim_workers(int n);

/* ---- The simulated CUDA runtime (cudasim builds: kernels/sim/cudart.cpp;
 * these are undefined in plain lsp_sim builds) ---- */

/* Sets the simulated device's memory (cudaMemGetInfo's total, what
 * cudaMalloc may hand out) to `bytes`; default 8 GiB or env LSP_CUDASIM_MEM
 * (bytes, or with a K/M/G suffix). Returns 0, or -1 when bytes is 0 or
 * device buffers are live. */
int lsp_sim_set_device_memory(size_t bytes);

/* Hazard mode: before each queued operation its stream's thread sleeps a
 * delay in [0, max_us] microseconds, a hash of (seed, the stream's number,
 * the operation's position in the stream), so a missing event between
 * streams changes results the same way on every run with that seed.
 * max_us 0 switches it off (the default; env LSP_CUDASIM_DELAYS=seed:max_us
 * switches it on at start). Applies to operations queued after the call;
 * streams created after it are numbered 1, 2, ... again. */
void lsp_sim_set_delays(uint64_t seed, unsigned max_us);

/* What lsp_sim_trace_read returns about one queued operation. */
typedef struct {
	uint64_t stream;   /* the cudaStream_t (0: the legacy default stream) */
	uint64_t seq;      /* 1, 2, ... within the stream */
	int kind;          /* LSP_SIM_OP_* */
	int status;        /* 0 ran; a cudaError_t it raised; -1 skipped (sticky error) */
	unsigned delay_us; /* the hazard delay slept before it */
	int64_t start_ns;  /* steady clock, after the delay */
	int64_t end_ns;
	char name[48]; /* kernel name, or the operation's ("memcpy H2D", ...) */
} lsp_sim_op_time;

enum {
	LSP_SIM_OP_KERNEL = 1,
	LSP_SIM_OP_MEMCPY_H2D = 2,
	LSP_SIM_OP_MEMCPY_D2H = 3,
	LSP_SIM_OP_MEMCPY_D2D = 4,
	LSP_SIM_OP_MEMSET = 5,
	LSP_SIM_OP_EVENT_RECORD = 6,
	LSP_SIM_OP_WAIT = 7, /* cudaStreamWaitEvent, or the legacy stream's implicit waits */
	LSP_SIM_OP_HOST_FUNC = 8,
	LSP_SIM_OP_NCCL = 9 /* a simulated NCCL send, receive, broadcast or group (nccl.cpp) */
};

/* Starts (on != 0: forgets what was recorded) or stops recording the
 * timestamps of executed operations (at most 1 << 20 are kept). */
void lsp_sim_trace(int on);

/* Copies up to max recorded operations, in the order they finished, to
 * out; returns how many were recorded (may exceed max). */
long long lsp_sim_trace_read(lsp_sim_op_time* out, long long max);

/* How many cudaMemcpyAsync calls had a host side outside pinned memory
 * (cudaMallocHost/cudaHostAlloc/cudaHostRegister): CUDA stages those
 * (H2D) or waits for them (D2H), as this runtime does. */
long long lsp_sim_pageable_copies(void);

/* Waits for every stream, then forgets the sticky error of a failed
 * asynchronous operation (which otherwise every later call returns, as a
 * corrupted CUDA context does) and returns it (0 if none); the calling
 * thread's last error too when it is that error (other threads keep
 * theirs). For tests that provoke a fault on purpose; CUDA itself has no
 * such call. */
int lsp_sim_clear_sticky_error(void);

/* The message of the simulated NCCL's last failure in this process (which
 * call, rank, peer and why; "" if none): its ncclResult_t codes carry no
 * more than NCCL's generic strings. Defined by kernels/sim/nccl.cpp, which
 * only package cuda's cudasim build compiles in. */
const char* lsp_sim_nccl_last_message(void);

#ifdef __cplusplus
}
#endif

#endif /* LSP_SIM_API_H */
