#!/usr/bin/env bash
# Runs in the lab VM: tcp-lab.sh with two urnbd binaries (or one binary
# with two sets of map flags), alternating (A, B, A, B, ...), for a
# before/after comparison of one change in the same boot. Each round's
# table lands in $LAB_OUT/<a|b><round>/tcp-bench.txt.
#   URNBD_A, URNBD_B   the two binaries (absolute paths, visible in the VM)
#   URNBD_AB_ROUNDS    rounds of each (default 2)
#   URNBD_MAP_ARGS_A, URNBD_MAP_ARGS_B   more urnbd map flags of each
#                      (e.g. one binary, --zero-copy against none)
# From the host, for example:
#   go build -o .cache/lab/bin/urnbd ./cmd/urnbd
#   tools/lab/lab --kernel 7 run --out .cache/bench/tcpab -- env URNBD_A=$PWD/.cache/lab/bin/urnbd \
#     URNBD_B=$PWD/.cache/lab/bin/urnbd URNBD_MAP_ARGS_B=--zero-copy tools/bench/tcp-lab-ab.sh
set -uo pipefail
: "${URNBD_A:?}" "${URNBD_B:?}" "${LAB_OUT:?}"
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
rc=0
for ((r = 1; r <= ${URNBD_AB_ROUNDS:-2}; r++)); do
  for v in a b; do
    bin=$URNBD_A args=${URNBD_MAP_ARGS_A:-}
    [[ $v == b ]] && bin=$URNBD_B args=${URNBD_MAP_ARGS_B:-}
    mkdir -p "$LAB_OUT/$v$r"
    URNBD_BIN=$bin URNBD_BENCH_MAP_ARGS=$args LAB_OUT=$LAB_OUT/$v$r "$here/tcp-lab.sh" || { echo "tcp-lab-ab: $v$r failed" >&2; rc=1; }
    # A daemon of one round must not serve the next one's maps.
    pkill -f "^$bin (server|client)" || true
    sleep 2
  done
done
exit $rc
