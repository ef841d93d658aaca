#!/usr/bin/env bash
# Runs in the lab VM: the cost of urnbd's eBPF tracing. An urnbd device
# mapped over soft-RoCE from an urnbd server backed by null_blk, fio 4k
# randread and randwrite at QD32, with the client daemon's eBPF programs
# on (block latency, completion CPU) and off (--no-bpf), alternating for
# URNBD_BENCH_ROUNDS rounds in the same run. Prints the IOPS of each run
# and the ratio of the sums (on / off). Writes $LAB_OUT/trace-overhead.txt.
set -euo pipefail
: "${URNBD_BIN:?}"
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
prov=$here/../lab/provision.sh
runtime=${URNBD_BENCH_RUNTIME:-5}
rounds=${URNBD_BENCH_ROUNDS:-3}
out=${LAB_OUT:-/tmp}/trace-overhead.txt
export URNBD_RUN_DIR=/run/urnbd-trace-bench
LAB_ARGS_NULL_BLK="nr_devices=1 gb=4" "$prov" modules >/dev/null
"$prov" rdma >/dev/null

"$URNBD_BIN" server --listen rdma://192.0.2.2:1240 --dev-search-path /dev 2>/dev/null &
srv=$!
daemon=
cleanup() {
  [ -z "$daemon" ] || kill "$daemon" 2>/dev/null || true
  kill "$srv" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup EXIT
sleep 1

fio_iops() { # DEV RW
  fio --output-format=json --name=b --filename="$1" --ioengine=libaio --direct=1 --rw="$2" --bs=4k \
      --iodepth=32 --time_based --runtime="$runtime" --ramp_time=1 2>/dev/null |
    sed -n '/^{/,$p' | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))'
}

# run MODE RW: one daemon (eBPF on or off), one mapping, one fio run.
run() {
  local flags=() dev iops
  [ "$1" = on ] || flags=(--no-bpf)
  "$URNBD_BIN" client daemon "${flags[@]}" 2>/dev/null &
  daemon=$!
  for _ in $(seq 100); do [ -S "$URNBD_RUN_DIR/client.sock" ] && break; sleep 0.1; done
  dev=$("$URNBD_BIN" map sessname=trace-bench transport=rdma dest_port=1240 path=ip:192.0.2.1@ip:192.0.2.2 device_path=nullb0)
  if [ "$1" = on ]; then
    "$URNBD_BIN" stats | grep -q '^ebpf: block latency on; completion CPU on' ||
      { echo "trace-overhead: eBPF is not on:" >&2; "$URNBD_BIN" stats | tail -1 >&2; exit 1; }
  fi
  iops=$(fio_iops "$dev" "$2")
  "$URNBD_BIN" unmap "$dev" >/dev/null
  kill "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  daemon=
  echo "$iops"
}

{
  echo "urnbd eBPF tracing overhead: urnbd client -> urnbd server over rxe, null_blk, fio 4k QD32, ${runtime}s per run, $rounds rounds"
  printf '%-10s %-6s %10s %10s\n' workload round "on IOPS" "off IOPS"
  for rw in randread randwrite; do
    son=0 soff=0
    for r in $(seq "$rounds"); do
      # Alternate which goes first, so a drift of the machine hits both.
      if ((r % 2)); then on=$(run on "$rw"); off=$(run off "$rw"); else off=$(run off "$rw"); on=$(run on "$rw"); fi
      printf '%-10s %-6s %10s %10s\n' "$rw" "$r" "$on" "$off"
      son=$((son + on)) soff=$((soff + off))
    done
    python3 -c "import sys; on,off=int(sys.argv[2]),int(sys.argv[3]); print(f'{sys.argv[1]:<10} total  on/off = {on/off:.3f} (cost {100*(1-on/off):.1f} %)')" "$rw" "$son" "$soff"
  done
} | tee "$out"
