#!/usr/bin/env bash
# Runs in the lab VM (tools/lab/lab run): the ublk frontend against the
# kernel's own devices and the kernel's own ublk server, same VM, same run,
# interleaved rounds (lab-lib.sh). fio 4k randread, 4k randwrite and 128k
# read, QD32, io_uring, O_DIRECT, on:
#   null_blk            the kernel's null device: the ceiling
#   urnbd-null          ublk null target, urnbd's queues: batch I/O and
#                       zero copy where the driver offers them (7.0, 6.16)
#   urnbd-null-copy     the same with --no-zero-copy, where zero copy exists
#   urnbd-null-pertag   --no-batch-io --no-zero-copy, where batch I/O exists
#                       (what 6.12 runs)
#   kublk-null          the kernel's ublk selftest server (C, liburing), if
#   kublk-null-batch-zc $URNBD_KUBLK names it: plain, and with batch I/O and
#                       zero copy (-b --auto_zc) where offered
#   kernel-loop         loop device, direct I/O, over a file on tmpfs
#   urnbd-loop          ublk loop target over the same file (zero copy
#   urnbd-loop-copy     where offered), and with --no-zero-copy
# with each run's costs per I/O: the whole VM's CPU, and the ublk server's
# CPU, context switches and system calls. Writes $LAB_OUT/ublk-bench.txt.
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
fio_engine=io_uring
table_col=device
# shellcheck source=tools/bench/lab-lib.sh
source "$here/lab-lib.sh"
out=${LAB_OUT:-/tmp}/ublk-bench.txt
runs=${LAB_OUT:-/tmp}/ublk-bench-runs.txt
costs=${LAB_OUT:-/tmp}/ublk-bench-costs.txt
srv=
modprobe ublk_drv
modprobe loop
null_blk_devices 1

offered() { "$URNBD_BIN" ublk features --format json | python3 -c 'import json,sys; sys.exit(sys.argv[1] not in json.load(sys.stdin)["offered"])' "$1"; }

names=("null_blk")
DEV[null_blk]=/dev/nullb0
add() { # add NAME ID DEVICE-PATH: a configuration served by ublk device ID
  names+=("$1")
  DEV[$1]=$3
  DAEMON[$1]=$(ublk_pid "$2")
}
add urnbd-null 0 "$("$URNBD_BIN" ublk add null --id 0 --size 4G)"
if offered auto_buf_reg; then
  add urnbd-null-copy 1 "$("$URNBD_BIN" ublk add null --id 1 --size 4G --no-zero-copy)"
fi
if offered batch_io; then
  add urnbd-null-pertag 2 "$("$URNBD_BIN" ublk add null --id 2 --size 4G --no-batch-io --no-zero-copy)"
fi
if [[ -n ${URNBD_KUBLK:-} ]]; then
  queues=$(nproc)
  if "$URNBD_KUBLK" add -t null -n 3 -q "$queues" -d 128 >/dev/null; then
    add kublk-null 3 /dev/ublkb3
  else
    echo "ublk-lab: kublk add failed: no kublk-null" >&2
  fi
  if offered batch_io && offered auto_buf_reg; then
    if "$URNBD_KUBLK" add -t null -n 4 -q "$queues" -d 128 -b --auto_zc >/dev/null; then
      add kublk-null-batch-zc 4 /dev/ublkb4
    else
      echo "ublk-lab: kublk add -b --auto_zc failed: no kublk-null-batch-zc" >&2
    fi
  fi
fi
file=/tmp/bench.img
truncate -s 1G "$file"
dd if=/dev/urandom of="$file" bs=1M count=1024 status=none conv=notrunc
names+=(kernel-loop)
DEV[kernel-loop]=$(losetup --direct-io=on --show -f "$file" 2>/dev/null || losetup --show -f "$file")
add urnbd-loop 5 "$("$URNBD_BIN" ublk add loop --id 5 --file "$file")"
if offered auto_buf_reg; then
  add urnbd-loop-copy 6 "$("$URNBD_BIN" ublk add loop --id 6 --file "$file" --no-zero-copy)"
fi

counting_check
rounds_run "$runs" "${names[@]}"
[[ -n ${keep:-} ]] && perf_stop "$keep"
[[ -n ${URNBD_KUBLK:-} ]] && "$URNBD_KUBLK" del -a >/dev/null 2>&1
"$URNBD_BIN" ublk del --all >/dev/null
losetup -d "${DEV[kernel-loop]}"

{
  table "ublk frontend" "${names[@]}"
  echo "ratios to null_blk (4k randread, 4k randwrite, 128k read):"
  for n in "${names[@]}"; do
    [[ $n == null_blk || $n == *loop* ]] && continue
    printf '  %-20s %s\n' "$n" "$(ratios "$n" null_blk)"
  done
  echo "ratios to kernel-loop:"
  for n in "${names[@]}"; do
    [[ $n == urnbd-loop* ]] || continue
    printf '  %-20s %s\n' "$n" "$(ratios "$n" kernel-loop)"
  done
  costs_table
} | tee "$out"
