#!/usr/bin/env bash
# Runs in the lab VM (tools/lab/lab run): the ublk frontend against the
# kernel's own devices, same VM, same run. fio 4k randread QD32 (io_uring,
# O_DIRECT) on:
#   ublk null  vs  null_blk
#   ublk loop  vs  the kernel's loop device, both over the same file
# Writes $LAB_OUT/ublk-bench.txt and prints the table with the ratios.
set -euo pipefail
: "${URNBD_BIN:?URNBD_BIN must name the urnbd binary}"
runtime=${URNBD_BENCH_RUNTIME:-10}
export URNBD_RUN_DIR=/run/urnbd-bench
modprobe ublk_drv
modprobe null_blk nr_devices=1 queue_mode=2 gb=4 bs=512 irqmode=0
modprobe loop
out=${LAB_OUT:-/tmp}/ublk-bench.txt

iops() { # iops DEVICE: fio 4k randread QD32, prints read IOPS
  fio --output-format=json --name=bench --filename="$1" --ioengine=io_uring --direct=1 \
      --rw=randread --bs=4k --iodepth=32 --numjobs=1 --time_based --runtime="$runtime" \
      --ramp_time=2 --size=1G 2>/dev/null |
    sed -n '/^{/,$p' | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))'
}

ublk_null=$("$URNBD_BIN" ublk add null --size 4G)
file=/tmp/bench.img
truncate -s 1G "$file"
dd if=/dev/urandom of="$file" bs=1M count=1024 status=none conv=notrunc
ublk_loop=$("$URNBD_BIN" ublk add loop --file "$file")
kloop=$(losetup --direct-io=on --show -f "$file" 2>/dev/null || losetup --show -f "$file")

r_nullb=$(iops /dev/nullb0)
r_unull=$(iops "$ublk_null")
r_kloop=$(iops "$kloop")
r_uloop=$(iops "$ublk_loop")
"$URNBD_BIN" ublk del --all >/dev/null
losetup -d "$kloop"

ratio() { python3 -c "print(f'{$1/$2:.2f}')"; }
{
  echo "fio 4k randread QD32, io_uring, O_DIRECT, ${runtime}s; lab VM (qemu TCG, $(nproc) vCPUs), $(uname -r)"
  printf '%-34s %10s\n' "device" "IOPS"
  printf '%-34s %10s\n' "null_blk (kernel)" "$r_nullb"
  printf '%-34s %10s\n' "ublk null (urnbd)" "$r_unull"
  printf '%-34s %10s\n' "loop (kernel, dio, file on tmpfs)" "$r_kloop"
  printf '%-34s %10s\n' "ublk loop (urnbd, same file)" "$r_uloop"
  echo "ratio ublk null / null_blk: $(ratio "$r_unull" "$r_nullb")"
  echo "ratio ublk loop / kernel loop: $(ratio "$r_uloop" "$r_kloop")"
} | tee "$out"
