# lsp-offload build. `make` builds bin/lsp-train, with CUDA where it can
# and CPU only otherwise (it never fails for lack of CUDA); `make sim`
# builds the same command on the simulated CUDA runtime; `make test` is
# what CI runs.

GO      ?= go
NVCC    ?= $(shell command -v nvcc 2>/dev/null)

.PHONY: all build sim test fmt-check vet gotest gotest-norace bench bench-train bench-recompute clean fuzz

all: build

# `make` (`make build`): bin/lsp-train. With CUDA (-tags cuda: the kernels
# of build/libkernels.a from `make kernels`, CUDA's runtime linked
# statically, the driver's libcuda.so.1 loaded when it starts) when
# CUDA_PROBE finds nothing missing: nvcc that knows sm_90 (CUDA 11.8 or
# newer), and a program linked against CUDA's libraries that starts; CPU
# only otherwise. Its last line says which it built and, for CPU only, why.
# CUDA=0 builds CPU only; CUDA=1 fails instead of falling back.
# The probe runs in the recipe, not when the Makefile is read, so the other
# targets do not pay for it. The CUDA build also needs the driver to start
# (libcuda.so.1, which package cu links), hence a probe that runs, not
# only links: a binary that cannot start could not even train on the CPU.
CUDA ?= auto
CUDA_PROBE = \
	if [ -z "$(NVCC)" ]; then echo "nvcc not found"; \
	elif ! $(NVCC) --list-gpu-code 2>/dev/null | grep -qx sm_90; then echo "$(NVCC) does not know sm_90 (CUDA 11.8 or newer needed)"; \
	else t=$$(mktemp -d); printf 'int main(void) { return 0; }\n' >$$t/p.c; \
		if ! $(CC) $$t/p.c -o $$t/p $(if $(CUDA_LIBDIR),-L$(dir $(CUDA_LIBDIR))) -Wl,--no-as-needed \
			-lcudart_static -lcuda -lcudart -ldl -lrt -lpthread >$$t/err 2>&1; then \
			echo "CUDA's libraries do not link ($$(grep -m1 -o 'cannot find -l[^ :]*' $$t/err || head -n1 $$t/err))"; \
		elif ! $$t/p >/dev/null 2>&1; then echo "the NVIDIA driver's libcuda.so.1 does not load"; fi; \
		rm -rf $$t; fi

# The CUDA build's cgo settings: gpu-test-bin's (the library's hash, so a
# new library relinks; CUDA's include and library folders where it is not
# installed system-wide), less the warnings of package cu's calls that CUDA
# has deprecated (cuDeviceComputeCapability), which are not ours to fix.
CMD_CUDA_ENV = CGO_CFLAGS="-g -O2 -Wno-deprecated-declarations -DLSP_KERNELS_LIB=$$(sha256sum build/libkernels.a | cut -c1-16) \
	$(if $(CUDA_INC),-I$(CUDA_INC))" $(if $(CUDA_LIBDIR),CGO_LDFLAGS="-L$(dir $(CUDA_LIBDIR))")

#
# With Open MPI's development files (pkg-config ompi-c) the build also has
# -tags mpi, so that `mpirun -np N bin/lsp-train ...` trains data-parallel;
# MPI=0 leaves it out.
MPI ?= auto
build:
	@mkdir -p bin
	@mpi=; if [ "$(MPI)" != 0 ] && pkg-config --exists ompi-c 2>/dev/null; then mpi=mpi; fi; \
	case "$(CUDA)" in 0) why="CUDA=0";; *) why=$$($(CUDA_PROBE));; esac; \
	if [ -n "$$why" ] && [ "$(CUDA)" = 1 ]; then echo "build: CUDA=1, but $$why"; exit 1; fi; \
	if [ -z "$$why" ]; then \
		$(MAKE) --no-print-directory build/libkernels.a && \
		echo "$(GO) build -tags cuda$${mpi:+,mpi} -o bin/lsp-train ./cmd/lsp-train" && \
		$(CMD_CUDA_ENV) $(GO) build -tags cuda$${mpi:+,mpi} -o bin/lsp-train ./cmd/lsp-train && \
		echo "build: bin/lsp-train WITH CUDA (-tags cuda$${mpi:+,mpi}; backends: cpu, cuda)"; \
	else \
		echo "$(GO) build $${mpi:+-tags mpi }-o bin/lsp-train ./cmd/lsp-train" && \
		$(GO) build $${mpi:+-tags mpi} -o bin/lsp-train ./cmd/lsp-train && \
		echo "build: bin/lsp-train CPU ONLY ($$why; backends: cpu$${mpi:+; MPI: -tags mpi})"; \
	fi

fmt-check:
	@out=$$(find . -name '*.go' -not -path './third_party/*' -not -path './.git/*' -print0 | xargs -0 gofmt -l); \
	if [ -n "$$out" ]; then echo "gofmt: unformatted files:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	@if [ -n "$(SIM_OK)" ]; then echo '$(SIM_ENV) $(GO) vet -tags lsp_sim ./kernels/...'; \
		$(SIM_ENV) $(GO) vet -tags lsp_sim ./kernels/...; \
		echo '$(SIM_ENV) $(GO) vet -tags cuda ./kernels/...'; $(SIM_ENV) $(GO) vet -tags cuda ./kernels/...; \
		echo '$(SIM_ENV) $(GO) vet -tags cudasim ./kernels/...'; $(SIM_ENV) $(GO) vet -tags cudasim ./kernels/...; \
		for tag in cuda cudasim; do echo "$(GO) vet -tags $$tag $(CUDASIM_VET)"; \
			$(SIM_ENV) $(GO) vet -tags $$tag $(CUDASIM_VET) || exit 1; done; fi

# Go packages under the race detector with -short; heavier training tests
# skip themselves under -short or under the race detector and run in the
# second, race-free pass (gotest-norace).
gotest:
	$(GO) test -race -short -count=1 ./...

# The race-free pass: every edge of the offload schedule removed in turn
# (those runs race on purpose, so the race detector would flag them), the
# pipelined-vs-sequential check at full length, compare's learning-rate
# grid and pretraining reuse (the whole job is make test-compare), a full
# disk at every write point (injected, and on a tmpfs where one mounts),
# the train command killed (SIGKILL) once at every named write point and
# resumed, stopped by SIGINT and SIGTERM (its exit status, during an
# evaluation too), every command line of README.md run, and every other
# test of the command that runs it as a child process (the whole package:
# about a minute; slow under -race, so -short skips them there), and
# a 1.1 GB sharded checkpoint loaded within 1.2x its size in resident
# memory, and the host memory plan of gpt2 runs against their peak
# resident memory (the race detector's shadow memory would break both
# measures), and the bf16 kernel-dtype check of every mode (numbers, not
# concurrency: three minutes under -race, 13 s here).
gotest-norace:
	$(GO) test -count=1 -run 'TestEveryEdgeIsNeeded|TestRingEveryEdgeIsNeeded|TestPipelinedMatchesSequential|TestComparePretrainReuse|TestCompareLRGrid' ./train/compare/ ./train/engine/
	$(GO) test -count=1 -run 'TestDiskFull|TestHostPlanMeasured' ./train/
	$(GO) test -count=1 -short -run 'TestBF16KernelDTypes' ./train/
	$(GO) test -count=1 -run 'TestLoadMemory' ./train/hf/
	$(GO) test -count=1 ./cmd/lsp-train/

# `make test-compare`: the compare job end to end at reduced size (tiny
# pretrained, ten rows over two seeds: TestCompare), about five minutes on
# two cores; taken out of make test to keep it within its 30 minutes
# (train/compare's smaller tests stay in it).
.PHONY: test-compare
test-compare:
	$(GO) test -count=1 -run 'TestCompare$$' ./train/compare/

# `make test-kill`: the train command killed with SIGKILL at every named
# write point, then KILLS more times at seeded random points and moments
# in native, zero and lsp mode, resumed after each kill; the outputs must
# equal an uninterrupted run's bit for bit. KILL_SEED=N replays a seed
# (each run logs its own).
KILLS ?= 40
.PHONY: test-kill
test-kill:
	@log=$$(mktemp); LSP_KILL_TEST_KILLS=$(KILLS) $(if $(KILL_SEED),LSP_KILL_TEST_SEED=$(KILL_SEED)) \
		$(GO) test -count=1 -v -run 'TestKillNamedPoints|TestKillRandom' ./cmd/lsp-train/ >$$log 2>&1; rc=$$?; \
	if [ $$rc -ne 0 ]; then cat $$log; else grep -E '^(--- |ok)|kills|seed' $$log; fi; rm -f $$log; exit $$rc

# `make mem-paper-shape`: the device memory plan against a real step at
# the paper's 1.3B shape (train's TestPaperShapeDeviceMem):
# deepseek-coder-1.3b, random weights, lsp mode, bf16, --d 512 --r 16,
# --recompute layer, --dense-params frozen, 2 x 1024 tokens, one step on
# the CPU backend with --device-mem set to the plan; the backend's
# high-water mark must equal the plan. Not in `make test`: several
# minutes on 2 cores and about 10 GiB of memory.
.PHONY: mem-paper-shape
mem-paper-shape:
	LSP_PAPER_SHAPE=1 $(GO) test -count=1 -v -timeout 90m -run '^TestPaperShapeDeviceMem$$' ./train/

test: fmt-check vet gotest gotest-norace simtest kernel-report cudasim-rt-test cudasim-test cudasim-engine-test cudasim-bench-test cudasim-bundle-test mpi-test cudasim-nccl-test

# `make mpi-test`: the communicator over Open MPI (train/comm/mpi, -tags
# mpi), vetted, then its tests, which launch the test binary under
# `mpirun -np 1`, `-np 2` and `-np 3`: every collective bit for bit against the sum
# in rank order, the bytes counted, a killed rank, a stalled rank, a size
# mismatch (about 15 s). Then data-parallel training (train/engine,
# TestDataParallel): lsp mode under `mpirun -np 2` and `-np 3` bit for bit
# against one process with --grad-accum N, zero mode's sharded host
# optimizer bit for bit against the replicated one, and the train command
# under `mpirun -np 2` (cmd/lsp-train: rank 0 writes, resume, the same
# export as --grad-accum 2, zero mode resumed from its gathered shards, a
# killed rank ends the job); about 45 s after the build.
# Needs mpirun and libopenmpi-dev (.ci/run installs them); skipped with a
# message otherwise.
.PHONY: mpi-test
mpi-test:
	@if command -v mpirun >/dev/null 2>&1 && pkg-config --exists ompi-c 2>/dev/null; then \
		echo '$(GO) vet -tags mpi ./train/comm/... ./train/engine/ ./cmd/lsp-train/' && \
		$(GO) vet -tags mpi ./train/comm/... ./train/engine/ ./cmd/lsp-train/ && \
		echo '$(GO) test -tags mpi -count=1 -timeout 5m ./train/comm/...' && \
		$(GO) test -tags mpi -count=1 -timeout 5m ./train/comm/... && \
		echo "$(GO) test -tags mpi -count=1 -timeout 5m -run 'TestDataParallel' ./train/engine/ ./cmd/lsp-train/" && \
		$(GO) test -tags mpi -count=1 -timeout 5m -run 'TestDataParallel' ./train/engine/ ./cmd/lsp-train/; \
	else echo "mpi-test: WARNING: MPI tests SKIPPED: mpirun or libopenmpi-dev (pkg-config ompi-c) not found (apt-get install openmpi-bin libopenmpi-dev, as .ci/run does)"; fi

# `make test-repeat`: the Go tests of `make test` REPEAT (10) times in a row,
# to find flaky tests (not in CI: about 10 x 10 minutes on 2 cores).
REPEAT ?= 10
.PHONY: test-repeat
test-repeat:
	scripts/test-repeat.sh $(REPEAT)

# `make bench`: matrix multiply against OpenBLAS (bench-gemm), then training
# throughput of the CPU backend, then the planner's predicted step times
# against measured ones (bench-plan).
bench: bench-gemm bench-train bench-plan

bench-train:
	$(GO) run ./bench/train

# What --recompute costs and saves: each preset and mode under none, attn
# and layer, the three engines stepped in turn (none is the control), with
# each one's device high-water mark beside its memory plan. About 3
# minutes on 2 cores.
bench-recompute:
	$(GO) run ./bench/train -recompute none,attn,layer

# The planner checked against this machine: the CPU backend calibrated from
# microbenchmarks only (train/calibrate, plan.FromCalibration), each
# configuration's step predicted, and timed on the real engine between the
# calibration's rounds (median after warm-up): tiny, gpt2 and llama-tiny in
# native, zero and lsp mode, sequential, pipelined and pipelined with
# --recompute layer, side by side, then a
# per-family breakdown of the worst; the last line is "plan-vs-measured: X"
# (worst max(pred/meas, meas/pred)). About 6 minutes on 2 cores; other work
# on the machine shows in X. BENCH_PLAN_FLAGS passes flags, e.g. -models
# tiny -budget 10s.
.PHONY: bench-plan
bench-plan:
	$(GO) run ./bench/plan $(BENCH_PLAN_FLAGS)

# `make fuzz`: Go's native fuzzing of every parser of a file a user may have
# downloaded (safetensors, the Hugging Face GPT-2 directory, the shard index
# of a Hugging Face directory, Alpaca JSON/JSONL and plain text, the
# tokenizers on that text), one target after another for
# FUZZTIME each, on one worker (FUZZPAR) so it shares the machine politely.
# The seed corpora (f.Add and testdata/fuzz/FuzzXxx) already run in every
# `go test`; a crash found here is written to the package's testdata/fuzz/ as
# a new regression seed. FUZZ=regexp picks targets, e.g. make fuzz FUZZ=Open.
#
# FUZZMIN caps the minimization of each new interesting input: Go's default
# (60 s each) looked like a stalled run, since executions spent minimizing
# are not counted. `make fuzz-ci` is the short campaign CI runs: a fixed
# number of executions per target (the third field of FUZZ_TARGETS, about
# 10 s each on 2 cores), because a duration-based -fuzztime can end in a
# spurious "context deadline exceeded" (golang/go#75804, unfixed in go1.26).
FUZZTIME ?= 2m
FUZZMIN  ?= 10s
FUZZPAR  ?= 1
FUZZ     ?= .
FUZZ_TARGETS = \
	./train/safetensors:FuzzOpen:10000 \
	./train/gpt2:FuzzHFConfig:10000 \
	./train/gpt2:FuzzLoadHF:8000 \
	./train/llama:FuzzHFConfig:10000 \
	./train/hf:FuzzIndex:10000 \
	./train/data:FuzzAlpaca:8000 \
	./train/data:FuzzText:5000 \
	./train/tokenizer:FuzzEncode:40000 \
	./train/tokenizer:FuzzDecode:200000 \
	./train/tokenizer:FuzzTokenizerJSON:20000 \
	./train/tokenizer:FuzzFileEncode:20000 \
	./train/tokenizer:FuzzLlama2CEncode:20000 \
	./train/llama2c:FuzzLoad:5000

.PHONY: fuzz-ci
fuzz fuzz-ci:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; fn=$${rest%%:*}; execs=$${rest#*:}; \
		echo "$$fn" | grep -Eq -e '$(FUZZ)' || continue; \
		if [ "$@" = fuzz-ci ]; then ft=$${execs}x; min=200x; else ft=$(FUZZTIME); min=$(FUZZMIN); fi; \
		echo "== $$fn ($$pkg) for $$ft"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $$ft -fuzzminimizetime $$min -parallel $(FUZZPAR) $$pkg; \
	done

clean:
	rm -rf bin build cmd/lsp-train/bundle

# host.Sgemm against OpenBLAS on the GPT-2 124M shapes; the last line is
# "gemm-vs-openblas: X.XX". Installs libopenblas-dev (apt-get, as root) when
# cblas.h is missing. BENCH_GEMM_FLAGS passes flags, e.g. -threads 1 -rounds 3.
.PHONY: bench-gemm
bench-gemm:
	@echo '#include <cblas.h>' | $(CC) -E -x c - >/dev/null 2>&1 || { \
		echo "bench-gemm: cblas.h missing, installing libopenblas-dev"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y libopenblas-dev; }
	$(GO) run -tags openblas ./bench/gemm $(BENCH_GEMM_FLAGS)

# Fused CPU Adam (host.Workers.AdamStep) at 1M/16M/128M (1B when memory
# allows) against a STREAM triad measured in the same run on the same pinned
# workers; the last line is "adam-vs-triad: X.XX" at 128M parameters.
# Which update wins on fine-tuning (compare's study at the mini preset) in
# two jobs on the shared data (skips when it is absent): Alpaca
# instruction tuning and a domain shift to Go source. Hours on two cores
# at its default size, not in CI; JOBS, STEPS, PRETRAIN_STEPS and SEEDS
# shrink it. See scripts/bench-quality.sh.
.PHONY: bench-quality
bench-quality: build
	scripts/bench-quality.sh

# BENCH_ADAM_FLAGS passes flags, e.g. -threads 1 -reps 3. The peers
# (DeepSpeed, torch) are compared by hand: bench/peers/adam_peers.sh.
.PHONY: bench-adam
bench-adam:
	$(GO) run ./bench/adam $(BENCH_ADAM_FLAGS)

# Kernels. `make kernels` compiles kernels/*.cu with nvcc into
# build/libkernels.a for sm_80, sm_86, sm_89 and sm_90 plus compute_90 PTX
# (CMakeLists.txt does the same); without nvcc it says so and succeeds.
# `make simtest` runs every kernel under the CPU simulator (kernels/sim) via
# the lsp_sim-tagged Go package kernels/simtest: no GPU needed, only CUDA's
# headers; without -short (the barrier-removal check runs) and without -race.
# The tests call the launchers through package kernels, the Go face
# generated from kernels/kernels.h (`go generate ./kernels`; a plain `go
# test ./kernels` fails when it is out of date).
# RUN=regexp selects tests (e.g. make simtest RUN=TestGemm).
.PHONY: kernels simtest gpu-test-bin
SIM_OK    := $(or $(wildcard /usr/include/cuda_bf16.h),$(NVCC))
CUDA_INC  := $(if $(wildcard /usr/include/cuda_bf16.h),,$(if $(NVCC),$(abspath $(dir $(realpath $(NVCC)))../include)))
# Go's build cache does not track the kernel sources simtest includes from
# ../ (nor the headers the generated face in package kernels includes from
# sim/), so their hash goes into CGO_CXXFLAGS and CGO_CFLAGS (part of the
# cache key); the tests check it (internal/simfresh, whose Globs are this list).
# Same list and order.
SIM_SRCS   = $(sort $(wildcard kernels/*.cu kernels/*.cuh kernels/*.h kernels/sim/*.h kernels/sim/*.cpp \
	kernels/simtest/*.cu kernels/simtest/*.h))
SIM_HASH   = $(if $(SIM_SRCS),$(shell cat $(SIM_SRCS) | sha256sum | cut -c1-16),none)
SIM_ENV    = CGO_CFLAGS="-g -O2 -DLSP_SIM_SOURCES=$(SIM_HASH) $(if $(CUDA_INC),-I$(CUDA_INC))" \
	CGO_CXXFLAGS="-g -O1 -DLSP_SIM_SOURCES=$(SIM_HASH) $(if $(CUDA_INC),-I$(CUDA_INC))"
KERNEL_SRC := $(wildcard kernels/*.cu)
KERNEL_OBJ := $(KERNEL_SRC:kernels/%.cu=build/kernels/%.o)
NVCC_ARCH := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_86,code=sm_86 \
	-gencode arch=compute_89,code=sm_89 -gencode arch=compute_90,code=sm_90 \
	-gencode arch=compute_90,code=compute_90
NVCC_FLAGS ?= -std=c++17 -O3 -Xcompiler -fPIC

kernels:
ifeq ($(NVCC),)
	@echo "kernels: nvcc not found; skipping build/libkernels.a (the CPU-only build does not need it)"
else
	@$(MAKE) --no-print-directory build/libkernels.a
endif

build/libkernels.a: $(KERNEL_OBJ)
	@mkdir -p $(@D)
	rm -f $@
	ar rcs $@ $^

build/kernels/%.o: kernels/%.cu kernels/kernels.h $(wildcard kernels/*.cuh)
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) $(NVCC_ARCH) -Ikernels -c $< -o $@

simtest:
ifneq ($(SIM_OK),)
	$(SIM_ENV) $(GO) test -tags lsp_sim -count=1 -timeout 30m $(if $(RUN),-run '$(RUN)') ./kernels/simtest/
else
	@echo "simtest: WARNING: kernel simulator tests SKIPPED: neither /usr/include/cuda_bf16.h nor nvcc found (install the CUDA toolkit, as .ci/run does)"
endif

# `make kernel-report`: the static report of the compiled kernels
# (kernels/cmd/kreport; the rules are kernels/internal/kreport's): for each
# kernel of build/kernels/*.o and each of sm_80, sm_86, sm_89 and sm_90,
# registers, stack frame, spills (ptxas -v, for the kernels with a stack
# frame), static and dynamic shared memory, threads per block and the
# theoretical occupancy, and HMMA in the loops of the GEMM and attention
# kernels (nvdisasm). It fails on a spill or on a stack frame or 255
# registers that the kernel's .cu file does not explain, and when the table
# in README.md is not this build's; UPDATE=1 rewrites that table. Builds
# build/libkernels.a first (nothing to do after `make kernels`, as in CI);
# about 20 s on 2 cores. Without nvcc it says so and succeeds.
.PHONY: kernel-report
kernel-report:
ifeq ($(NVCC),)
	@echo "kernel-report: WARNING: static kernel report SKIPPED: nvcc not found (install the CUDA toolkit, as .ci/run does)"
else
	@$(MAKE) --no-print-directory build/libkernels.a
	$(GO) run ./kernels/cmd/kreport -nvcc $(NVCC) -nvcc-flags "$(NVCC_FLAGS) -Ikernels" $(if $(UPDATE),-update)
endif

# `make cudasim-rt-test`: the simulated CUDA runtime (kernels/sim/cudart.cpp,
# what -tags cudasim builds link instead of NVIDIA's libraries) tested on
# its own through cgo by kernels/cudasimrt: stream order and overlap from
# the runtime's timestamps, CUDA's event rules, sticky asynchronous errors,
# out-of-memory, pinned host memory, the hazard delays, and ldd of the test
# binary showing no NVIDIA library. Needs only CUDA's headers, as simtest;
# about 20 s on 2 cores after the C++ is compiled. RUN=regexp selects tests.
.PHONY: cudasim-rt-test
cudasim-rt-test:
ifneq ($(SIM_OK),)
	$(SIM_ENV) $(GO) test -tags cudasim -count=1 -timeout 5m $(if $(RUN),-run '$(RUN)') ./kernels/cudasimrt/
else
	@echo "cudasim-rt-test: WARNING: simulated CUDA runtime tests SKIPPED: neither /usr/include/cuda_bf16.h nor nvcc found (install the CUDA toolkit, as .ci/run does)"
endif

# `make cudasim-test`: the CUDA backend (package cuda: lifecycle, events,
# errors, the conformance table against the CPU backend) and the packages
# that open it (train/device), built with -tags cudasim: the same Go code
# on the simulated CUDA runtime (kernels/sim/cudart.cpp), with the kernels
# compiled by g++ into package cuda. No GPU needed, only CUDA's headers;
# the source hash in SIM_ENV rebuilds it when a kernel changes (the tests
# check it). Then a short bf16 run of tiny (and of llama-tiny, in native
# and lsp) in native, zero and lsp mode on
# the CUDA backend against the same run on the CPU backend
# (TestCUDATrainsLikeCPU in train), and the LLaMA fixtures' logits, loss
# and gradients on both backends (TestCUDAMatchesCPU in train/llama), and
# the KV-cache decoder's logits on both (TestCUDADecoderMatchesCPU in
# train/eval), and the planner's step graph priced with per-op times that
# the CUDA backend's events measured (TestMeasuredOpsCUDA in train/plan).
# About 3 minutes on 2 cores. RUN=regexp
# selects tests.
#
# `make cudasim-engine-test`: the engine's device tests on the CUDA backend
# (zero matches native, pipelined matches sequential bit for bit, every
# edge of the schedule needed, caught by the hazard check wrapped around
# the backend: train/hazard.Wrap, which tells the device goroutine and
# each host node's goroutine apart, so a missing edge is found whatever
# the timing), with -short as in gotest; about 2 minutes.
.PHONY: cudasim-test cudasim-engine-test
CUDASIM_PKGS ?= ./cuda/ ./train/device/ ./train/lsp/ ./train/rsvd/
CUDASIM_ENGINE_RUN = TestZeroMatchesNative|TestPipelinedMatchesSequential|TestRingPipelinedMatchesSequential|TestRecomputeBitIdentical|TestEveryEdgeIsNeeded|TestCheckOnDevice|TestQuantizedBaseIsItsValues
CUDASIM_VET = ./cuda/ ./cuda/nccltest/ ./train/device/ ./train/engine/ ./train/hazard/ ./train/llama/ ./train/eval/ ./bench/pcie/ ./bench/kernels/ ./bench/pciebench/ ./bench/kernelbench/ ./cmd/lsp-train/
SIM_SKIP_MSG = WARNING: tests on the simulated CUDA runtime SKIPPED: neither /usr/include/cuda_bf16.h nor nvcc found (install the CUDA toolkit, as .ci/run does)
cudasim-test:
ifneq ($(SIM_OK),)
	$(SIM_ENV) $(GO) test -tags cudasim -count=1 -timeout 30m $(if $(RUN),-run '$(RUN)') $(CUDASIM_PKGS)
	$(SIM_ENV) $(GO) test -tags cudasim -count=1 -timeout 30m -run '$(or $(RUN),TestCUDATrainsLikeCPU)' ./train/
	$(SIM_ENV) $(GO) test -tags cudasim -count=1 -timeout 30m -run '$(or $(RUN),TestCUDAMatchesCPU)' ./train/llama/
	$(SIM_ENV) $(GO) test -tags cudasim -count=1 -timeout 30m -run '$(or $(RUN),TestCUDADecoderMatchesCPU)' ./train/eval/
	$(SIM_ENV) $(GO) test -tags cudasim -count=1 -timeout 30m -run '$(or $(RUN),TestMeasuredOpsCUDA)' ./train/plan/
else
	@echo "cudasim-test: $(SIM_SKIP_MSG)"
endif

cudasim-engine-test:
ifneq ($(SIM_OK),)
	$(SIM_ENV) $(GO) test -tags cudasim -count=1 -short -timeout 30m -run '$(or $(RUN),$(CUDASIM_ENGINE_RUN))' ./train/engine/
else
	@echo "cudasim-engine-test: $(SIM_SKIP_MSG)"
endif

# `make -s sim-env`: the cgo settings of the cudasim targets (SIM_ENV) as a
# shell export line, to build a cudasim test binary by hand with the same
# source hash: eval "$(make -s sim-env)"; go test -c -tags "cudasim mpi" ...
.PHONY: sim-env
sim-env:
	@echo 'export $(SIM_ENV)'

# `make cudasim-nccl-test`: package cuda's NCCL communicator (cuda/nccl.go)
# on the simulated NCCL (kernels/sim/nccl.cpp: sends and receives queued on
# the simulated streams, carried between the ranks' processes over local
# sockets), built with -tags "cudasim mpi" (cuda/nccltest): one rank in
# this process, then the test binary under `mpirun -np 2` and `-np 3`,
# every collective bit for bit against the host's sum in rank order on
# ragged sizes, then rank 1 of 3 lost (ncclCommAbort, SIGKILL, stalled past
# LSP_CUDASIM_NCCL_TIMEOUT=2): the others must fail with an error naming
# the cause, not hang. Then data-parallel training summing on the
# (simulated) devices, with the same build tags: the engine under
# `mpirun -np 2` and `-np 3` (TestDataParallelNCCL: lsp, its dense
# gradients and native mode, bit for bit the same summing on the devices
# as on the host, and lsp as one process with --grad-accum N), and the
# train command (TestDataParallelNCCLCommand: --collectives nccl, host and
# auto export the same weights as one process). About 2 minutes after the
# build. Needs CUDA's headers (as cudasim-test), mpirun and
# libopenmpi-dev; skipped with a message otherwise. RUN=regexp selects
# the communicator's tests.
.PHONY: cudasim-nccl-test
cudasim-nccl-test:
ifneq ($(SIM_OK),)
	@if command -v mpirun >/dev/null 2>&1 && pkg-config --exists ompi-c 2>/dev/null; then \
		echo '$(GO) vet -tags "cudasim mpi" ./cuda/nccltest/' && \
		$(SIM_ENV) $(GO) vet -tags "cudasim mpi" ./cuda/nccltest/ && \
		echo '$(GO) test -tags "cudasim mpi" -count=1 -timeout 10m $(if $(RUN),-run $(RUN)) ./cuda/nccltest/' && \
		$(SIM_ENV) $(GO) test -tags "cudasim mpi" -count=1 -timeout 10m $(if $(RUN),-run '$(RUN)') ./cuda/nccltest/ && \
		echo '$(GO) test -tags "cudasim mpi" -count=1 -timeout 10m -run TestDataParallelNCCL ./train/engine/ ./cmd/lsp-train/' && \
		$(SIM_ENV) $(GO) test -tags "cudasim mpi" -count=1 -timeout 10m -run 'TestDataParallelNCCL' ./train/engine/ ./cmd/lsp-train/; \
	else echo "cudasim-nccl-test: WARNING: simulated NCCL tests between processes SKIPPED: mpirun or libopenmpi-dev (pkg-config ompi-c) not found (apt-get install openmpi-bin libopenmpi-dev, as .ci/run does)"; \
		echo '$(GO) test -tags cudasim -count=1 -timeout 5m ./cuda/nccltest/' && \
		$(SIM_ENV) $(GO) test -tags cudasim -count=1 -timeout 5m $(if $(RUN),-run '$(RUN)') ./cuda/nccltest/; fi
else
	@echo "cudasim-nccl-test: $(SIM_SKIP_MSG)"
endif

# `make cudasim-bench-test`: lsp-train profile on the CUDA backend on
# the simulated runtime (TestProfileCUDA: tiny, every mode, a projector
# check; its phases and families sum to its device time, every phase
# present, its metrics lines parse), then bench/pcie (4 KiB to 1 MiB,
# once) and bench/kernels (tiny and llama-tiny at 2 x 16 tokens, once, no
# cuBLAS) on it, both marked SIMULATED; about 1.5 minutes on 2 cores.
.PHONY: cudasim-bench-test
cudasim-bench-test:
ifneq ($(SIM_OK),)
	$(SIM_ENV) $(GO) test -tags cudasim -count=1 -timeout 10m -run '$(or $(RUN),TestProfileCUDA)' ./cmd/lsp-train/
	$(SIM_ENV) $(GO) run -tags cudasim ./bench/pcie
	$(SIM_ENV) $(GO) run -tags cudasim ./bench/kernels
else
	@echo "cudasim-bench-test: $(SIM_SKIP_MSG)"
endif

# `make bench-pcie`: the host-device link of CUDA device 0 (bench/pcie):
# pinned and staged copies of 4 KiB to 1 GiB each way and both at once,
# GB/s median and spread over 20 runs timed by events, and the ratio to the
# link's rate (PCIe speed and width from sysfs). Built with -tags cuda
# where `make build` would build CUDA (CUDA_PROBE); otherwise it prints
# one line saying there is no device and succeeds. BENCH_PCIE_FLAGS passes
# flags, e.g. -max 268435456 -runs 5.
#
# `make bench-kernels`: every op of a real step of GPT-2 124M (4 x 1024)
# and of one LLaMA 7B layer (1 x 2048), native and lsp, bf16, each
# compute node of the step run again 10 times with L2 flushed before
# each run (bench/kernels): median time by events, TFLOP/s or GB/s, the
# ratio to the GPU's peak (train/plan's preset of it, when there is one),
# cuBLAS's time for each bf16 GEMM (cuBLAS loaded at run time: the
# column is skipped with a line where libcublas is absent), the launchers
# it did not run, and each job's ops by family beside train/plan's
# prediction for that GPU (-calibration FILE writes the efficiencies
# measured, for lsp-train plan --calibration). The code is package
# bench/kernelbench (bench/pciebench for bench-pcie), so the GPU bundle's
# binary runs it too. Built as bench-pcie. BENCH_KERNELS_FLAGS passes
# flags, e.g. -runs 20 -models llama-7b-layer -modes native,zero,lsp.
.PHONY: bench-pcie bench-kernels
GPU_BENCH_RUN = case "$(CUDA)" in 0) why="CUDA=0";; *) why=$$($(CUDA_PROBE));; esac; if [ -z "$$why" ]; then \
		$(MAKE) --no-print-directory build/libkernels.a && \
		$(CMD_CUDA_ENV) $(GO) run -tags cuda $(1); \
	else echo "$@: built without CUDA ($$why)"; $(GO) run $(1); fi
bench-pcie:
	@$(call GPU_BENCH_RUN,./bench/pcie $(BENCH_PCIE_FLAGS))
bench-kernels:
	@$(call GPU_BENCH_RUN,./bench/kernels $(BENCH_KERNELS_FLAGS))

# `make sim`: the same command on the simulated CUDA runtime
# (kernels/sim/cudart.cpp, -tags cudasim), as bin/lsp-train-sim so that it
# does not replace a real build: `--device cuda` on it trains on the
# simulated GPU (the kernels under g++, on the CPU: slow, for tests; see
# scripts/sim-smoke.sh). Needs only CUDA's headers, as simtest.
sim:
ifneq ($(SIM_OK),)
	@mkdir -p bin
	$(SIM_ENV) $(GO) build -tags cudasim -o bin/lsp-train-sim ./cmd/lsp-train
	@echo "sim: bin/lsp-train-sim on the simulated CUDA runtime (backends: cpu, cuda = simulated)"
else
	@echo "sim: neither /usr/include/cuda_bf16.h nor nvcc found: the simulated runtime needs CUDA's headers (install the CUDA toolkit, as .ci/run does)"; exit 1
endif

# `make gpu-test-bin`: the kernel tests of kernels/simtest for a real GPU
# (-tags cuda), linked against build/libkernels.a and CUDA's static runtime
# (libcudart_static.a), into bin/gpu/kernels.test. Copy that one file to a
# GPU machine and run it there (bin/gpu/kernels.test -test.v; -test.run
# selects tests); it needs only the driver's libcuda.so, and without a
# usable GPU (sm_80 or newer) it says so and exits 0. Go's build cache does
# not see the library's contents, so its hash goes into CGO_CFLAGS (the
# binary prints it). The ldd check keeps libcudart.so out of the binary.
CUDA_LIBDIR := $(if $(NVCC),$(firstword $(wildcard $(abspath $(dir $(realpath $(NVCC)))../lib64/libcudart_static.a))))
GPU_ENV    = CGO_CFLAGS="-g -O2 -DLSP_KERNELS_LIB=$$(sha256sum build/libkernels.a | cut -c1-16) -DLSP_SIM_SOURCES=$(SIM_HASH) \
	$(if $(CUDA_INC),-I$(CUDA_INC))" \
	$(if $(CUDA_LIBDIR),CGO_LDFLAGS="-L$(dir $(CUDA_LIBDIR))")

gpu-test-bin:
ifeq ($(NVCC),)
	@echo "gpu-test-bin: nvcc not found; cannot build build/libkernels.a, so no GPU test binary"; exit 1
else
	@$(MAKE) --no-print-directory build/libkernels.a
	@mkdir -p bin/gpu
	$(GPU_ENV) $(GO) test -c -tags cuda -o bin/gpu/kernels.test ./kernels/simtest/
	@if ldd bin/gpu/kernels.test | grep -q 'libcudart\.so'; then \
		echo "gpu-test-bin: bin/gpu/kernels.test needs libcudart.so at run time; it must link libcudart_static.a"; exit 1; fi
	@echo "gpu-test-bin: bin/gpu/kernels.test (run it on a GPU machine: bin/gpu/kernels.test -test.v)"
endif

# `make gpu-bundle`: everything the first minutes on a GPU need, in
# GPU_BUNDLE_DIR (bin/gpu-bundle): lsp-train, one binary that also runs
# the kernel tests, the CUDA backend's tests, the CPU-vs-CUDA training
# comparison (lsp-train gpu-test kernels|cuda|train: the `go test -c`
# binaries, gzip'd inside it), bench-pcie, bench-kernels and gpu-info;
# and run.sh (scripts/gpu-bundle.sh), which runs them all within a time
# budget into a report. Copy the folder to the GPU machine and run
# ./run.sh --out DIR there: it needs only the NVIDIA driver. Built with
# -tags cuda,gpubundle and no MPI, the kernels compiled by nvcc for
# GPU_BUNDLE_ARCH only (build/bundle/<archs>/, copied to
# build/bundle/libkernels.a, which the gpubundle tag links), CUDA's
# runtime and libstdc++ linked statically, cuBLAS loaded at run time when
# present. The folder must stay under 64 MiB, and every binary in it may
# need only libc, libm, libdl, libpthread, librt and the driver's
# libcuda (internal/gpubundle's TestBundleDeps, which also states the
# oldest glibc they need). About 5 minutes on 2 cores the first time.
GPU_BUNDLE_ARCH ?= 80 90
# GPU_BUNDLE_PTX: the architecture whose PTX the bundle also carries, so
# that a GPU newer than every GPU_BUNDLE_ARCH (the borrowed machine may
# be one) still runs, its driver compiling the PTX; empty for none.
GPU_BUNDLE_PTX  ?= 90
GPU_BUNDLE_DIR  ?= bin/gpu-bundle
GPU_BUNDLE_MAX  := 67108864
space := $(subst ,, )
comma := ,
BUNDLE_BUILD     = build/bundle/sm$(subst $(space),-,$(strip $(GPU_BUNDLE_ARCH)))$(if $(strip $(GPU_BUNDLE_PTX)),-ptx$(strip $(GPU_BUNDLE_PTX)))
BUNDLE_OBJ       = $(KERNEL_SRC:kernels/%.cu=$(BUNDLE_BUILD)/%.o)
# The tests each binary carries: the package, and the tags beside the
# runtime's (cuda or cudasim; the kernel tests on the simulated runtime
# are the simulator's, lsp_sim).
BUNDLE_TESTS = kernels:./kernels/simtest/ cuda:./cuda/ train:./train/
.PHONY: gpu-bundle cudasim-bundle-test

$(BUNDLE_BUILD)/libkernels.a: $(BUNDLE_OBJ)
	rm -f $@
	ar rcs $@ $(BUNDLE_OBJ)

$(BUNDLE_BUILD)/%.o: kernels/%.cu kernels/kernels.h $(wildcard kernels/*.cuh)
	@mkdir -p $(@D)
	$(NVCC) $(NVCC_FLAGS) $(foreach a,$(GPU_BUNDLE_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
		$(if $(strip $(GPU_BUNDLE_PTX)),-gencode arch=compute_$(strip $(GPU_BUNDLE_PTX))$(comma)code=compute_$(strip $(GPU_BUNDLE_PTX))) -Ikernels -c $< -o $@

# bundle-payload TAGS: the test binaries of BUNDLE_TESTS built with TAGS
# (the kernel tests with $(2) instead of the runtime's tag), stripped and
# gzip'd (-n: the same bytes every time, so Go's cache of the embedding
# package holds) into cmd/lsp-train/bundle/, the originals kept in
# build/bundle/tests/ for the dependency check.
define bundle-payload
	@rm -rf cmd/lsp-train/bundle build/bundle/tests && mkdir -p cmd/lsp-train/bundle build/bundle/tests
	@set -e; for t in $(BUNDLE_TESTS); do n=$${t%%:*}; p=$${t#*:}; tags=$(1); \
		[ $$n = kernels ] && tags=$(2); \
		echo "$(GO) test -c -tags $$tags -ldflags='-s -w' -o build/bundle/tests/$$n.test $$p"; \
		$(3) $(GO) test -c -tags $$tags -ldflags='-s -w' -o build/bundle/tests/$$n.test $$p; \
		gzip -n -6 -c build/bundle/tests/$$n.test >cmd/lsp-train/bundle/$$n.test.gz; done
endef

gpu-bundle:
ifeq ($(NVCC),)
	@echo "gpu-bundle: nvcc not found; cannot compile the kernels, so no bundle"; exit 1
else
	@$(MAKE) --no-print-directory $(BUNDLE_BUILD)/libkernels.a
	@cmp -s $(BUNDLE_BUILD)/libkernels.a build/bundle/libkernels.a || cp $(BUNDLE_BUILD)/libkernels.a build/bundle/libkernels.a
	$(call bundle-payload,cuda$(comma)gpubundle,cuda$(comma)gpubundle,$(BUNDLE_ENV))
	@rm -rf $(GPU_BUNDLE_DIR) && mkdir -p $(GPU_BUNDLE_DIR)
	$(BUNDLE_ENV) $(GO) build -tags cuda,gpubundle -ldflags='-s -w' -o $(GPU_BUNDLE_DIR)/lsp-train ./cmd/lsp-train
	cp scripts/gpu-bundle.sh $(GPU_BUNDLE_DIR)/run.sh
	LSP_BUNDLE_DEPS="$(abspath $(GPU_BUNDLE_DIR))/lsp-train $$(ls $(CURDIR)/build/bundle/tests/*.test)" \
		$(GO) test -count=1 -v -run '^TestBundleDeps$$' ./internal/gpubundle/
	@size=$$(du -sb $(GPU_BUNDLE_DIR) | cut -f1); echo "gpu-bundle: $(GPU_BUNDLE_DIR): $$size bytes (limit $(GPU_BUNDLE_MAX)), kernels for sm_$(subst $(space), and sm_,$(strip $(GPU_BUNDLE_ARCH)))$(if $(strip $(GPU_BUNDLE_PTX)), with compute_$(strip $(GPU_BUNDLE_PTX)) PTX)"; \
		if [ $$size -gt $(GPU_BUNDLE_MAX) ]; then echo "gpu-bundle: over the 64 MiB limit"; exit 1; fi
endif
BUNDLE_ENV = CGO_CFLAGS="-g -O2 -Wno-deprecated-declarations -DLSP_KERNELS_LIB=$$(sha256sum build/bundle/libkernels.a | cut -c1-16) \
	-DLSP_SIM_SOURCES=$(SIM_HASH) $(if $(CUDA_INC),-I$(CUDA_INC))" $(if $(CUDA_LIBDIR),CGO_LDFLAGS="-L$(dir $(CUDA_LIBDIR))")

# `make cudasim-bundle-test`: the same bundle on the simulated CUDA runtime
# (-tags cudasim,gpubundle; the kernel tests under the simulator,
# lsp_sim) in bin/gpu-bundle-sim, and its script run by
# internal/gpubundle's tests with --quick (the smallest shapes, one run
# each): every stage runs and the report parses, one stage's failure
# injected (LSP_BUNDLE_FAIL) shows in the report with its log, a tiny
# budget skips stages with a line each, and a stage that hangs (a
# stand-in binary) is killed at its time and reported. Same SIM_ENV as
# the other cudasim targets, so their build cache serves. About 80 s of
# CPU on 2 cores (1.5 minutes when the machine is otherwise idle).
cudasim-bundle-test:
ifneq ($(SIM_OK),)
	$(call bundle-payload,cudasim,lsp_sim,$(SIM_ENV))
	@rm -rf bin/gpu-bundle-sim && mkdir -p bin/gpu-bundle-sim
	$(SIM_ENV) $(GO) build -tags cudasim,gpubundle -o bin/gpu-bundle-sim/lsp-train ./cmd/lsp-train
	cp scripts/gpu-bundle.sh bin/gpu-bundle-sim/run.sh
	LSP_BUNDLE_DIR=$(CURDIR)/bin/gpu-bundle-sim LSP_BUNDLE_SRC=$(CURDIR) $(GO) test -count=1 -v -timeout 10m -run '^TestBundleScript' ./internal/gpubundle/
else
	@echo "cudasim-bundle-test: $(SIM_SKIP_MSG)"
endif
