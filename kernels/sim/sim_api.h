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

#ifdef __cplusplus
}
#endif

#endif /* LSP_SIM_API_H */
