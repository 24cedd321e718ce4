#!/usr/bin/env bash
# make bench-quality: does lsp with fitted projectors fine-tune like full
# fine-tuning on a task that looks like the paper's use? The compare job at
# a larger size: the mini preset (GPT-2 style, 4 layers, 128 wide, 256
# positions, byte tokens) pretrained natively on the text corpus in
# $LSP_DATA (../shared/data by default), then fine-tuned on its Alpaca-style
# instruction file (prompt-masked loss; records cut at 256 byte tokens,
# those whose prompt alone is longer dropped) in five rows (native, zero, lsp
# with its default random projectors, lsp with fitted projectors (--fit),
# lsp with fresh random projectors at every check), three seeds each. It prints the compare table, whose
# lines give the eval loss mean ± sd per row, the projector checks over
# time (bias ratios, the share of matrices refitted, check seconds),
# lsp-quality and lsp-recovery; out/bench-quality/compare.png has the
# curves. Not in CI: about 70 minutes on two cores (pretraining 15 to 20,
# each of the 15 fine-tuning runs 2 to 4). Extra arguments go to compare
# (e.g. --refit split); PRETRAIN_STEPS, STEPS and SEEDS shrink it.
set -euo pipefail
cd "$(dirname "$0")/.."

data=${LSP_DATA:-../shared/data}
corpus=$data/tinyshakespeare.txt
alpaca=$data/alpaca_en_demo.json
for f in "$corpus" "$alpaca"; do
	if [ ! -f "$f" ]; then
		echo "bench-quality: skipped: $f is absent (set LSP_DATA to a directory holding tinyshakespeare.txt and alpaca_en_demo.json)"
		exit 0
	fi
done

exec ./bin/lsp-train compare --model mini \
	--pretrain-task "$corpus" --pretrain-steps "${PRETRAIN_STEPS:-1600}" \
	--task "$alpaca" --steps "${STEPS:-200}" --seeds "${SEEDS:-3}" \
	--rows native,zero,lsp,lsp-fit,lsp-resample \
	--batch 8 --seq-len 256 --truncate --eval-every 25 --eval-generate 0 --timing-steps 3 --calib-samples 64 \
	--out "${OUT:-out/bench-quality}" "$@"
