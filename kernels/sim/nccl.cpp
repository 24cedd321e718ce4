/*
 * nccl.cpp: a simulated NCCL for cudasim builds. It implements the NCCL
 * entry points that package cuda's communicator (cuda/nccl.go) calls, with
 * NCCL's semantics, on top of the simulated CUDA runtime (cudart.cpp): the
 * importing cgo package includes it after cudart.cpp (one translation
 * unit, cuda/cudart_sim.cc), so a cudasim binary needs no libnccl.so.2 and
 * cuda/nccl.go binds these functions instead of dlopening NCCL.
 *
 * What it simulates:
 *   - ncclGetVersion reports the header's NCCL_VERSION_CODE
 *     (third_party/nccl/nccl.h). ncclGetUniqueId puts a magic and a random
 *     job tag (getrandom) into the 128-byte id; the caller hands it to the
 *     other ranks (cuda.NewNCCL broadcasts it over MPI).
 *   - Ranks are processes on one host (mpirun -np N), each with its own
 *     simulated device. ncclCommInitRank joins them in a full mesh of unix
 *     stream sockets in Linux's abstract namespace, named by the job tag
 *     and the rank: rank r listens, connects to every lower rank and
 *     accepts every higher one, each connection opened by a hello that
 *     names rank and size (a different size, or a rank taken twice, is
 *     ncclInvalidUsage). It returns when every rank has joined, or fails
 *     with ncclSystemError naming the ranks missing after the timeout. A
 *     communicator of one rank opens no socket.
 *   - ncclSend, ncclRecv and ncclBroadcast (any ncclDataType_t; count 0 is
 *     a no-op) are checked when called (live communicator, peer or root in
 *     range, the buffer inside one live cudaMalloc buffer: else
 *     ncclInvalidArgument) and queued on the cudaStream_t as one operation
 *     of the stream (trace kind LSP_SIM_OP_NCCL): it runs on the stream's
 *     thread after the work queued before it, honours event waits, the
 *     legacy stream's implicit synchronisation and the hazard delays like
 *     any other queued operation, and runs while kernels of other streams
 *     run. Between ncclGroupStart and ncclGroupEnd (nested: the outermost
 *     end submits) the calls collect into one operation whose sends and
 *     receives progress together (poll over the peers' sockets), so their
 *     order cannot deadlock. Messages between two ranks match in the order
 *     they were issued, as NCCL's point-to-point calls do; each carries a
 *     header (sequence number, bytes), and a receive whose size differs
 *     from the matching send's fails with ncclInvalidUsage. Sends and
 *     receives to and from the calling rank itself are matched in order
 *     and copied. The operations of a communicator run in the order they
 *     were issued, also across streams.
 *   - Failures of queued work (a peer that closed its connection: it
 *     exited, died, aborted or failed, ncclRemoteError; no progress for the
 *     timeout, or a socket error, ncclSystemError; mismatched sizes,
 *     ncclInvalidUsage; ncclCommAbort, ncclSystemError) become the
 *     communicator's asynchronous error (ncclCommGetAsyncError) and the
 *     simulated device's sticky error cudaErrorLaunchFailure with the
 *     message, as an NCCL kernel that faults would leave it: every later
 *     CUDA call of the process returns it (see cudart.cpp). The failing
 *     rank then shuts its sockets down, so its peers fail at once instead
 *     of waiting for the timeout; later operations of the communicator
 *     fail at once with the same error. An operation skipped because the
 *     device already has a sticky error fails the communicator the same
 *     way. Nothing waits without a bound: the timeout is
 *     LSP_CUDASIM_NCCL_TIMEOUT seconds (default 300) without progress,
 *     for ncclCommInitRank, for each queued operation and for
 *     ncclCommDestroy.
 *   - ncclCommDestroy waits for the communicator's queued operations, then
 *     closes its sockets. ncclCommAbort does not wait: it wakes the running
 *     operation, which fails, shuts the sockets down, and the operations
 *     still queued fail when they run; the handle is invalid after either.
 *   - The message of the last failure (which rank, which bytes, why) is
 *     lsp_sim_nccl_last_message (sim_api.h); ncclGetErrorString gives
 *     NCCL's generic strings. Every failure is also printed to stderr as a
 *     "NCCL WARN" line, as NCCL_DEBUG=WARN would.
 *
 * Not simulated: NCCL's own collectives (ncclAllReduce, ncclReduceScatter,
 * ncclAllGather, ncclReduce: package cuda sums in rank order with send and
 * receive instead), communicators split or grown, non-blocking
 * communicators (ncclCommInitRankConfig), user buffer registration, ranks on
 * several hosts (the abstract sockets are local), a group spanning several
 * communicators or streams (ncclInvalidUsage), and NCCL's performance:
 * bytes move through the kernel's socket buffers on the CPU. Entry points
 * not defined here do not link.
 */
#ifndef LSP_CUDASIM
#error "nccl.cpp is the simulated NCCL: include it after cudart.cpp, compiled with -DLSP_SIM -DLSP_CUDASIM"
#endif

/* nccl.h includes cuda_runtime.h, CUDA's C++ layer over the runtime API,
 * whose templates collide with the simulator's kernel macros (gridDim, ...,
 * sim.h); the simulator has the runtime API (cuda_runtime_api.h) already,
 * which is all nccl.h's prototypes need, so the C++ layer is kept out. */
#ifndef __CUDA_RUNTIME_H__
#define __CUDA_RUNTIME_H__
#endif
#include "nccl.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <functional>
#include <set>

namespace lsp_sim {
struct NcclComm;
}

/* nccl.h's opaque ncclComm_t. */
struct ncclComm {
	std::shared_ptr<lsp_sim::NcclComm> c;
};

namespace lsp_sim {
namespace {

const char kNcclIdMagic[8] = {'l', 's', 'p', 'n', 'c', 'c', 'l', '1'};
const size_t kNcclTagLen = 32; /* hex digits of the job tag after the magic */
const uint32_t kNcclMsgMagic = 0x4e50534c; /* "LSPN" */
const uint32_t kNcclHelloMagic = 0x4c4c4548; /* "HELL" */

struct NcclHello {
	uint32_t magic;
	int32_t rank;
	int32_t nranks;
	char tag[kNcclTagLen];
};

/* Before every message of a send. */
struct NcclMsgHeader {
	uint32_t magic;
	int32_t from;
	uint64_t seq; /* 1, 2, ... per ordered pair of ranks */
	uint64_t bytes;
};

double nccl_timeout_s() {
	static double t = [] {
		const char* v = getenv("LSP_CUDASIM_NCCL_TIMEOUT");
		if (v && *v) {
			char* end = nullptr;
			double x = strtod(v, &end);
			if (end != v && *end == '\0' && x > 0) return x;
			fprintf(stderr, "lsp_sim: ignoring LSP_CUDASIM_NCCL_TIMEOUT=%s (want seconds > 0)\n", v);
		}
		return 300.0;
	}();
	return t;
}

} /* namespace */

/* One rank's communicator (named outside the anonymous namespace because
 * ncclComm, a global type, holds it). */
struct NcclComm {
	int rank = 0, nranks = 1;
	std::string tag;
	std::vector<int> fds; /* by peer rank; -1 for this rank */
	int wake = -1;        /* eventfd: ncclCommAbort wakes a running operation */
	std::atomic<bool> aborted{false};

	std::mutex mu; /* guards the rest; never held while taking S.mu */
	std::condition_variable cv;
	uint64_t issued = 0, finished = 0; /* queued operations, by ticket */
	std::vector<uint64_t> sent, received; /* messages, by peer */
	ncclResult_t async = ncclSuccess;
	std::string async_msg;
	bool shut = false;

	~NcclComm() {
		for (int fd : fds)
			if (fd >= 0) close(fd);
		if (wake >= 0) close(wake);
	}

	/* Shuts every connection down (under mu): the peers' reads end. */
	void shutdown_locked() {
		if (shut) return;
		shut = true;
		for (int fd : fds)
			if (fd >= 0) shutdown(fd, SHUT_RDWR);
	}

	/* Fails the communicator (the first error stays) and shuts it down;
	 * whether this was the first error. */
	bool fail(ncclResult_t code, const std::string& msg) {
		std::lock_guard<std::mutex> l(mu);
		bool first = async == ncclSuccess;
		if (first) {
			async = code;
			async_msg = msg;
		}
		shutdown_locked();
		return first;
	}
};

namespace {

std::mutex g_nccl_msg_mu;
std::string g_nccl_msg;

/* Records msg as the last failure's message and prints it, as NCCL does
 * under NCCL_DEBUG=WARN; returns code. */
ncclResult_t nccl_fail(ncclResult_t code, const std::string& msg) {
	std::string m = "lsp_sim: simulated NCCL: " + msg;
	{
		std::lock_guard<std::mutex> l(g_nccl_msg_mu);
		g_nccl_msg = m;
	}
	fprintf(stderr, "NCCL WARN %s\n", m.c_str());
	return code;
}

std::string rank_name(const NcclComm* c) { return format("rank %d of %d", c->rank, c->nranks); }

/* The live handles: a destroyed or aborted handle is refused. */
std::mutex g_comms_mu;
std::set<ncclComm_t> g_comms;

std::shared_ptr<NcclComm> live_comm(ncclComm_t h) {
	std::lock_guard<std::mutex> l(g_comms_mu);
	return g_comms.count(h) ? h->c : nullptr;
}

size_t dtype_size(ncclDataType_t t) {
	switch (t) {
	case ncclInt8:
	case ncclUint8:
#if NCCL_VERSION_CODE >= 21900
	case ncclFloat8e4m3:
	case ncclFloat8e5m2:
#endif
		return 1;
	case ncclFloat16:
	case ncclBfloat16: return 2;
	case ncclInt32:
	case ncclUint32:
	case ncclFloat32: return 4;
	case ncclInt64:
	case ncclUint64:
	case ncclFloat64: return 8;
	default: return 0;
	}
}

/* ---- sockets ---- */

sockaddr_un nccl_addr(const std::string& tag, int rank, socklen_t* len) {
	sockaddr_un a;
	memset(&a, 0, sizeof a);
	a.sun_family = AF_UNIX;
	/* Abstract namespace: a leading NUL, no file, gone with the socket. */
	int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "lsp-nccl-sim/%s/%d", tag.c_str(), rank);
	*len = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + size_t(n));
	return a;
}

int64_t ms_left(int64_t deadline_ns) {
	int64_t d = deadline_ns - now_ns();
	return d <= 0 ? 0 : d / 1000000 + 1;
}

/* Reads or writes exactly n bytes of a blocking socket before the
 * deadline; false with *why otherwise. */
bool io_all(int fd, void* p, size_t n, bool rd, int64_t deadline_ns, std::string* why) {
	char* b = static_cast<char*>(p);
	while (n > 0) {
		pollfd pf = {fd, short(rd ? POLLIN : POLLOUT), 0};
		int64_t ms = ms_left(deadline_ns);
		if (ms == 0) {
			*why = "timed out";
			return false;
		}
		int r = poll(&pf, 1, int(std::min<int64_t>(ms, 1000)));
		if (r < 0 && errno != EINTR) {
			*why = format("poll: %s", strerror(errno));
			return false;
		}
		if (r <= 0) continue;
		ssize_t k = rd ? recv(fd, b, n, MSG_DONTWAIT) : send(fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (k == 0 && rd) {
			*why = "the peer closed the connection";
			return false;
		}
		if (k < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
			*why = format("%s: %s", rd ? "recv" : "send", strerror(errno));
			return false;
		}
		b += k;
		n -= size_t(k);
	}
	return true;
}

/* A fixed send buffer (the kernel doubles it), the same on every machine
 * that allows it (net.core.wmem_max >= 128 KiB): a 1 MiB test tensor then
 * only gets through when a group's sends and receives progress together. */
void tune(int fd) {
	int sz = 128 << 10;
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
}

/* Joins c->rank to every other rank of c's job (see the header). */
ncclResult_t nccl_connect(NcclComm* c) {
	double tmo = nccl_timeout_s();
	int64_t deadline = now_ns() + int64_t(tmo * 1e9);
	std::string who = rank_name(c);
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0) return nccl_fail(ncclSystemError, format("ncclCommInitRank (%s): socket: %s", who.c_str(), strerror(errno)));
	socklen_t len = 0;
	sockaddr_un me = nccl_addr(c->tag, c->rank, &len);
	if (bind(lfd, reinterpret_cast<sockaddr*>(&me), len) != 0) {
		int e = errno;
		close(lfd);
		if (e == EADDRINUSE)
			return nccl_fail(ncclInvalidUsage, format("ncclCommInitRank (%s): another process already joined job %s as "
			                                          "rank %d (two ranks passed the same rank, or the id was reused)",
			                                          who.c_str(), c->tag.c_str(), c->rank));
		return nccl_fail(ncclSystemError, format("ncclCommInitRank (%s): bind: %s", who.c_str(), strerror(e)));
	}
	if (listen(lfd, c->nranks) != 0) {
		int e = errno;
		close(lfd);
		return nccl_fail(ncclSystemError, format("ncclCommInitRank (%s): listen: %s", who.c_str(), strerror(e)));
	}
	NcclHello mine;
	memset(&mine, 0, sizeof mine);
	mine.magic = kNcclHelloMagic;
	mine.rank = c->rank;
	mine.nranks = c->nranks;
	memcpy(mine.tag, c->tag.data(), kNcclTagLen);
	auto check_hello = [&](const NcclHello& h, int want_rank, std::string* why) -> ncclResult_t {
		if (h.magic != kNcclHelloMagic || memcmp(h.tag, mine.tag, kNcclTagLen) != 0) {
			*why = "a connection that is not from this job's simulated NCCL";
			return ncclSystemError;
		}
		if (h.nranks != c->nranks) {
			*why = format("rank %d joined with %d ranks, this rank with %d", h.rank, h.nranks, c->nranks);
			return ncclInvalidUsage;
		}
		if (h.rank < 0 || h.rank >= c->nranks || (want_rank >= 0 && h.rank != want_rank) ||
		    (want_rank < 0 && (h.rank <= c->rank || c->fds[size_t(h.rank)] >= 0))) {
			*why = format("a peer joined as rank %d, which is out of range or taken twice", h.rank);
			return ncclInvalidUsage;
		}
		return ncclSuccess;
	};
	ncclResult_t res = ncclSuccess;
	std::string why;
	/* Lower ranks: connect (retrying until they listen), hello, reply. */
	for (int p = 0; p < c->rank && res == ncclSuccess; p++) {
		sockaddr_un to = nccl_addr(c->tag, p, &len);
		int fd = -1;
		for (;;) {
			fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
			if (fd < 0) {
				res = nccl_fail(ncclSystemError, format("ncclCommInitRank (%s): socket: %s", who.c_str(), strerror(errno)));
				break;
			}
			if (connect(fd, reinterpret_cast<sockaddr*>(&to), len) == 0) break;
			int e = errno;
			close(fd);
			fd = -1;
			if (e != ECONNREFUSED && e != ENOENT && e != EAGAIN && e != EINTR) {
				res = nccl_fail(ncclSystemError,
				                format("ncclCommInitRank (%s): connect to rank %d: %s", who.c_str(), p, strerror(e)));
				break;
			}
			if (now_ns() >= deadline) {
				res = nccl_fail(ncclSystemError,
				                format("ncclCommInitRank (%s): rank %d did not join job %s within %gs "
				                       "(LSP_CUDASIM_NCCL_TIMEOUT)",
				                       who.c_str(), p, c->tag.c_str(), tmo));
				break;
			}
			std::this_thread::sleep_for(std::chrono::milliseconds(5));
		}
		if (fd < 0) break;
		c->fds[size_t(p)] = fd;
		NcclHello h;
		if (!io_all(fd, &mine, sizeof mine, false, deadline, &why) || !io_all(fd, &h, sizeof h, true, deadline, &why)) {
			res = nccl_fail(ncclSystemError,
			                format("ncclCommInitRank (%s): hello with rank %d: %s", who.c_str(), p, why.c_str()));
			break;
		}
		if (ncclResult_t r = check_hello(h, p, &why)) res = nccl_fail(r, format("ncclCommInitRank (%s): %s", who.c_str(), why.c_str()));
	}
	/* Higher ranks: accept, hello, reply. */
	for (int k = c->rank + 1; k < c->nranks && res == ncclSuccess; k++) {
		pollfd pf = {lfd, POLLIN, 0};
		int64_t ms = ms_left(deadline);
		int r = ms > 0 ? poll(&pf, 1, int(std::min<int64_t>(ms, 1000))) : 0;
		if (r < 0 && errno == EINTR) {
			k--;
			continue;
		}
		if (r == 0 && now_ns() < deadline) {
			k--;
			continue;
		}
		if (r <= 0) {
			std::string missing;
			for (int q = c->rank + 1; q < c->nranks; q++)
				if (c->fds[size_t(q)] < 0) missing += format("%s%d", missing.empty() ? "" : ", ", q);
			res = nccl_fail(ncclSystemError, r < 0 ? format("ncclCommInitRank (%s): poll: %s", who.c_str(), strerror(errno))
			                                       : format("ncclCommInitRank (%s): rank(s) %s did not join job %s "
			                                                "within %gs (LSP_CUDASIM_NCCL_TIMEOUT)",
			                                                who.c_str(), missing.c_str(), c->tag.c_str(), tmo));
			break;
		}
		int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) {
				k--;
				continue;
			}
			res = nccl_fail(ncclSystemError, format("ncclCommInitRank (%s): accept: %s", who.c_str(), strerror(errno)));
			break;
		}
		NcclHello h;
		if (!io_all(fd, &h, sizeof h, true, deadline, &why)) {
			close(fd);
			res = nccl_fail(ncclSystemError, format("ncclCommInitRank (%s): hello: %s", who.c_str(), why.c_str()));
			break;
		}
		if (ncclResult_t e = check_hello(h, -1, &why)) {
			close(fd);
			res = nccl_fail(e, format("ncclCommInitRank (%s): %s", who.c_str(), why.c_str()));
			break;
		}
		c->fds[size_t(h.rank)] = fd;
		if (!io_all(fd, &mine, sizeof mine, false, deadline, &why)) {
			res = nccl_fail(ncclSystemError,
			                format("ncclCommInitRank (%s): hello to rank %d: %s", who.c_str(), h.rank, why.c_str()));
			break;
		}
	}
	close(lfd);
	if (res != ncclSuccess) return res;
	for (int fd : c->fds)
		if (fd >= 0) tune(fd);
	return ncclSuccess;
}

/* ---- transfers ---- */

struct Xfer {
	bool recv = false;
	int peer = 0;
	char* ptr = nullptr;
	size_t bytes = 0;
};

/* One rank's side of the messages to and from one peer in an operation. */
struct Lane {
	std::vector<const Xfer*> sends, recvs;
	size_t si = 0, soff = 0; /* current send, bytes of header+payload written */
	size_t ri = 0, roff = 0; /* current receive, bytes of header+payload read */
	NcclMsgHeader shdr, rhdr;
};

/* Moves the operation's messages (see the header); returns ncclSuccess, or
 * the failure with *why. */
ncclResult_t transfer(NcclComm* c, const std::vector<Xfer>& xs, std::string* why) {
	std::vector<Lane> lanes(size_t(c->nranks));
	for (const Xfer& x : xs) (x.recv ? lanes[size_t(x.peer)].recvs : lanes[size_t(x.peer)].sends).push_back(&x);
	/* To and from this rank: in order, as copies. */
	Lane& self = lanes[size_t(c->rank)];
	if (self.sends.size() != self.recvs.size()) {
		*why = format("%zu send(s) to itself but %zu receive(s) from itself in one operation", self.sends.size(),
		              self.recvs.size());
		return ncclInvalidUsage;
	}
	for (size_t i = 0; i < self.sends.size(); i++) {
		if (self.sends[i]->bytes != self.recvs[i]->bytes) {
			*why = format("a send of %zu bytes to itself matches a receive of %zu bytes", self.sends[i]->bytes,
			              self.recvs[i]->bytes);
			return ncclInvalidUsage;
		}
		if (self.sends[i]->ptr != self.recvs[i]->ptr)
			memmove(self.recvs[i]->ptr, self.sends[i]->ptr, self.sends[i]->bytes);
	}
	self.sends.clear();
	self.recvs.clear();
	const double tmo = nccl_timeout_s();
	int64_t progress = now_ns();
	std::vector<pollfd> pfs;
	std::vector<int> peer_of;
	for (;;) {
		pfs.clear();
		peer_of.clear();
		pfs.push_back(pollfd{c->wake, POLLIN, 0});
		peer_of.push_back(-1);
		for (int p = 0; p < c->nranks; p++) {
			Lane& l = lanes[size_t(p)];
			short ev = 0;
			if (l.si < l.sends.size()) ev |= POLLOUT;
			if (l.ri < l.recvs.size()) ev |= POLLIN;
			if (ev) {
				pfs.push_back(pollfd{c->fds[size_t(p)], ev, 0});
				peer_of.push_back(p);
			}
		}
		if (pfs.size() == 1) return ncclSuccess;
		if (c->aborted.load()) {
			*why = "ncclCommAbort was called while the operation ran";
			return ncclSystemError;
		}
		int64_t left = progress + int64_t(tmo * 1e9) - now_ns();
		if (left <= 0) {
			std::string waiting;
			for (size_t i = 1; i < pfs.size(); i++) {
				const Lane& l = lanes[size_t(peer_of[i])];
				waiting += format("%s rank %d (%s%s%s)", i > 1 ? "," : "", peer_of[i],
				                  l.si < l.sends.size() ? "sending to it" : "",
				                  l.si < l.sends.size() && l.ri < l.recvs.size() ? ", " : "",
				                  l.ri < l.recvs.size() ? "receiving from it" : "");
			}
			*why = format("no progress for %gs (LSP_CUDASIM_NCCL_TIMEOUT) waiting for%s: a rank stalled or does not "
			              "issue the same operations",
			              tmo, waiting.c_str());
			return ncclSystemError;
		}
		int r = poll(pfs.data(), nfds_t(pfs.size()), int(std::min<int64_t>(left / 1000000 + 1, 1000)));
		if (r < 0) {
			if (errno == EINTR) continue;
			*why = format("poll: %s", strerror(errno));
			return ncclSystemError;
		}
		for (size_t i = 1; i < pfs.size(); i++) {
			if (!pfs[i].revents) continue;
			int p = peer_of[i], fd = pfs[i].fd;
			Lane& l = lanes[size_t(p)];
			/* Sends: header, then payload, until the socket is full. */
			while (l.si < l.sends.size()) {
				const Xfer* x = l.sends[l.si];
				if (l.soff == 0) {
					l.shdr.magic = kNcclMsgMagic;
					l.shdr.from = c->rank;
					l.shdr.seq = c->sent[size_t(p)] + 1;
					l.shdr.bytes = x->bytes;
				}
				const char* b;
				size_t n;
				if (l.soff < sizeof l.shdr) {
					b = reinterpret_cast<const char*>(&l.shdr) + l.soff;
					n = sizeof l.shdr - l.soff;
				} else {
					b = x->ptr + (l.soff - sizeof l.shdr);
					n = x->bytes - (l.soff - sizeof l.shdr);
				}
				ssize_t k = send(fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL);
				if (k < 0) {
					if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
					int e = errno;
					*why = format("sending %zu bytes to rank %d: %s", x->bytes, p, strerror(e));
					if (e == EPIPE || e == ECONNRESET) {
						*why += format(": rank %d closed its connection (it exited, died, aborted or failed)", p);
						return ncclRemoteError;
					}
					return ncclSystemError;
				}
				progress = now_ns();
				l.soff += size_t(k);
				if (l.soff == sizeof l.shdr + x->bytes) {
					c->sent[size_t(p)]++;
					l.si++;
					l.soff = 0;
				}
			}
			/* Receives: exactly the header, then exactly the payload. */
			while (l.ri < l.recvs.size()) {
				const Xfer* x = l.recvs[l.ri];
				char* b;
				size_t n;
				if (l.roff < sizeof l.rhdr) {
					b = reinterpret_cast<char*>(&l.rhdr) + l.roff;
					n = sizeof l.rhdr - l.roff;
				} else {
					b = x->ptr + (l.roff - sizeof l.rhdr);
					n = x->bytes - (l.roff - sizeof l.rhdr);
				}
				ssize_t k = n ? recv(fd, b, n, MSG_DONTWAIT) : 0;
				if (k == 0 && n) {
					*why = format("receiving %zu bytes from rank %d (%zu received): rank %d closed its connection (it "
					              "exited, died, aborted or failed)",
					              x->bytes, p, l.roff > sizeof l.rhdr ? l.roff - sizeof l.rhdr : 0, p);
					return ncclRemoteError;
				}
				if (k < 0) {
					if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
					int e = errno;
					*why = format("receiving %zu bytes from rank %d: %s", x->bytes, p, strerror(e));
					if (e == ECONNRESET) {
						*why += format(": rank %d closed its connection (it exited, died, aborted or failed)", p);
						return ncclRemoteError;
					}
					return ncclSystemError;
				}
				progress = now_ns();
				bool had_hdr = l.roff >= sizeof l.rhdr;
				l.roff += size_t(k);
				if (!had_hdr && l.roff == sizeof l.rhdr) {
					if (l.rhdr.magic != kNcclMsgMagic || l.rhdr.from != p || l.rhdr.seq != c->received[size_t(p)] + 1) {
						*why = format("a corrupt message header from rank %d", p);
						return ncclSystemError;
					}
					if (l.rhdr.bytes != x->bytes) {
						*why = format("message %llu from rank %d has %llu bytes, but the matching receive of this rank "
						              "wants %zu (the ranks issue different operations)",
						              (unsigned long long)l.rhdr.seq, p, (unsigned long long)l.rhdr.bytes, x->bytes);
						return ncclInvalidUsage;
					}
				}
				if (l.roff == sizeof l.rhdr + x->bytes) {
					c->received[size_t(p)]++;
					l.ri++;
					l.roff = 0;
				}
			}
		}
	}
}

/* Runs one queued operation on its stream's thread: waits for its turn
 * among the communicator's operations, moves its bytes; returns 0 or a
 * cudaError_t with *msg for the device's sticky error. */
int run_nccl(const std::shared_ptr<NcclComm>& c, uint64_t ticket, const std::vector<Xfer>& xs, const char* what,
             bool dead, std::string* msg) {
	const double tmo = nccl_timeout_s();
	std::string who = rank_name(c.get());
	ncclResult_t res = ncclSuccess;
	std::string why;
	{
		std::unique_lock<std::mutex> l(c->mu);
		auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(tmo);
		if (!c->cv.wait_until(l, deadline, [&] { return c->finished + 1 == ticket || c->aborted.load(); })) {
			res = ncclSystemError;
			why = format("%s: the communicator's earlier operation (on another stream) did not finish within %gs "
			             "(LSP_CUDASIM_NCCL_TIMEOUT)",
			             what, tmo);
		} else if (dead) {
			res = ncclUnhandledCudaError;
			why = format("%s skipped: the simulated device already has a sticky error", what);
		} else if (c->async != ncclSuccess) {
			res = c->async;
			why = format("%s: the communicator failed earlier: %s", what, c->async_msg.c_str());
		}
	}
	if (res == ncclSuccess) {
		res = transfer(c.get(), xs, &why);
		if (res != ncclSuccess) why = format("%s: %s", what, why.c_str());
	}
	if (res != ncclSuccess) {
		std::string m = format("%s: %s", who.c_str(), why.c_str());
		/* Only the communicator's first error is news: the operations
		 * that fail after it, because of it, would bury it. */
		if (c->fail(res, m)) nccl_fail(res, m);
		*msg = "lsp_sim: simulated NCCL: " + m;
	}
	{
		std::lock_guard<std::mutex> l(c->mu);
		c->finished = std::max(c->finished, ticket);
		c->cv.notify_all();
	}
	return res == ncclSuccess ? 0 : int(cudaErrorLaunchFailure);
}

/* The calls of the open group of this thread (ncclGroupStart). */
struct Group {
	int depth = 0;
	ncclResult_t err = ncclSuccess;
	ncclComm_t handle = nullptr;
	std::shared_ptr<NcclComm> comm;
	cudaStream_t stream = nullptr;
	std::vector<Xfer> xs;
	std::string what;
};
thread_local Group t_group;

/* Queues xs on stream as one operation of c. */
ncclResult_t submit(const std::shared_ptr<NcclComm>& c, cudaStream_t stream, std::vector<Xfer> xs, const std::string& what) {
	rt_init();
	if (S.sticky.load() != 0) {
		std::lock_guard<std::mutex> l(S.sticky_mu);
		return nccl_fail(ncclUnhandledCudaError, format("%s (%s): the simulated device has a sticky error: %s",
		                                                what.c_str(), rank_name(c.get()).c_str(), S.sticky_msg.c_str()));
	}
	{
		std::lock_guard<std::mutex> l(c->mu);
		if (c->async != ncclSuccess)
			return nccl_fail(c->async, format("%s (%s): the communicator failed earlier: %s", what.c_str(),
			                                  rank_name(c.get()).c_str(), c->async_msg.c_str()));
	}
	std::unique_lock<std::mutex> l(S.mu);
	cudaError_t err = cudaSuccess;
	std::shared_ptr<Stream> s = find_stream(stream, &err);
	if (!s) {
		l.unlock();
		return nccl_fail(ncclInvalidArgument, format("%s: stream %p is not a live stream of the simulated runtime (%s)",
		                                             what.c_str(), static_cast<void*>(stream), cudaGetErrorName(err)));
	}
	for (const Xfer& x : xs) {
		std::string why;
		if (!dev_range(x.ptr, x.bytes, &why)) {
			l.unlock();
			return nccl_fail(ncclInvalidArgument, format("%s: the %s buffer: %s", what.c_str(), x.recv ? "receive" : "send",
			                                             why.c_str()));
		}
	}
	uint64_t ticket;
	{
		std::lock_guard<std::mutex> m(c->mu);
		ticket = ++c->issued;
	}
	auto op = new_op(LSP_SIM_OP_NCCL, xs.size() == 1 ? (xs[0].recv ? "ncclRecv" : "ncclSend") : "nccl group");
	auto shared = std::make_shared<std::vector<Xfer>>(std::move(xs));
	std::string w = what;
	op->task = [c, ticket, shared, w](bool dead, std::string* msg) {
		return run_nccl(c, ticket, *shared, w.c_str(), dead, msg);
	};
	enqueue(s, std::move(op));
	return ncclSuccess;
}

/* Adds xs (one call's transfers) to the open group, or queues them at once. */
ncclResult_t add(ncclComm_t h, cudaStream_t stream, std::vector<Xfer> xs, const std::string& what) {
	Group& g = t_group;
	auto c = live_comm(h);
	ncclResult_t r = ncclSuccess;
	if (!c) r = nccl_fail(ncclInvalidArgument, format("%s: %p is not a live communicator", what.c_str(), static_cast<void*>(h)));
	if (r == ncclSuccess && g.depth == 0) {
		if (xs.empty()) return ncclSuccess;
		return submit(c, stream, std::move(xs), what);
	}
	if (r == ncclSuccess && g.handle && (g.handle != h || g.stream != stream))
		r = nccl_fail(ncclInvalidUsage, format("%s: the simulated NCCL runs a group on one communicator and one "
		                                       "stream; this group already has communicator %p on stream %p",
		                                       what.c_str(), static_cast<void*>(g.handle),
		                                       static_cast<void*>(g.stream)));
	if (r != ncclSuccess) {
		if (g.depth > 0 && g.err == ncclSuccess) g.err = r;
		return r;
	}
	if (!g.handle) {
		g.handle = h;
		g.comm = c;
		g.stream = stream;
		g.what = what;
	} else if (g.what.find(" ...") == std::string::npos && g.what != what) {
		g.what += " ...";
	}
	for (Xfer& x : xs) g.xs.push_back(x);
	return ncclSuccess;
}

ncclResult_t p2p(bool recv, void* buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t h, cudaStream_t stream) {
	const char* fn = recv ? "ncclRecv" : "ncclSend";
	auto c = live_comm(h);
	if (!c) return add(h, stream, {}, fn); /* fails, in the group too */
	size_t es = dtype_size(dt);
	ncclResult_t r = ncclSuccess;
	if (es == 0)
		r = nccl_fail(ncclInvalidArgument, format("%s: datatype %d is not an ncclDataType_t", fn, int(dt)));
	else if (peer < 0 || peer >= c->nranks)
		r = nccl_fail(ncclInvalidArgument, format("%s (%s): peer %d out of range", fn, rank_name(c.get()).c_str(), peer));
	else if (count > SIZE_MAX / es)
		r = nccl_fail(ncclInvalidArgument, format("%s: count %zu overflows", fn, count));
	if (r != ncclSuccess) {
		if (t_group.depth > 0 && t_group.err == ncclSuccess) t_group.err = r;
		return r;
	}
	std::vector<Xfer> xs;
	if (count > 0) {
		Xfer x;
		x.recv = recv;
		x.peer = peer;
		x.ptr = static_cast<char*>(buf);
		x.bytes = count * es;
		xs.push_back(x);
	}
	return add(h, stream, std::move(xs), format("%s of %zu bytes %s rank %d", fn, count * es, recv ? "from" : "to", peer));
}

} /* namespace */
} /* namespace lsp_sim */

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
	if (!version) return lsp_sim::nccl_fail(ncclInvalidArgument, "ncclGetVersion: null version");
	*version = NCCL_VERSION_CODE;
	return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
	case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	case ncclRemoteError: return "remote process exited or there was a network error";
	case ncclInProgress: return "NCCL operation in progress";
	default: return "unknown result code";
	}
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
	if (!id) return lsp_sim::nccl_fail(ncclInvalidArgument, "ncclGetUniqueId: null id");
	unsigned char rnd[lsp_sim::kNcclTagLen / 2];
	size_t got = 0;
	while (got < sizeof rnd) {
		ssize_t k = getrandom(rnd + got, sizeof rnd - got, 0);
		if (k < 0) {
			if (errno == EINTR) continue;
			return lsp_sim::nccl_fail(ncclSystemError, lsp_sim::format("ncclGetUniqueId: getrandom: %s", strerror(errno)));
		}
		got += size_t(k);
	}
	memset(id, 0, sizeof *id);
	memcpy(id->internal, lsp_sim::kNcclIdMagic, sizeof lsp_sim::kNcclIdMagic);
	for (size_t i = 0; i < sizeof rnd; i++)
		snprintf(id->internal + sizeof lsp_sim::kNcclIdMagic + 2 * i, 3, "%02x", rnd[i]);
	return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
	using lsp_sim::format;
	using lsp_sim::nccl_fail;
	lsp_sim::rt_init();
	if (!comm) return nccl_fail(ncclInvalidArgument, "ncclCommInitRank: null comm");
	*comm = nullptr;
	if (nranks < 1 || rank < 0 || rank >= nranks)
		return nccl_fail(ncclInvalidArgument, format("ncclCommInitRank: rank %d of %d is out of range", rank, nranks));
	if (memcmp(id.internal, lsp_sim::kNcclIdMagic, sizeof lsp_sim::kNcclIdMagic) != 0)
		return nccl_fail(ncclInvalidArgument, "ncclCommInitRank: the id was not made by the simulated NCCL's ncclGetUniqueId");
	auto c = std::make_shared<lsp_sim::NcclComm>();
	c->rank = rank;
	c->nranks = nranks;
	c->tag.assign(id.internal + sizeof lsp_sim::kNcclIdMagic, lsp_sim::kNcclTagLen);
	c->fds.assign(size_t(nranks), -1);
	c->sent.assign(size_t(nranks), 0);
	c->received.assign(size_t(nranks), 0);
	c->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (c->wake < 0) return nccl_fail(ncclSystemError, format("ncclCommInitRank: eventfd: %s", strerror(errno)));
	if (nranks > 1) {
		if (ncclResult_t r = lsp_sim::nccl_connect(c.get())) return r;
	}
	ncclComm_t h = new ncclComm{c};
	{
		std::lock_guard<std::mutex> l(lsp_sim::g_comms_mu);
		lsp_sim::g_comms.insert(h);
	}
	*comm = h;
	return ncclSuccess;
}

/* Removes h from the live handles; null if it was not live. */
static std::shared_ptr<lsp_sim::NcclComm> lspnccl_release(ncclComm_t h) {
	std::lock_guard<std::mutex> l(lsp_sim::g_comms_mu);
	if (!lsp_sim::g_comms.erase(h)) return nullptr;
	auto c = h->c;
	delete h;
	return c;
}

ncclResult_t ncclCommDestroy(ncclComm_t h) {
	if (!h) return ncclSuccess; /* as NCCL */
	auto c = lspnccl_release(h);
	if (!c)
		return lsp_sim::nccl_fail(ncclInvalidArgument,
		                          lsp_sim::format("ncclCommDestroy: %p is not a live communicator", static_cast<void*>(h)));
	std::unique_lock<std::mutex> l(c->mu);
	/* Each queued operation ends within the timeout, or fails. */
	while (c->finished < c->issued) {
		uint64_t before = c->finished;
		auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(lsp_sim::nccl_timeout_s() + 5);
		if (!c->cv.wait_until(l, deadline, [&] { return c->finished != before; })) {
			c->aborted = true;
			uint64_t one = 1;
			if (write(c->wake, &one, sizeof one) < 0) { /* the eventfd cannot be full */
			}
			c->shutdown_locked();
			return lsp_sim::nccl_fail(ncclSystemError,
			                          lsp_sim::format("ncclCommDestroy (%s): %llu queued operation(s) did not finish; "
			                                          "aborted",
			                                          lsp_sim::rank_name(c.get()).c_str(),
			                                          (unsigned long long)(c->issued - c->finished)));
		}
	}
	c->shutdown_locked(); /* the sockets close when the last reference goes */
	return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t h) {
	if (!h) return ncclSuccess;
	auto c = lspnccl_release(h);
	if (!c)
		return lsp_sim::nccl_fail(ncclInvalidArgument,
		                          lsp_sim::format("ncclCommAbort: %p is not a live communicator", static_cast<void*>(h)));
	c->aborted = true;
	uint64_t one = 1;
	if (write(c->wake, &one, sizeof one) < 0) { /* the eventfd cannot be full */
	}
	std::lock_guard<std::mutex> l(c->mu);
	if (c->async == ncclSuccess && c->finished < c->issued) {
		c->async = ncclSystemError;
		c->async_msg = lsp_sim::format("%s: ncclCommAbort was called", lsp_sim::rank_name(c.get()).c_str());
	}
	c->shutdown_locked();
	c->cv.notify_all();
	return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t h, ncclResult_t* err) {
	if (!err) return lsp_sim::nccl_fail(ncclInvalidArgument, "ncclCommGetAsyncError: null asyncError");
	auto c = lsp_sim::live_comm(h);
	if (!c)
		return lsp_sim::nccl_fail(ncclInvalidArgument, lsp_sim::format("ncclCommGetAsyncError: %p is not a live communicator",
		                                                               static_cast<void*>(h)));
	std::lock_guard<std::mutex> l(c->mu);
	*err = c->async;
	return ncclSuccess;
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t h, cudaStream_t stream) {
	return lsp_sim::p2p(false, const_cast<void*>(buf), count, dt, peer, h, stream);
}

ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t h, cudaStream_t stream) {
	return lsp_sim::p2p(true, buf, count, dt, peer, h, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuf, void* recvbuf, size_t count, ncclDataType_t dt, int root, ncclComm_t h,
                           cudaStream_t stream) {
	using lsp_sim::format;
	auto c = lsp_sim::live_comm(h);
	if (!c) return lsp_sim::add(h, stream, {}, "ncclBroadcast");
	size_t es = lsp_sim::dtype_size(dt);
	ncclResult_t r = ncclSuccess;
	if (es == 0)
		r = lsp_sim::nccl_fail(ncclInvalidArgument, format("ncclBroadcast: datatype %d is not an ncclDataType_t", int(dt)));
	else if (root < 0 || root >= c->nranks)
		r = lsp_sim::nccl_fail(ncclInvalidArgument,
		                       format("ncclBroadcast (%s): root %d out of range", lsp_sim::rank_name(c.get()).c_str(), root));
	else if (count > SIZE_MAX / es)
		r = lsp_sim::nccl_fail(ncclInvalidArgument, format("ncclBroadcast: count %zu overflows", count));
	if (r != ncclSuccess) {
		if (lsp_sim::t_group.depth > 0 && lsp_sim::t_group.err == ncclSuccess) lsp_sim::t_group.err = r;
		return r;
	}
	std::vector<lsp_sim::Xfer> xs;
	size_t bytes = count * es;
	auto x = [&](bool recv, int peer, const void* p) {
		lsp_sim::Xfer t;
		t.recv = recv;
		t.peer = peer;
		t.ptr = static_cast<char*>(const_cast<void*>(p));
		t.bytes = bytes;
		xs.push_back(t);
	};
	if (bytes > 0) {
		if (c->rank == root) {
			for (int p = 0; p < c->nranks; p++)
				if (p != root) x(false, p, sendbuf);
			if (sendbuf != recvbuf) {
				x(false, root, sendbuf);
				x(true, root, recvbuf);
			}
		} else {
			x(true, root, recvbuf);
		}
	}
	return lsp_sim::add(h, stream, std::move(xs), format("ncclBroadcast of %zu bytes from root %d", bytes, root));
}

ncclResult_t ncclGroupStart(void) {
	lsp_sim::t_group.depth++;
	return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
	lsp_sim::Group& g = lsp_sim::t_group;
	if (g.depth == 0) return lsp_sim::nccl_fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
	if (--g.depth > 0) return ncclSuccess;
	lsp_sim::Group done = std::move(g);
	g = lsp_sim::Group();
	if (done.err != ncclSuccess) return done.err; /* the group's calls are dropped, as NCCL drops them */
	if (done.xs.empty()) return ncclSuccess;
	return lsp_sim::submit(done.comm, done.stream, std::move(done.xs), "group of " + done.what);
}

const char* lsp_sim_nccl_last_message(void) {
	static thread_local std::string copy;
	std::lock_guard<std::mutex> l(lsp_sim::g_nccl_msg_mu);
	copy = lsp_sim::g_nccl_msg;
	return copy.c_str();
}

} /* extern "C" */
