// The C half of every Go face kernelgen writes (kernels/launch_gen.go,
// kernels/simtest/selftest_gen.go): each face's cgo preamble includes this
// header after the launchers' own, and its generated shims call
// lspgo_begin and lspgo_end around one launcher each. Hand-written, so
// that the faces share one copy; static, so that each cgo package gets
// its own.
#ifndef LSP_LSPGO_H
#define LSP_LSPGO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// lspgo_ret is a launch's result: the CUDA error and, in simulator builds,
// a malloc'd copy of the simulator's message (NULL when there is none).
typedef struct {
	int code;
	char* msg;
} lspgo_ret;

// lspgo_begin clears the calling thread's last CUDA error (and the
// simulator's message), which an earlier call on this OS thread may have
// left, so that what the launcher returns is its own.
static void lspgo_begin(void) {
	(void)cudaGetLastError();
#ifdef LSP_SIM
	lsp_sim_clear_message();
#endif
}

// lspgo_end completes a launch on the thread that made it: with sync it
// waits for the device and takes the kernel's run-time error as the
// launch's; it copies the simulator's message of a failure before any
// other launch on this thread can replace it.
static lspgo_ret lspgo_end(cudaError_t e, int sync) {
	lspgo_ret r;
	r.code = (int)e;
	r.msg = NULL;
	if (r.code == 0 && sync) {
		r.code = (int)cudaDeviceSynchronize();
		if (r.code == 0) r.code = (int)cudaGetLastError();
	}
#ifdef LSP_SIM
	if (r.code != 0) {
		const char* m = lsp_sim_last_message();
		if (m != NULL && m[0] != 0) r.msg = strdup(m);
	}
#endif
	return r;
}

#endif
