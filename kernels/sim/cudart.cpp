/*
 * cudart.cpp: a simulated CUDA runtime for cudasim builds. It implements
 * the subset of CUDA's runtime API the cuda/ backend calls, with CUDA's
 * semantics, on top of the CPU simulator (sim.cpp, which this file
 * includes: one translation unit), so the backend's Go code runs unchanged
 * on a machine without a GPU and without NVIDIA's libraries (only CUDA's
 * headers). The importing cgo package compiles it through a one-line .cc
 * file (#include "../sim/cudart.cpp") and the kernels with -DLSP_SIM
 * -DLSP_CUDASIM, under which LSP_LAUNCH queues grids instead of running
 * them (sim.h).
 *
 * What it simulates:
 *   - One device, 0: "lsp-offload cudasim", compute capability 9.0, 132
 *     SMs, 227 KiB opt-in shared memory per block, PCI 0000:01:00;
 *     totalGlobalMem is the configured memory (lsp_sim_set_device_memory,
 *     env LSP_CUDASIM_MEM, default 8 GiB). cudaMalloc charges requests
 *     rounded up to 256 bytes against it and fails with
 *     cudaErrorMemoryAllocation past it. Each buffer is an lsp_sim_alloc
 *     buffer: 256-byte aligned, filled with 0xFF (NaN), ending at a guard
 *     page (an access past it faults and the simulator names the buffer);
 *     the < 256 bytes between the end and the guard are a canary that
 *     cudaFree checks (overwritten: a sticky cudaErrorIllegalAddress).
 *   - Pinned host memory: cudaMallocHost/cudaHostAlloc (mmap, 0xFF) and
 *     cudaHostRegister (the range must be mapped; no overlaps) record
 *     ranges. cudaMemcpyAsync with a host side outside them behaves as
 *     CUDA does for pageable memory: H2D copies into a staging buffer
 *     before it returns, D2H returns only when the copy is done.
 *   - Streams: each stream has its own thread that runs its queue in
 *     order; launches, cudaMemcpyAsync, cudaMemsetAsync, event records,
 *     waits and host functions are queued and the call returns at once.
 *     Kernels run one at a time (a global execution lock; the grid itself
 *     runs on the simulator's worker pool), but copies, memsets and host
 *     functions on other streams run while a kernel runs.
 *   - The legacy default stream (0 or cudaStreamLegacy) is a stream of its
 *     own that synchronises with every blocking stream as CUDA's does: an
 *     operation on it waits for the work queued before it on all blocking
 *     streams, and an operation on a blocking stream waits for the work
 *     queued before it on stream 0. Streams created with
 *     cudaStreamNonBlocking do neither. cudaMemcpy (synchronous) runs on
 *     stream 0 and waits for its copy. cudaStreamPerThread is refused.
 *   - Events: a record is bound to its position in the stream and stamped
 *     (steady clock) when the stream reaches it; cudaStreamWaitEvent binds
 *     to the latest record when it is called; a wait on, a query of or a
 *     synchronisation with a never-recorded event succeeds at once;
 *     cudaEventElapsedTime gives milliseconds between the stamps,
 *     cudaErrorInvalidResourceHandle when an event was never recorded or
 *     has cudaEventDisableTiming, cudaErrorNotReady while a record is
 *     pending.
 *   - Errors: a call refused on its arguments returns the error and sets
 *     the calling thread's last error (cudaGetLastError) and message
 *     (lsp_sim_last_message), as CUDA does; copy and memset ranges are
 *     checked against the live buffers when they are queued. An error of a
 *     queued operation (a kernel fault the simulator detects: barrier,
 *     warp collective, shared memory canary, misaligned wmma) is sticky:
 *     later work is skipped and every later call that touches the device
 *     (synchronise, query, launch, copy, malloc, ...) returns it, with the
 *     simulator's message, as a corrupted CUDA context does, until
 *     lsp_sim_clear_sticky_error. Release calls (cudaFree, cudaFreeHost,
 *     cudaHostUnregister, cudaStreamDestroy, cudaEventDestroy) still
 *     release, then return it.
 *   - cudaFree, cudaFreeHost and cudaHostUnregister wait for every stream
 *     first, as cudaFree does on a GPU (and so no queued copy can outlive
 *     its buffer).
 *   - Hazard mode (lsp_sim_set_delays, env LSP_CUDASIM_DELAYS=seed:max_us):
 *     seeded delays before each queued operation. Timestamps of executed
 *     operations: lsp_sim_trace / lsp_sim_trace_read.
 *   - Not implemented: an entry point not defined here does not link;
 *     those a backend might plausibly reach for (managed and stream-ordered
 *     allocation, 2D and peer copies, graphs capture, cudaLaunchKernel,
 *     cudaDeviceReset, ...) are defined and return cudaErrorNotSupported;
 *     unsupported flags and kinds (mapped or write-combined host memory,
 *     interprocess events, cudaMemcpyHostToHost, per-thread default
 *     stream, function attributes other than max dynamic shared memory)
 *     return cudaErrorNotSupported. Device queries (count, properties,
 *     attributes, function attributes, error names) do not report the
 *     sticky error.
 *
 *   - NCCL: package cuda's cudasim build also compiles nccl.cpp, a
 *     simulated NCCL, into the same translation unit: its sends, receives
 *     and broadcasts are queued operations of kind LSP_SIM_OP_NCCL (stream
 *     order, events, the legacy stream's rules and the hazard delays apply
 *     as to any other), whose failure is a sticky cudaErrorLaunchFailure;
 *     see its header. The runtime's own entry points are the same with or
 *     without it.
 *
 * Limits: a SIGSEGV in a kernel (an access through a guard page) still
 * ends the process with the simulator's report, as it does in lsp_sim
 * builds; a real GPU would make it a sticky cudaErrorIllegalAddress.
 * cudaFuncGetAttributes knows only maxThreadsPerBlock (1024), the dynamic
 * shared memory limit and the versions (90); numRegs and the static sizes
 * are 0 (unknown). A host function (cudaLaunchHostFunc) runs on the
 * stream's thread and must not call CUDA (cudaFree or a synchronisation
 * from it deadlocks, as CUDA forbids them); it is skipped after a sticky
 * error. cudaMalloc touches every byte it hands out (the 0xFF fill), so
 * simulated device memory is real memory: size arenas by what a test uses.
 */
#ifndef LSP_CUDASIM
#error "cudart.cpp is the simulated CUDA runtime: compile it with -DLSP_SIM -DLSP_CUDASIM"
#endif
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "the simulated CUDA runtime implements the legacy default stream only"
#endif

#include "sim.cpp"

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>

namespace lsp_sim {
namespace {

const size_t kDefaultDeviceMem = size_t(8) << 30;
const size_t kMallocAlign = 256; /* cudaMalloc's alignment, and its accounting granule */
const size_t kMaxTrace = size_t(1) << 20;
const size_t kHandleSpace = size_t(1) << 30;

/* One cudaEventRecord, or the completion of an operation a caller waits
 * for: done and stamped when the stream reaches it. */
struct Record {
	bool done = false;
	int64_t t_ns = 0;
};

struct Stream;

struct Op {
	int kind = 0;
	const char* label = "";
	uint64_t seq = 0;
	unsigned delay_us = 0;
	/* kernel */
	const char* file = nullptr;
	int line = 0;
	const void* kernel = nullptr;
	Thunk thunk = nullptr;
	void* params = nullptr;
	ParamsFree free_params = nullptr;
	dim3 grid, block;
	size_t smem = 0;
	uint64_t seed = 0;
	/* copy, memset */
	void* dst = nullptr;
	const void* src = nullptr;
	size_t bytes = 0;
	int value = 0;
	std::vector<unsigned char> staging; /* pageable H2D: the host bytes at the call */
	/* wait: for a record, or for a stream to finish its first wait_seq ops */
	std::shared_ptr<Record> wait_rec;
	std::shared_ptr<Stream> wait_stream;
	uint64_t wait_seq = 0;
	/* host function */
	cudaHostFn_t fn = nullptr;
	void* user = nullptr;
	/* NCCL operation (nccl.cpp): runs even after a sticky error (dead), so
	 * that it can fail its communicator; 0, or the sticky error's code with
	 * its message */
	std::function<int(bool dead, std::string* msg)> task;
	/* completed and stamped when the op has run (event records, waited-for copies) */
	std::shared_ptr<Record> done;

	~Op() {
		if (params && free_params) free_params(params);
	}
};

struct Stream {
	uintptr_t handle = 0; /* the cudaStream_t; 0 for the legacy stream */
	unsigned flags = 0;
	uint64_t number = 0; /* for the hazard delays: 0 legacy, 1, 2, ... */
	std::deque<std::unique_ptr<Op>> q;
	uint64_t queued = 0, done = 0;
	bool destroyed = false;
	std::condition_variable cv; /* work for the stream's thread */
};

struct Event {
	unsigned flags = 0;
	std::shared_ptr<Record> latest; /* null: never recorded */
};

struct DevBuf {
	size_t bytes;
	size_t charged;
};

struct HostRange {
	size_t bytes;
	size_t map_len; /* allocated by cudaHostAlloc (munmap at cudaFreeHost); 0: registered */
};

/* All state, under mu. Never destroyed: detached stream threads use it
 * until the process exits. */
struct State {
	std::mutex mu;
	std::condition_variable cv; /* an operation finished */
	std::once_flag init;
	std::map<uintptr_t, std::shared_ptr<Stream>> streams; /* live created streams */
	std::vector<std::shared_ptr<Stream>> running;           /* every stream whose thread runs, legacy included */
	std::shared_ptr<Stream> legacy;
	std::map<uintptr_t, std::shared_ptr<Event>> events;
	std::map<uintptr_t, DevBuf> dev;
	std::map<uintptr_t, HostRange> host;
	size_t mem_total = kDefaultDeviceMem, mem_used = 0;
	uint64_t inflight = 0; /* queued, not yet finished, over all streams */
	uint64_t delay_seed = 0;
	unsigned delay_max_us = 0;
	uint64_t stream_numbers = 0;
	uintptr_t handle_base = 0;
	uint64_t handles = 0;
	bool trace_on = false;
	std::vector<lsp_sim_op_time> trace;
	long long trace_total = 0;
	long long pageable = 0;
	/* The sticky error: its code is read without mu, its message under sticky_mu. */
	std::atomic<int> sticky{0};
	std::mutex sticky_mu;
	std::string sticky_msg;
};
State& S = *new State;

int64_t now_ns() {
	return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
	    .count();
}

/* "123", "512K", "64M", "8G" (powers of 1024); 0 when it does not parse. */
size_t parse_bytes(const char* v) {
	if (!v || !*v) return 0;
	char* end = nullptr;
	unsigned long long x = strtoull(v, &end, 10);
	int shift = 0;
	if (*end == 'K' || *end == 'k') shift = 10;
	if (*end == 'M' || *end == 'm') shift = 20;
	if (*end == 'G' || *end == 'g') shift = 30;
	if (shift) end++;
	if (end == v || *end != '\0' || x == 0 || x > (~0ull >> shift)) return 0;
	return size_t(x << shift);
}

void rt_init() {
	std::call_once(S.init, [] {
		init_env();
		const char* m = getenv("LSP_CUDASIM_MEM");
		if (m && *m) {
			size_t b = parse_bytes(m);
			if (b == 0)
				fprintf(stderr, "lsp_sim: ignoring LSP_CUDASIM_MEM=%s (want bytes, or a number with K, M or G)\n", m);
			else
				S.mem_total = b;
		}
		const char* d = getenv("LSP_CUDASIM_DELAYS");
		if (d && *d) {
			unsigned long long seed = 0, max_us = 0;
			char tail = 0;
			if (sscanf(d, "%llu:%llu%c", &seed, &max_us, &tail) == 2 && max_us <= 10000000) {
				S.delay_seed = seed;
				S.delay_max_us = unsigned(max_us);
			} else {
				fprintf(stderr, "lsp_sim: ignoring LSP_CUDASIM_DELAYS=%s (want seed:max_us)\n", d);
			}
		}
		/* Handles are addresses in a reserved, inaccessible range: never
		 * reused (a destroyed handle stays invalid), never in Go's heap,
		 * and a dereference faults. */
		void* h = mmap(nullptr, kHandleSpace, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (h == MAP_FAILED) {
			fprintf(stderr, "lsp_sim: cannot reserve address space for stream and event handles\n");
			abort();
		}
		S.handle_base = reinterpret_cast<uintptr_t>(h);
	});
}

uintptr_t new_handle() { return S.handle_base + 16 * (++S.handles % (kHandleSpace / 16 - 1)); }

/* ---- errors ---- */

cudaError_t fail(cudaError_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
cudaError_t fail(cudaError_t code, const char* fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	set_message("lsp_sim: " + vformat(fmt, ap));
	va_end(ap);
	t_last_error = code;
	return code;
}

/* Returns the sticky error (0 if none), which also becomes the calling
 * thread's last error and message. */
cudaError_t sticky() {
	int code = S.sticky.load();
	if (code == 0) return cudaSuccess;
	std::lock_guard<std::mutex> l(S.sticky_mu);
	set_message(S.sticky_msg);
	t_last_error = cudaError_t(code);
	return cudaError_t(code);
}

void make_sticky(int code, const std::string& msg) {
	std::lock_guard<std::mutex> l(S.sticky_mu);
	if (S.sticky.load() != 0) return;
	S.sticky_msg = msg;
	S.sticky.store(code);
}

cudaError_t unsupported(const char* what) {
	return fail(cudaErrorNotSupported, "%s is not implemented by the simulated CUDA runtime", what);
}

/* ---- memory lookups (under S.mu) ---- */

/* The device buffer holding address p, or end(). */
std::map<uintptr_t, DevBuf>::iterator dev_at(uintptr_t p) {
	auto it = S.dev.upper_bound(p);
	if (it == S.dev.begin()) return S.dev.end();
	--it;
	return p < it->first + it->second.bytes ? it : S.dev.end();
}

/* Whether [p, p+n) lies in one device buffer; else why not. */
bool dev_range(const void* ptr, size_t n, std::string* why) {
	uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
	auto it = dev_at(p);
	if (it == S.dev.end()) {
		*why = format("%p is not in a live cudaMalloc buffer", ptr);
		return false;
	}
	size_t off = p - it->first;
	if (n > it->second.bytes - off) {
		*why = format("%zu bytes at %p (offset %zu of the %zu-byte buffer at 0x%zx) run %zu bytes past its end", n, ptr,
		              off, it->second.bytes, size_t(it->first), n - (it->second.bytes - off));
		return false;
	}
	return true;
}

/* Whether [p, p+n) overlaps any range of m (ranges do not overlap each other). */
template <class T>
bool overlaps(const std::map<uintptr_t, T>& m, uintptr_t p, size_t n) {
	if (n == 0) n = 1;
	auto it = m.upper_bound(p + n - 1);
	if (it == m.begin()) return false;
	--it;
	return it->first + it->second.bytes > p;
}

/* Whether [p, p+n) lies in one pinned host range. */
bool pinned(const void* ptr, size_t n) {
	uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
	auto it = S.host.upper_bound(p);
	if (it == S.host.begin()) return false;
	--it;
	return p >= it->first && p - it->first <= it->second.bytes && n <= it->second.bytes - (p - it->first);
}

/* ---- streams ---- */

void stream_main(std::shared_ptr<Stream> s);

std::shared_ptr<Stream> start_stream(uintptr_t handle, unsigned flags, uint64_t number) {
	auto s = std::make_shared<Stream>();
	s->handle = handle;
	s->flags = flags;
	s->number = number;
	S.running.push_back(s);
	std::thread(stream_main, s).detach();
	return s;
}

/* The stream behind a handle (under S.mu), or null with *err. */
std::shared_ptr<Stream> find_stream(cudaStream_t h, cudaError_t* err) {
	if (h == nullptr || h == cudaStreamLegacy) {
		if (!S.legacy) S.legacy = start_stream(0, 0, 0);
		return S.legacy;
	}
	if (h == cudaStreamPerThread) {
		*err = cudaErrorNotSupported;
		return nullptr;
	}
	auto it = S.streams.find(reinterpret_cast<uintptr_t>(h));
	if (it == S.streams.end()) {
		*err = cudaErrorInvalidResourceHandle;
		return nullptr;
	}
	return it->second;
}

/* live_stream is find_stream for an entry point, under S.mu held by l: for
 * a handle that is no live stream it releases l and fails with why (a
 * printf format whose one %p is the handle), leaving the error for the
 * entry point to return in *ret. */
std::shared_ptr<Stream> live_stream(std::unique_lock<std::mutex>& l, cudaStream_t h, const char* why, cudaError_t* ret) {
	cudaError_t err = cudaSuccess;
	std::shared_ptr<Stream> s = find_stream(h, &err);
	if (!s) {
		l.unlock();
		*ret = fail(err, why, static_cast<void*>(h));
	}
	return s;
}

/* live_event is live_stream for an event handle (under S.mu held by l):
 * its event, or null after failing with cudaErrorInvalidResourceHandle. */
std::shared_ptr<Event> live_event(std::unique_lock<std::mutex>& l, cudaEvent_t ev, const char* why, cudaError_t* ret) {
	auto it = S.events.find(reinterpret_cast<uintptr_t>(ev));
	if (it == S.events.end()) {
		l.unlock();
		*ret = fail(cudaErrorInvalidResourceHandle, why, static_cast<void*>(ev));
		return nullptr;
	}
	return it->second;
}

/* new_op is an operation of kind (LSP_SIM_OP_*) with its trace label. */
std::unique_ptr<Op> new_op(int kind, const char* label) {
	auto op = std::unique_ptr<Op>(new Op);
	op->kind = kind;
	op->label = label;
	return op;
}

unsigned delay_for(const Stream* s, uint64_t seq) {
	if (S.delay_max_us == 0) return 0;
	return unsigned(mix(mix(S.delay_seed, s->number + 1), seq) % (uint64_t(S.delay_max_us) + 1));
}

void push(Stream* s, std::unique_ptr<Op> op) {
	op->seq = ++s->queued;
	op->delay_us = delay_for(s, op->seq);
	S.inflight++;
	s->q.push_back(std::move(op));
	s->cv.notify_one();
}

std::unique_ptr<Op> wait_for_stream(const std::shared_ptr<Stream>& t) {
	auto w = new_op(LSP_SIM_OP_WAIT, "legacy stream sync");
	w->wait_stream = t;
	w->wait_seq = t->queued;
	return w;
}

/* Queues op on s (under S.mu), after the implicit waits of the legacy
 * default stream. */
void enqueue(const std::shared_ptr<Stream>& s, std::unique_ptr<Op> op) {
	if (s == S.legacy) {
		for (const auto& b : S.running)
			if (b != s && !(b->flags & cudaStreamNonBlocking) && b->done < b->queued) push(s.get(), wait_for_stream(b));
	} else if (!(s->flags & cudaStreamNonBlocking) && S.legacy && S.legacy->done < S.legacy->queued) {
		push(s.get(), wait_for_stream(S.legacy));
	}
	push(s.get(), std::move(op));
}

/* Runs one operation on its stream's thread (without S.mu); returns its
 * status for the trace. */
int run_op(Stream* s, Op* op) {
	bool dead = S.sticky.load() != 0;
	switch (op->kind) {
	case LSP_SIM_OP_KERNEL: {
		if (dead) return -1;
		std::string msg;
		int code = run_launch(op->label, op->file, op->line, op->kernel, op->thunk, op->params, op->grid, op->block,
		                      op->smem, &op->seed, &msg);
		if (code != 0)
			make_sticky(code, msg + format(" (asynchronous: the kernel was queued on stream 0x%zx)", size_t(s->handle)));
		return code;
	}
	case LSP_SIM_OP_MEMCPY_H2D:
	case LSP_SIM_OP_MEMCPY_D2H:
	case LSP_SIM_OP_MEMCPY_D2D:
		if (dead) return -1;
		memcpy(op->dst, op->staging.empty() ? op->src : op->staging.data(), op->bytes);
		return 0;
	case LSP_SIM_OP_MEMSET:
		if (dead) return -1;
		memset(op->dst, op->value, op->bytes);
		return 0;
	case LSP_SIM_OP_EVENT_RECORD: return 0;
	case LSP_SIM_OP_WAIT: {
		std::unique_lock<std::mutex> l(S.mu);
		if (op->wait_rec) {
			Record* r = op->wait_rec.get();
			S.cv.wait(l, [r] { return r->done; });
		} else {
			Stream* t = op->wait_stream.get();
			uint64_t n = op->wait_seq;
			S.cv.wait(l, [t, n] { return t->done >= n; });
		}
		return 0;
	}
	case LSP_SIM_OP_HOST_FUNC:
		if (dead) return -1;
		op->fn(op->user);
		return 0;
	case LSP_SIM_OP_NCCL: {
		std::string msg;
		int code = op->task(dead, &msg);
		if (dead) return -1;
		if (code != 0) make_sticky(code, msg + format(" (asynchronous: queued on stream 0x%zx)", size_t(s->handle)));
		return code;
	}
	}
	return -1;
}

void stream_main(std::shared_ptr<Stream> s) {
	block_async_signals();
	std::unique_lock<std::mutex> l(S.mu);
	for (;;) {
		s->cv.wait(l, [&s] { return !s->q.empty() || s->destroyed; });
		if (s->q.empty()) break; /* destroyed and drained */
		std::unique_ptr<Op> op = std::move(s->q.front());
		s->q.pop_front();
		l.unlock();
		if (op->delay_us) std::this_thread::sleep_for(std::chrono::microseconds(op->delay_us));
		int64_t t0 = now_ns();
		int status = run_op(s.get(), op.get());
		int64_t t1 = now_ns();
		l.lock();
		s->done++;
		S.inflight--;
		if (op->done) {
			op->done->t_ns = t0;
			op->done->done = true;
		}
		if (S.trace_on) {
			if (S.trace.size() < kMaxTrace) {
				lsp_sim_op_time t;
				memset(&t, 0, sizeof t);
				t.stream = s->handle;
				t.seq = op->seq;
				t.kind = op->kind;
				t.status = status;
				t.delay_us = op->delay_us;
				t.start_ns = t0;
				t.end_ns = t1;
				snprintf(t.name, sizeof t.name, "%s", op->label);
				S.trace.push_back(t);
			}
			S.trace_total++;
		}
		op.reset(); /* frees a kernel's captured arguments */
		S.cv.notify_all();
	}
	for (size_t i = 0; i < S.running.size(); i++) {
		if (S.running[i] == s) {
			S.running.erase(S.running.begin() + long(i));
			break;
		}
	}
}

void wait_idle(std::unique_lock<std::mutex>& l) {
	S.cv.wait(l, [] { return S.inflight == 0; });
}

/* ---- copies ---- */

const char* kind_label(int k) {
	switch (k) {
	case LSP_SIM_OP_MEMCPY_H2D: return "memcpy H2D";
	case LSP_SIM_OP_MEMCPY_D2H: return "memcpy D2H";
	default: return "memcpy D2D";
	}
}

/* cudaMemcpyAsync on stream, or (sync) cudaMemcpy: on the legacy stream,
 * returning when the copy is done. */
cudaError_t memcpy_impl(const char* fn, void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                        cudaStream_t stream, bool sync) {
	rt_init();
	if (cudaError_t e = sticky()) return e;
	if (int(kind) < int(cudaMemcpyHostToHost) || int(kind) > int(cudaMemcpyDefault))
		return fail(cudaErrorInvalidMemcpyDirection, "%s: kind %d is not a cudaMemcpyKind", fn, int(kind));
	if (kind == cudaMemcpyHostToHost)
		return fail(cudaErrorNotSupported, "%s: cudaMemcpyHostToHost is not implemented by the simulated runtime", fn);
	std::unique_lock<std::mutex> l(S.mu);
	cudaError_t err = cudaSuccess;
	std::shared_ptr<Stream> s = find_stream(sync ? nullptr : stream, &err);
	if (!s) {
		l.unlock();
		return fail(err, "%s: stream %p is not a live stream", fn, static_cast<void*>(stream));
	}
	if (n == 0) return cudaSuccess;
	if (!dst || !src) {
		l.unlock();
		return fail(cudaErrorInvalidValue, "%s: null pointer (dst %p, src %p) for %zu bytes", fn, dst, src, n);
	}
	uintptr_t d = reinterpret_cast<uintptr_t>(dst), sp = reinterpret_cast<uintptr_t>(src);
	bool dd, sd;
	if (kind == cudaMemcpyDefault) {
		dd = dev_at(d) != S.dev.end();
		sd = dev_at(sp) != S.dev.end();
		if (!dd && !sd) {
			l.unlock();
			return fail(cudaErrorNotSupported,
			            "%s: cudaMemcpyDefault between two host pointers (%p, %p): host to host is not implemented", fn,
			            dst, src);
		}
	} else {
		dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
		sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
	}
	std::string why;
	const void* ends[2] = {dst, src};
	bool isdev[2] = {dd, sd};
	const char* names[2] = {"dst", "src"};
	for (int i = 0; i < 2; i++) {
		if (isdev[i] && !dev_range(ends[i], n, &why)) {
			l.unlock();
			return fail(cudaErrorInvalidValue, "%s: %s: %s", fn, names[i], why.c_str());
		}
		if (!isdev[i] && overlaps(S.dev, reinterpret_cast<uintptr_t>(ends[i]), n)) {
			l.unlock();
			return fail(cudaErrorInvalidValue,
			            "%s: %s %p (%zu bytes) is the host side of the copy but overlaps a device buffer (wrong kind?)",
			            fn, names[i], ends[i], n);
		}
	}
	if ((d < sp ? sp - d : d - sp) < n) {
		l.unlock();
		return fail(cudaErrorInvalidValue, "%s: the ranges of dst %p and src %p (%zu bytes) overlap", fn, dst, src, n);
	}
	const int k = dd && sd ? LSP_SIM_OP_MEMCPY_D2D : dd ? LSP_SIM_OP_MEMCPY_H2D : LSP_SIM_OP_MEMCPY_D2H;
	auto op = new_op(k, kind_label(k));
	op->dst = dst;
	op->src = src;
	op->bytes = n;
	bool wait = sync;
	if (!sync && !((dd || pinned(dst, n)) && (sd || pinned(src, n)))) {
		S.pageable++;
		if (!sd) {
			/* Pageable H2D: CUDA returns once the bytes are staged. */
			op->staging.assign(static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + n);
		} else {
			wait = true; /* pageable D2H: CUDA returns once the copy is done */
		}
	}
	std::shared_ptr<Record> done;
	if (wait) op->done = done = std::make_shared<Record>();
	enqueue(s, std::move(op));
	if (!wait) return cudaSuccess;
	Record* r = done.get();
	S.cv.wait(l, [r] { return r->done; });
	l.unlock();
	return sticky();
}

} /* namespace */

/* sim.h: LSP_LAUNCH under LSP_CUDASIM. */
void launch_async(const char* name, const char* file, int line, const void* kernel, Thunk thunk, void* params,
                  ParamsFree free_params, dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
	rt_init();
	auto op = std::unique_ptr<Op>(new Op); /* owns params from here */
	op->params = params;
	op->free_params = free_params;
	if (check_launch(name, file, line, kernel, grid, block, smem) != cudaSuccess) return;
	if (sticky()) return;
	std::unique_lock<std::mutex> l(S.mu);
	cudaError_t err = cudaSuccess;
	std::shared_ptr<Stream> s = find_stream(stream, &err);
	if (!s) {
		l.unlock();
		fail(err, "launch of %s at %s:%d: stream %p is not a live stream", name, base_name(file), line,
		     static_cast<void*>(stream));
		return;
	}
	op->kind = LSP_SIM_OP_KERNEL;
	op->label = name;
	op->file = file;
	op->line = line;
	op->kernel = kernel;
	op->thunk = thunk;
	op->grid = grid;
	op->block = block;
	op->smem = smem;
	op->seed = next_launch_seed();
	enqueue(s, std::move(op));
}

} /* namespace lsp_sim */

/* ---------------------------------------------------------------------------
 * The CUDA runtime entry points (cuda_runtime_api.h)
 * ------------------------------------------------------------------------- */

using lsp_sim::S;
using lsp_sim::fail;
using lsp_sim::sticky;

extern "C" {

/* ---- errors ---- */

cudaError_t cudaGetLastError(void) {
	cudaError_t e = lsp_sim::t_last_error;
	lsp_sim::t_last_error = cudaSuccess;
	return e != cudaSuccess ? e : cudaError_t(S.sticky.load());
}

cudaError_t cudaPeekAtLastError(void) {
	cudaError_t e = lsp_sim::t_last_error;
	return e != cudaSuccess ? e : cudaError_t(S.sticky.load());
}

/* ---- device ---- */

cudaError_t cudaGetDeviceCount(int* count) {
	if (!count) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount: null count");
	*count = 1;
	return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
	if (device != 0) return fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): the simulated runtime has device 0 only", device);
	return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
	if (!device) return fail(cudaErrorInvalidValue, "cudaGetDevice: null device");
	*device = 0;
	return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* p, int device) {
	lsp_sim::rt_init();
	if (!p) return fail(cudaErrorInvalidValue, "cudaGetDeviceProperties: null prop");
	if (device != 0) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d): device 0 only", device);
	memset(p, 0, sizeof *p);
	snprintf(p->name, sizeof p->name, "lsp-offload cudasim");
	memcpy(p->uuid.bytes, "lsp-offload-sim0", 16);
	{
		std::lock_guard<std::mutex> l(S.mu);
		p->totalGlobalMem = S.mem_total;
	}
	p->sharedMemPerBlock = 48 * 1024;
	p->regsPerBlock = 65536;
	p->warpSize = 32;
	p->memPitch = size_t(1) << 31;
	p->maxThreadsPerBlock = 1024;
	p->maxThreadsDim[0] = 1024;
	p->maxThreadsDim[1] = 1024;
	p->maxThreadsDim[2] = 64;
	p->maxGridSize[0] = 0x7FFFFFFF;
	p->maxGridSize[1] = 65535;
	p->maxGridSize[2] = 65535;
	p->clockRate = 1980000;
	p->totalConstMem = 65536;
	p->major = 9;
	p->minor = 0;
	p->textureAlignment = 512;
	p->texturePitchAlignment = 32;
	p->deviceOverlap = 1;
	p->multiProcessorCount = 132;
	p->computeMode = cudaComputeModeDefault;
	p->concurrentKernels = 0; /* kernels run one at a time */
	p->pciBusID = 1;
	p->pciDeviceID = 0;
	p->pciDomainID = 0;
	p->asyncEngineCount = 2;
	p->unifiedAddressing = 1;
	p->memoryClockRate = 2619000;
	p->memoryBusWidth = 5120;
	p->l2CacheSize = 50 * 1024 * 1024;
	p->maxThreadsPerMultiProcessor = 2048;
	p->globalL1CacheSupported = 1;
	p->localL1CacheSupported = 1;
	p->sharedMemPerMultiprocessor = 228 * 1024;
	p->regsPerMultiprocessor = 65536;
	p->sharedMemPerBlockOptin = 227 * 1024;
	p->maxBlocksPerMultiProcessor = 32;
	p->reservedSharedMemPerBlock = 1024;
	return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
	if (!value) return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: null value");
	if (device != 0) return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: device %d (device 0 only)", device);
	int v;
	switch (attr) {
	case cudaDevAttrMaxThreadsPerBlock: v = 1024; break;
	case cudaDevAttrMaxBlockDimX: v = 1024; break;
	case cudaDevAttrMaxBlockDimY: v = 1024; break;
	case cudaDevAttrMaxBlockDimZ: v = 64; break;
	case cudaDevAttrMaxGridDimX: v = 0x7FFFFFFF; break;
	case cudaDevAttrMaxGridDimY: v = 65535; break;
	case cudaDevAttrMaxGridDimZ: v = 65535; break;
	case cudaDevAttrMaxSharedMemoryPerBlock: v = 48 * 1024; break;
	case cudaDevAttrTotalConstantMemory: v = 65536; break;
	case cudaDevAttrWarpSize: v = 32; break;
	case cudaDevAttrMaxRegistersPerBlock: v = 65536; break;
	case cudaDevAttrClockRate: v = 1980000; break;
	case cudaDevAttrMultiProcessorCount: v = 132; break;
	case cudaDevAttrKernelExecTimeout: v = 0; break;
	case cudaDevAttrIntegrated: v = 0; break;
	case cudaDevAttrCanMapHostMemory: v = 0; break; /* cudaHostAllocMapped is not simulated */
	case cudaDevAttrComputeMode: v = cudaComputeModeDefault; break;
	case cudaDevAttrConcurrentKernels: v = 0; break;
	case cudaDevAttrEccEnabled: v = 0; break;
	case cudaDevAttrPciBusId: v = 1; break;
	case cudaDevAttrPciDeviceId: v = 0; break;
	case cudaDevAttrPciDomainId: v = 0; break;
	case cudaDevAttrAsyncEngineCount: v = 2; break;
	case cudaDevAttrUnifiedAddressing: v = 1; break;
	case cudaDevAttrMemoryClockRate: v = 2619000; break;
	case cudaDevAttrGlobalMemoryBusWidth: v = 5120; break;
	case cudaDevAttrL2CacheSize: v = 50 * 1024 * 1024; break;
	case cudaDevAttrMaxThreadsPerMultiProcessor: v = 2048; break;
	case cudaDevAttrComputeCapabilityMajor: v = 9; break;
	case cudaDevAttrComputeCapabilityMinor: v = 0; break;
	case cudaDevAttrMaxSharedMemoryPerMultiprocessor: v = 228 * 1024; break;
	case cudaDevAttrMaxRegistersPerMultiprocessor: v = 65536; break;
	case cudaDevAttrManagedMemory: v = 0; break;
	case cudaDevAttrMaxSharedMemoryPerBlockOptin: v = 227 * 1024; break;
	case cudaDevAttrMaxBlocksPerMultiprocessor: v = 32; break;
	default:
		return fail(cudaErrorNotSupported, "cudaDeviceGetAttribute: attribute %d is not simulated", int(attr));
	}
	*value = v;
	return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
	lsp_sim::rt_init();
	if (!free_bytes || !total) return fail(cudaErrorInvalidValue, "cudaMemGetInfo: null pointer");
	if (cudaError_t e = sticky()) return e;
	std::lock_guard<std::mutex> l(S.mu);
	*total = S.mem_total;
	*free_bytes = S.mem_total - S.mem_used;
	return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
	lsp_sim::rt_init();
	{
		std::unique_lock<std::mutex> l(S.mu);
		lsp_sim::wait_idle(l);
	}
	return sticky();
}

/* ---- device memory ---- */

cudaError_t cudaMalloc(void** ptr, size_t size) {
	lsp_sim::rt_init();
	if (!ptr) return fail(cudaErrorInvalidValue, "cudaMalloc: null devPtr");
	*ptr = nullptr;
	if (cudaError_t e = sticky()) return e;
	if (size == 0) return cudaSuccess;
	size_t charged;
	{
		std::lock_guard<std::mutex> l(S.mu);
		size_t avail = S.mem_total - S.mem_used;
		charged = (size + lsp_sim::kMallocAlign - 1) / lsp_sim::kMallocAlign * lsp_sim::kMallocAlign;
		if (size > avail || charged > avail)
			return fail(cudaErrorMemoryAllocation, "cudaMalloc of %zu bytes: %zu of %zu bytes of device memory free",
			            size, avail, S.mem_total);
		S.mem_used += charged;
	}
	void* p = lsp_sim_alloc(size, lsp_sim::kMallocAlign, 0);
	std::lock_guard<std::mutex> l(S.mu);
	if (!p) {
		S.mem_used -= charged;
		return fail(cudaErrorMemoryAllocation, "cudaMalloc of %zu bytes: the host cannot map it (or 16384 buffers live)",
		            size);
	}
	S.dev[reinterpret_cast<uintptr_t>(p)] = lsp_sim::DevBuf{size, charged};
	*ptr = p;
	return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
	lsp_sim::rt_init();
	if (!p) return sticky();
	{
		std::unique_lock<std::mutex> l(S.mu);
		lsp_sim::wait_idle(l);
		auto it = S.dev.find(reinterpret_cast<uintptr_t>(p));
		if (it == S.dev.end()) {
			l.unlock();
			return fail(cudaErrorInvalidValue, "cudaFree(%p): not the start of a live cudaMalloc buffer", p);
		}
		size_t bytes = it->second.bytes;
		S.mem_used -= it->second.charged;
		S.dev.erase(it);
		l.unlock();
		if (lsp_sim_free(p) == 1)
			lsp_sim::make_sticky(cudaErrorIllegalAddress,
			                     lsp_sim::format("lsp_sim: a kernel wrote past the end of the %zu-byte device buffer at "
			                                     "%p (the canary before its guard page was overwritten; found by cudaFree)",
			                                     bytes, p));
	}
	return sticky();
}

/* ---- pinned host memory ---- */

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
	lsp_sim::rt_init();
	if (!ptr) return fail(cudaErrorInvalidValue, "cudaHostAlloc: null pHost");
	*ptr = nullptr;
	if (flags & ~unsigned(cudaHostAllocPortable))
		return fail(cudaErrorNotSupported,
		            "cudaHostAlloc: flags 0x%x (only cudaHostAllocDefault and cudaHostAllocPortable are simulated)", flags);
	if (cudaError_t e = sticky()) return e;
	if (size == 0) return cudaSuccess;
	size_t len = (size + lsp_sim::g_page - 1) / lsp_sim::g_page * lsp_sim::g_page;
	void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) return fail(cudaErrorMemoryAllocation, "cudaHostAlloc of %zu bytes: mmap failed", size);
	memset(m, 0xFF, size); /* undefined contents, as on a GPU's host */
	std::lock_guard<std::mutex> l(S.mu);
	S.host[reinterpret_cast<uintptr_t>(m)] = lsp_sim::HostRange{size, len};
	*ptr = m;
	return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* p) {
	lsp_sim::rt_init();
	if (!p) return sticky();
	{
		std::unique_lock<std::mutex> l(S.mu);
		lsp_sim::wait_idle(l);
		auto it = S.host.find(reinterpret_cast<uintptr_t>(p));
		if (it == S.host.end() || it->second.map_len == 0) {
			l.unlock();
			return fail(cudaErrorInvalidValue, "cudaFreeHost(%p): not from cudaMallocHost or cudaHostAlloc", p);
		}
		size_t len = it->second.map_len;
		S.host.erase(it);
		munmap(p, len);
	}
	return sticky();
}

cudaError_t cudaHostRegister(void* p, size_t size, unsigned int flags) {
	lsp_sim::rt_init();
	if (flags & ~unsigned(cudaHostRegisterPortable))
		return fail(cudaErrorNotSupported,
		            "cudaHostRegister: flags 0x%x (only cudaHostRegisterDefault and cudaHostRegisterPortable are "
		            "simulated)",
		            flags);
	if (!p || size == 0) return fail(cudaErrorInvalidValue, "cudaHostRegister(%p, %zu): null or empty range", p, size);
	if (cudaError_t e = sticky()) return e;
	/* As CUDA pins the pages, the range must be mapped memory. */
	uintptr_t a = reinterpret_cast<uintptr_t>(p);
	uintptr_t lo = a & ~uintptr_t(lsp_sim::g_page - 1);
	if (msync(reinterpret_cast<void*>(lo), a + size - lo, MS_ASYNC) != 0)
		return fail(cudaErrorInvalidValue, "cudaHostRegister(%p, %zu): the range is not mapped memory", p, size);
	std::lock_guard<std::mutex> l(S.mu);
	if (lsp_sim::overlaps(S.dev, a, size))
		return fail(cudaErrorInvalidValue, "cudaHostRegister(%p, %zu): overlaps a device buffer", p, size);
	if (lsp_sim::overlaps(S.host, a, size))
		return fail(cudaErrorHostMemoryAlreadyRegistered, "cudaHostRegister(%p, %zu): overlaps pinned memory", p, size);
	S.host[a] = lsp_sim::HostRange{size, 0};
	return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* p) {
	lsp_sim::rt_init();
	{
		std::unique_lock<std::mutex> l(S.mu);
		lsp_sim::wait_idle(l);
		auto it = S.host.find(reinterpret_cast<uintptr_t>(p));
		if (it == S.host.end() || it->second.map_len != 0) {
			l.unlock();
			return fail(cudaErrorHostMemoryNotRegistered, "cudaHostUnregister(%p): not the start of a registered range", p);
		}
		S.host.erase(it);
	}
	return sticky();
}

/* ---- copies and memset ---- */

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
	return lsp_sim::memcpy_impl("cudaMemcpyAsync", dst, src, count, kind, stream, false);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
	return lsp_sim::memcpy_impl("cudaMemcpy", dst, src, count, kind, nullptr, true);
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t count, cudaStream_t stream) {
	lsp_sim::rt_init();
	if (cudaError_t e = sticky()) return e;
	std::unique_lock<std::mutex> l(S.mu);
	cudaError_t ret;
	auto s = lsp_sim::live_stream(l, stream, "cudaMemsetAsync: stream %p is not a live stream", &ret);
	if (!s) return ret;
	if (count == 0) return cudaSuccess;
	std::string why;
	if (!lsp_sim::dev_range(p, count, &why)) {
		l.unlock();
		return fail(cudaErrorInvalidValue, "cudaMemsetAsync: %s", why.c_str());
	}
	auto op = lsp_sim::new_op(LSP_SIM_OP_MEMSET, "memset");
	op->dst = p;
	op->bytes = count;
	op->value = int(static_cast<unsigned char>(value));
	lsp_sim::enqueue(s, std::move(op));
	return cudaSuccess;
}

/* ---- streams ---- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* ps, unsigned int flags) {
	lsp_sim::rt_init();
	if (!ps) return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: null pStream");
	if (flags & ~unsigned(cudaStreamNonBlocking))
		return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: flags 0x%x (cudaStreamDefault or cudaStreamNonBlocking)",
		            flags);
	if (cudaError_t e = sticky()) return e;
	std::lock_guard<std::mutex> l(S.mu);
	uintptr_t h = lsp_sim::new_handle();
	S.streams[h] = lsp_sim::start_stream(h, flags, ++S.stream_numbers);
	*ps = reinterpret_cast<cudaStream_t>(h);
	return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* ps) { return cudaStreamCreateWithFlags(ps, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t h) {
	lsp_sim::rt_init();
	{
		std::lock_guard<std::mutex> l(S.mu);
		auto it = S.streams.find(reinterpret_cast<uintptr_t>(h));
		if (it == S.streams.end())
			return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(%p): not a live created stream",
			            static_cast<void*>(h));
		/* As CUDA, queued work still runs; the thread ends after it. */
		it->second->destroyed = true;
		it->second->cv.notify_one();
		S.streams.erase(it);
	}
	return sticky();
}

cudaError_t cudaStreamSynchronize(cudaStream_t h) {
	lsp_sim::rt_init();
	{
		std::unique_lock<std::mutex> l(S.mu);
		cudaError_t ret;
		auto s = lsp_sim::live_stream(l, h, "cudaStreamSynchronize(%p): not a live stream", &ret);
		if (!s) return ret;
		uint64_t n = s->queued;
		lsp_sim::Stream* sp = s.get();
		S.cv.wait(l, [sp, n] { return sp->done >= n; });
	}
	return sticky();
}

cudaError_t cudaStreamQuery(cudaStream_t h) {
	lsp_sim::rt_init();
	if (cudaError_t e = sticky()) return e;
	std::unique_lock<std::mutex> l(S.mu);
	cudaError_t ret;
	auto s = lsp_sim::live_stream(l, h, "cudaStreamQuery(%p): not a live stream", &ret);
	if (!s) return ret;
	return s->done == s->queued ? cudaSuccess : cudaErrorNotReady; /* not ready is no error: last error untouched */
}

cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t ev, unsigned int flags) {
	lsp_sim::rt_init();
	if (flags != 0)
		return fail(cudaErrorNotSupported, "cudaStreamWaitEvent: flags 0x%x (only cudaEventWaitDefault)", flags);
	if (cudaError_t e = sticky()) return e;
	std::unique_lock<std::mutex> l(S.mu);
	cudaError_t ret;
	auto s = lsp_sim::live_stream(l, h, "cudaStreamWaitEvent: stream %p is not a live stream", &ret);
	if (!s) return ret;
	auto e = lsp_sim::live_event(l, ev, "cudaStreamWaitEvent: event %p is not a live event", &ret);
	if (!e) return ret;
	if (!e->latest) return cudaSuccess; /* never recorded: a no-op, as CUDA */
	auto op = lsp_sim::new_op(LSP_SIM_OP_WAIT, "wait event");
	op->wait_rec = e->latest; /* the latest record now, not a later one */
	lsp_sim::enqueue(s, std::move(op));
	return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void* user) {
	lsp_sim::rt_init();
	if (!fn) return fail(cudaErrorInvalidValue, "cudaLaunchHostFunc: null fn");
	if (cudaError_t e = sticky()) return e;
	std::unique_lock<std::mutex> l(S.mu);
	cudaError_t ret;
	auto s = lsp_sim::live_stream(l, h, "cudaLaunchHostFunc: stream %p is not a live stream", &ret);
	if (!s) return ret;
	auto op = lsp_sim::new_op(LSP_SIM_OP_HOST_FUNC, "host function");
	op->fn = fn;
	op->user = user;
	lsp_sim::enqueue(s, std::move(op));
	return cudaSuccess;
}

/* ---- events ---- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* pe, unsigned int flags) {
	lsp_sim::rt_init();
	if (!pe) return fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags: null event");
	if (flags & cudaEventInterprocess)
		return fail(cudaErrorNotSupported, "cudaEventCreateWithFlags: cudaEventInterprocess is not simulated");
	if (flags & ~unsigned(cudaEventBlockingSync | cudaEventDisableTiming))
		return fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags: unknown flags 0x%x", flags);
	if (cudaError_t e = sticky()) return e;
	std::lock_guard<std::mutex> l(S.mu);
	uintptr_t h = lsp_sim::new_handle();
	auto ev = std::make_shared<lsp_sim::Event>();
	ev->flags = flags;
	S.events[h] = ev;
	*pe = reinterpret_cast<cudaEvent_t>(h);
	return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* pe) { return cudaEventCreateWithFlags(pe, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
	lsp_sim::rt_init();
	{
		std::lock_guard<std::mutex> l(S.mu);
		/* A pending record completes later all the same (it is shared with its op). */
		if (S.events.erase(reinterpret_cast<uintptr_t>(ev)) == 0)
			return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy(%p): not a live event", static_cast<void*>(ev));
	}
	return sticky();
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t h) {
	lsp_sim::rt_init();
	if (cudaError_t e = sticky()) return e;
	std::unique_lock<std::mutex> l(S.mu);
	cudaError_t ret;
	auto e = lsp_sim::live_event(l, ev, "cudaEventRecord: event %p is not a live event", &ret);
	if (!e) return ret;
	auto s = lsp_sim::live_stream(l, h, "cudaEventRecord: stream %p is not a live stream", &ret);
	if (!s) return ret;
	auto op = lsp_sim::new_op(LSP_SIM_OP_EVENT_RECORD, "event record");
	op->done = std::make_shared<lsp_sim::Record>();
	e->latest = op->done;
	lsp_sim::enqueue(s, std::move(op));
	return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
	lsp_sim::rt_init();
	if (cudaError_t e = sticky()) return e;
	std::unique_lock<std::mutex> l(S.mu);
	cudaError_t ret;
	auto e = lsp_sim::live_event(l, ev, "cudaEventQuery(%p): not a live event", &ret);
	if (!e) return ret;
	const auto& r = e->latest;
	return !r || r->done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
	lsp_sim::rt_init();
	{
		std::unique_lock<std::mutex> l(S.mu);
		cudaError_t ret;
		auto e = lsp_sim::live_event(l, ev, "cudaEventSynchronize(%p): not a live event", &ret);
		if (!e) return ret;
		std::shared_ptr<lsp_sim::Record> r = e->latest;
		if (r) S.cv.wait(l, [&r] { return r->done; });
	}
	return sticky();
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
	lsp_sim::rt_init();
	if (!ms) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: null ms");
	if (cudaError_t e = sticky()) return e;
	std::unique_lock<std::mutex> l(S.mu);
	auto a = S.events.find(reinterpret_cast<uintptr_t>(start));
	auto b = S.events.find(reinterpret_cast<uintptr_t>(end));
	if (a == S.events.end() || b == S.events.end()) {
		l.unlock();
		return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: %s event is not a live event",
		            a == S.events.end() ? "the start" : "the end");
	}
	if ((a->second->flags | b->second->flags) & cudaEventDisableTiming) {
		l.unlock();
		return fail(cudaErrorInvalidResourceHandle,
		            "cudaEventElapsedTime: an event was created with cudaEventDisableTiming");
	}
	if (!a->second->latest || !b->second->latest) {
		l.unlock();
		return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: the %s event was never recorded",
		            !a->second->latest ? "start" : "end");
	}
	if (!a->second->latest->done || !b->second->latest->done) return cudaErrorNotReady;
	*ms = float(double(b->second->latest->t_ns - a->second->latest->t_ns) / 1e6);
	return cudaSuccess;
}

/* ---- functions ---- */

cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func) {
	if (!attr) return fail(cudaErrorInvalidValue, "cudaFuncGetAttributes: null attr");
	if (!func) return fail(cudaErrorInvalidDeviceFunction, "cudaFuncGetAttributes: null func");
	memset(attr, 0, sizeof *attr);
	attr->maxThreadsPerBlock = 1024;
	attr->ptxVersion = 90;
	attr->binaryVersion = 90;
	attr->preferredShmemCarveout = -1;
	attr->maxDynamicSharedSizeBytes = int(lsp_sim::kDefaultDynSmem);
	std::lock_guard<std::mutex> l(lsp_sim::g_attr_mu);
	auto it = lsp_sim::g_max_dyn_smem.find(func);
	if (it != lsp_sim::g_max_dyn_smem.end()) attr->maxDynamicSharedSizeBytes = it->second;
	return cudaSuccess;
}

/* ---- entry points a backend might reach for, not simulated ---- */

cudaError_t cudaDeviceReset(void) { return lsp_sim::unsupported("cudaDeviceReset"); }
cudaError_t cudaSetDeviceFlags(unsigned int) { return lsp_sim::unsupported("cudaSetDeviceFlags"); }
cudaError_t cudaDeviceSetLimit(enum cudaLimit, size_t) { return lsp_sim::unsupported("cudaDeviceSetLimit"); }
cudaError_t cudaMallocManaged(void**, size_t, unsigned int) { return lsp_sim::unsupported("cudaMallocManaged"); }
cudaError_t cudaMallocAsync(void**, size_t, cudaStream_t) { return lsp_sim::unsupported("cudaMallocAsync"); }
cudaError_t cudaFreeAsync(void*, cudaStream_t) { return lsp_sim::unsupported("cudaFreeAsync"); }
cudaError_t cudaMallocPitch(void**, size_t*, size_t, size_t) { return lsp_sim::unsupported("cudaMallocPitch"); }
cudaError_t cudaHostGetDevicePointer(void**, void*, unsigned int) {
	return lsp_sim::unsupported("cudaHostGetDevicePointer");
}
cudaError_t cudaMemset(void*, int, size_t) { return lsp_sim::unsupported("cudaMemset (use cudaMemsetAsync)"); }
cudaError_t cudaMemcpy2DAsync(void*, size_t, const void*, size_t, size_t, size_t, enum cudaMemcpyKind, cudaStream_t) {
	return lsp_sim::unsupported("cudaMemcpy2DAsync");
}
cudaError_t cudaMemcpyPeerAsync(void*, int, const void*, int, size_t, cudaStream_t) {
	return lsp_sim::unsupported("cudaMemcpyPeerAsync");
}
cudaError_t cudaStreamCreateWithPriority(cudaStream_t*, unsigned int, int) {
	return lsp_sim::unsupported("cudaStreamCreateWithPriority");
}
cudaError_t cudaStreamAddCallback(cudaStream_t, cudaStreamCallback_t, void*, unsigned int) {
	return lsp_sim::unsupported("cudaStreamAddCallback (use cudaLaunchHostFunc)");
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, enum cudaStreamCaptureMode) {
	return lsp_sim::unsupported("cudaStreamBeginCapture");
}
cudaError_t cudaEventRecordWithFlags(cudaEvent_t, cudaStream_t, unsigned int) {
	return lsp_sim::unsupported("cudaEventRecordWithFlags");
}
cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) {
	return lsp_sim::unsupported("cudaLaunchKernel (kernels launch through LSP_LAUNCH)");
}

/* ---- sim_api.h: the runtime's controls ---- */

int lsp_sim_set_device_memory(size_t bytes) {
	lsp_sim::rt_init();
	std::lock_guard<std::mutex> l(S.mu);
	if (bytes == 0 || !S.dev.empty()) return -1;
	S.mem_total = bytes;
	return 0;
}

void lsp_sim_set_delays(uint64_t seed, unsigned max_us) {
	lsp_sim::rt_init();
	std::lock_guard<std::mutex> l(S.mu);
	S.delay_seed = seed;
	S.delay_max_us = max_us;
	S.stream_numbers = 0;
}

void lsp_sim_trace(int on) {
	lsp_sim::rt_init();
	std::lock_guard<std::mutex> l(S.mu);
	S.trace_on = on != 0;
	if (on) {
		S.trace.clear();
		S.trace_total = 0;
	}
}

long long lsp_sim_trace_read(lsp_sim_op_time* out, long long max) {
	lsp_sim::rt_init();
	std::lock_guard<std::mutex> l(S.mu);
	long long n = (long long)S.trace.size();
	if (max > n) max = n;
	for (long long i = 0; i < max; i++) out[i] = S.trace[size_t(i)];
	return S.trace_total;
}

long long lsp_sim_pageable_copies(void) {
	std::lock_guard<std::mutex> l(S.mu);
	return S.pageable;
}

int lsp_sim_clear_sticky_error(void) {
	lsp_sim::rt_init();
	std::unique_lock<std::mutex> l(S.mu);
	lsp_sim::wait_idle(l);
	std::lock_guard<std::mutex> m(S.sticky_mu);
	int code = S.sticky.exchange(0);
	S.sticky_msg.clear();
	if (code != 0 && lsp_sim::t_last_error == code) lsp_sim::t_last_error = cudaSuccess;
	return code;
}

} /* extern "C" */
