#!/usr/bin/env bash
# Runs the Go lab tests (func TestLab*) of every test binary that
# tools/test.sh built into .cache/lab/bin, inside the lab guest, each from
# its package folder. A missing facility fails rather than skips there
# (URNBD_LAB=1).
set -euo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../../.." && pwd -P)
bin=$root/.cache/lab/bin
export URNBD_LAB=1 URNBD_BIN=${URNBD_BIN:-$bin/urnbd}
"$root/tools/lab/provision.sh" modules
shopt -s nullglob
tests=("$bin"/*.test)
((${#tests[@]})) || { echo "go-tests: no test binaries in $bin (run tools/test.sh lab)" >&2; exit 1; }
failed=0
for t in "${tests[@]}"; do
  name=$(basename "$t" .test)
  # The package folder: cmd/urnbd for urnbd.test, else the package name.
  dir=$root/$name
  [[ -d $dir ]] || dir=$root/cmd/$name
  echo "--- $name ($dir)"
  if ! (cd "$dir" && "$t" -test.v -test.count=1 -test.timeout=20m -test.run '^TestLab'); then
    failed=$((failed + 1))
  fi
done
((failed == 0))
