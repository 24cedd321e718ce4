#!/usr/bin/env bash
# train_peers.sh: compares this project's native training step on the CPU
# backend with PyTorch's (transformers GPT2LMHeadModel, torch.optim.AdamW
# fused) on the same CPU, for the tiny and gpt2 (124M) presets. Run by hand,
# not by CI: it installs torch and transformers from PyPI into a throwaway
# virtual environment (removed at exit unless PEERS_VENV names a directory to
# keep); same environment handling as adam_peers.sh (bench/peers/venv.sh).
#
#   bench/peers/train_peers.sh                       # all cores, tiny and gpt2
#   THREADS=2 ROUNDS=3 STEPS=tiny=10,gpt2=2 PRESETS=tiny,gpt2 bench/peers/train_peers.sh
#   PEERS_VENV=/work/venv-peers PEERS_BASE_PYTHON=/work/venv/bin/python bench/peers/train_peers.sh
#
# How it measures: train_peers.py runs ROUNDS interleaved rounds per preset,
# each timing ours (a fresh bench/peers/trainstep process: engine and model
# built, one warm-up step, best of STEPS steps) and then PyTorch's step the
# same way in the driver process, both with THREADS threads (trainstep
# -threads; torch.set_num_threads and OMP_NUM_THREADS). The ratio is formed
# within each round, so load that drifts on a shared machine hits both sides
# alike; the median over rounds is printed with its min-max and interquartile
# range, and the load average at the start and end. What the two steps do,
# and where they differ, is in train_peers.py's docstring. A gpt2 step takes
# about 10 s on two cores: ROUNDS=3 with STEPS gpt2=2 is several minutes.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
threads=${THREADS:-$(nproc)}
rounds=${ROUNDS:-3}
steps=${STEPS:-tiny=10,gpt2=2}
presets=${PRESETS:-tiny,gpt2}
base_python=${PEERS_BASE_PYTHON:-python3}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
venv=${PEERS_VENV:-$tmp/venv}
# shellcheck source=bench/peers/venv.sh
source "$root/bench/peers/venv.sh"
peers_venv "$venv" "$base_python" 'import torch, transformers' torch transformers

export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
# The CPU against the CPU: keep torch from probing a GPU (and warning about it).
export CUDA_VISIBLE_DEVICES=

echo "== load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
(cd "$root" && go build -o "$tmp/trainstep" ./bench/peers/trainstep)
"$venv/bin/python" "$root/bench/peers/train_peers.py" --threads "$threads" --presets "$presets" \
	--rounds "$rounds" --steps "$steps" --ours "$tmp/trainstep"
