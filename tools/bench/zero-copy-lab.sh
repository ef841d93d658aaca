#!/usr/bin/env bash
# Runs in the lab VM (Linux 7.x, whose ublk driver has auto_buf_reg): one
# urnbd client daemon with two mappings over TCP on the lab's first veth
# pair, each on its own null_blk device: "copy" (the driver copies between
# the tag's buffer and the request) and "zerocopy" (map --zero-copy). fio
# 128k read and 4k randread at QD32 alternate between them for
# URNBD_BENCH_ROUNDS rounds (default 3), every run counted (lab-lib.sh).
# Writes $LAB_OUT/zero-copy-bench.txt: per run the IOPS, the client
# daemon's CPU µs per I/O and its CPU per second of the run (µs per I/O ×
# IOPS), which tells a data path that costs more CPU per I/O from one that
# only waits longer (the same CPU per second, fewer I/Os); then the path
# statistics of one more 128k read run per mapping
# ($LAB_OUT/zero-copy-stats-{copy,zerocopy}.{txt,json}).
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
# shellcheck source=lab-lib.sh
. "$here/lab-lib.sh"
rounds=${URNBD_BENCH_ROUNDS:-3}
costs=${LAB_OUT:-/tmp}/zero-copy-costs.txt
null_blk_devices 2
"$prov" rdma >/dev/null

srv=
cleanup() {
  local d
  for d in "${DEV[@]}"; do "$URNBD_BIN" unmap "$d" >/dev/null 2>&1 || true; done
  [[ -z $srv ]] || kill "$srv" 2>/dev/null || true
  [[ -z ${keep:-} ]] || kill -INT "$keep" 2>/dev/null || true
}
trap cleanup EXIT

"$URNBD_BIN" server --listen tcp://192.0.2.2:1237 --dev-search-path /dev 2>/dev/null &
srv=$!
sleep 1
counting_check
[[ -n $can_count ]] || { echo "zero-copy-lab: needs perf to count the daemon's CPU" >&2; exit 1; }
DEV[copy]=$("$URNBD_BIN" map sessname=zcbench0 transport=tcp dest_port=1237 path=ip:192.0.2.1@ip:192.0.2.2 device_path=nullb0)
DEV[zerocopy]=$("$URNBD_BIN" map --zero-copy sessname=zcbench1 transport=tcp dest_port=1237 path=ip:192.0.2.1@ip:192.0.2.2 device_path=nullb1)
"$URNBD_BIN" list --json >"${LAB_OUT:-/tmp}/zero-copy-list.json"
keeper_start
counting=1
for ((r = 1; r <= rounds; r++)); do
  for n in copy zerocopy; do
    for w in "read 128k" "randread 4k"; do
      read -r rw bs <<<"$w"
      echo "zero-copy-lab: round $r $n $rw $bs: $(measured "$n" "${DEV[$n]}" "$rw" "$bs") IOPS" >&2
    done
  done
done
counting=

# Then one uncounted 128k read run per mapping with the path statistics
# reset before it: wc_completion's average is the answers completed per
# read of the connection, rdma_lat_us the requests' time in RTRS.
for n in copy zerocopy; do
  "$URNBD_BIN" stats --reset >/dev/null
  echo "zero-copy-lab: $n read 128k (statistics): $(fio_iops "${DEV[$n]}" read 128k) IOPS" >&2
  "$URNBD_BIN" stats >"${LAB_OUT:-/tmp}/zero-copy-stats-$n.txt"
  "$URNBD_BIN" stats --json >"${LAB_OUT:-/tmp}/zero-copy-stats-$n.json"
done

out=${LAB_OUT:-/tmp}/zero-copy-bench.txt
python3 - "$costs" <<'PY' | tee "$out"
import re, sys
print("mapping   workload      IOPS  client µs/IO  client CPU/s  server µs/IO")
for line in open(sys.argv[1]):
    f = line.split()
    c = re.search(r"client:us/io=([\d.]+)", line)
    s = re.search(r"server:us/io=([\d.]+)", line)
    if len(f) < 4 or not c or f[3] == "failed":
        print(line.strip()); continue
    us, iops = float(c.group(1)), int(f[3])
    print(f"{f[0]:<9} {f[1] + ' ' + f[2]:<13} {iops:>5} {us:>13.1f} {us * iops / 1e6:>13.2f} {s.group(1) if s else 'n/a':>13}")
PY
