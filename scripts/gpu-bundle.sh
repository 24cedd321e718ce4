#!/usr/bin/env bash
# gpu-bundle.sh: the first minutes on a GPU, in one step. It runs beside
# the bundle's one binary (lsp-train, built by make gpu-bundle, which
# copies this script into the bundle as run.sh) and needs only the NVIDIA
# driver: no Go, no CUDA toolkit. Stages, in order:
#
#   device         nvidia-smi (when present) and lsp-train gpu-info: the
#                  device, and the CUDA context's size against the plan's
#   memory         a short lsp training run: the arena's high-water mark
#                  against the memory plan (the figure every memory claim
#                  rests on)
#   kernels        the kernel tests (kernels/simtest, on the GPU)
#   conformance    the CUDA backend's tests, its conformance table against
#                  the CPU backend included
#   train-compare  4 bf16 steps on CUDA against the same on the CPU
#                  (train's TestCUDATrainsLikeCPU)
#   bench-pcie     the host-device link
#   bench-kernels  every op of a GPT-2 step, with cuBLAS's GEMM beside
#                  ours when libcublas is present
#   default-job    the default job with --device cuda
#   profile        lsp-train profile of gpt2 in each mode
#   block          one LLaMA-7B-shaped layer's step in native, zero and
#                  lsp, op by op, against the planner's prediction for this
#                  GPU; the efficiencies measured go to calibration.json,
#                  which lsp-train plan --gpu <that GPU> --calibration
#                  reads (for that GPU only)
#
# Each stage has a share of the budget (SHARES below, scaled to --budget);
# it may also use what earlier stages left unused, never the later
# stages' shares, and is killed when it runs past that. A stage whose
# share is more than the budget left is skipped with a line saying so. A
# stage's result is appended to report.md and report.jsonl (one JSON
# object per stage) as soon as it ends, so a run cut short still leaves
# what it did; a failed or killed stage's entry has the last 30 lines of
# its log, every log is in logs/, and the script goes on to the next
# stage. The script itself exits 0 once the report is written.
#
# Usage: run.sh [--budget DURATION] [--out DIR] [--quick]
#   --budget  seconds, or with a unit: 90s, 6m (default 6m)
#   --out     the output folder (default gpu-report-<UTC time>); its
#             report.md, report.jsonl, calibration.json and logs/ are what
#             to bring back
#   --quick   the smallest shapes, one run each (CI, on the simulated
#             runtime); also LSP_BUNDLE_QUICK=1
# Environment: LSP_BUNDLE_FAIL=stage[,stage] marks those stages failed
# after they run (to test the report's failure path); LSP_BUNDLE_BIN is
# the binary (default: lsp-train beside this script).
set -uo pipefail

budget=360
out=""
quick=${LSP_BUNDLE_QUICK:-0}
while [ $# -gt 0 ]; do
	case "$1" in
	--budget) budget=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--quick) quick=1; shift ;;
	-h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "gpu-bundle: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done
case "$budget" in
*m) budget=$(( ${budget%m} * 60 )) ;;
*s) budget=${budget%s} ;;
esac
if ! [ "$budget" -ge 0 ] 2>/dev/null; then
	echo "gpu-bundle: --budget $budget: want seconds (90, 90s) or minutes (6m)" >&2
	exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
bin=${LSP_BUNDLE_BIN:-$here/lsp-train}
if [ ! -x "$bin" ]; then
	echo "gpu-bundle: $bin not found (run the bundle's run.sh beside its lsp-train)" >&2
	exit 2
fi
[ -n "$out" ] || out=gpu-report-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out/logs" "$out/runs" || exit 2
out=$(cd "$out" && pwd)
md=$out/report.md
jl=$out/report.jsonl
start=$(date +%s)
export bin out

# The stages in order, and each one's share of a 6-minute budget in
# seconds (scaled to --budget): roughly what each takes on an H100-class
# GPU, the tests and the op-by-op timings getting the most.
STAGES=(device memory kernels conformance train-compare bench-pcie bench-kernels default-job profile block)
declare -A SHARES=([device]=10 [memory]=25 [kernels]=60 [conformance]=40 [train-compare]=30
	[bench-pcie]=25 [bench-kernels]=50 [default-job]=25 [profile]=45 [block]=50)

# The commands of each stage, full and --quick. Quick: the smallest
# shapes (tiny and llama-tiny stand in for gpt2 and llama-7b), one run
# each, a few of the tests: every stage exercised, in CI's time.
small=(--batch 2 --seq-len 16 --data builtin:sort:200 --eval-fraction 0 --eval-generate 0 --checkpoint-every 0)
stage_cmds() {
	local s=$1
	case "$s/$quick" in
	device/*)
		if command -v nvidia-smi >/dev/null 2>&1; then
			echo "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit,pcie.link.gen.max,pcie.link.width.max --format=csv"
		fi
		echo "\$bin gpu-info" ;;
	memory/*) echo "\$bin gpu-info" ;;&
	memory/0) echo "\$bin --device cuda --model gpt2 --mode lsp --steps 3 --batch 4 --seq-len 512 --eval-fraction 0 --eval-generate 0 --checkpoint-every 0 --out \$out/runs/memory --overwrite" ;;
	memory/1) echo "\$bin --device cuda --mode lsp --steps 2 ${small[*]} --out \$out/runs/memory --overwrite" ;;
	kernels/0) echo "\$bin gpu-test kernels -test.v" ;;
	kernels/1) echo "\$bin gpu-test kernels -test.v -test.short -test.run '^(TestGemmArgs|TestAdamW|TestNormsLayerNormForward)\$'" ;;
	conformance/0) echo "\$bin gpu-test cuda -test.v -test.skip '^TestEveryKernelCompiled\$'" ;;
	conformance/1) echo "\$bin gpu-test cuda -test.v -test.short -test.run '^TestConformance\$'" ;;
	train-compare/0) echo "\$bin gpu-test train -test.v -test.run '^TestCUDATrainsLikeCPU\$'" ;;
	train-compare/1) echo "\$bin gpu-test train -test.v -test.run '^TestCUDATrainsLikeCPU\$/^tiny\$/^native\$'" ;;
	bench-pcie/0) echo "\$bin bench-pcie -max 268435456 -runs 10" ;;
	bench-pcie/1) echo "\$bin bench-pcie -max 65536 -runs 1" ;;
	bench-kernels/0) echo "\$bin bench-kernels -models gpt2 -modes native,lsp -runs 10" ;;
	bench-kernels/1) echo "\$bin bench-kernels -models gpt2 -modes native -runs 1" ;;
	default-job/0) echo "\$bin --device cuda --out \$out/runs/default --overwrite" ;;
	default-job/1) echo "\$bin --device cuda --steps 2 ${small[*]} --out \$out/runs/default --overwrite" ;;
	profile/0) echo "\$bin profile --device cuda --model gpt2 --mode all --steps 4 --batch 4 --seq-len 512 --out \$out/runs/profile" ;;
	profile/1) echo "\$bin profile --device cuda --mode all --steps 2 ${small[*]} --out \$out/runs/profile" ;;
	block/*)
		local runs=5
		[ "$quick" = 1 ] && runs=1
		echo "\$bin bench-kernels -models llama-7b-layer -modes native,zero,lsp -runs $runs -calibration \$out/calibration.json"
		echo "\$bin gpu-info -calibration \$out/calibration.json"
		echo "plan_calibrated" ;;
	esac
}

# plan_calibrated: the planner for this GPU's preset with the efficiencies
# just measured, on a LLaMA-7B step in each mode (the preset is calibration.json's).
plan_calibrated() {
	local preset
	preset=$(sed -n 's/.*"preset": *"\([^"]*\)".*/\1/p' "$out/calibration.json")
	if [ -z "$preset" ]; then
		echo "no preset in $out/calibration.json: no calibrated plan"
		return 1
	fi
	"$bin" plan --model llama-7b --gpu "$preset" --calibration "$out/calibration.json"
}

# What report.md shows of a finished stage's log (a failed one shows its
# last 30 lines instead): the lines that carry its figures.
summary_re() {
	case "$1" in
	device) echo '^(name|NVIDIA|device:|context:|gpu-info:|SIMULATED)|, [0-9]+ MiB' ;;
	memory) echo '^context:|device memory|host memory' ;;
	kernels | conformance | train-compare) echo '^(--- (PASS|FAIL|SKIP)|ok|PASS|FAIL|simtest:|cuda:)|losses cuda|SKIP' ;;
	bench-pcie) echo '.' ;;
	bench-kernels) echo '^(device|peaks|cuBLAS|no cuBLAS|SIMULATED|==|--|family|gemm|attention|launchers)|vs plan' ;;
	default-job) echo 'device memory|host memory|step|loss|cuda' ;;
	profile) echo '.' ;;
	block) echo '^(--|family|[a-z]+ +[0-9]+ +[0-9.]+ +[0-9.]+|calibration|context|figures|== |device memory|step [0-9.]+ ms predicted|SIMULATED)' ;;
	esac
}

# json STRING: STRING as a JSON string.
json() {
	printf '%s' "$1" | awk 'BEGIN { ORS = ""; print "\"" }
		{ gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); gsub(/\t/, "\\t"); gsub(/\r/, "\\r");
		  gsub(/[\001-\037]/, " "); if (NR > 1) print "\\n"; print }
		END { print "\"" }'
}

now() { date +%s; }
elapsed() { echo $(( $(now) - start )); }

# record STAGE STATUS SECONDS ALLOTTED NOTE LOG: one stage's entry, in
# both reports.
record() {
	local stage=$1 status=$2 secs=$3 allot=$4 note=$5 log=$6 body=""
	{
		echo "## $stage: $status (${secs} s of ${allot} s allotted)"
		echo
		[ -n "$note" ] && { echo "$note"; echo; }
		if [ -n "$log" ] && [ -f "$log" ]; then
			[ "$status" = ok ] && body=$(grep -E -- "$(summary_re "$stage")" "$log" | head -n 150)
			[ -n "$body" ] || body=$(tail -n 30 "$log")
			echo "log: logs/$(basename "$log")"
			echo
			echo '```'
			echo "$body"
			echo '```'
			echo
		fi
	} >>"$md"
	printf '{"stage":%s,"status":%s,"seconds":%s,"allotted":%s,"note":%s,"log":%s,"excerpt":%s}\n' \
		"$(json "$stage")" "$(json "$status")" "$secs" "$allot" "$(json "$note")" \
		"$(json "${log:+logs/$(basename "$log")}")" "$(json "$body")" >>"$jl"
}

mode=full
[ "$quick" = 1 ] && mode="quick (smallest shapes, one run each)"
{
	echo "# GPU bundle report"
	echo
	echo "- started: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "- host: $(uname -n), $(uname -srm)"
	echo "- binary: $("$bin" --version 2>&1 | head -n 1)"
	echo "- budget: ${budget} s; mode: $mode"
	echo "- stages: ${STAGES[*]}"
	echo
} >"$md"
: >"$jl"
printf '{"stage":"start","budget":%s,"quick":%s,"stages":%s}\n' "$budget" "$([ "$quick" = 1 ] && echo true || echo false)" \
	"$(json "${STAGES[*]}")" >>"$jl"

total_shares=0
for s in "${STAGES[@]}"; do total_shares=$(( total_shares + SHARES[$s] )); done

for i in "${!STAGES[@]}"; do
	s=${STAGES[$i]}
	share=$(( SHARES[$s] * budget / total_shares ))
	later=0
	for t in "${STAGES[@]:$((i + 1))}"; do later=$(( later + SHARES[$t] * budget / total_shares )); done
	left=$(( budget - $(elapsed) ))
	if [ "$left" -lt "$share" ] || [ "$share" -le 0 ]; then
		record "$s" skipped 0 "$share" "skipped: its share of the budget is ${share} s and ${left} s are left" ""
		echo "gpu-bundle: $s skipped (${left} s left, its share ${share} s)"
		continue
	fi
	# Its share, and what earlier stages left unused; never the later
	# stages' shares.
	allot=$(( left - later ))
	[ "$allot" -lt "$share" ] && allot=$share
	log=$out/logs/$s.log
	: >"$log"
	echo "gpu-bundle: $s (up to ${allot} s)"
	t0=$(now)
	rc=0
	deadline=$(( t0 + allot ))
	while IFS= read -r c; do
		[ -n "$c" ] || continue
		rem=$(( deadline - $(now) ))
		if [ "$rem" -le 0 ]; then rc=124; break; fi
		echo "\$ $c" >>"$log"
		if [ "$c" = plan_calibrated ]; then
			plan_calibrated >>"$log" 2>&1 || rc=$?
		else
			# A shell of its own: the commands name $bin and $out (exported)
			# and quote their regexps.
			timeout --kill-after=10 "$rem" bash -c "$c" >>"$log" 2>&1 || rc=$?
		fi
		[ "$rc" -eq 0 ] || break
	done < <(stage_cmds "$s")
	secs=$(( $(now) - t0 ))
	status=ok note=""
	case "$rc" in
	0) ;;
	124 | 137) status=timeout note="killed: it ran past the ${allot} s it had" ;;
	*) status=failed note="exit status $rc" ;;
	esac
	# A stage that ran and passed only because there was no device to
	# test (the tests' SKIP line, the benchmarks' "no CUDA device") says
	# so, rather than passing for a GPU's result.
	if [ "$rc" -eq 0 ] && grep -Eq 'SKIP: |--- SKIP: TestCUDA|no CUDA device' "$log"; then
		status=no-device note="it ran, but found no usable CUDA device (its log says why)"
	fi
	if [[ ",${LSP_BUNDLE_FAIL:-}," == *",$s,"* ]]; then
		echo "gpu-bundle: failure injected by LSP_BUNDLE_FAIL=$LSP_BUNDLE_FAIL" >>"$log"
		status=failed note="failure injected (LSP_BUNDLE_FAIL); it had ended with status $rc"
	fi
	record "$s" "$status" "$secs" "$allot" "$note" "$log"
	echo "gpu-bundle: $s $status (${secs} s)"
done

printf '{"stage":"end","seconds":%s}\n' "$(elapsed)" >>"$jl"
echo "- finished: $(date -u +%Y-%m-%dT%H:%M:%SZ), $(elapsed) s" >>"$md"
echo "gpu-bundle: report in $md and $jl"
