#!/usr/bin/env bash
# The demo's part inside the lab VM; see tools/demo.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prov=$here/../lab/provision.sh
urnbd=${URNBD_BIN:?}
export URNBD_RUN_DIR=/run/urnbd
hr() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

hr "soft-RoCE: two paths"
LAB_ARGS_NULL_BLK="nr_devices=1 gb=4" "$prov" modules >/dev/null
"$prov" rdma

hr "urnbd: server exporting a file, client mapping it over both soft-RoCE paths (RTRS over RDMA)"
mkdir -p /tmp/exports && truncate -s 1G /tmp/exports/disk.img
"$urnbd" server --listen rdma://192.0.2.2:1235 --listen rdma://198.51.100.2:1235 \
  --dev-search-path /tmp/exports 2>/tmp/urnbd-server.log &
srv=$!
sleep 1
tx0=$(cat /sys/class/net/veth0/statistics/tx_packets)
tx2=$(cat /sys/class/net/veth2/statistics/tx_packets)
dev=$("$urnbd" map sessname=demo transport=rdma dest_port=1235 \
  path=ip:192.0.2.1@ip:192.0.2.2 path=ip:198.51.100.1@ip:198.51.100.2 device_path=disk.img)
echo "mapped $dev: $(($(cat /sys/block/${dev#/dev/}/size) / 2048)) MiB"
fio --name=demo --filename="$dev" --ioengine=io_uring --direct=1 --rw=randrw --bs=4k \
    --iodepth=32 --numjobs=2 --size=128M --offset_increment=128M --runtime=5 --time_based \
    --verify=crc32c --verify_state_save=0 --group_reporting | grep -E 'IOPS|err=|verify' || true
echo "packets sent: veth0 $(($(cat /sys/class/net/veth0/statistics/tx_packets) - tx0)), veth2 $(($(cat /sys/class/net/veth2/statistics/tx_packets) - tx2))"
"$urnbd" list
"$urnbd" path list
hr "urnbd stats: the kernel's per-path files (6.12 and the 5.6 ABI) and the eBPF block latency of the device"
"$urnbd" stats
hr "urnbd trace: one frame of the live view, under a short fio"
fio --name=trace --filename="$dev" --ioengine=libaio --direct=1 --rw=randread --bs=4k --iodepth=16 \
    --runtime=3 --time_based >/dev/null &
fiopid=$!
sleep 1
"$urnbd" trace --interval 1s --count 1
wait "$fiopid" || true
"$urnbd" unmap "$dev"
kill "$srv"; wait "$srv" 2>/dev/null || true

hr "the kernel's RNBD over both soft-RoCE paths (the peer urnbd interoperates with)"
"$prov" rnbd >/dev/null
echo "sessname=demo path=ip:192.0.2.1@ip:192.0.2.2 path=ip:198.51.100.1@ip:198.51.100.2 device_path=/dev/nullb0" \
  >/sys/devices/virtual/rnbd-client/ctl/map_device
for _ in $(seq 50); do [ -b /dev/rnbd0 ] && break; sleep 0.1; done
echo "mapped /dev/rnbd0: state $(cat /sys/block/rnbd0/rnbd/state), session $(cat /sys/block/rnbd0/rnbd/session)"
fio --name=rnbd --filename=/dev/rnbd0 --ioengine=libaio --direct=1 --rw=randread --bs=4k \
    --iodepth=32 --runtime=5 --time_based | grep -E 'IOPS|err=' || true
for p in /sys/class/rtrs-client/demo/paths/*; do
  echo "path ${p##*/}: state $(cat "$p/state"), hca $(cat "$p/hca_name")"
  echo "  stats/rdma (reads, read bytes, writes, write bytes, inflight, failovers): $(cat "$p/stats/rdma")"
  echo "  stats/reconnects: $(cat "$p/stats/reconnects")"
  echo "  stats/cpu_migration_from: $(cat "$p/stats/cpu_migration_from")"
done
echo "mpath_policy: $(cat /sys/class/rtrs-client/demo/mpath_policy)"
echo normal >/sys/block/rnbd0/rnbd/unmap_device
echo "unmapped /dev/rnbd0"
hr "done"
