#!/usr/bin/env bash
# Interoperability with the kernel's RNBD/RTRS over soft-RoCE, both ways,
# each with fio --verify=crc32c (0 errors required):
#   1. the kernel's rnbd_client maps a file exported by `urnbd server`;
#   2. `urnbd map transport=rdma` maps /dev/nullb0 from the kernel's
#      rnbd_server (always_invalidate=Y, its default);
#   3. a `urnbd server --auth-keys` refuses the kernel client (EACCES,
#      with an audit line) and a urnbd client with another key, and serves
#      a urnbd client that proves its key.
# Needs the kernel modules built by `tools/lab/lab build-rnbd` and URNBD_BIN.
set -euo pipefail
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
prov=$here/../provision.sh
urnbd=${URNBD_BIN:?URNBD_BIN must name the urnbd binary}
export URNBD_RUN_DIR=/run/urnbd-interop
say() { printf 'rnbd-interop: %s\n' "$*"; }
fail() { printf 'rnbd-interop: FAIL: %s\n' "$*" >&2; dmesg | grep -iE 'rtrs|rnbd' | tail -20 >&2; exit 1; }

listening() { # listening PID LOG: wait until the server says it listens
  local _
  for _ in $(seq 100); do
    grep -q "listening on" "$2" 2>/dev/null && return 0
    kill -0 "$1" 2>/dev/null || fail "urnbd server exited: $(tail -5 "$2")"
    sleep 0.1
  done
  fail "urnbd server does not listen after 10 s: $(tail -5 "$2")"
}

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
listening $srv /tmp/interop-server.log
echo "sessname=interop path=ip:192.0.2.1,ip:192.0.2.2 device_path=disk.img" \
  >/sys/devices/virtual/rnbd-client/ctl/map_device || fail "kernel map_device; server log: $(tail -5 /tmp/interop-server.log)"
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

say "3. authentication: urnbd server --auth-keys over RDMA"
modprobe -r rnbd_server || fail "modprobe -r rnbd_server"
rm -f /tmp/interop/*.key
"$urnbd" key generate --out /tmp/interop/server.key lab || fail "key generate"
cp -p /tmp/interop/server.key /tmp/interop/client.key
"$urnbd" key generate --out /tmp/interop/other.key lab2 || fail "key generate"
"$urnbd" server --listen rdma://192.0.2.2:1234 --dev-search-path /tmp/interop --auth-keys /tmp/interop/server.key 2>/tmp/interop-auth.log &
srv=$!
trap 'kill $srv 2>/dev/null || true' EXIT
listening $srv /tmp/interop-auth.log
if echo "sessname=interop3k path=ip:192.0.2.1,ip:192.0.2.2 device_path=disk.img" \
    >/sys/devices/virtual/rnbd-client/ctl/map_device 2>/tmp/interop-kmap.err; then
  fail "the kernel client mapped from a server that requires authentication"
fi
say "   kernel client refused: $(cat /tmp/interop-kmap.err)"
grep -q "refused: the client does not authenticate" /tmp/interop-auth.log ||
  fail "no audit line for the kernel client: $(tail -5 /tmp/interop-auth.log)"
if out=$("$urnbd" map sessname=interop3w transport=rdma path=ip:192.0.2.1@ip:192.0.2.2 device_path=disk.img auth_key=/tmp/interop/other.key 2>&1); then
  fail "a client with another key mapped: $out"
fi
case $out in *'refused key "lab2"'*) ;; *) fail "wrong key: no clear error: $out" ;; esac
say "   client with another key refused: $out"
dev=$("$urnbd" map sessname=interop3 transport=rdma path=ip:192.0.2.1@ip:192.0.2.2 device_path=disk.img auth_key=/tmp/interop/client.key) ||
  fail "urnbd map with the key"
verify "$dev"
"$urnbd" unmap "$dev" >/dev/null || fail "urnbd unmap"
kill "$srv"; wait "$srv" 2>/dev/null || true
trap - EXIT
say "3. PASS: kernel client and wrong key refused, fio verify with the key"
