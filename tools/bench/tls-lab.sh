#!/usr/bin/env bash
# TLS on vs off and authentication on vs off over TCP, inside the lab VM
# (its kernel has kTLS; a build host may not): tools/rtrsbench on loopback,
# plain, -tls and -auth alternating, URNBD_BENCH_ROUNDS rounds (default 2)
# of 4k randread, 4k randwrite and 128k read at QD32. Prints per workload
# and mode the IOPS of each round, the ratio to plain, and the CPU µs per
# I/O of client and server together (the process's, kernel crypto
# included).
#
#   tools/lab/lab run --timeout 900 -- tools/bench/tls-lab.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
runtime=${URNBD_BENCH_RUNTIME:-8}
out=${LAB_OUT:-/tmp}/tls-bench.txt
B=.cache/bench/rtrsbench
[[ -x $B ]] || { echo "tls-lab: build $B first: go build -o $B ./tools/rtrsbench" >&2; exit 1; }
: >"$out"
for round in $(seq "${URNBD_BENCH_ROUNDS:-2}"); do
  for w in "randread 4k" "randwrite 4k" "read 128k"; do
    set -- $w
    for mode in plain tls auth; do
      flag=
      [[ $mode == tls ]] && flag=-tls
      [[ $mode == auth ]] && flag=-auth
      echo "$round $mode $1 $2 $($B $flag -rw "$1" -bs "$2" -iodepth 32 -runtime "${runtime}s" | tail -1)" >>"$out"
    done
  done
done
python3 - "$out" <<'PY'
import collections, json, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split(" ", 4)
    j = json.loads(f[4])
    runs[(f[2] + " " + f[3], f[1])].append((j["iops"], j["cpu_us_per_io"], j["errors"]))
print(f"{'workload':14s} {'mode':6s} {'IOPS each round':>24s} {'ratio':>6s} {'cpu us/io':>10s} {'errors':>6s}")
for w in sorted({k[0] for k in runs}):
    base = sum(r[0] for r in runs[(w, "plain")]) / len(runs[(w, "plain")])
    for m in ("plain", "tls", "auth"):
        r = runs[(w, m)]
        iops = sum(x[0] for x in r) / len(r)
        each = " ".join(f"{x[0]:.0f}" for x in r)
        print(f"{w:14s} {m:6s} {each:>24s} {iops / base:6.2f} {sum(x[1] for x in r) / len(r):10.1f} {sum(x[2] for x in r):6d}")
PY
