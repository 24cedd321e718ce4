# lsp-offload build. `make` builds bin/lsp-train (CPU only when nvcc is
# absent: it never fails for lack of CUDA); `make test` is what CI runs.

GO      ?= go
NVCC    ?= $(shell command -v nvcc 2>/dev/null)

.PHONY: all build test fmt-check vet gotest bench bench-train clean

all: build

build:
	@mkdir -p bin
	$(GO) build -o bin/lsp-train ./cmd/lsp-train

fmt-check:
	@out=$$(find . -name '*.go' -not -path './third_party/*' -not -path './.git/*' -print0 | xargs -0 gofmt -l); \
	if [ -n "$$out" ]; then echo "gofmt: unformatted files:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# Go packages under the race detector with -short; heavier training tests
# skip themselves under -short and run in the second, race-free pass.
gotest:
	$(GO) test -race -short -count=1 ./...

test: fmt-check vet gotest

# `make bench`: matrix multiply against OpenBLAS (bench-gemm), then training
# throughput of the CPU backend.
bench: bench-gemm bench-train

bench-train:
	$(GO) run ./bench/train

clean:
	rm -rf bin

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
# BENCH_ADAM_FLAGS passes flags, e.g. -threads 1 -reps 3. The peers
# (DeepSpeed, torch) are compared by hand: bench/peers/adam_peers.sh.
.PHONY: bench-adam
bench-adam:
	$(GO) run ./bench/adam $(BENCH_ADAM_FLAGS)
