#!/usr/bin/env bash
# Runs several guest tests in one lab boot:
#   tools/lab/lab run -- tools/lab/tests/run-all.sh [TEST...]
# TEST defaults to kernel-rnbd-smoke.sh rdma-smoke.sh (names relative to
# this folder, or paths). Writes one line per test, "PASS name secs" or
# "FAIL name status secs", to $LAB_OUT/results.txt and each test's output to
# $LAB_OUT/<name>.log. Exits non-zero if any test failed.
set -uo pipefail

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
OUT=${LAB_OUT:-$(mktemp -d)}
RESULTS=$OUT/results.txt

(($#)) || set -- kernel-rnbd-smoke.sh rdma-smoke.sh
: >"$RESULTS"
failed=0
for t in "$@"; do
	[[ $t == */* ]] || t=$HERE/$t
	name=$(basename "$t" .sh)
	printf '=== RUN %s\n' "$name"
	t0=$EPOCHREALTIME
	"$t" 2>&1 | tee "$OUT/$name.log"
	rc=${PIPESTATUS[0]}
	secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
	if ((rc == 0)); then
		printf 'PASS %s %ss\n' "$name" "$secs" | tee -a "$RESULTS"
	else
		printf 'FAIL %s %d %ss\n' "$name" "$rc" "$secs" | tee -a "$RESULTS"
		failed=$((failed + 1))
	fi
done
printf '=== %d of %d failed\n' "$failed" "$#"
((failed == 0))
