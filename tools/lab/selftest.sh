#!/usr/bin/env bash
# tools/lab/selftest.sh — checks the lab itself, on the host:
#   - shellcheck of the lab's scripts (if shellcheck is installed)
#   - validate-vagrant.sh: `vagrant validate` of the Vagrantfile (default
#     provider, and with the provider config ignored) and that it provisions
#     with provision.sh
#   - `tools/lab/lab build-rnbd`
#   - one lab boot running tests/kernel-rnbd-smoke.sh and tests/rdma-smoke.sh
# Prints "N passed, N failed" and exits non-zero if anything failed.
set -euo pipefail

LAB_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
ROOT=$(cd -- "$LAB_DIR/../.." && pwd -P)
LAB=$LAB_DIR/lab
OUT=$ROOT/.cache/lab/out/selftest-$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
cd "$ROOT"

passed=0 failed=0 failures=()
pass() { printf 'selftest: PASS %s\n' "$1"; passed=$((passed + 1)); }
fail() { printf 'selftest: FAIL %s\n' "$1"; failed=$((failed + 1)); failures+=("$1"); }
# check NAME CMD...: runs CMD, logs to $OUT/NAME.log.
check() {
	local name=$1
	shift
	printf 'selftest: running %s\n' "$name"
	if "$@" >"$OUT/$name.log" 2>&1; then
		pass "$name"
	else
		tail -20 "$OUT/$name.log" | sed 's/^/    /'
		fail "$name (log: $OUT/$name.log)"
	fi
}

if command -v shellcheck >/dev/null; then
	check shellcheck shellcheck "$LAB" "$LAB_DIR"/guest-init "$LAB_DIR"/*.sh "$LAB_DIR"/tests/*.sh
else
	printf 'selftest: shellcheck not installed, skipped\n'
fi

check vagrant-validate "$LAB_DIR/validate-vagrant.sh"

check build-rnbd "$LAB" build-rnbd

# One boot, both guest tests; their results come back in $OUT/boot.
printf 'selftest: running the guest tests (one boot, a few minutes under emulation)\n'
rc=0
"$LAB" run --out "$OUT/boot" -- tools/lab/tests/run-all.sh \
	kernel-rnbd-smoke.sh rdma-smoke.sh 2>&1 | tee "$OUT/boot.log" || rc=$?
if ((rc != 0)); then
	fail "lab-run (exit status $rc, log: $OUT/boot.log)"
else
	pass "lab-run"
fi
for t in kernel-rnbd-smoke rdma-smoke; do
	if grep -q "^PASS $t " "$OUT/boot/results.txt" 2>/dev/null; then
		pass "$t"
	else
		fail "$t (log: $OUT/boot/$t.log)"
	fi
done
grep '^lab: boot' "$OUT/boot.log" | sed 's/^/selftest: /' || true

printf '%d passed, %d failed\n' "$passed" "$failed"
if ((failed)); then
	printf 'failed: %s\n' "${failures[@]}"
	exit 1
fi
