#!/usr/bin/env bash
# Runs TestLabVethDown (rtrs/rdmatr): path failure by "ip link set veth0
# down" under verified I/O. It needs a lab boot of its own: on the lab
# kernel the soft-RoCE pair it takes down stays unusable afterwards (see
# the test's comment), and the other lab tests take the other pair down.
set -euo pipefail
root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../../.." && pwd -P)
bin=$root/.cache/lab/bin
export URNBD_LAB=1 URNBD_LAB_VETH_DOWN=1
"$root/tools/lab/provision.sh" modules
test=$(awk '$2 == "rtrs/rdmatr" {print $1}' "$bin/tests.txt" 2>/dev/null || true)
[[ -n $test ]] || { echo "veth-down: no rtrs/rdmatr test binary in $bin/tests.txt (run tools/test.sh lab)" >&2; exit 1; }
cd "$root/rtrs/rdmatr"
exec "$bin/$test" -test.v -test.count=1 -test.timeout=5m -test.run '^TestLabVethDown$'
