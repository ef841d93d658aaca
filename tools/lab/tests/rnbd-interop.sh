#!/usr/bin/env bash
# Interoperability with the kernel's RNBD/RTRS over soft-RoCE, both ways,
# each with fio --verify=crc32c (0 errors required):
#   1. the kernel's rnbd_client maps a file exported by `urnbd server`;
#   2. `urnbd map transport=rdma` maps /dev/nullb0 from the kernel's
#      rnbd_server (always_invalidate=Y, its default).
# Needs the kernel modules built by `tools/lab/lab build-rnbd` and URNBD_BIN.
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
prov=$here/../provision.sh
urnbd=${URNBD_BIN:?URNBD_BIN must name the urnbd binary}
export URNBD_RUN_DIR=/run/urnbd-interop
say() { printf 'rnbd-interop: %s\n' "$*"; }
fail() { printf 'rnbd-interop: FAIL: %s\n' "$*" >&2; dmesg | grep -iE 'rtrs|rnbd' | tail -20 >&2; exit 1; }

verify() { # verify DEV
  fio --name=interop --filename="$1" --ioengine=libaio --direct=1 --rw=randrw --bsrange=4k-64k \
      --iodepth=16 --size=64M --verify=crc32c --verify_fatal=1 --verify_state_save=0 \
      --output-format=terse >/tmp/interop-fio.txt 2>&1 || fail "fio verify on $1: $(tail -3 /tmp/interop-fio.txt)"
}

LAB_ARGS_NULL_BLK="nr_devices=1 memory_backed=1 gb=1" "$prov" modules >/dev/null
"$prov" rdma >/dev/null
"$prov" rnbd >/dev/null

say "1. kernel rnbd_client -> urnbd server over RDMA"
modprobe -r rnbd_server 2>/dev/null || true # frees RDMA CM port 1234
mkdir -p /tmp/interop && truncate -s 256M /tmp/interop/disk.img
"$urnbd" server --listen rdma://192.0.2.2:1234 --dev-search-path /tmp/interop 2>/tmp/interop-server.log &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
sleep 1
echo "sessname=interop path=ip:192.0.2.1,ip:192.0.2.2 device_path=disk.img" \
  >/sys/devices/virtual/rnbd-client/ctl/map_device || fail "kernel map_device"
for _ in $(seq 50); do [ -b /dev/rnbd0 ] && break; sleep 0.1; done
[ -b /dev/rnbd0 ] || fail "/dev/rnbd0 did not appear"
verify /dev/rnbd0
echo normal >/sys/block/rnbd0/rnbd/unmap_device || fail "kernel unmap"
kill "$srv"; wait "$srv" 2>/dev/null || true
trap - EXIT
say "1. PASS: fio verify through the kernel client and our server"

say "2. urnbd client -> kernel rnbd_server over RDMA"
modprobe rnbd_server dev_search_path=/ || fail "modprobe rnbd_server"
dev=$("$urnbd" map sessname=interop2 transport=rdma path=ip:192.0.2.1@ip:192.0.2.2 device_path=/dev/nullb0) ||
  fail "urnbd map from the kernel server"
verify "$dev"
"$urnbd" unmap "$dev" >/dev/null || fail "urnbd unmap"
say "2. PASS: fio verify through our client and the kernel server"
