#!/usr/bin/env bash
# Runs in the lab VM: rnbd-lab.sh with two urnbd binaries, alternating
# (A, B, A, B, ...), for a before/after comparison of one change in the
# same boot. Each round's table lands in $LAB_OUT/<a|b><round>/.
#   URNBD_A, URNBD_B   the two binaries (absolute paths, visible in the VM)
#   URNBD_AB_ROUNDS    rounds of each (default 2)
#   URNBD_SERVER_ARGS_A, URNBD_SERVER_ARGS_B   more urnbd server options of each
#                      (e.g. one binary, --backend-io sync against loop)
#   URNBD_MAP_ARGS_A, URNBD_MAP_ARGS_B   more urnbd map flags of each (tcp-lab.sh)
#   URNBD_AB_BENCH     the bench to run (default rnbd-lab.sh; tcp-lab.sh for
#                      TCP, e.g. URNBD_MAP_ARGS_B=--zero-copy)
# From the host, for example:
#   git worktree add /tmp/before REV && (cd /tmp/before && go build -o "$PWD/.cache/lab/bin/urnbd.a" ./cmd/urnbd)
#   go build -o .cache/lab/bin/urnbd.b ./cmd/urnbd && tools/lab/lab build-rnbd
#   tools/lab/lab run --out .cache/bench/ab -- env URNBD_A=$PWD/.cache/lab/bin/urnbd.a URNBD_B=$PWD/.cache/lab/bin/urnbd.b tools/bench/rnbd-lab-ab.sh
set -uo pipefail
: "${URNBD_A:?}" "${URNBD_B:?}" "${LAB_OUT:?}"
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
rc=0
for ((r = 1; r <= ${URNBD_AB_ROUNDS:-2}; r++)); do
  for v in a b; do
    bin=$URNBD_A args=${URNBD_SERVER_ARGS_A:-} margs=${URNBD_MAP_ARGS_A:-}
    [[ $v == b ]] && bin=$URNBD_B args=${URNBD_SERVER_ARGS_B:-} margs=${URNBD_MAP_ARGS_B:-}
    mkdir -p "$LAB_OUT/$v$r"
    URNBD_BIN=$bin URNBD_SERVER_ARGS=$args URNBD_BENCH_MAP_ARGS=$margs LAB_OUT=$LAB_OUT/$v$r "$here/${URNBD_AB_BENCH:-rnbd-lab.sh}" || { echo "rnbd-lab-ab: $v$r failed" >&2; rc=1; }
    # A daemon of one binary must not serve the next one's maps.
    pkill -f "^$bin (server|client)" || true
    sleep 2
  done
done
exit $rc
