/*
 * sim.cpp: the runtime of the CPU simulator declared in sim.h and
 * sim_api.h: fibers and their scheduler, barriers and warp collectives, the
 * wmma emulation, launches on a worker pool, guarded device buffers, the
 * CUDA runtime calls launchers make, and a SIGSEGV reporter that names the
 * kernel, block, thread and buffer of a faulting access.
 *
 * Fibers switch with a few instructions of x86-64 assembly (callee-saved
 * registers, MXCSR and the x87 control word); other targets, or
 * -DLSP_SIM_UCONTEXT, use ucontext. Each worker owns its fibers, their
 * stacks (LSP_SIM_STACK_KIB, default 64, guard page below) and a dynamic
 * shared memory window ending at a guard page. A block runs entirely on one
 * worker: the scheduler picks a random runnable fiber (per-seed RNG), runs
 * it until it waits (barrier, warp collective) or returns, and repeats.
 *
 * Under -DLSP_CUDASIM the simulated CUDA runtime (cudart.cpp) includes this
 * file, queues launches on its streams (launch_async) and runs each grid
 * through run_launch; it then defines the runtime calls that see streams
 * and sticky errors (cudaGetLastError, the synchronisations) itself.
 *
 * Limits: one launch at a time (launches are serialised); a failing block is
 * abandoned with its fibers suspended (no destructors run, as on a GPU); the
 * SIGSEGV reporter chains to the previous handler (Go's) for faults outside
 * kernels and is off with LSP_SIM_NO_SIGNAL_HANDLER=1.
 */
#include "sim.h"

#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#if !defined(__x86_64__) && !defined(LSP_SIM_UCONTEXT)
#define LSP_SIM_UCONTEXT 1
#endif
#ifdef LSP_SIM_UCONTEXT
#include <ucontext.h>
#endif

/* ---------------------------------------------------------------------------
 * Context switch
 * ------------------------------------------------------------------------- */

#ifndef LSP_SIM_UCONTEXT
extern "C" void lsp_sim_switch(void** save_sp, void* load_sp);
extern "C" void lsp_sim_fiber_start();
/* lsp_sim_switch saves rbp, rbx, r12-r15, MXCSR and the x87 control word on
 * the current stack, stores the stack pointer in *save_sp, loads load_sp
 * and restores the same from there. A new fiber's stack holds such a frame
 * whose return address is lsp_sim_fiber_start, which calls r13(r12). */
asm(R"(
	.text
	.globl lsp_sim_switch
	.type lsp_sim_switch,@function
	.p2align 4
lsp_sim_switch:
	pushq %rbp
	pushq %rbx
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	subq $8, %rsp
	stmxcsr (%rsp)
	fnstcw 4(%rsp)
	movq %rsp, (%rdi)
	movq %rsi, %rsp
	ldmxcsr (%rsp)
	fldcw 4(%rsp)
	addq $8, %rsp
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbx
	popq %rbp
	ret
	.size lsp_sim_switch, .-lsp_sim_switch

	.globl lsp_sim_fiber_start
	.type lsp_sim_fiber_start,@function
	.p2align 4
lsp_sim_fiber_start:
	movq %r12, %rdi
	callq *%r13
	ud2
	.size lsp_sim_fiber_start, .-lsp_sim_fiber_start
)");
#endif

namespace lsp_sim {

__thread ThreadCoord* tls_thread;
__thread BlockCoord* tls_block;

namespace {

const size_t kMaxDynSmem = 227 * 1024;     /* sm_90's opt-in maximum */
const size_t kDefaultDynSmem = 48 * 1024;  /* without cudaFuncSetAttribute */
const size_t kSmemCanary = 256;            /* canary bytes before the window */
const unsigned char kCanary = 0xA5;
const int kMaxAllocs = 16384;

enum FiberState { F_READY, F_RUNNING, F_WAIT_BAR, F_WAIT_WARP, F_DONE };

struct Fiber {
	ThreadCoord coord;
	unsigned linear, lane, warp;
	int state;
	char* stack_lo; /* usable stack: [stack_lo, stack_hi); guard page below */
	char* stack_hi;
#ifdef LSP_SIM_UCONTEXT
	ucontext_t uc;
#else
	void* sp;
#endif
	const char* coll_what;
	CollectiveOp coll_op;
	unsigned coll_mask;
	void* coll_arg;
	int bar_pred, bar_result;
};

/* Lane bitmasks of one warp: waiting in a collective (with its op and
 * mask), waiting at the barrier, returned. Compact, so a collective checks
 * its lanes without touching 32 fibers. */
struct WarpState {
	unsigned wait, bar, done;
	CollectiveOp op[32];
	unsigned mask[32];
};

struct Launch {
	const char* name;
	const char* file;
	int line;
	const void* kernel;
	Thunk thunk;
	const void* params;
	dim3 grid, block;
	size_t smem;
	uint64_t nblocks;
	uint64_t seed;
	uint64_t serial; /* 1, 2, ... over the process */
	std::atomic<uint64_t> next{0};
	std::atomic<bool> abort{false};
	std::mutex mu;
	int err_code = 0;
	std::string err_msg;
	int nerrors = 0;
};

struct Rng {
	uint64_t s;
	uint64_t next() {
		uint64_t z = (s += 0x9E3779B97F4A7C15ull);
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
		z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
		return z ^ (z >> 31);
	}
	size_t below(size_t n) { return size_t(((unsigned __int128)next() * n) >> 64); }
};

struct Worker {
	int id = 0;
	std::thread th;
#ifdef LSP_SIM_UCONTEXT
	ucontext_t sched_uc;
#else
	void* sched_sp = nullptr;
#endif
	std::vector<Fiber> fibers; /* capacity 1024, never reallocated */
	std::vector<Fiber*> runnable;
	WarpState warps[32];
	Fiber* cur = nullptr;
	BlockCoord block;
	unsigned nthreads = 0, ndone = 0, nbar = 0;
	Fiber* first_done = nullptr;
	const char* bar_file = nullptr;
	int bar_line = 0, bar_kind = 0;
	Rng rng{0};
	Launch* job = nullptr;
	bool failed = false;
	volatile sig_atomic_t in_fiber = 0;
	unsigned char* smem_lo = nullptr; /* mapped window [smem_lo, smem_guard) */
	unsigned char* smem_guard = nullptr;
	size_t smem_bytes = 0;
	uint64_t gen = 0;
	/* This thread's TLS block of the executable, its content at thread start,
	 * which 8-byte words kernels have written (static __shared__) or must not
	 * be touched (the simulator's own thread-locals), and the launch whose
	 * first block on this worker was last scanned. */
	uint64_t* tls = nullptr;
	size_t tls_words = 0;
	std::vector<uint64_t> tls_snap;
	std::vector<uint8_t> tls_mark; /* 0 clean, 1 written by kernels, 2 keep */
	std::vector<std::pair<size_t, size_t>> tls_dirty; /* word ranges [lo, hi) */
	uint64_t tls_scanned = 0;
};

__thread Worker* tls_worker;

/* ---- global state ---- */

std::atomic<uint64_t> g_seed{1};
std::atomic<uint64_t> g_launch_no{0};
std::atomic<uint64_t> g_launch_serial{0};
uint16_t g_perm[FRAG_KINDS][256]; /* fragment slot (lane*8+i) -> row*16+col */

/* The last error and its message are per thread, as CUDA keeps its last
 * error: a launch on one thread must not report another thread's failure. */
thread_local std::string t_last_msg;
__thread cudaError_t t_last_error = cudaSuccess;

std::mutex g_attr_mu;
std::unordered_map<const void*, int> g_max_dyn_smem;

struct SkipSite {
	std::string base;
	int line;
};
std::vector<SkipSite> g_skip;
std::atomic<bool> g_skip_active{false};
std::atomic<long long> g_skip_hits{0};

std::once_flag g_env_once;
int g_nworkers = 0;
size_t g_stack_bytes = 64 * 1024;
size_t g_page = 4096;

std::mutex g_launch_mu; /* one launch at a time */
/* Never destroyed: detached workers wait on them until the process exits. */
std::mutex& g_pool_mu = *new std::mutex;
std::condition_variable& g_cv_work = *new std::condition_variable;
std::condition_variable& g_cv_done = *new std::condition_variable;
std::vector<Worker*>& g_workers = *new std::vector<Worker*>;
Launch* g_job = nullptr;
uint64_t g_gen = 0;
int g_active = 0;

struct AllocRec {
	volatile uintptr_t map; /* 0: free slot */
	size_t map_len;
	uintptr_t data;
	size_t bytes;
	size_t slack;
	int guard_before;
};
AllocRec g_allocs[kMaxAllocs];
std::mutex g_alloc_mu;

struct sigaction g_old_segv, g_old_bus;
bool g_handler_installed = false;

/* ---- helpers ---- */

uint64_t mix(uint64_t a, uint64_t b) {
	Rng r{a ^ (b * 0xD6E8FEB86659FD93ull)};
	return r.next();
}

const char* base_name(const char* file) {
	const char* s = strrchr(file, '/');
	return s ? s + 1 : file;
}

int parse_skip(const char* sites, std::vector<SkipSite>* out) {
	out->clear();
	if (!sites) return 0;
	std::string s(sites);
	size_t i = 0;
	while (i < s.size()) {
		size_t j = s.find(',', i);
		if (j == std::string::npos) j = s.size();
		std::string item = s.substr(i, j - i);
		i = j + 1;
		while (!item.empty() && item.back() == ' ') item.pop_back();
		while (!item.empty() && item.front() == ' ') item.erase(0, 1);
		if (item.empty()) continue;
		size_t c = item.rfind(':');
		if (c == std::string::npos || c == 0 || c + 1 == item.size()) return -1;
		char* end = nullptr;
		long line = strtol(item.c_str() + c + 1, &end, 10);
		if (*end != '\0' || line <= 0) return -1;
		out->push_back(SkipSite{std::string(base_name(item.substr(0, c).c_str())), int(line)});
	}
	return 0;
}

void make_perms(uint64_t seed) {
	Rng r{seed ^ 0x77AA55CC33EE11FFull};
	for (int k = 0; k < FRAG_KINDS; k++) {
		for (int i = 0; i < 256; i++) g_perm[k][i] = uint16_t(i);
		for (int i = 255; i > 0; i--) {
			size_t j = r.below(size_t(i) + 1);
			uint16_t t = g_perm[k][i];
			g_perm[k][i] = g_perm[k][j];
			g_perm[k][j] = t;
		}
	}
}

size_t env_size(const char* name, size_t def, size_t lo, size_t hi) {
	const char* v = getenv(name);
	if (!v || !*v) return def;
	char* end = nullptr;
	unsigned long long x = strtoull(v, &end, 10);
	if (*end != '\0' || x < lo || x > hi) {
		fprintf(stderr, "lsp_sim: ignoring %s=%s (want %zu..%zu)\n", name, v, lo, hi);
		return def;
	}
	return size_t(x);
}

void init_env() {
	std::call_once(g_env_once, [] {
		g_page = size_t(sysconf(_SC_PAGESIZE));
		unsigned ncpu = std::thread::hardware_concurrency();
		if (ncpu == 0) ncpu = 1;
		if (g_nworkers == 0) g_nworkers = int(env_size("LSP_SIM_WORKERS", ncpu < 8 ? ncpu : 8, 1, 256));
		g_stack_bytes = env_size("LSP_SIM_STACK_KIB", 64, 16, 16384) * 1024;
		make_perms(g_seed.load());
		if (parse_skip(getenv("LSP_SIM_SKIP_BARRIER"), &g_skip) != 0) {
			fprintf(stderr, "lsp_sim: cannot parse LSP_SIM_SKIP_BARRIER=%s (want file.cu:line[,...])\n",
			        getenv("LSP_SIM_SKIP_BARRIER"));
			abort();
		}
		g_skip_active = !g_skip.empty();
	});
}

void set_message(const std::string& m) { t_last_msg = m; }

std::string vformat(const char* fmt, va_list ap) {
	char buf[1024];
	vsnprintf(buf, sizeof buf, fmt, ap);
	return buf;
}

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	std::string s = vformat(fmt, ap);
	va_end(ap);
	return s;
}

std::string where(Worker* w, Fiber* f) {
	Launch* j = w->job;
	std::string s = format("kernel %s (launched at %s:%d) block (%u,%u,%u)", j->name, base_name(j->file),
	                       j->line, w->block.idx.x, w->block.idx.y, w->block.idx.z);
	if (f) s += format(" thread (%u,%u,%u)", f->coord.idx.x, f->coord.idx.y, f->coord.idx.z);
	return s;
}

/* Records the first error of a launch, prints it, and stops the block. */
void record_error(Worker* w, Fiber* f, int code, const std::string& msg) {
	Launch* j = w->job;
	std::string full = "lsp_sim: " + where(w, f) + ": " + msg;
	{
		std::lock_guard<std::mutex> l(j->mu);
		if (j->nerrors++ == 0) {
			j->err_code = code;
			j->err_msg = full;
			fprintf(stderr, "%s\n", full.c_str());
		}
	}
	w->failed = true;
	j->abort = true;
}

std::string fiber_name(Fiber* f) {
	return format("(%u,%u,%u)", f->coord.idx.x, f->coord.idx.y, f->coord.idx.z);
}

/* ---- static shared memory ----
 * Static __shared__ variables are thread_locals of the executable (sim.h).
 * Their addresses are unknown, so each worker snapshots its TLS block of
 * the executable at thread start (dl_iterate_phdr's dlpi_tls_data) and,
 * after the first block of each launch it runs, marks the 8-byte words that
 * differ from the snapshot: those kernels wrote. At every block start the
 * marked words get 0xFF bytes. The simulator's own thread-locals are never
 * marked; no other code runs on worker threads (Go's TLS slot stays 0). */

struct TlsFind {
	uintptr_t addr; /* a per-thread address inside the wanted block */
	uint64_t* base;
	size_t len;
};

int find_tls(struct dl_phdr_info* info, size_t, void* data) {
	TlsFind* f = static_cast<TlsFind*>(data);
	uintptr_t lo = reinterpret_cast<uintptr_t>(info->dlpi_tls_data);
	for (int i = 0; i < info->dlpi_phnum && lo; i++) {
		const ElfW(Phdr)& ph = info->dlpi_phdr[i];
		if (ph.p_type == PT_TLS && f->addr >= lo && f->addr < lo + ph.p_memsz) {
			f->base = static_cast<uint64_t*>(info->dlpi_tls_data);
			f->len = ph.p_memsz;
			return 1;
		}
	}
	return 0;
}

void keep_word(Worker* w, const void* p, size_t n) {
	uintptr_t a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(w->tls);
	for (uintptr_t x = a & ~uintptr_t(7); x < a + n; x += 8)
		if (x >= base && (x - base) / 8 < w->tls_words) w->tls_mark[(x - base) / 8] = 2;
}

void tls_init(Worker* w) {
	TlsFind f{reinterpret_cast<uintptr_t>(&tls_worker), nullptr, 0};
	dl_iterate_phdr(find_tls, &f);
	if (!f.base || reinterpret_cast<uintptr_t>(f.base) % 8 != 0) {
		fprintf(stderr, "lsp_sim: warning: cannot find the thread-local block; static __shared__ is not poisoned\n");
		return;
	}
	w->tls = f.base;
	w->tls_words = f.len / 8;
	w->tls_snap.assign(w->tls, w->tls + w->tls_words);
	w->tls_mark.assign(w->tls_words, 0);
	keep_word(w, &tls_worker, sizeof tls_worker);
	keep_word(w, &tls_thread, sizeof tls_thread);
	keep_word(w, &tls_block, sizeof tls_block);
	keep_word(w, &t_last_error, sizeof t_last_error);
}

/* Marks the words the last block wrote (once per launch and worker). */
void tls_scan(Worker* w, uint64_t launch) {
	if (!w->tls || w->tls_scanned == launch) return;
	w->tls_scanned = launch;
	bool grew = false;
	for (size_t i = 0; i < w->tls_words; i++) {
		if (w->tls_mark[i] == 0 && w->tls[i] != w->tls_snap[i]) {
			w->tls_mark[i] = 1;
			grew = true;
		}
	}
	if (!grew) return;
	w->tls_dirty.clear();
	for (size_t i = 0; i < w->tls_words;) {
		if (w->tls_mark[i] != 1) {
			i++;
			continue;
		}
		size_t j = i;
		while (j < w->tls_words && w->tls_mark[j] == 1) j++;
		w->tls_dirty.push_back({i, j});
		i = j;
	}
}

void tls_poison(Worker* w) {
	for (const auto& r : w->tls_dirty) memset(w->tls + r.first, 0xFF, (r.second - r.first) * 8);
}

/* ---- fibers ---- */

void fiber_main(void* arg);

#ifdef LSP_SIM_UCONTEXT
void fiber_entry_uc(unsigned lo, unsigned hi) {
	fiber_main(reinterpret_cast<void*>((uintptr_t(hi) << 32) | uintptr_t(lo)));
}
#endif

void to_fiber(Worker* w, Fiber* f) {
	w->cur = f;
	tls_thread = &f->coord;
	f->state = F_RUNNING;
	w->in_fiber = 1;
#ifdef LSP_SIM_UCONTEXT
	swapcontext(&w->sched_uc, &f->uc);
#else
	lsp_sim_switch(&w->sched_sp, f->sp);
#endif
	w->in_fiber = 0;
	w->cur = nullptr;
}

void to_scheduler(Worker* w, Fiber* f) {
#ifdef LSP_SIM_UCONTEXT
	swapcontext(&f->uc, &w->sched_uc);
#else
	lsp_sim_switch(&f->sp, w->sched_sp);
#endif
}

/* Leaves a failed fiber suspended for good. */
[[noreturn]] void abandon(Worker* w, Fiber* f) {
	to_scheduler(w, f);
	fprintf(stderr, "lsp_sim: internal error: an abandoned fiber was resumed\n");
	abort();
}

void init_fiber(Fiber* f) {
	uintptr_t arg = reinterpret_cast<uintptr_t>(f);
#ifdef LSP_SIM_UCONTEXT
	getcontext(&f->uc);
	f->uc.uc_stack.ss_sp = f->stack_lo;
	f->uc.uc_stack.ss_size = size_t(f->stack_hi - f->stack_lo);
	f->uc.uc_link = nullptr;
	makecontext(&f->uc, reinterpret_cast<void (*)()>(&fiber_entry_uc), 2, unsigned(arg & 0xFFFFFFFFu),
	            unsigned(arg >> 32));
#else
	uintptr_t top = reinterpret_cast<uintptr_t>(f->stack_hi) & ~uintptr_t(15);
	uint64_t* sp = reinterpret_cast<uint64_t*>(top - 80);
	uint32_t mxcsr = 0x1F80;
	uint16_t fpucw = 0x037F;
	asm volatile("stmxcsr %0" : "=m"(mxcsr));
	asm volatile("fnstcw %0" : "=m"(fpucw));
	sp[0] = uint64_t(mxcsr) | (uint64_t(fpucw) << 32);
	sp[1] = 0; /* r15 */
	sp[2] = 0; /* r14 */
	sp[3] = reinterpret_cast<uint64_t>(&fiber_main); /* r13 */
	sp[4] = arg;                                      /* r12 */
	sp[5] = 0;                                        /* rbx */
	sp[6] = 0;                                        /* rbp */
	sp[7] = reinterpret_cast<uint64_t>(&lsp_sim_fiber_start);
	f->sp = sp;
#endif
}

bool ensure_fibers(Worker* w, unsigned n) {
	while (w->fibers.size() < n) {
		size_t len = g_stack_bytes + g_page;
		void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (m == MAP_FAILED) return false;
		if (mprotect(m, g_page, PROT_NONE) != 0) {
			munmap(m, len);
			return false;
		}
		Fiber f;
		memset(static_cast<void*>(&f), 0, sizeof f);
		f.stack_lo = static_cast<char*>(m) + g_page;
		f.stack_hi = static_cast<char*>(m) + len;
		w->fibers.push_back(f);
	}
	return true;
}

void fiber_exit(Worker* w, Fiber* f) {
	f->state = F_DONE;
	w->warps[f->warp].done |= 1u << f->lane;
	w->ndone++;
	if (!w->first_done) w->first_done = f;
	if (w->nbar > 0) {
		record_error(w, f, cudaErrorLaunchFailure,
		             format("returned while %u thread(s) wait at __syncthreads() at %s:%d: every thread of a "
		                    "block must reach every barrier",
		                    w->nbar, base_name(w->bar_file), w->bar_line));
		abandon(w, f);
	}
	const WarpState& ws = w->warps[f->warp];
	for (unsigned wait = ws.wait; wait; wait &= wait - 1) {
		unsigned l = unsigned(__builtin_ctz(wait));
		if (ws.mask[l] >> f->lane & 1) {
			Fiber* g = &w->fibers[f->warp * 32 + l];
			record_error(w, f, cudaErrorLaunchFailure,
			             format("returned while lane %u waits in %s with mask 0x%08x naming it", l, g->coll_what,
			                    g->coll_mask));
			abandon(w, f);
		}
	}
	to_scheduler(w, f);
	abort(); /* never resumed */
}

void fiber_main(void* arg) {
	Fiber* f = static_cast<Fiber*>(arg);
	Worker* w = tls_worker;
	w->job->thunk(w->job->kernel, w->job->params);
	fiber_exit(w, f);
}

/* ---- blocks ---- */

void describe_deadlock(Worker* w) {
	unsigned nbar = 0, nwarp = 0, ndone = 0;
	Fiber* wf = nullptr;
	for (unsigned i = 0; i < w->nthreads; i++) {
		Fiber* f = &w->fibers[i];
		if (f->state == F_WAIT_BAR) nbar++;
		if (f->state == F_DONE) ndone++;
		if (f->state == F_WAIT_WARP) {
			nwarp++;
			if (!wf) wf = f;
		}
	}
	std::string m = format("deadlock: %u thread(s) wait at __syncthreads(), %u in warp collectives, %u returned",
	                       nbar, nwarp, ndone);
	if (wf) {
		m += format("; thread %s (lane %u) waits in %s with mask 0x%08x for lanes", fiber_name(wf).c_str(), wf->lane,
		            wf->coll_what, wf->coll_mask);
		unsigned base = wf->warp * 32;
		for (unsigned l = 0; l < 32; l++) {
			if (!(wf->coll_mask >> l & 1) || base + l >= w->nthreads) continue;
			Fiber* g = &w->fibers[base + l];
			if (g->state != F_WAIT_WARP)
				m += format(" %u(%s)", l, g->state == F_WAIT_BAR ? "at a barrier" : g->state == F_DONE ? "returned" : "?");
		}
	}
	record_error(w, nullptr, cudaErrorLaunchFailure, m);
}

void check_canary(Worker* w, const unsigned char* p, size_t n, const char* what) {
	for (size_t i = 0; i < n; i++) {
		if (p[i] != kCanary) {
			record_error(w, nullptr, cudaErrorIllegalAddress,
			             format("a thread wrote %s the block's %zu bytes of dynamic shared memory", what,
			                    w->block.dyn_smem_bytes));
			return;
		}
	}
}

void run_block(Worker* w, Launch* j, uint64_t b) {
	BlockCoord& bc = w->block;
	bc.idx.x = unsigned(b % j->grid.x);
	bc.idx.y = unsigned((b / j->grid.x) % j->grid.y);
	bc.idx.z = unsigned(b / (uint64_t(j->grid.x) * j->grid.y));
	bc.dim = j->block;
	bc.grid = j->grid;
	bc.dyn_smem_bytes = j->smem;
	size_t rounded = (j->smem + 15) & ~size_t(15);
	unsigned char* base = w->smem_guard - rounded;
	bc.dyn_smem = base;
	/* 0xFF (NaN) inside, canaries in the rounding gap and just before. */
	memset(base, 0xFF, j->smem);
	memset(base + j->smem, kCanary, rounded - j->smem);
	memset(base - kSmemCanary, kCanary, kSmemCanary);
	tls_poison(w);
	tls_block = &bc;

	unsigned n = j->block.x * j->block.y * j->block.z;
	w->nthreads = n;
	w->ndone = 0;
	w->nbar = 0;
	w->first_done = nullptr;
	w->failed = false;
	w->rng.s = mix(j->seed, b);
	w->runnable.clear();
	memset(static_cast<void*>(w->warps), 0, sizeof w->warps);
	for (unsigned t = 0; t < n; t++) {
		Fiber* f = &w->fibers[t];
		f->linear = t;
		f->coord.idx.x = t % j->block.x;
		f->coord.idx.y = (t / j->block.x) % j->block.y;
		f->coord.idx.z = t / (j->block.x * j->block.y);
		f->lane = t % 32;
		f->warp = t / 32;
		f->state = F_READY;
		f->coll_op = nullptr;
		init_fiber(f);
		w->runnable.push_back(f);
	}
	while (!w->failed && !j->abort) {
		if (w->runnable.empty()) {
			if (w->ndone != n) describe_deadlock(w);
			break;
		}
		size_t i = w->rng.below(w->runnable.size());
		Fiber* f = w->runnable[i];
		w->runnable[i] = w->runnable.back();
		w->runnable.pop_back();
		to_fiber(w, f);
	}
	if (!w->failed) {
		check_canary(w, base + j->smem, rounded - j->smem, "past the end of");
		if (!w->failed) check_canary(w, base - kSmemCanary, kSmemCanary, "before the start of");
	}
	tls_block = nullptr;
	tls_thread = nullptr;
}

/* ---- worker pool ---- */

void block_async_signals() {
	sigset_t s;
	sigfillset(&s);
	int sync[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT};
	for (int sig : sync) sigdelset(&s, sig);
	pthread_sigmask(SIG_SETMASK, &s, nullptr);
}

void worker_loop(Worker* w) {
	tls_worker = w;
	block_async_signals();
	tls_init(w);
	/* An alternate signal stack, so a fiber stack overflow is reported. */
	stack_t ss;
	ss.ss_size = 64 * 1024;
	ss.ss_sp = mmap(nullptr, ss.ss_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ss.ss_flags = 0;
	if (ss.ss_sp != MAP_FAILED) sigaltstack(&ss, nullptr);
	for (;;) {
		Launch* j;
		{
			std::unique_lock<std::mutex> l(g_pool_mu);
			g_cv_work.wait(l, [w] { return g_gen != w->gen; });
			w->gen = g_gen;
			j = g_job;
		}
		w->job = j;
		unsigned n = j->block.x * j->block.y * j->block.z;
		if (!ensure_fibers(w, n)) {
			std::lock_guard<std::mutex> l(j->mu);
			if (j->nerrors++ == 0) {
				j->err_code = cudaErrorMemoryAllocation;
				j->err_msg = "lsp_sim: cannot map fiber stacks";
			}
			j->abort = true;
		}
		while (!j->abort) {
			uint64_t b = j->next.fetch_add(1);
			if (b >= j->nblocks) break;
			run_block(w, j, b);
			tls_scan(w, j->serial);
		}
		w->job = nullptr;
		std::lock_guard<std::mutex> l(g_pool_mu);
		if (--g_active == 0) g_cv_done.notify_all();
	}
}

void install_handler();

void start_pool() {
	if (!g_workers.empty()) return;
	install_handler();
	size_t win = ((kMaxDynSmem + kSmemCanary + g_page - 1) / g_page + 1) * g_page;
	for (int i = 0; i < g_nworkers; i++) {
		Worker* w = new Worker;
		w->id = i;
		w->fibers.reserve(1024);
		void* m = mmap(nullptr, win + g_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED || mprotect(static_cast<char*>(m) + win, g_page, PROT_NONE) != 0) {
			fprintf(stderr, "lsp_sim: cannot map shared memory windows\n");
			abort();
		}
		w->smem_lo = static_cast<unsigned char*>(m);
		w->smem_guard = w->smem_lo + win;
		g_workers.push_back(w);
		w->th = std::thread(worker_loop, w);
		w->th.detach();
	}
}

/* ---- SIGSEGV reporting ---- */

void say(const char* s) {
	size_t n = strlen(s);
	while (n > 0) {
		ssize_t k = write(2, s, n);
		if (k <= 0) return;
		s += k;
		n -= size_t(k);
	}
}

void describe_addr(uintptr_t a, char* buf, size_t len) {
	for (int i = 0; i < kMaxAllocs; i++) {
		const AllocRec& r = g_allocs[i];
		uintptr_t m = r.map;
		if (!m || a < m || a >= m + r.map_len) continue;
		if (a < r.data)
			snprintf(buf, len, "%zu byte(s) before the start of a %zu-byte device buffer at 0x%zx",
			         size_t(r.data - a), r.bytes, size_t(r.data));
		else
			snprintf(buf, len, "at byte offset %zu of a %zu-byte device buffer at 0x%zx (past its end)",
			         size_t(a - r.data), r.bytes, size_t(r.data));
		return;
	}
	for (Worker* w : g_workers) {
		uintptr_t guard = uintptr_t(w->smem_guard);
		if (a >= guard && a < guard + g_page) {
			size_t n = w->block.dyn_smem_bytes;
			size_t gap = ((n + 15) & ~size_t(15)) - n;
			snprintf(buf, len, "at byte offset %zu of the block's %zu bytes of dynamic shared memory (past its end)",
			         size_t(a - guard) + gap + n, n);
			return;
		}
		for (const Fiber& f : w->fibers) {
			if (a >= uintptr_t(f.stack_lo) - g_page && a < uintptr_t(f.stack_lo)) {
				snprintf(buf, len, "in the guard page of a fiber stack: stack overflow (raise LSP_SIM_STACK_KIB, now %zu)",
				         g_stack_bytes / 1024);
				return;
			}
		}
	}
	snprintf(buf, len, "not in a simulator guard zone (a wild pointer?)");
}

void chain(const struct sigaction& old, int sig, siginfo_t* si, void* uc) {
	if (old.sa_flags & SA_SIGINFO) {
		if (old.sa_sigaction) old.sa_sigaction(sig, si, uc);
		return;
	}
	if (old.sa_handler == SIG_IGN) return;
	if (old.sa_handler == SIG_DFL) {
		signal(sig, SIG_DFL);
		return; /* the fault repeats and kills the process */
	}
	old.sa_handler(sig);
}

void on_fault(int sig, siginfo_t* si, void* uc) {
	Worker* w = tls_worker;
	if (!w || !w->in_fiber || !w->job || !w->cur) {
		chain(sig == SIGBUS ? g_old_bus : g_old_segv, sig, si, uc);
		return;
	}
	static char buf[1024], desc[400];
	describe_addr(uintptr_t(si->si_addr), desc, sizeof desc);
	Launch* j = w->job;
	Fiber* f = w->cur;
	snprintf(buf, sizeof buf,
	         "lsp_sim: %s in kernel %s (launched at %s:%d) block (%u,%u,%u) thread (%u,%u,%u): address 0x%zx is %s\n",
	         sig == SIGBUS ? "SIGBUS" : "SIGSEGV", j->name, base_name(j->file), j->line, w->block.idx.x,
	         w->block.idx.y, w->block.idx.z, f->coord.idx.x, f->coord.idx.y, f->coord.idx.z, size_t(si->si_addr), desc);
	say(buf);
	signal(sig, SIG_DFL); /* the fault repeats and kills the process */
}

void install_handler() {
	const char* off = getenv("LSP_SIM_NO_SIGNAL_HANDLER");
	if (g_handler_installed || (off && *off && strcmp(off, "0") != 0)) return;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, &g_old_segv);
	sigaction(SIGBUS, &sa, &g_old_bus);
	g_handler_installed = true;
}

/* ---- launch validation ---- */

cudaError_t config_error(cudaError_t code, const std::string& msg) {
	set_message("lsp_sim: " + msg);
	t_last_error = code;
	return code;
}

} /* namespace */

/* ---------------------------------------------------------------------------
 * Kernel-side entry points (sim.h)
 * ------------------------------------------------------------------------- */

unsigned lane_id() { return tls_worker->cur->lane; }

void kernel_error(int code, const char* fmt, ...) {
	va_list ap;
	va_start(ap, fmt);
	std::string m = vformat(fmt, ap);
	va_end(ap);
	Worker* w = tls_worker;
	if (!w || !w->cur) {
		fprintf(stderr, "lsp_sim: %s (outside a kernel)\n", m.c_str());
		abort();
	}
	Fiber* f = w->cur;
	record_error(w, f, code, m);
	abandon(w, f);
}

int syncthreads_at(int kind, int pred, const char* file, int line) {
	Worker* w = tls_worker;
	if (!w || !w->cur) {
		fprintf(stderr, "lsp_sim: __syncthreads() at %s:%d outside a kernel\n", file, line);
		abort();
	}
	Fiber* f = w->cur;
	if (kind == BAR_SYNC && g_skip_active.load(std::memory_order_relaxed)) {
		const char* b = base_name(file);
		for (const SkipSite& s : g_skip) {
			if (s.line == line && s.base == b) {
				g_skip_hits++;
				return 0;
			}
		}
	}
	if (w->ndone > 0)
		kernel_error(cudaErrorLaunchFailure,
		             "reached __syncthreads() at %s:%d after thread %s returned: every thread of a block must "
		             "reach every barrier",
		             base_name(file), line, fiber_name(w->first_done).c_str());
	if (w->nbar == 0) {
		w->bar_file = file;
		w->bar_line = line;
		w->bar_kind = kind;
	} else if (line != w->bar_line || kind != w->bar_kind || (file != w->bar_file && strcmp(file, w->bar_file) != 0)) {
		kernel_error(cudaErrorLaunchFailure,
		             "divergent barriers: reached the barrier at %s:%d while %u thread(s) wait at the one at %s:%d",
		             base_name(file), line, w->nbar, base_name(w->bar_file), w->bar_line);
	}
	f->bar_pred = pred;
	f->state = F_WAIT_BAR;
	w->warps[f->warp].bar |= 1u << f->lane;
	if (++w->nbar == w->nthreads) {
		int count = 0;
		for (unsigned i = 0; i < w->nthreads; i++) count += w->fibers[i].bar_pred;
		int r = kind == BAR_COUNT ? count : kind == BAR_AND ? count == int(w->nthreads) : count > 0;
		w->nbar = 0;
		for (unsigned i = 0; i < (w->nthreads + 31) / 32; i++) w->warps[i].bar = 0;
		for (unsigned i = 0; i < w->nthreads; i++) {
			Fiber* g = &w->fibers[i];
			g->bar_result = r;
			g->state = F_READY;
			w->runnable.push_back(g);
		}
	} else {
		/* Someone in a warp collective naming this thread can never finish. */
		const WarpState& ws = w->warps[f->warp];
		for (unsigned wait = ws.wait; wait; wait &= wait - 1) {
			unsigned l = unsigned(__builtin_ctz(wait));
			if (ws.mask[l] >> f->lane & 1)
				kernel_error(cudaErrorLaunchFailure,
				             "reached __syncthreads() at %s:%d while lane %u waits in %s with mask 0x%08x naming it",
				             base_name(file), line, l, w->fibers[f->warp * 32 + l].coll_what, ws.mask[l]);
		}
	}
	to_scheduler(w, f);
	if (w->failed) abandon(w, f);
	return f->bar_result;
}

void warp_collective(const char* what, unsigned mask, CollectiveOp op, void* arg) {
	Worker* w = tls_worker;
	if (!w || !w->cur) {
		fprintf(stderr, "lsp_sim: %s outside a kernel\n", what);
		abort();
	}
	Fiber* f = w->cur;
	if (!(mask >> f->lane & 1))
		kernel_error(cudaErrorLaunchFailure, "%s: the calling lane %u is not in mask 0x%08x", what, f->lane, mask);
	unsigned base = f->warp * 32;
	unsigned nlanes = w->nthreads - base < 32 ? w->nthreads - base : 32;
	if (nlanes < 32 && (mask >> nlanes) != 0)
		kernel_error(cudaErrorLaunchFailure, "%s: mask 0x%08x names lanes beyond the %u of this partial warp", what,
		             mask, nlanes);
	f->coll_what = what;
	f->coll_op = op;
	f->coll_mask = mask;
	f->coll_arg = arg;
	WarpState& ws = w->warps[f->warp];
	unsigned self = 1u << f->lane;
	if (unsigned gone = ws.done & mask)
		kernel_error(cudaErrorLaunchFailure, "%s with mask 0x%08x: lane %u has already returned", what, mask,
		             unsigned(__builtin_ctz(gone)));
	if (unsigned at_bar = ws.bar & mask)
		kernel_error(cudaErrorLaunchFailure, "%s with mask 0x%08x: lane %u waits at __syncthreads() at %s:%d", what,
		             mask, unsigned(__builtin_ctz(at_bar)), base_name(w->bar_file), w->bar_line);
	unsigned same = self;
	for (unsigned wait = ws.wait & mask; wait; wait &= wait - 1) {
		unsigned l = unsigned(__builtin_ctz(wait));
		if (ws.op[l] == op && ws.mask[l] == mask) {
			same |= 1u << l;
		} else if (ws.mask[l] & self) {
			/* Lane l waiting elsewhere for this lane can never come here. */
			kernel_error(cudaErrorLaunchFailure, "%s with mask 0x%08x while lane %u waits in %s with mask 0x%08x",
			             what, mask, l, w->fibers[f->warp * 32 + l].coll_what, ws.mask[l]);
		}
	}
	if (same != mask) {
		ws.wait |= self;
		ws.op[f->lane] = op;
		ws.mask[f->lane] = mask;
		f->state = F_WAIT_WARP;
		to_scheduler(w, f);
		if (w->failed) abandon(w, f);
		return;
	}
	void* args[32] = {};
	for (unsigned m = mask; m; m &= m - 1) {
		unsigned l = unsigned(__builtin_ctz(m));
		args[l] = w->fibers[base + l].coll_arg;
	}
	op(args, mask);
	ws.wait &= ~mask;
	for (unsigned m = mask & ~self; m; m &= m - 1) {
		Fiber* g = &w->fibers[base + unsigned(__builtin_ctz(m))];
		g->state = F_READY;
		w->runnable.push_back(g);
	}
}

void sync_op(void* const*, unsigned) {}

#define LSP_SIM_VOTE(fn, init, expr)                             \
	void fn(void* const* args, unsigned mask) {                  \
		unsigned r = (init);                                     \
		bool first = true;                                       \
		for (int l = 0; l < 32; l++) {                           \
			if (!(mask >> l & 1)) continue;                      \
			unsigned v = static_cast<VoteArg*>(args[l])->in;     \
			(void)v;                                             \
			(void)first;                                         \
			expr;                                                \
			first = false;                                       \
		}                                                        \
		for (int l = 0; l < 32; l++)                             \
			if (mask >> l & 1) static_cast<VoteArg*>(args[l])->out = r; \
	}
LSP_SIM_VOTE(vote_ballot, 0u, r |= (v ? 1u << l : 0u))
LSP_SIM_VOTE(vote_all, 1u, r &= v)
LSP_SIM_VOTE(vote_any, 0u, r |= v)
LSP_SIM_VOTE(reduce_add, 0u, r += v)
LSP_SIM_VOTE(reduce_min_u, 0u, r = first || v < r ? v : r)
LSP_SIM_VOTE(reduce_max_u, 0u, r = first || v > r ? v : r)
LSP_SIM_VOTE(reduce_min_i, 0u, r = first || int(v) < int(r) ? v : r)
LSP_SIM_VOTE(reduce_max_i, 0u, r = first || int(v) > int(r) ? v : r)
LSP_SIM_VOTE(reduce_and, ~0u, r &= v)
LSP_SIM_VOTE(reduce_or, 0u, r |= v)
LSP_SIM_VOTE(reduce_xor, 0u, r ^= v)
#undef LSP_SIM_VOTE

/* ---- wmma ---- */

namespace {

struct WmmaArg {
	int kind;
	void* x;
	const void* p;
	unsigned ldm;
	int col_major;
	/* mma */
	const void* a;
	const void* b;
	const void* c;
	int bkind;
};

const char* kind_name(int k) {
	static const char* names[] = {"matrix_a row_major", "matrix_a col_major", "matrix_b row_major",
	                              "matrix_b col_major", "accumulator"};
	return names[k];
}

/* Same arguments in every lane, aligned pointer and stride. */
void check_mem_args(const char* what, void* const* args, size_t elem) {
	const WmmaArg* a0 = static_cast<const WmmaArg*>(args[0]);
	for (int l = 1; l < 32; l++) {
		const WmmaArg* a = static_cast<const WmmaArg*>(args[l]);
		if (a->p != a0->p || a->ldm != a0->ldm || a->col_major != a0->col_major || a->kind != a0->kind)
			kernel_error(cudaErrorLaunchFailure,
			             "%s: lane %d passes (%p, ldm %u) but lane 0 (%p, ldm %u): all lanes must agree", what, l, a->p,
			             a->ldm, a0->p, a0->ldm);
	}
	if (reinterpret_cast<uintptr_t>(a0->p) % 32 != 0)
		kernel_error(cudaErrorMisalignedAddress, "%s: pointer %p is not 32-byte aligned", what, a0->p);
	if ((size_t(a0->ldm) * elem) % 16 != 0)
		kernel_error(cudaErrorMisalignedAddress, "%s: ldm %u is not a multiple of 16 bytes (%zu elements)", what,
		             a0->ldm, 16 / elem);
}

size_t mem_index(int pos, unsigned ldm, bool col_major) {
	size_t r = size_t(pos / 16), c = size_t(pos % 16);
	return col_major ? c * ldm + r : r * ldm + c;
}

void wmma_load_ab_op(void* const* args, unsigned) {
	check_mem_args("wmma::load_matrix_sync", args, 2);
	const WmmaArg* a0 = static_cast<const WmmaArg*>(args[0]);
	const __nv_bfloat16* p = static_cast<const __nv_bfloat16*>(a0->p);
	bool colm = a0->kind == FRAG_A_COL || a0->kind == FRAG_B_COL;
	for (int l = 0; l < 32; l++) {
		__nv_bfloat16* x = static_cast<__nv_bfloat16*>(static_cast<const WmmaArg*>(args[l])->x);
		for (int i = 0; i < 8; i++) x[i] = p[mem_index(g_perm[a0->kind][l * 8 + i], a0->ldm, colm)];
	}
}

void wmma_load_acc_op(void* const* args, unsigned) {
	check_mem_args("wmma::load_matrix_sync (accumulator)", args, 4);
	const WmmaArg* a0 = static_cast<const WmmaArg*>(args[0]);
	const float* p = static_cast<const float*>(a0->p);
	for (int l = 0; l < 32; l++) {
		float* x = static_cast<float*>(static_cast<const WmmaArg*>(args[l])->x);
		for (int i = 0; i < 8; i++) x[i] = p[mem_index(g_perm[FRAG_ACC][l * 8 + i], a0->ldm, a0->col_major)];
	}
}

void wmma_store_acc_op(void* const* args, unsigned) {
	check_mem_args("wmma::store_matrix_sync", args, 4);
	const WmmaArg* a0 = static_cast<const WmmaArg*>(args[0]);
	float* p = static_cast<float*>(const_cast<void*>(a0->p));
	for (int l = 0; l < 32; l++) {
		const float* x = static_cast<const float*>(static_cast<const WmmaArg*>(args[l])->x);
		for (int i = 0; i < 8; i++) p[mem_index(g_perm[FRAG_ACC][l * 8 + i], a0->ldm, a0->col_major)] = x[i];
	}
}

void wmma_mma_op(void* const* args, unsigned) {
	const WmmaArg* a0 = static_cast<const WmmaArg*>(args[0]);
	float A[256], B[256], C[256];
	for (int l = 0; l < 32; l++) {
		const WmmaArg* a = static_cast<const WmmaArg*>(args[l]);
		if (a->kind != a0->kind || a->bkind != a0->bkind)
			kernel_error(cudaErrorLaunchFailure, "wmma::mma_sync: lanes 0 and %d use different fragment types", l);
		const __nv_bfloat16* xa = static_cast<const __nv_bfloat16*>(a->a);
		const __nv_bfloat16* xb = static_cast<const __nv_bfloat16*>(a->b);
		const float* xc = static_cast<const float*>(a->c);
		for (int i = 0; i < 8; i++) {
			A[g_perm[a0->kind][l * 8 + i]] = __bfloat162float(xa[i]);
			B[g_perm[a0->bkind][l * 8 + i]] = __bfloat162float(xb[i]);
			C[g_perm[FRAG_ACC][l * 8 + i]] = xc[i];
		}
	}
	float D[256];
	for (int r = 0; r < 16; r++) {
		for (int c = 0; c < 16; c++) {
			float acc = C[r * 16 + c];
			for (int k = 0; k < 16; k++) acc += A[r * 16 + k] * B[k * 16 + c];
			D[r * 16 + c] = acc;
		}
	}
	for (int l = 0; l < 32; l++) {
		float* xd = static_cast<float*>(static_cast<const WmmaArg*>(args[l])->x);
		for (int i = 0; i < 8; i++) xd[i] = D[g_perm[FRAG_ACC][l * 8 + i]];
	}
}

} /* namespace */

void wmma_load_ab(int kind, __nv_bfloat16* x, const __nv_bfloat16* p, unsigned ldm) {
	WmmaArg a{};
	a.kind = kind;
	a.x = x;
	a.p = p;
	a.ldm = ldm;
	warp_collective("wmma::load_matrix_sync", 0xffffffffu, &wmma_load_ab_op, &a);
	(void)kind_name;
}

void wmma_load_acc(float* x, const float* p, unsigned ldm, int col_major) {
	WmmaArg a{};
	a.kind = FRAG_ACC;
	a.x = x;
	a.p = p;
	a.ldm = ldm;
	a.col_major = col_major;
	warp_collective("wmma::load_matrix_sync", 0xffffffffu, &wmma_load_acc_op, &a);
}

void wmma_store_acc(float* p, const float* x, unsigned ldm, int col_major) {
	WmmaArg a{};
	a.kind = FRAG_ACC;
	a.x = const_cast<float*>(x);
	a.p = p;
	a.ldm = ldm;
	a.col_major = col_major;
	warp_collective("wmma::store_matrix_sync", 0xffffffffu, &wmma_store_acc_op, &a);
}

void wmma_mma(float* d, const __nv_bfloat16* a, int akind, const __nv_bfloat16* b, int bkind, const float* c) {
	WmmaArg m{};
	m.kind = akind;
	m.bkind = bkind;
	m.x = d;
	m.a = a;
	m.b = b;
	m.c = c;
	warp_collective("wmma::mma_sync", 0xffffffffu, &wmma_mma_op, &m);
}

/* ---------------------------------------------------------------------------
 * Launches
 * ------------------------------------------------------------------------- */

cudaError_t set_func_attribute(const void* kernel, int attr, int bytes) {
	if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
		return config_error(cudaErrorNotSupported,
		                    format("cudaFuncSetAttribute: attribute %d is not simulated (only "
		                           "cudaFuncAttributeMaxDynamicSharedMemorySize)",
		                           attr));
	if (bytes < 0 || size_t(bytes) > kMaxDynSmem)
		return config_error(cudaErrorInvalidValue,
		                    format("cudaFuncSetAttribute: MaxDynamicSharedMemorySize %d is outside [0, %zu]", bytes,
		                           kMaxDynSmem));
	std::lock_guard<std::mutex> l(g_attr_mu);
	g_max_dyn_smem[kernel] = bytes;
	return cudaSuccess;
}

/* Checks a launch's configuration as CUDA does before the grid is queued
 * (block and grid shape, dynamic shared memory against the kernel's
 * limit); on failure sets the calling thread's last error and message and
 * returns the code. */
cudaError_t check_launch(const char* name, const char* file, int line, const void* kernel, dim3 grid, dim3 block,
                         size_t smem) {
	init_env();
	const char* at = base_name(file);
	if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
	    uint64_t(block.x) * block.y * block.z > 1024) {
		return config_error(
		    cudaErrorInvalidConfiguration,
		    format("launch of %s at %s:%d: block (%u,%u,%u) is not 1..1024 threads (x, y <= 1024, z <= 64)", name, at,
		           line, block.x, block.y, block.z));
	}
	if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7FFFFFFFu || grid.y > 65535 || grid.z > 65535) {
		return config_error(
		    cudaErrorInvalidConfiguration,
		    format("launch of %s at %s:%d: grid (%u,%u,%u) out of range (x < 2^31, y, z <= 65535, none 0)", name, at,
		           line, grid.x, grid.y, grid.z));
	}
	size_t limit = kDefaultDynSmem;
	{
		std::lock_guard<std::mutex> l(g_attr_mu);
		auto it = g_max_dyn_smem.find(kernel);
		if (it != g_max_dyn_smem.end() && size_t(it->second) > limit) limit = size_t(it->second);
	}
	if (smem > limit) {
		return config_error(cudaErrorInvalidValue,
		                    format("launch of %s at %s:%d: %zu bytes of dynamic shared memory exceed the limit of %zu "
		                           "(above 48 KiB needs cudaFuncSetAttribute(kernel, "
		                           "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), at most 227 KiB)",
		                           name, at, line, smem, limit));
	}
	return cudaSuccess;
}

/* The seed of the next launch's thread orders: the process seed mixed with
 * the launch number since lsp_sim_set_seed. The simulated CUDA runtime
 * takes it when a launch is queued, so schedules follow the order of
 * launches, not of the streams' threads. */
uint64_t next_launch_seed() { return mix(g_seed.load(), g_launch_no.fetch_add(1) + 1); }

/* Runs a checked launch to completion on the worker pool, one grid at a
 * time (it holds g_launch_mu), with the given seed or, when seed is null,
 * the next one. Returns 0 or the first error a block reported, whose
 * message goes to *msg. */
int run_launch(const char* name, const char* file, int line, const void* kernel, Thunk thunk, const void* params,
               dim3 grid, dim3 block, size_t smem, const uint64_t* seed, std::string* msg) {
	init_env();
	std::lock_guard<std::mutex> serial(g_launch_mu);
	Launch j;
	j.name = name;
	j.file = file;
	j.line = line;
	j.kernel = kernel;
	j.thunk = thunk;
	j.params = params;
	j.grid = grid;
	j.block = block;
	j.smem = smem;
	j.nblocks = uint64_t(grid.x) * grid.y * grid.z;
	j.seed = seed ? *seed : next_launch_seed();
	j.serial = g_launch_serial.fetch_add(1) + 1;
	{
		std::unique_lock<std::mutex> l(g_pool_mu);
		start_pool();
		g_job = &j;
		g_gen++;
		g_active = int(g_workers.size());
		g_cv_work.notify_all();
		g_cv_done.wait(l, [] { return g_active == 0; });
		g_job = nullptr;
	}
	if (j.nerrors == 0) return 0;
	*msg = j.err_msg;
	if (j.nerrors > 1) *msg += format(" (and %d more error(s))", j.nerrors - 1);
	return j.err_code;
}

/* The synchronous launch of plain LSP_SIM builds: the grid runs before
 * LSP_LAUNCH returns, and its error is the calling thread's last error. */
void launch_impl(const char* name, const char* file, int line, const void* kernel, Thunk thunk, const void* params,
                 dim3 grid, dim3 block, size_t smem, cudaStream_t) {
	if (check_launch(name, file, line, kernel, grid, block, smem) != cudaSuccess) return;
	std::string msg;
	int code = run_launch(name, file, line, kernel, thunk, params, grid, block, smem, nullptr, &msg);
	if (code != 0) {
		set_message(msg);
		t_last_error = cudaError_t(code);
	}
}

} /* namespace lsp_sim */

/* ---------------------------------------------------------------------------
 * CUDA runtime calls (declared by cuda_runtime_api.h)
 * ------------------------------------------------------------------------- */

extern "C" {

/* Under LSP_CUDASIM the simulated runtime (cudart.cpp) defines the calls
 * that see streams and sticky errors instead. */
#ifndef LSP_CUDASIM
cudaError_t cudaGetLastError(void) {
	cudaError_t e = lsp_sim::t_last_error;
	lsp_sim::t_last_error = cudaSuccess;
	return e;
}

cudaError_t cudaPeekAtLastError(void) { return lsp_sim::t_last_error; }

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
#endif

const char* cudaGetErrorName(cudaError_t e) { return lsp_sim_error_name(int(e)); }

const char* cudaGetErrorString(cudaError_t e) { return lsp_sim_error_string(int(e)); }

cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
	return lsp_sim::set_func_attribute(func, attr, value);
}

/* ---- sim_api.h ---- */

void lsp_sim_set_seed(uint64_t seed) {
	lsp_sim::init_env();
	std::lock_guard<std::mutex> l(lsp_sim::g_launch_mu);
	lsp_sim::g_seed = seed;
	lsp_sim::g_launch_no = 0;
	lsp_sim::make_perms(seed);
}

void* lsp_sim_alloc(size_t bytes, size_t align, int guard_before) {
	using namespace lsp_sim;
	init_env();
	if (align == 0) align = 1;
	if ((align & (align - 1)) != 0 || align > g_page || bytes > (size_t(1) << 40)) return nullptr;
	size_t page = g_page;
	size_t region, map_len;
	if (bytes == 0) {
		region = 0;
		guard_before = 0;
	} else if (guard_before) {
		region = (bytes + page - 1) / page * page;
	} else {
		region = (bytes + align - 1 + page - 1) / page * page;
	}
	map_len = region + page;
	void* m = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) return nullptr;
	char* map = static_cast<char*>(m);
	char* guard = guard_before ? map : map + region;
	char* data;
	size_t slack = 0;
	if (mprotect(guard, page, PROT_NONE) != 0) {
		munmap(m, map_len);
		return nullptr;
	}
	if (guard_before) {
		data = map + page;
	} else {
		data = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(guard) - bytes) & ~uintptr_t(align - 1));
		slack = size_t(guard - (data + bytes));
		memset(data + bytes, kCanary, slack);
	}
	memset(data, 0xFF, bytes);
	std::lock_guard<std::mutex> l(g_alloc_mu);
	for (int i = 0; i < kMaxAllocs; i++) {
		AllocRec& r = g_allocs[i];
		if (r.map) continue;
		r.map_len = map_len;
		r.data = reinterpret_cast<uintptr_t>(data);
		r.bytes = bytes;
		r.slack = slack;
		r.guard_before = guard_before;
		__atomic_store_n(&r.map, reinterpret_cast<uintptr_t>(map), __ATOMIC_RELEASE);
		return data;
	}
	munmap(m, map_len);
	return nullptr;
}

int lsp_sim_free(void* p) {
	using namespace lsp_sim;
	uintptr_t d = reinterpret_cast<uintptr_t>(p);
	std::lock_guard<std::mutex> l(g_alloc_mu);
	for (int i = 0; i < kMaxAllocs; i++) {
		AllocRec& r = g_allocs[i];
		if (!r.map || r.data != d) continue;
		int rc = 0;
		const unsigned char* s = reinterpret_cast<const unsigned char*>(r.data + r.bytes);
		for (size_t k = 0; k < r.slack; k++)
			if (s[k] != kCanary) rc = 1;
		uintptr_t map = r.map;
		__atomic_store_n(&r.map, uintptr_t(0), __ATOMIC_RELEASE);
		munmap(reinterpret_cast<void*>(map), r.map_len);
		return rc;
	}
	return -1;
}

const char* lsp_sim_last_message(void) { return lsp_sim::t_last_msg.c_str(); }

void lsp_sim_clear_message(void) { lsp_sim::t_last_msg.clear(); }

const char* lsp_sim_error_name(int code) {
	switch (code) {
	case cudaSuccess: return "cudaSuccess";
	case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
	case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
	case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
	case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
	case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
	case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
	case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
	case cudaErrorNotSupported: return "cudaErrorNotSupported";
	case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
	case cudaErrorNotReady: return "cudaErrorNotReady";
	case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
	case cudaErrorNoDevice: return "cudaErrorNoDevice";
	case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
	case cudaErrorHostMemoryAlreadyRegistered: return "cudaErrorHostMemoryAlreadyRegistered";
	case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
	default: return "cudaErrorUnknown";
	}
}

const char* lsp_sim_error_string(int code) {
	switch (code) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
	case cudaErrorMisalignedAddress: return "misaligned address";
	case cudaErrorLaunchFailure: return "unspecified launch failure";
	case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
	case cudaErrorInvalidDeviceFunction: return "invalid device function";
	case cudaErrorNotSupported: return "operation not supported";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorNotReady: return "device not ready";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
	case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
	case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
	default: return "unknown error";
	}
}

int lsp_sim_set_skip_barriers(const char* sites) {
	lsp_sim::init_env();
	std::lock_guard<std::mutex> l(lsp_sim::g_launch_mu);
	std::vector<lsp_sim::SkipSite> v;
	if (lsp_sim::parse_skip(sites, &v) != 0) return -1;
	lsp_sim::g_skip = v;
	lsp_sim::g_skip_active = !v.empty();
	return 0;
}

#define LSP_SIM_STR2(x) #x
#define LSP_SIM_STR(x) LSP_SIM_STR2(x)
const char* lsp_sim_build_info(void) {
#ifdef LSP_SIM_SOURCES
	return __DATE__ " " __TIME__ "|" LSP_SIM_STR(LSP_SIM_SOURCES);
#else
	return __DATE__ " " __TIME__ "|";
#endif
}

long long lsp_sim_skipped_barrier_hits(void) { return lsp_sim::g_skip_hits.load(); }

int lsp_sim_workers(int n) {
	std::lock_guard<std::mutex> l(lsp_sim::g_pool_mu);
	if (n > 0 && lsp_sim::g_workers.empty()) lsp_sim::g_nworkers = n;
	lsp_sim::init_env();
	return lsp_sim::g_nworkers;
}

} /* extern "C" */
