#!/usr/bin/env bash
# sim-smoke.sh: the train command end to end on the simulated GPU. For each
# update mode (native, zero, lsp, lsp with svd projectors: lsp-svd, lora,
# lora on an NF4 base: lora-nf4, and galore)
# it trains a few steps of the default job
# (tiny on builtin:sort, at a small size) twice with the same flags and the
# same binary: --device cuda (the CUDA backend on the simulated runtime:
# the kernels of kernels/*.cu under g++) and --device cpu --dtype bf16 (the
# CPU reference at the same storage type). Every train loss and the final
# eval loss of the two must agree within TOL (relative); anything else (an
# error, a missing or non-finite loss, a run that did not open cuda:0)
# fails. CI runs it after `make sim` (.ci/run); about 5 minutes on 2
# cores, 4 of them the lsp row (its projector fit on the device at d 128).
#
# Tolerance: both runs start from the same weights and batches, so step 1's
# loss is a forward pass at bf16 whose only differences are summation
# order and where the kernels round; later steps add a few AdamW updates
# stored at bf16, where one rounding flip of a weight moves it by up to
# 2^-8 relative. Measured differences are about 5e-5 relative (3 steps,
# warmup learning rates); TOL is 2e-3, forty times that, and still far
# below what a wrong kernel, a missed event or a dropped update does to a
# loss (those show as 1e-2 and more, or NaN).
#
# Usage: scripts/sim-smoke.sh [BINARY]   (default bin/lsp-train-sim)
# Environment: TOL (2e-3), STEPS (3), KEEP=1 keeps the run directories.
set -euo pipefail

bin=${1:-bin/lsp-train-sim}
tol=${TOL:-2e-3}
steps=${STEPS:-3}
if [ ! -x "$bin" ]; then
	echo "sim-smoke: $bin not found; build it with make sim" >&2
	exit 1
fi
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

work=$(mktemp -d)
if [ "${KEEP:-}" = 1 ]; then
	echo "sim-smoke: runs kept in $work"
else
	trap 'rm -rf "$work"' EXIT
fi

# The default job, small: 400 records (20 held out for the eval loss), no
# greedy generation, 2 rows a step; lsp calibrates on 4 rows instead of 256
# (its projector check is forward and backward passes on the simulator).
flags=(--steps "$steps" --batch 2 --data builtin:sort:400 --eval-fraction 0.05 --eval-generate 0
	--checkpoint-every 0 --seed 1)

# losses FILE: "train STEP LOSS" and "eval STEP LOSS" lines of a metrics.jsonl.
losses() {
	awk '{
		step = $0; sub(/.*"step":/, "", step); sub(/[,}].*/, "", step)
		if ($0 ~ /"train_loss":/) { v = $0; sub(/.*"train_loss":/, "", v); sub(/[,}].*/, "", v); print "train", step, v }
		if ($0 ~ /"eval_loss":/) { v = $0; sub(/.*"eval_loss":/, "", v); sub(/[,}].*/, "", v); print "eval", step, v }
	}' "$1"
}

# run NAME ARGS...: one training run into $work/NAME; its log on failure.
run() {
	local name=$1
	shift
	if ! (cd "$work" && "$bin" "$@" "${flags[@]}" --out "$name") >"$work/$name.log" 2>&1; then
		echo "sim-smoke: FAIL: lsp-train $* ${flags[*]} --out $name:" >&2
		tail -n 20 "$work/$name.log" >&2
		return 1
	fi
}

fail=0
for row in native zero lsp lsp-svd lora lora-nf4 galore; do
	mode=${row%%-*}
	extra=(--mode "$mode")
	# lora-nf4: QLoRA's quantized base, read by the GemmQ kernel.
	[ "$row" = lora-nf4 ] && extra+=(--base-dtype nf4)
	# galore refreshes its projectors at step 1 (a randomized SVD of each
	# matrix's gradient through the GEMMs), then steps in the subspace by
	# the dense kernels.
	[ "$row" = galore ] && extra+=(--galore-rank 4)
	# lsp checks its projectors before step 1 (--check-at-start; the
	# default's first check would come after this run's last step) and
	# keeps the fit its own data prefers (--accept fit), so that no
	# held-out threshold can tip one way on the simulator and the other on
	# the CPU. --d 128 is tiny's width, the whole side: the d this run had
	# before the default became a quarter of the side (lsp.AutoD), so its
	# time on the simulator (the projector check is most of it) stays what
	# CI has measured. The fit at a d below the side is checked on the
	# simulator by train/lsp's devicefit tests and engine's
	# TestCheckOnDevice.
	[ "$row" = lsp ] && extra+=(--fit --calib-samples 4 --check-at-start --accept fit --d 128)
	# lsp-svd: dense projectors from the calibration gradient's singular
	# vectors (train/rsvd through the GEMMs) at a check before step 1,
	# then compressed and applied by the dense kernels.
	[ "$row" = lsp-svd ] && extra+=(--projector svd --calib-samples 4 --check-at-start --d 16)
	t0=$SECONDS
	run "$row-cuda" --device cuda "${extra[@]}" || { fail=1; continue; }
	t1=$SECONDS
	run "$row-cpu" --device cpu --dtype bf16 "${extra[@]}" || { fail=1; continue; }
	# The run must have trained on the CUDA backend, not fallen back.
	if ! grep -q 'device=cuda:0' "$work/$row-cuda.log"; then
		echo "sim-smoke: FAIL: $row: the --device cuda run did not report device=cuda:0" >&2
		fail=1
		continue
	fi
	echo "== $row (simulated GPU ${steps} steps in $((t1 - t0)) s; cpu bf16 in $((SECONDS - t1)) s)"
	if ! paste <(losses "$work/$row-cuda/metrics.jsonl") <(losses "$work/$row-cpu/metrics.jsonl") |
		awk -v tol="$tol" -v want="$steps" -v mode="$row" '
		function abs(x) { return x < 0 ? -x : x }
		{
			n++
			if ($1 != $4 || $2 != $5) { printf "  %s: row %d: cuda has %s step %s, cpu %s step %s\n", mode, n, $1, $2, $4, $5; bad = 1; next }
			if ($1 == "train") trains++; else evals++
			# Not a number (nan, inf, empty): fails the check below as well.
			ok = ($3 ~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/) && ($6 ~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/)
			d = ok ? abs($3 - $6) / (abs($6) > 1 ? abs($6) : 1) : -1
			pass = ok && d <= tol
			printf "  %-5s step %-3s cuda %-18s cpu %-18s rel diff %s%s\n", $1, $2, $3, $6, ok ? sprintf("%.2e", d) : "not a number", pass ? "" : "  > " tol " MISMATCH"
			if (!pass) bad = 1
		}
		END {
			if (trains != want || evals != 1) { printf "  %s: want %d train losses and 1 eval loss, got %d and %d\n", mode, want, trains, evals; bad = 1 }
			exit bad
		}'; then
		fail=1
	fi
done
if [ "$fail" != 0 ]; then
	echo "sim-smoke: FAIL: the CUDA backend on the simulated runtime does not match the CPU backend (tolerance $tol relative)" >&2
	exit 1
fi
echo "sim-smoke: ok: native, zero, lsp, lsp-svd, lora, lora-nf4 and galore on the simulated GPU match the CPU backend at bf16 within $tol relative"
