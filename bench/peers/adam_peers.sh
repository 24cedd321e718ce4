#!/usr/bin/env bash
# adam_peers.sh: compares this project's CPU Adam (bench/adam) with
# DeepSpeed's CPU Adam and torch.optim.AdamW (fused, foreach) on the same
# sizes and thread count. Run by hand, not by CI: it installs torch and
# deepspeed from PyPI into a throwaway virtual environment (several GB;
# removed at exit unless PEERS_VENV names a directory to keep).
#
#   bench/peers/adam_peers.sh                 # all cores, 1M,16M,128M
#   THREADS=2 SIZES=1M,16M ROUNDS=5 REPS=10 bench/peers/adam_peers.sh
#   PEERS_VENV=/work/venv-peers bench/peers/adam_peers.sh  # reuse/keep a venv
#   BASE_BIN=/path/to/adam ...                # also time this bench/adam build
#                                             # (e.g. from main) in every round
#   PEERS_BASE_PYTHON=/path/to/python ...     # venv on top of a python that
#                                             # already has torch (no re-download;
#                                             # that python may itself be a venv)
#
# How it measures (the comparison is only as good as this): the machine's
# bandwidth yardsticks (triad, read-modify-write ceiling) are measured once by
# bench/adam; then adam_peers.py runs ROUNDS interleaved rounds per size, each
# timing ours (a fresh bench/adam process, its f32/norm row), DeepSpeedCPUAdam,
# torch AdamW fused and torch AdamW foreach back to back: every measurement
# allocates its arrays, takes one warm-up step and keeps the best of REPS
# steps, with THREADS threads (bench/adam -threads, torch.set_num_threads,
# OMP_NUM_THREADS for DeepSpeed's OpenMP). Ratios are formed within a round,
# so load that drifts over minutes on a shared machine hits both sides of each
# ratio alike; the median over rounds is printed with its min-max and
# interquartile range, and the load average at the start and end. A wide
# spread or a high load says the run is noise: rerun on a quiet machine.
#
# DeepSpeed builds its cpu_adam extension on first use (needs a C++ compiler
# and ninja); without a GPU it needs DS_ACCELERATOR=cpu and
# DS_SKIP_CUDA_CHECK=1, which this script sets.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
threads=${THREADS:-$(nproc)}
sizes=${SIZES:-1M,16M,128M}
reps=${REPS:-10}
rounds=${ROUNDS:-5}
base_python=${PEERS_BASE_PYTHON:-python3}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
venv=${PEERS_VENV:-$tmp/venv}
# shellcheck source=bench/peers/venv.sh
source "$root/bench/peers/venv.sh"
peers_venv "$venv" "$base_python" 'import torch, deepspeed' torch deepspeed ninja py-cpuinfo

export DS_ACCELERATOR=cpu DS_SKIP_CUDA_CHECK=1
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
# DeepSpeed needs ninja (installed in the venv) on PATH for its JIT build.
export PATH="$venv/bin:$PATH"

echo "== load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
(cd "$root" && go build -o "$tmp/adam" ./bench/adam)
echo "== yardsticks (bench/adam), $threads threads"
"$tmp/adam" -threads "$threads" -sizes 1M -reps "$reps" -combos f32/norm | grep -e '^machine:' -e '^triad:' -e '^ceiling:'
echo
echo "== interleaved rounds, $threads threads"
"$venv/bin/python" "$root/bench/peers/adam_peers.py" --threads "$threads" --sizes "$sizes" \
	--reps "$reps" --rounds "$rounds" --ours "$tmp/adam" --base "${BASE_BIN:-}" \
	2> >(grep -v -e Warning -e warn -e '^ *r = ' -e '^ *raw_cnt' -e 'No CUDA runtime' >&2)
