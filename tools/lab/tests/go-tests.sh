#!/usr/bin/env bash
# Runs the Go lab tests (func TestLab*) of every test binary that
# tools/test.sh built into .cache/lab/bin, inside the lab guest, each from
# its package folder (listed in .cache/lab/bin/tests.txt). A missing
# facility fails rather than skips there (URNBD_LAB=1).
set -euo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../../.." && pwd -P)
bin=$root/.cache/lab/bin
export URNBD_LAB=1 URNBD_BIN=${URNBD_BIN:-$bin/urnbd}
"$root/tools/lab/provision.sh" modules
[[ -s $bin/tests.txt ]] || { echo "go-tests: no test binaries listed in $bin/tests.txt (run tools/test.sh lab)" >&2; exit 1; }
failed=0
while read -r test dir; do
  echo "--- $test ($dir)"
  if ! (cd "$root/$dir" && "$bin/$test" -test.v -test.count=1 -test.timeout=20m -test.run '^TestLab'); then
    failed=$((failed + 1))
  fi
done <"$bin/tests.txt"
((failed == 0))
