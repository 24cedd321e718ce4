#!/usr/bin/env bash
# make bench-quality: which update wins on fine-tuning that looks like a
# user's? Two compare jobs at a larger size than compare's default, both
# on the mini preset (GPT-2 style, 4 layers, 128 wide, 256 positions,
# byte tokens) pretrained natively on the text corpus in $LSP_DATA
# (../shared/data by default), then fine-tuned in every row of compare's
# default --rows (native, zero, the lsp projector kinds, galore, lora,
# lora on nf4, and the dense ones at lsp's memory), three seeds each,
# each row at its best of the learning-rate grid:
#
#   alpaca  instruction tuning on the Alpaca-style file in $LSP_DATA
#           (prompt-masked loss, records cut at 256 byte tokens);
#   code    a domain shift: language modelling on Go source, the Go
#           standard library's own (its BSD licence allows it), read from
#           this machine's toolchain at run time into the job's directory
#           and never committed; the table's "Shift" line gives how far
#           it starts above the corpus the model was pretrained on.
#
# Each prints compare's tables and writes out/bench-quality/JOB/
# (compare.md, compare.json, compare.png); the second job reuses the
# first's pretraining. JOBS picks them (default "alpaca code");
# PRETRAIN_STEPS, STEPS, SEEDS, LRS and ROWS shrink them; extra arguments
# go to both compares. Not in CI: hours on two cores (see the README's
# "Which update wins" for the sizes that were run and their times).
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
out=${OUT:-out/bench-quality}
mkdir -p "$out"

# go_corpus writes about 1 MB of Go source, whole files in a fixed order
# from a fixed list of standard-library packages, without tests, to $1.
go_corpus() {
	local root
	root=$(go env GOROOT)/src
	: > "$1.tmp"
	for pkg in strings bytes strconv sort bufio fmt errors unicode/utf8 path container/list container/heap \
		text/tabwriter encoding/csv encoding/hex encoding/base64 math/bits time regexp/syntax; do
		for f in $(ls "$root/$pkg"/*.go | grep -v _test.go | sort); do
			cat "$f" >> "$1.tmp"
			[ "$(stat -c %s "$1.tmp")" -ge 1100000 ] && break 2
		done
	done
	mv "$1.tmp" "$1"
}

run_job() {
	local job=$1 task=$2
	shift 2
	local dir=$out/$job
	mkdir -p "$dir"
	if [ "$job" != "${first_job:-}" ] && [ -n "${first_job:-}" ] && [ ! -d "$dir/pretrain" ]; then
		# compare reuses it only if its stamp matches these settings
		cp -r "$out/$first_job/pretrain" "$dir/pretrain"
	fi
	./bin/lsp-train compare --model mini \
		--pretrain-task "$corpus" --pretrain-steps "${PRETRAIN_STEPS:-1600}" \
		--task "$task" --steps "${STEPS:-200}" --seeds "${SEEDS:-3}" \
		${LRS:+--lrs "$LRS"} ${ROWS:+--rows "$ROWS"} \
		--batch 8 --seq-len 256 --truncate --eval-every 25 --eval-generate 0 --timing-steps 3 --calib-samples 64 \
		--out "$dir" "$@"
	first_job=${first_job:-$job}
}

for job in ${JOBS:-alpaca code}; do
	case $job in
	alpaca) run_job alpaca "$alpaca" "$@" ;;
	code)
		go_corpus "$out/go-stdlib.txt"
		echo "bench-quality: code: $(stat -c %s "$out/go-stdlib.txt") bytes of Go $(go env GOVERSION) sources in $out/go-stdlib.txt"
		run_job code "$out/go-stdlib.txt" "$@"
		;;
	*) echo "bench-quality: unknown job $job in JOBS (want alpaca, code)" >&2; exit 2 ;;
	esac
done
