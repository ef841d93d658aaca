#!/usr/bin/env bash
# Runs in the lab VM: RNBD over soft-RoCE (path 192.0.2.1 -> 192.0.2.2),
# same VM, same run, all backed by null_blk: fio 4k randread and randwrite
# at QD32 and 128k sequential read at QD32 through
#   kernel client -> kernel server  (the reference)
#   urnbd client  -> urnbd server
#   urnbd client  -> kernel server
#   kernel client -> urnbd server
# Writes $LAB_OUT/rnbd-bench.txt.
set -euo pipefail
: "${URNBD_BIN:?}"
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
prov=$here/../lab/provision.sh
runtime=${URNBD_BENCH_RUNTIME:-5}
export URNBD_RUN_DIR=/run/urnbd-bench
LAB_ARGS_NULL_BLK="nr_devices=1 gb=4" "$prov" modules >/dev/null
"$prov" rdma >/dev/null
LAB_ARGS_RNBD_SERVER="dev_search_path=/" "$prov" rnbd >/dev/null
CTL=/sys/devices/virtual/rnbd-client/ctl/map_device

"$URNBD_BIN" server --listen rdma://192.0.2.2:1236 --dev-search-path /dev 2>/dev/null &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
sleep 1

fio_iops() { # DEV RW BS
  fio --output-format=json --name=b --filename="$1" --ioengine=libaio --direct=1 --rw="$2" --bs="$3" \
      --iodepth=32 --time_based --runtime="$runtime" --ramp_time=1 2>/dev/null |
    sed -n '/^{/,$p' | python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round(j["read"]["iops"]+j["write"]["iops"]))'
}

kmap() { # SESS PORT DEVPATH -> /dev/rnbdN
  echo "dest_port=$2 sessname=$1 path=ip:192.0.2.1,ip:192.0.2.2 device_path=$3" >"$CTL"
  for _ in $(seq 50); do
    for d in /sys/block/rnbd*; do
      [ -f "$d/rnbd/session" ] && [ "$(cat "$d/rnbd/session")" = "$1" ] && { echo "/dev/${d##*/}"; return; }
    done
    sleep 0.1
  done
  return 1
}
kunmap() { echo normal >"/sys/block/${1#/dev/}/rnbd/unmap_device"; }
umap() { "$URNBD_BIN" map sessname="$1" transport=rdma dest_port="$2" path=ip:192.0.2.1@ip:192.0.2.2 device_path="$3"; }
uunmap() { "$URNBD_BIN" unmap "$1" >/dev/null; }

declare -A R
run() { # NAME DEV
  R[$1,rr]=$(fio_iops "$2" randread 4k)
  R[$1,rw]=$(fio_iops "$2" randwrite 4k)
  R[$1,sr]=$(fio_iops "$2" read 128k)
}
d=$(kmap kk 1234 /dev/nullb0); run kernel-kernel "$d"; kunmap "$d"
d=$(umap uu 1236 nullb0); run urnbd-urnbd "$d"; uunmap "$d"
d=$(umap uk 1234 /dev/nullb0); run urnbd-kernel "$d"; uunmap "$d"
d=$(kmap ku 1236 nullb0); run kernel-urnbd "$d"; kunmap "$d"

out=${LAB_OUT:-/tmp}/rnbd-bench.txt
{
  echo "RNBD over soft-RoCE (rxe, one path), null_blk backend, fio libaio QD32, ${runtime}s; $(uname -r), $(nproc) vCPUs under qemu TCG"
  printf '%-22s %12s %12s %12s\n' "client -> server" "4k randread" "4k randwrite" "128k seqread"
  for n in kernel-kernel urnbd-urnbd urnbd-kernel kernel-urnbd; do
    printf '%-22s %12s %12s %12s\n' "$n" "${R[$n,rr]}" "${R[$n,rw]}" "${R[$n,sr]}"
  done
  for n in urnbd-urnbd urnbd-kernel kernel-urnbd; do
    printf 'ratio %s / kernel-kernel: %s\n' "$n" "$(python3 -c "print(' '.join(f'{a/b:.2f}' for a,b in zip([${R[$n,rr]},${R[$n,rw]},${R[$n,sr]}],[${R[kernel-kernel,rr]},${R[kernel-kernel,rw]},${R[kernel-kernel,sr]}])))")"
  done
} | tee "$out"
