#!/usr/bin/env bash
# RTRS over TCP on loopback, same machine, same run: urnbd's load generator
# (tools/rtrsbench: RTRS client and server with a memory backend) against
# nbdkit's memory plugin driven by fio's nbd engine. 4k randread and
# randwrite at QD32, 128k sequential read at QD32. Prints IOPS and ratios.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
GO=${GO:-$(bash tools/deps.sh | sed -n 's/^GO=//p')}
runtime=${URNBD_BENCH_RUNTIME:-10}
mkdir -p .cache/bench
"$GO" build -o .cache/bench/rtrsbench ./tools/rtrsbench
port=$((20000 + RANDOM % 20000))
nbdkit -f -p "$port" -i 127.0.0.1 memory 1G &
nbdpid=$!
trap 'kill $nbdpid 2>/dev/null || true' EXIT
sleep 1
json() { python3 -c "import json,sys; print(round(json.load(sys.stdin)[sys.argv[1]]))" "$1"; }
fio_iops() {
  fio --output-format=json --name=nbd --ioengine=nbd --uri="nbd://127.0.0.1:$port" --rw="$1" --bs="$2" \
      --iodepth=32 --time_based --runtime="$runtime" --size=1G 2>/dev/null |
    sed -n '/^{/,$p' | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))'
}
printf '%-16s %12s %12s %8s\n' workload urnbd-rtrs nbdkit ratio
for w in "randread 4k" "randwrite 4k" "read 128k"; do
  set -- $w
  ours=$(.cache/bench/rtrsbench -rw "$1" -bs "$2" -iodepth 32 -runtime "${runtime}s" | json iops)
  theirs=$(fio_iops "$1" "$2")
  printf '%-16s %12s %12s %7.2fx\n' "$1 $2" "$ours" "$theirs" "$(python3 -c "print($ours/$theirs)")"
done | tee .cache/bench/rtrs-tcp.txt
# Authentication on vs off (rtrsbench -auth: the server requires a key the
# client proves), alternating, two rounds: IOPS and CPU µs per I/O of
# client and server together. Only the handshake changes; the data path
# must not.
printf '%-16s %12s %12s %8s %14s %14s\n' workload auth-off auth-on ratio cpu-us/io-off cpu-us/io-on
for w in "randread 4k" "randwrite 4k"; do
  set -- $w
  off=() on=() coff=() con=()
  for round in 1 2; do
    r=$(.cache/bench/rtrsbench -rw "$1" -bs "$2" -iodepth 32 -runtime "${runtime}s")
    off+=("$(json iops <<<"$r")"); coff+=("$(python3 -c "import json,sys; print(round(json.load(sys.stdin)['cpu_us_per_io'],1))" <<<"$r")")
    r=$(.cache/bench/rtrsbench -auth -rw "$1" -bs "$2" -iodepth 32 -runtime "${runtime}s")
    on+=("$(json iops <<<"$r")"); con+=("$(python3 -c "import json,sys; print(round(json.load(sys.stdin)['cpu_us_per_io'],1))" <<<"$r")")
  done
  python3 - "$1 $2" "${off[*]}" "${on[*]}" "${coff[*]}" "${con[*]}" <<'PY'
import sys
name, off, on, coff, con = sys.argv[1], *[list(map(float, a.split())) for a in sys.argv[2:]]
avg = lambda x: sum(x) / len(x)
print(f"{name:16s} {avg(off):12.0f} {avg(on):12.0f} {avg(on)/avg(off):7.2f}x {avg(coff):14.1f} {avg(con):14.1f}")
PY
done | tee -a .cache/bench/rtrs-tcp.txt
# The loopback ceiling of a 128 KiB read whatever the protocol (copy into
# the socket and out of it, nothing else): what 128k IOPS cannot exceed.
ns=$("$GO" test -run '^$' -bench 'LoopbackCeiling128K' -benchtime "${runtime}s" ./rtrs/tcp | awk '/^BenchmarkLoopbackCeiling128K/ {print $3}')
theirs=$(awk '$1 == "read" && $2 == "128k" {print $4}' .cache/bench/rtrs-tcp.txt)
python3 -c "import sys; ns=float(sys.argv[1]); t=float(sys.argv[2]); c=1e9/ns; print(f'loopback ceiling, 128k messages/s: {c:.0f} = {c/t:.2f}x nbdkit')" "$ns" "$theirs" | tee -a .cache/bench/rtrs-tcp.txt
