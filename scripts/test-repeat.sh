#!/usr/bin/env bash
# test-repeat.sh N: runs the Go tests of `make test` (the race pass, the
# race-free pass, the kernel simulator tests and the cudasim ones: the
# simulated runtime, the CUDA backend and the engine on it) N times in a row and
# reports how many runs were green and, for every failing run, the tests
# that failed. A flaky test shows up here long before it turns CI red.
# Each run's log stays in build/test-repeat/run-I.log; `--- FAIL` lines and
# the seeds the failing tests logged are what to replay (README, "Seeds").
set -uo pipefail
cd "$(dirname "$0")/.."

n=${1:-10}
dir=build/test-repeat
rm -rf "$dir" && mkdir -p "$dir"
green=0
for i in $(seq 1 "$n"); do
	log="$dir/run-$i.log"
	start=$(date +%s)
	if make --no-print-directory gotest gotest-norace simtest cudasim-rt-test cudasim-test cudasim-engine-test >"$log" 2>&1; then
		green=$((green + 1))
		echo "run $i of $n: green ($(($(date +%s) - start)) s)"
	else
		echo "run $i of $n: FAILED ($(($(date +%s) - start)) s), log $log:"
		grep -E -e '^\s*--- FAIL' -e 'seed' -e '^FAIL' "$log" | head -20 | sed 's/^/    /'
	fi
done
echo "test-repeat: $green of $n green"
[ "$green" -eq "$n" ]
