#!/usr/bin/env bash
# adam_peers.sh: compares this project's CPU Adam (bench/adam) with
# DeepSpeed's CPU Adam and torch.optim.AdamW (foreach, fused) on the same
# sizes and thread count, printing both tables. Run by hand, not by CI: it
# installs torch and deepspeed from PyPI into a throwaway virtual environment
# (several GB; removed at exit unless PEERS_VENV names a directory to keep).
#
#   bench/peers/adam_peers.sh                 # all cores, 1M,16M,128M
#   THREADS=2 SIZES=1M,16M bench/peers/adam_peers.sh
#   PEERS_VENV=/work/venv-peers bench/peers/adam_peers.sh  # reuse/keep a venv
#   PEERS_BASE_PYTHON=/path/to/python ...     # venv on top of a python that
#                                             # already has torch (no re-download)
#
# DeepSpeed builds its cpu_adam extension on first use (needs a C++ compiler
# and ninja); without a GPU it needs DS_ACCELERATOR=cpu and
# DS_SKIP_CUDA_CHECK=1, which this script sets.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
threads=${THREADS:-$(nproc)}
sizes=${SIZES:-1M,16M,128M}
reps=${REPS:-10}
base_python=${PEERS_BASE_PYTHON:-python3}

venv=${PEERS_VENV:-}
if [[ -z "$venv" ]]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	venv=$tmp/venv
fi
if [[ ! -x "$venv/bin/python" ]]; then
	site=()
	[[ -n "${PEERS_BASE_PYTHON:-}" ]] && site=(--system-site-packages)
	"$base_python" -m venv "${site[@]}" "$venv"
fi
if ! "$venv/bin/python" -c 'import torch, deepspeed' >/dev/null 2>&1; then
	"$venv/bin/pip" install --quiet torch
	"$venv/bin/pip" install --quiet deepspeed ninja py-cpuinfo
fi

export DS_ACCELERATOR=cpu DS_SKIP_CUDA_CHECK=1
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
# DeepSpeed needs ninja (installed in the venv) on PATH for its JIT build.
export PATH="$venv/bin:$PATH"

csv=$(mktemp)
trap 'rm -f "$csv"; [[ -n "${tmp:-}" ]] && rm -rf "$tmp"' EXIT
echo "== lsp-offload bench/adam (f32 rows), $threads threads"
(cd "$root" && go run ./bench/adam -threads "$threads" -sizes "$sizes" -reps "$reps" \
	-combos f32,f32/norm -headline f32 -csv "$csv" | grep -v '^adam-vs-triad')
echo
echo "== peers, $threads threads"
"$venv/bin/python" "$root/bench/peers/adam_peers.py" --threads "$threads" --sizes "$sizes" \
	--reps "$reps" --ours "$csv" 2> >(grep -v -e Warning -e warn -e '^ *r = ' -e '^ *raw_cnt' >&2)
